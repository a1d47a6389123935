"""FLAME (Nguyen et al., USENIX Security 2022): cosine HDBSCAN, median-norm clipping, adaptive noise."""

from __future__ import annotations

import torch

from ._validation import check_updates, check_vector
from .kernels import gram, row_dots, weighted_row_sum
from .records import RuleRecord

__all__ = ["flame_admitted", "flame"]


def _cosine_distances(g: torch.Tensor) -> torch.Tensor:
    norms = torch.diagonal(g).clamp_min(0.0).sqrt()
    den = norms[:, None] * norms[None, :]
    cos = torch.where(den > 0, g / den.clamp_min(1e-300), torch.zeros_like(g))
    dist = (1.0 - cos).clamp(0.0, 2.0)
    dist.fill_diagonal_(0.0)
    return (dist + dist.T) / 2.0


def flame_admitted(cosine_distances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""FLAME's filter: HDBSCAN on the cosine distances with ``min_cluster_size`` :math:`\lfloor n/2
    \rfloor + 1`, ``min_samples`` 1 and a single cluster allowed; the majority cluster is admitted,
    the noise points (label -1) are not.

    scikit-learn's ``HDBSCAN(metric="precomputed")``. A cluster needs more than half of the
    updates, so there is at most one. When HDBSCAN finds none (everything noise) or n < 3 (no
    majority cluster to find), every update is admitted and the labels say so (all -1).

    Parameters
    ----------
    cosine_distances : torch.Tensor
        ``(n, n)`` symmetric :math:`1 - \cos(w_i, w_j)`.

    Returns
    -------
    tuple of torch.Tensor
        ``(admitted (n,) bool, labels (n,) int64)`` with HDBSCAN's labels.
    """
    dist = torch.as_tensor(cosine_distances, dtype=torch.float64).cpu()
    n = dist.shape[0]
    if n < 3:
        return torch.ones(n, dtype=torch.bool), torch.full((n,), -1, dtype=torch.long)
    from sklearn.cluster import HDBSCAN  # local: scikit-learn loads only for this rule

    labels = torch.as_tensor(HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                                     allow_single_cluster=True, copy=True).fit(dist.numpy()).labels_, dtype=torch.long)
    admitted = labels >= 0
    if not bool(admitted.any()):
        admitted = torch.ones(n, dtype=torch.bool)
    return admitted, labels


def flame(x: torch.Tensor, *, global_model: torch.Tensor | None = None, noise_lambda: float = 0.001,
          generator: torch.Generator | None = None) -> tuple[torch.Tensor, RuleRecord]:
    r"""FLAME: admit the majority cluster of cosine HDBSCAN, clip every admitted update to the median
    update norm, average, add Gaussian noise scaled to that norm.

    .. math::

        c_{ij} = 1 - \cos(w_i, w_j),\quad A = \text{HDBSCAN}(c)\text{'s majority cluster},\quad
        S = \mathrm{med}_i \lVert u_i\rVert,

        \mathrm{FLAME}(u) = \frac{1}{|A|}\sum_{i \in A} u_i \min\Bigl(1, \frac{S}{\lVert u_i\rVert}\Bigr)
                            + \mathcal N(0, (\lambda S)^2 I)

    with :math:`u_i = w_i - w_G` the updates, :math:`w_i` the local models and
    :math:`S` the median of all n update norms (the models' distances to the global model).
    Nguyen, Rieger, Chen, Yalame, Möllering, Fereidooni, Marchal, Miettinen, Mirhoseini,
    Zeitouni, Koushanfar, Sadeghi, Schneider, "FLAME: Taming Backdoors in Federated Learning",
    USENIX Security 2022 (Algorithm 1; :math:`\lambda = 0.001` for image classification). The
    paper clusters the local *models*: pass ``global_model`` for that (:math:`w_i = w_G + u_i`);
    without it the updates themselves are clustered (what hospitrust, which holds updates, can
    always do). Noise is added to the aggregate update, which is the same as adding it to the
    aggregated model.

    Passes: the Gram matrix (one), the dot products with ``global_model`` when given (one), the
    weighted sum (one), plus drawing ``d`` Gaussian numbers.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    global_model : torch.Tensor or None
        ``(d,)`` the flattened global model :math:`w_G`; None clusters the updates.
    noise_lambda : float
        :math:`\lambda \ge 0`; 0 adds no noise.
    generator : torch.Generator or None
        Draws the noise; None: the global generator.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate (noise included) and the record (``detail``: ``labels``,
        ``clip_bound``, ``clip_factors``, ``noise_std``).
    """
    n, d = check_updates(x)
    if not (isinstance(noise_lambda, (int, float)) and noise_lambda >= 0):
        raise ValueError(f"flame requires noise_lambda >= 0; got {noise_lambda!r}")
    g = gram(x).cpu()
    norms = torch.diagonal(g).clamp_min(0.0).sqrt()
    if global_model is None:
        models = g
    else:
        w = check_vector(global_model, d, "global_model", x)
        dots = row_dots(x, w)[0].cpu()
        models = g + dots[:, None] + dots[None, :] + float((w.double() @ w.double()))
    admitted, labels = flame_admitted(_cosine_distances(models))
    bound = float(torch.quantile(norms, 0.5))
    factors = torch.where(norms > bound, bound / norms.clamp_min(1e-300), torch.ones_like(norms))
    coef = torch.where(admitted, factors / int(admitted.sum()), torch.zeros_like(factors))
    out = weighted_row_sum(x, coef)
    std = float(noise_lambda) * bound
    if std > 0:
        device = generator.device if generator is not None else x.device
        out = out + (torch.randn(d, generator=generator, dtype=x.dtype, device=device) * std).to(x.device)
    rec = RuleRecord(admitted, coef, {"labels": labels, "clip_bound": bound, "clip_factors": factors, "noise_std": std})
    return out, rec

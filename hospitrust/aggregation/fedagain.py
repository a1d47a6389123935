"""FedAgain trust (Reyes-Amezcua et al., arXiv:2603.19512), with its two holes closed."""

from __future__ import annotations

import torch

from ._validation import check_updates, check_vector

__all__ = ["fedagain_divergence", "fedagain_trust"]


def fedagain_divergence(x: torch.Tensor, global_vector: torch.Tensor | None = None, kind: str = "l2") -> torch.Tensor:
    r"""Divergence :math:`D_k` of each hospital's returned weights from the global weights.

    ``l2``: :math:`D_k = \lVert w_k - w\rVert = \lVert u_k\rVert` (the paper).
    ``cosine``: :math:`D_k = 1 - \cos(w + u_k, w)` on the full parameter vectors (the
    authors' public code); a zero vector on either side gives :math:`D_k = 1`.
    ``median`` (our variant): :math:`D_k = \lVert u_k - \mathrm{med}(u)\rVert`, the distance to
    the round's coordinate-wise median update. The paper's ``l2`` gives a sign-flipped
    update the same D as the honest one it came from (same norm); measured from the
    median it is about twice as far.

    Returns ``(n,)`` float64 on CPU.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)`` (returned minus global weights, :math:`u_k`).
    global_vector : torch.Tensor or None
        ``(d,)`` the global weights :math:`w`; needed by ``cosine`` only.
    kind : {"l2", "cosine", "median"}
        Which divergence.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 divergences on the CPU.
    """
    n, d = check_updates(x)
    if kind == "l2":
        return torch.linalg.vector_norm(x.double(), dim=1).cpu()
    if kind == "median":
        from .median import coordinate_median

        return torch.linalg.vector_norm((x - coordinate_median(x)).double(), dim=1).cpu()
    if kind != "cosine":
        raise ValueError(f"kind must be 'l2', 'cosine' or 'median', got {kind!r}")
    if global_vector is None:
        raise ValueError("cosine divergence needs the global vector")
    g = check_vector(global_vector, d, "global_vector", x).double()
    w = x.double() + g
    denom = torch.linalg.vector_norm(w, dim=1) * torch.linalg.vector_norm(g)
    cos = torch.where(denom > 0, (w @ g) / denom.clamp_min(1e-300), torch.zeros_like(denom))
    return (1.0 - cos).clamp_min(0.0).cpu()


def fedagain_trust(
    errors: torch.Tensor,
    divergences: torch.Tensor,
    *,
    divergence_quantile: float = 0.5,
    error_quantile: float = 0.5,
    error_floor: float = 0.01,
    eps: float = 1e-6,
    eps_placement: str = "product",
) -> dict[str, torch.Tensor]:
    r"""FedAgain trust and weights with floored factors.

    .. math::

        D'_k = \max(D_k,\ Q_{q_D}(D),\ 10^{-12}),\qquad
        E'_k = \max(E_k,\ Q_{q_E}(E),\ e_{\min}),\qquad
        T_k = \frac{1}{E'_k D'_k + \varepsilon},\qquad w_k = \frac{T_k}{\sum_j T_j}

    :math:`Q_q` is the round's q-quantile (linear interpolation, ``torch.quantile``).
    The paper's rule is :math:`q_D = q_E = 0`, :math:`e_{\min} = 0`: a free-rider that
    returns the global model (:math:`D = 0`) or a hospital that reports :math:`E = 0`
    gets trust :math:`1/\varepsilon` and takes the whole aggregate. With the floors,
    no hospital's trust exceeds :math:`T_{\max} = 1/(E_{fl} D_{fl} + \varepsilon)` where
    :math:`E_{fl}, D_{fl}` are the round's floors: when fewer than a share
    :math:`1 - q` of the hospitals lie or free-ride, the floors are honest values, so a
    liar or free-rider is worth at most an honest hospital at the median error and
    median divergence (with the default q = 0.5).

    ``eps_placement``: ``"product"`` is :math:`T_k = 1 / (E'_k D'_k + \varepsilon)` (the paper);
    ``"factors"`` is :math:`T_k = 1 / ((E'_k + \varepsilon)(D'_k + \varepsilon))` (the authors'
    public code, ``robust_divergence_experiments/train.py``). They differ only when a factor
    is near 0: with E = 0 the first gives :math:`1/\varepsilon`, the second
    :math:`1/(\varepsilon (D + \varepsilon))`.

    Parameters
    ----------
    errors : (n,) benchmark errors in [0, 1] (reported by the hospital, or measured by the server).
    divergences : (n,) non-negative divergences (:func:`fedagain_divergence`).
    eps_placement : {"product", "factors"}, where eps enters (see above).

    Returns
    -------
    dict with ``trust``, ``weights``, ``error`` (E'), ``divergence`` (D'), float64 on CPU.
    """
    e = torch.as_tensor(errors, dtype=torch.float64).flatten().cpu()
    dv = torch.as_tensor(divergences, dtype=torch.float64).flatten().cpu()
    if e.shape != dv.shape or e.numel() == 0:
        raise ValueError(f"errors and divergences must be (n,) with n >= 1; got {tuple(e.shape)} and {tuple(dv.shape)}")
    if not (torch.isfinite(e).all() and torch.isfinite(dv).all()):
        raise ValueError("errors and divergences must be finite")
    for name, q in (("divergence_quantile", divergence_quantile), ("error_quantile", error_quantile)):
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {q}")
    e = e.clamp(0.0, 1.0)
    dv = dv.clamp_min(0.0)
    d_floor = max(float(torch.quantile(dv, divergence_quantile)), 1e-12)
    e_floor = max(float(torch.quantile(e, error_quantile)), error_floor)
    e2, d2 = e.clamp_min(e_floor), dv.clamp_min(d_floor)
    if eps_placement == "product":
        trust = 1.0 / (e2 * d2 + eps)
    elif eps_placement == "factors":
        trust = 1.0 / ((e2 + eps) * (d2 + eps))
    else:
        raise ValueError(f"eps_placement must be 'product' or 'factors', got {eps_placement!r}")
    return {"trust": trust, "weights": trust / trust.sum(), "error": e2, "divergence": d2}

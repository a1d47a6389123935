"""Geometric median by smoothed Weiszfeld iterations (Pillutla et al., RFA)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._validation import check_updates, check_weights
from .kernels import gram, weighted_row_sum

__all__ = ["geometric_median"]


def geometric_median(
    x: torch.Tensor,
    eps: float = 1e-6,
    iters: int = 100,
    weights: torch.Tensor | Sequence[float] | None = None,
) -> torch.Tensor:
    r"""Approximate geometric median with the smoothed Weiszfeld algorithm.

    .. math:: z^\star = \arg\min_z \sum_i \alpha_i \lVert z - x_i\rVert

    iterated as

    .. math:: z \leftarrow \frac{\sum_i \beta_i x_i}{\sum_i \beta_i},\qquad
              \beta_i = \frac{\alpha_i}{\max(\varepsilon, \lVert z - x_i\rVert)}

    starting from the weighted mean, for at most ``iters`` steps, stopping
    early when a step moves :math:`z` by less than ``eps`` times the current
    mean distance :math:`\sum_i \alpha_i \lVert z - x_i\rVert`. Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated
    Learning" (RFA), IEEE TSP 2022; Weiszfeld (1937).

    Every iterate is a convex combination :math:`z = \sum_j c_j x_j`, so
    :math:`\lVert z - x_i\rVert^2 = G_{ii} - 2 (Gc)_i + c^\top G c` with the
    Gram matrix :math:`G = XX^\top`: the data are read once for ``G`` (float64
    accumulation, :func:`~hospitrust.aggregation.gram`) and once for the final combination
    (:func:`~hospitrust.aggregation.kernels.weighted_row_sum`), whatever ``iters``: two passes.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    eps : float
        Smoothing :math:`\varepsilon > 0` (and relative stopping tolerance).
    iters : int
        Maximum number of Weiszfeld steps, ``>= 1``.
    weights : array-like of shape (n,), optional
        Non-negative :math:`\alpha_i` with positive sum; default uniform.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n, _ = check_updates(x)
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"geometric_median requires eps > 0; got eps={eps!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"geometric_median requires an int iters >= 1; got iters={iters!r}")
    if weights is None:
        alpha = torch.full((n,), 1.0 / n, dtype=torch.float64)
    else:
        alpha = check_weights(weights, n, x).to(device="cpu", dtype=torch.float64)
        alpha = alpha / alpha.sum()
    g = gram(x).cpu()
    diag = torch.diagonal(g)

    def dists(c: torch.Tensor) -> torch.Tensor:
        gc = g @ c
        return (diag - 2.0 * gc + c @ gc).clamp_min(0.0).sqrt()

    c = alpha.clone()
    dist = dists(c)
    for _ in range(iters):
        beta = alpha / dist.clamp_min(eps)
        c_new = beta / beta.sum()
        delta = c_new - c
        step = float(delta @ (g @ delta)) ** 0.5 if float(delta @ (g @ delta)) > 0 else 0.0
        c = c_new
        dist = dists(c)
        if step <= eps * max(float(alpha @ dist), 1e-300):
            break
    return weighted_row_sum(x, c)

"""Centered clipping (Karimireddy, He, Jaggi, 2021)."""

from __future__ import annotations

import torch

from ._validation import check_updates, check_vector
from .kernels import centered_gram, fused_kernels_apply, row_distances, weighted_row_sum

__all__ = ["centered_clipping"]


def _distances_to(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact ``||x_i - v||`` for every row, one pass over ``x``, float64
    (:func:`~hospitrust.aggregation.kernels.row_distances`).
    """
    return row_distances(x, v)


def _scale(dist: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.where(dist > tau, tau / dist.clamp_min(1e-300), torch.ones_like(dist))


def centered_clipping(
    x: torch.Tensor, center: torch.Tensor, tau: float, iters: int = 1
) -> torch.Tensor:
    r"""Centered clipping around ``center`` (e.g. the previous aggregate / momentum).

    .. math::

        v \leftarrow v + \frac1n \sum_i (x_i - v)\,
            \min\!\Bigl(1, \frac{\tau}{\lVert x_i - v\rVert}\Bigr)

    repeated ``iters`` times from :math:`v = ` ``center``. Karimireddy, He,
    Jaggi, "Learning from History for Byzantine Robust Optimization",
    ICML 2021.

    Every iterate is :math:`v_t = v_0 + \sum_j c_j (x_j - v_0)` (the clipping weights sum
    with :math:`1 - \sum_j c_j` on :math:`v_t` to one), so with the Gram matrix
    :math:`H` of the centred updates :math:`u_j = x_j - v_0`,
    :math:`\lVert x_i - v_t\rVert^2 = H_{ii} - 2 (Hc)_i + c^\top H c`. On the CPU for large
    ``d``: two passes over the data whatever ``iters`` (the exact distances to the centre,
    or for ``iters > 1`` the centred Gram matrix, then one weighted sum of the rows); the
    distances of later iterates lose relative accuracy only when an update lies much closer
    to the iterate than to the centre. Otherwise each iteration reads the data twice (exact
    distances, then the weighted sum).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    center : torch.Tensor
        ``(d,)`` starting point.
    tau : float
        Clipping radius, ``> 0``.
    iters : int
        Number of clipping iterations, ``>= 1``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n, d = check_updates(x)
    v = check_vector(center, d, "center", x)
    if not (isinstance(tau, (int, float)) and tau > 0):
        raise ValueError(f"centered_clipping requires tau > 0; got tau={tau!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"centered_clipping requires an int iters >= 1; got iters={iters!r}")
    if fused_kernels_apply(x, 1):
        return _centered_clipping_two_passes(x, v, tau, iters)
    for _ in range(iters):
        dist = _distances_to(x, v).cpu()
        coef = _scale(dist, tau) / n
        # v + sum_i coef_i (x_i - v) = (1 - sum coef) v + coef @ x
        v = weighted_row_sum(x, coef, v, 1.0 - float(coef.sum()))
    return v


def _centered_clipping_two_passes(x: torch.Tensor, v0: torch.Tensor, tau: float, iters: int) -> torch.Tensor:
    """The iterations on coefficients: ``v_t = (1 - sum c) v0 + sum_j c_j x_j``."""
    n = x.shape[0]
    c = torch.zeros(n, dtype=torch.float64)
    if iters == 1:
        dist = _distances_to(x, v0).cpu()
        c = _scale(dist, tau) / n
    else:
        h = centered_gram(x, v0).cpu()
        diag = torch.diagonal(h)
        for _ in range(iters):
            hc = h @ c
            dist = (diag - 2.0 * hc + c @ hc).clamp_min(0.0).sqrt()
            # v_{t+1} - v0 = (v_t - v0) + sum_i s_i/n (u_i - (v_t - v0))
            s = _scale(dist, tau) / n
            c = c * (1.0 - float(s.sum())) + s
    return weighted_row_sum(x, c, v0, 1.0 - float(c.sum()))

"""Centered clipping (Karimireddy, He, Jaggi, 2021)."""

from __future__ import annotations

import torch

from ._validation import check_updates, check_vector

__all__ = ["centered_clipping"]

DIST_BLOCK = 65_536


def _distances_to(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact ``||x_i - v||`` for every row (no Gram identity: the updates may sit close to
    the center), one pass over ``x``, float64. On the CPU the differences are formed one
    cache-sized column block at a time instead of as an ``(n, d)`` temporary.
    """
    if x.dtype not in (torch.float32, torch.float64):
        return torch.linalg.vector_norm(x.float() - v.float(), dim=1).double()
    n, d = x.shape
    if x.device.type != "cpu" or d <= DIST_BLOCK:
        return torch.linalg.vector_norm(x - v, dim=1).double()
    acc = torch.zeros(n, dtype=torch.float64)
    buf = torch.empty(n, DIST_BLOCK, dtype=x.dtype)
    for start in range(0, d, DIST_BLOCK):
        block = x[:, start : start + DIST_BLOCK]
        diff = buf[:, : block.shape[1]]
        torch.sub(block, v[start : start + DIST_BLOCK], out=diff)
        acc += torch.linalg.vector_norm(diff, dim=1).double().square_()
    return acc.sqrt_()


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

    Each iteration reads the data twice (distances, then the weighted sum).

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
    for _ in range(iters):
        dist = _distances_to(x, v).cpu()
        scale = torch.where(dist > tau, tau / dist.clamp_min(1e-300), torch.ones_like(dist))
        coef = scale / n
        # v + sum_i coef_i (x_i - v) = (1 - sum coef) v + coef @ x
        v = coef.to(dtype=x.dtype, device=x.device) @ x + (1.0 - float(coef.sum())) * v
    return v

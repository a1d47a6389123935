"""Coordinate-wise trimmed mean (Yin et al., 2018)."""

from __future__ import annotations

import torch

from ._validation import check_f, check_updates
from .order_statistics import trimmed_mean_kernel

__all__ = ["trimmed_mean"]


def trimmed_mean(x: torch.Tensor, f: int) -> torch.Tensor:
    r"""Coordinate-wise trimmed mean: drop the ``f`` largest and ``f`` smallest.

    .. math::

        \mathrm{TM}_f(x)_j = \frac{1}{n - 2f} \sum_{r=f+1}^{n-f} x_{(r), j}

    with :math:`x_{(1), j} \le \dots \le x_{(n), j}` the sorted values of
    coordinate ``j``. Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
    Distributed Learning: Towards Optimal Statistical Rates", ICML 2018.
    Flower's ``FedTrimmedAvg(beta)`` is this rule with
    ``f = int(beta * n)``.

    Computed in one fused pass over the data on CPU (selection network, see
    :mod:`hospitrust.aggregation.order_statistics`); equal to the
    ``torch.sort``-based definition up to the rounding of the final sum.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates, shape ``(n, d)``, floating dtype.
    f : int
        Number of values trimmed at each end, ``0 <= f`` and ``2f < n``.

    Returns
    -------
    torch.Tensor
        Shape ``(d,)``.

    Raises
    ------
    ValueError
        If ``f < 0`` or ``2f >= n``, or ``x`` is not 2-D floating.
    """
    n, _ = check_updates(x)
    f = check_f(f)
    if 2 * f >= n:
        raise ValueError(
            f"trimmed_mean requires 2f < n (at least one value left per coordinate); "
            f"got n={n}, f={f}"
        )
    return trimmed_mean_kernel(x, f)

"""Coordinate-wise median (Yin et al., 2018)."""

from __future__ import annotations

import torch

from ._validation import check_updates
from .order_statistics import median_kernel

__all__ = ["coordinate_median"]


def coordinate_median(x: torch.Tensor) -> torch.Tensor:
    r"""Coordinate-wise median of the client updates.

    .. math::

        \mathrm{med}(x)_j = \begin{cases}
            x_{(k+1), j} & n = 2k + 1 \\
            \tfrac12\,(x_{(k), j} + x_{(k+1), j}) & n = 2k
        \end{cases}

    where :math:`x_{(1), j} \le \dots \le x_{(n), j}` are the sorted values of
    coordinate ``j`` -- i.e. ``numpy.median(x, axis=0)`` (and Flower's
    ``FedMedian``). Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
    Distributed Learning: Towards Optimal Statistical Rates", ICML 2018.

    Computed with a pruned sorting network over the rows (one fused pass over
    the data on CPU, see :mod:`hospitrust.aggregation.order_statistics`);
    equal to the ``torch.sort``-based definition above. Inputs must be finite.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates, shape ``(n, d)``, floating dtype.

    Returns
    -------
    torch.Tensor
        Shape ``(d,)``.
    """
    check_updates(x)
    return median_kernel(x)

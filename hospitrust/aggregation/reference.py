"""Straightforward ``torch.sort``-based reference implementations.

They define the exact semantics the fast kernels in
:mod:`hospitrust.aggregation.order_statistics` must reproduce (up to float
rounding of the final sums) and are used by the tests. They are slow (a full
sort along the client axis) and do no argument checking.
"""

from __future__ import annotations

import torch

__all__ = [
    "reference_coordinate_median",
    "reference_trimmed_mean",
    "reference_bulyan_coordinate",
]


def reference_coordinate_median(x: torch.Tensor) -> torch.Tensor:
    """Median per column; even ``n``: mean of the two middle values.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    s = torch.sort(x, dim=0).values
    n = x.shape[0]
    k = n // 2
    return s[k] if n % 2 else (s[k - 1] + s[k]) * 0.5


def reference_trimmed_mean(x: torch.Tensor, f: int) -> torch.Tensor:
    """Mean per column after dropping the ``f`` smallest and ``f`` largest.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Values dropped at each end of every column.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    s = torch.sort(x, dim=0).values
    n = x.shape[0]
    return s[f : n - f].mean(0)


def reference_bulyan_coordinate(x: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan coordinate phase over all rows of ``x`` (``theta`` rows).

    Per column: sort, take the median ``m`` (even: mean of the middle two),
    order the sorted values by ``|s - m|`` with a *stable* sort (ties prefer
    the smaller value) and average the first ``beta = theta - 2f``.

    Parameters
    ----------
    x : torch.Tensor
        The ``theta`` selected rows ``(theta, d)``.
    f : int
        Assumed number of Byzantine clients.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    theta = x.shape[0]
    beta = theta - 2 * f
    s = torch.sort(x, dim=0).values
    k = theta // 2
    m = s[k] if theta % 2 else (s[k - 1] + s[k]) * 0.5
    dist = (s - m).abs()
    order = torch.sort(dist, dim=0, stable=True).indices[:beta]
    return torch.gather(s, 0, order).mean(0)

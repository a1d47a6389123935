"""(Weighted) arithmetic mean -- FedAvg's aggregation rule."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._validation import check_updates, check_weights
from .kernels import weighted_row_sum

__all__ = ["mean"]


def mean(
    x: torch.Tensor, weights: torch.Tensor | Sequence[float] | None = None
) -> torch.Tensor:
    r"""Weighted mean of the client updates (FedAvg).

    .. math:: \bar x = \frac{\sum_i w_i x_i}{\sum_i w_i}

    (McMahan et al., "Communication-Efficient Learning of Deep Networks from
    Decentralized Data", AISTATS 2017.)

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates, shape ``(n, d)``, floating dtype, any device.
    weights : array-like of shape (n,), optional
        Non-negative client weights (e.g. numbers of examples) with a positive
        sum. ``None`` gives the plain mean.

    Returns
    -------
    torch.Tensor
        Shape ``(d,)``, same dtype and device as ``x``.

    Raises
    ------
    ValueError
        If ``x`` is not a non-empty 2-D floating tensor, or ``weights`` does
        not have length ``n``, has negative entries or sums to zero.
    """
    n, _ = check_updates(x)
    if weights is None:
        # A weighted sum of the rows reads x once and is faster than x.sum(0) / n (a compiled
        # one-pass kernel for large d on the CPU, a matrix-vector product otherwise).
        w = torch.full((n,), 1.0 / n, dtype=x.dtype, device=x.device)
    else:
        w = check_weights(weights, n, x)
        w = w / w.sum()
    return weighted_row_sum(x, w)

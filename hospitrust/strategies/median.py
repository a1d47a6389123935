"""Coordinate-wise median (Yin et al., ICML 2018)."""

from __future__ import annotations

import torch

from hospitrust.aggregation import coordinate_median
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class Median(HospitrustStrategy):
    """Each coordinate of the update is the median of the hospitals' values.

    Coordinate-wise: no hospital is excluded as a whole, so each is recorded as selected
    with the nominal weight 1/n.

    Parameters
    ----------
    hospitals, options, **kwargs
        As every rule takes them (:class:`~hospitrust.strategies.base.HospitrustStrategy`).
    """

    name = "median"
    agr_tailored = "distance"

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        return Aggregate(coordinate_median(updates), torch.full((n,), 1.0 / n), torch.ones(n, dtype=torch.bool))

"""Coordinate-wise trimmed mean (Yin et al., ICML 2018)."""

from __future__ import annotations

import torch

from hospitrust.aggregation import trimmed_mean
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sized import SizedRule


class TrimmedMean(SizedRule):
    """Per coordinate, drop the f largest and f smallest values and average the rest (2f < n).

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "trimmed-mean"

    agr_tailored = "distance"

    def required_replies(self) -> int:
        return 2 * self.f + 1

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        return Aggregate(trimmed_mean(updates, self.f), torch.full((n,), 1.0 / n), torch.ones(n, dtype=torch.bool))

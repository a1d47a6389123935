"""Coordinate-wise trimmed mean (Yin et al., ICML 2018)."""

from __future__ import annotations

import torch

from hospitrust.aggregation import trimmed_mean
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class TrimmedMean(HospitrustStrategy):
    """Per coordinate, drop the f largest and f smallest values and average the rest (2f < n).

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name (from the query round).
    options : Options or Mapping, optional
        The rule's options (an instance of its ``Options``, or a mapping of field names); its
        defaults when None.
    assumed_malicious : int
        f, the attackers the rule is sized for (run config ``assumed-malicious``).
    **kwargs
        The base's keyword arguments (:class:`~hospitrust.strategies.base.HospitrustStrategy`:
        train_config, fraction_train, min_hospitals, limits, seed, device).
    """

    name = "trimmed-mean"

    sized_for_attackers = True
    agr_tailored = "distance"

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.f = assumed_malicious

    def required_replies(self) -> int:
        return 2 * self.f + 1

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        return Aggregate(trimmed_mean(updates, self.f), torch.full((n,), 1.0 / n), torch.ones(n, dtype=torch.bool))

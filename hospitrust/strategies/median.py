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
    hospitals : Mapping[int, str]
        Node id -> hospital name (from the query round).
    options : Options or Mapping, optional
        The rule's options (an instance of its ``Options``, or a mapping of field names); its
        defaults when None.
    train_config : Mapping, optional
        Values every hospital gets in its train ConfigRecord (local epochs, lr, ...).
    fraction_train : float
        Share of hospitals asked each round (at least ``min_hospitals``).
    min_hospitals : int
        Fewest valid replies to update the model; fewer keeps the previous one.
    limits : ReplyLimits, optional
        Bounds of the reply validation.
    seed : int
        Seeds hospital sampling.
    device : torch.device or str
        Where the aggregation math runs.
    """

    name = "median"
    agr_tailored = "distance"

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        return Aggregate(coordinate_median(updates), torch.full((n,), 1.0 / n), torch.ones(n, dtype=torch.bool))

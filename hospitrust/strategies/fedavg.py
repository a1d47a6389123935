"""FedAvg (McMahan et al. 2017): the example-weighted mean of the updates."""

from __future__ import annotations

import torch

from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FedAvg(HospitrustStrategy):
    """``Δ = Σ_i n_i u_i / Σ_i n_i``: every valid reply counts, in proportion to its examples.

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

    name = "fedavg"
    weighted_mean = True
    central_dp_compatible = True
    weighs_hospitals = False
    secagg_compatible = True

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        # example_weights: the round's weights, all ones under central DP (its noise is calibrated for the
        # equal-weight mean of n clipped updates, Δ = Σ_i u_i / n)
        weights = example_weights / example_weights.sum()
        update = weights.to(updates.dtype) @ updates
        return Aggregate(update=update, weights=weights, selected=torch.ones(len(example_weights), dtype=torch.bool))

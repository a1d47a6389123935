"""FedAvg (McMahan et al. 2017): the example-weighted mean of the updates."""

from __future__ import annotations

import torch

from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FedAvg(HospitrustStrategy):
    """``Δ = Σ_i n_i u_i / Σ_i n_i``: every valid reply counts, in proportion to its examples.

    Parameters
    ----------
    hospitals, options, **kwargs
        As every rule takes them (:class:`~hospitrust.strategies.base.HospitrustStrategy`).
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

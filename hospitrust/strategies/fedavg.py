"""FedAvg (McMahan et al. 2017): the example-weighted mean of the updates."""

from __future__ import annotations

import torch

from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FedAvg(HospitrustStrategy):
    """``Δ = Σ_i n_i u_i / Σ_i n_i``: every valid reply counts, in proportion to its examples."""

    name = "fedavg"

    def aggregate_updates(self, server_round, updates, num_examples, replies) -> Aggregate:
        weights = num_examples / num_examples.sum()
        update = weights.to(updates.dtype) @ updates
        return Aggregate(update=update, weights=weights, selected=torch.ones(len(replies), dtype=torch.bool))

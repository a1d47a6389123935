"""Bulyan (El Mhamdi et al., ICML 2018)."""

from __future__ import annotations

import torch

from hospitrust.aggregation import bulyan, bulyan_select, pairwise_sq_distances
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sized import SizedRule


class Bulyan(SizedRule):
    """Recursive Krum selects theta = n - 2f updates, then per coordinate the beta = theta - 2f
    values closest to the median are averaged. Needs n >= 4f + 3.

    Selected hospitals are recorded with the nominal weight 1/theta (the coordinate phase
    trims per coordinate, so a hospital's real share varies by coordinate).

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "bulyan"

    agr_tailored = "selection"

    def required_replies(self) -> int:
        return 4 * self.f + 3

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        chosen = bulyan_select(updates, self.f, distances=pairwise_sq_distances(updates))
        selected = torch.zeros(n, dtype=torch.bool)
        selected[chosen.cpu()] = True
        update = bulyan(updates, self.f)
        return Aggregate(update, selected.double() / selected.sum(), selected)

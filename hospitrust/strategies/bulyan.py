"""Bulyan (El Mhamdi et al., ICML 2018)."""

from __future__ import annotations

import torch

from hospitrust.aggregation import bulyan, bulyan_select, pairwise_sq_distances
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class Bulyan(HospitrustStrategy):
    """Recursive Krum selects theta = n - 2f updates, then per coordinate the beta = theta - 2f
    values closest to the median are averaged. Needs n >= 4f + 3.

    Selected hospitals are recorded with the nominal weight 1/theta (the coordinate phase
    trims per coordinate, so a hospital's real share varies by coordinate).

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

    name = "bulyan"

    sized_for_attackers = True
    agr_tailored = "selection"

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.f = assumed_malicious

    def required_replies(self) -> int:
        return 4 * self.f + 3

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        chosen = bulyan_select(updates, self.f, distances=pairwise_sq_distances(updates))
        selected = torch.zeros(n, dtype=torch.bool)
        selected[chosen.cpu()] = True
        update = bulyan(updates, self.f)
        return Aggregate(update, selected.double() / selected.sum(), selected)

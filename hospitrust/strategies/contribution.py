"""Contribution-weighted aggregation: each hospital weighs in with its clipped positive score.

``Δ = Σ_i w_i u_i`` with ``w_i ∝ max(s_i, 0)``, where ``s_i`` is hospital i's contribution
score (Fair-Private or Everybody-Else, run config ``contribution.score``) accumulated over
the rounds scored so far. Until every hospital in the round has a score, and whenever no
score is positive, it is FedAvg (weights ∝ examples). The scores come from
``hospitrust.contribution`` through ``receive_scores`` after each round; the aggregate is
still a weighted mean, so the next round's contribution scores stay defined. A hospital
whose accumulated score is not positive gets weight 0: it is out of the aggregate and, not
being in it, out of later scoring too (its score is frozen), which is how a label flipper
is shut out. Not available under secure aggregation (the server cannot weight a sum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from pydantic import Field

from hospitrust.contribution.options import ContributionScoringOptions
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class ContributionOptions(Options):
    """The contribution-weighted rule's options: which score the weights come from."""

    score: Literal["fp", "ee", "fp-published", "ee-published"] = Field("fp", description=(
        "The contribution score the weights come from: fp (Fair-Private) or ee (Everybody-Else), hospitrust's "
        "forms; fp-published or ee-published, as the paper describes them; accumulated over the rounds, "
        "clipped at 0. Needs contribution-scoring.enabled."
    ))


class ContributionWeighted(HospitrustStrategy):
    """Each hospital weighs in with its accumulated contribution score, clipped at 0 (FedAvg until every hospital has one).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **common
        The base's other keyword arguments.
    """

    name = "contribution"
    reads_who_sent = True  # scores per hospital
    Options = ContributionOptions
    options: ContributionOptions
    state_attrs = ("scores",)  # checkpointed: the accumulated scores the weights come from
    weighted_mean = True  # the aggregate stays a weighted mean: the next round's scores stay defined

    @classmethod
    def check_run_config(cls, cfg) -> None:
        if not cfg.section(ContributionScoringOptions).enabled:
            raise ValueError("strategy 'contribution' weights hospitals by their scores: set "
                             "contribution-scoring.enabled = true")

    def __init__(self, hospitals, options=None, **common) -> None:
        super().__init__(hospitals, options, **common)
        self.scores: dict[str, float] = {}

    def receive_scores(self, totals: Mapping[str, Mapping[str, float]]) -> None:
        """Accumulated scores per hospital (``ContributionLedger.totals()``), the weights' source."""
        self.scores = {h: float(v[self.options.score]) for h, v in totals.items()}

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        names = list(context.hospitals)
        fedavg = example_weights / example_weights.sum()
        raw = torch.tensor([max(self.scores.get(h, float("nan")), 0.0) if h in self.scores else float("nan") for h in names],
                           dtype=torch.float64, device=example_weights.device)
        if torch.isnan(raw).any() or float(raw.sum()) <= 0.0:
            weights, mode = fedavg, "fedavg"
        else:
            weights, mode = raw / raw.sum(), self.options.score
        update = weights.to(updates.dtype) @ updates
        return Aggregate(
            update=update,
            weights=weights,
            selected=weights > 0,
            extra={"contribution_weighting": [mode] * len(example_weights),
                   "accumulated_score": [self.scores.get(h, float("nan")) for h in names]},
        )

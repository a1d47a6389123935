"""Contribution scoring as a round feature: each hospital in the aggregate is told its weight with
the evaluate message and reports the scalars of its contribution; the server scores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Message

from hospitrust.contribution.federation import ContributionTracker
from hospitrust.contribution.options import SECTION, ContributionScoringOptions
from hospitrust.features.base import Round, RoundFeature, RunFacts


class ContributionScoring(RoundFeature):
    """The ``contribution-scoring`` section (enabled).

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name.
    """

    name = "contribution"
    overlaps_rounds = False  # it asks with the evaluation, which needs the round's aggregate first
    order = 40
    section, Options, doc = SECTION, ContributionScoringOptions, "rules/contribution.md"

    @classmethod
    def for_run(cls, run: RunFacts) -> ContributionScoring | None:
        return cls(run.hospitals) if run.cfg.section(ContributionScoringOptions).enabled else None

    def __init__(self, hospitals: Mapping[int, str]) -> None:
        self.tracker = ContributionTracker(hospitals)

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        self.tracker.restore(checkpoint["history"])  # a resumed run keeps its earlier rounds' scores

    def on_evaluate(self, rnd: Round, messages: list[Message]) -> list[Message]:
        assert rnd.result is not None
        return self.tracker.ask(rnd.number, rnd.result, messages)

    def record(self, rnd: Round) -> dict[str, Any]:
        return {"contribution": self.tracker.score(rnd.number, rnd.evaluate_replies)}

    def scores(self) -> dict[str, dict[str, float]]:
        """The accumulated scores (a rule weighted by them, ``contribution``, takes them)."""
        return self.tracker.totals()

    def summary(self) -> dict[str, Any]:
        return {"contribution": self.tracker.summary()}

    def finish(self, run_dir: Path) -> None:
        self.tracker.write(run_dir)


__all__ = ["ContributionScoring"]

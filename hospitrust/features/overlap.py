"""Overlapping rounds as a round feature: on a grid that takes pushes (a deployed or the in-process
grid) the next round's train messages go out with this round's evaluation (one idle SuperNode
poll a round instead of two).
"""

from __future__ import annotations

from hospitrust.features.base import AheadSender, Round, RoundFeature, RunFacts


class OverlappingRounds(RoundFeature):
    """Sends round r + 1's train messages once round r's evaluate messages are out, when every
    feature of the run allows it (``overlaps_rounds``: not SecAgg+, contribution scoring, central DP).

    Parameters
    ----------
    num_rounds : int
        The run's last round (nothing is sent ahead of it).
    """

    name = "overlapping-rounds"
    order = 1000  # last: the next round starts after every other feature saw this one's evaluation go out

    def __init__(self, num_rounds: int) -> None:
        self.num_rounds = num_rounds

    @classmethod
    def for_run(cls, run: RunFacts) -> OverlappingRounds | None:
        return cls(run.cfg.num_server_rounds) if run.grid_takes_pushes else None

    def while_evaluating(self, rnd: Round, loop: AheadSender) -> None:
        if rnd.number < self.num_rounds and loop.overlaps_rounds():
            loop.send_ahead(rnd.number + 1)


__all__ = ["OverlappingRounds"]

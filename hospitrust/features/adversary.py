"""The simulated colluding adversary as a round feature (simulation only): before the rule sees the
stacked updates, the malicious hospitals' rows are replaced by what the colluding attack crafts
from the honest rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from hospitrust.attacks.threat_model import ColludingAdversary
from hospitrust.attacks.interfaces import ColludingAttack
from hospitrust.features.base import Round, RoundFeature, RunFacts
from hospitrust.strategies.base import UpdateStep


class SimulatedAdversary(RoundFeature):
    """A colluding attack's server-side step, applied to the update stack of every round.

    Parameters
    ----------
    adversary : ColludingAdversary
        The attack with the malicious hospitals and the seed.
    """

    name = "simulated-adversary"
    order = 20

    @classmethod
    def for_run(cls, run: RunFacts) -> SimulatedAdversary | None:
        if not isinstance(run.attack, ColludingAttack):
            return None
        return cls(ColludingAdversary(run.attack, {h for h, bad in run.truth.items() if bad}, run.cfg.seed))

    def __init__(self, adversary: ColludingAdversary) -> None:
        self.adversary = adversary

    def update_steps(self, rnd: Round) -> Sequence[UpdateStep]:
        return (self.adversary,)


__all__ = ["SimulatedAdversary"]

"""DnC, divide and conquer (Shejwalkar & Houmansadr, NDSS 2021)."""

from __future__ import annotations

from pydantic import Field

from hospitrust.aggregation import dnc
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sized import SizedRule


class DnCOptions(Options):
    """DnC's options: the coordinate subsets and the filtering fraction."""

    sub_dim: int = Field(10_000, ge=1, description=(
        "b, the random coordinates each iteration scores on (all of them when b >= d; Blades' 10000)."
    ))
    iterations: int = Field(1, ge=1, le=100, description=(
        "Iterations, each on fresh coordinates; a hospital is kept only when every iteration keeps it."
    ))
    filter_fraction: float = Field(1.0, ge=0.0, description=(
        "c: each iteration removes the floor(c x f) highest outlier scores (f = assumed-malicious)."
    ))


class DnC(SizedRule):
    """On ``dnc.sub-dim`` random coordinates, every update is scored by its squared projection on the
    top singular direction of the centred updates; the floor(c f) highest are removed; over
    ``dnc.iterations`` the kept sets are intersected and the kept updates averaged (Shejwalkar &
    Houmansadr, "Manipulating the Byzantine", NDSS 2021, Algorithm 2). f is ``assumed-malicious``;
    it needs more than floor(c f) valid replies.

    The coordinates are drawn from a generator seeded by the run seed and the round, so a run (and a
    resumed run) is reproducible.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "dnc"
    Options = DnCOptions
    options: DnCOptions

    def required_replies(self) -> int:
        return int(self.options.filter_fraction * self.f) + 1

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        o = self.options
        update, rec = dnc(updates, self.f, sub_dim=o.sub_dim, iters=o.iterations, filter_frac=o.filter_fraction,
                          generator=self.round_generator(context.server_round))
        return Aggregate(update, rec.weights, rec.selected,
                         extra={"outlier_score": [float(v) for v in rec.detail["scores"]]})

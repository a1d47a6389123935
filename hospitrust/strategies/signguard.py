"""SignGuard (Xu, Huang, Wang, Lin & Wu, ICDCS 2022): a norm filter and sign-statistics clustering."""

from __future__ import annotations

from pydantic import Field

from hospitrust.aggregation import signguard
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class SignGuardOptions(Options):
    """SignGuard's options: the norm band, the sampled coordinates, the clustering bandwidth."""

    lower: float = Field(0.1, ge=0.0, le=1.0, description=(
        "L: an update whose norm is below L x the median norm is left out (the paper's 0.1)."
    ))
    upper: float = Field(3.0, ge=1.0, description=(
        "R: an update whose norm is above R x the median norm is left out (the paper's 3.0)."
    ))
    coordinate_fraction: float = Field(0.1, gt=0.0, le=1.0, description=(
        "The share of the coordinates, drawn at random each round, whose signs are counted."
    ))
    bandwidth_quantile: float = Field(0.5, gt=0.0, le=1.0, description=(
        "The quantile of scikit-learn's estimate_bandwidth that sets the mean-shift bandwidth."
    ))


class SignGuard(HospitrustStrategy):
    """An update is kept when its norm is within [L, R] x the median norm and its sign statistics
    (shares of positive, zero and negative entries on a random share of the coordinates) fall in
    the largest mean-shift cluster; the kept updates, clipped to the median norm, are averaged (Xu,
    Huang, Wang, Lin & Wu, "SignGuard", ICDCS 2022, the plain variant).

    The coordinates are drawn from a generator seeded by the run seed and the round, so a run (and a
    resumed run) is reproducible.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "signguard"
    Options = SignGuardOptions
    options: SignGuardOptions

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        o = self.options
        update, rec = signguard(updates, lower=o.lower, upper=o.upper, coordinate_fraction=o.coordinate_fraction,
                                bandwidth_quantile=o.bandwidth_quantile, generator=self.round_generator(context.server_round))
        d = rec.detail
        return Aggregate(update, rec.weights, rec.selected, extra={
            "norm_ratio": [float(v) for v in d["norm_ratio"]],
            "norm_ok": [bool(v) for v in d["norm_ok"]],
            "sign_shares": [[float(p) for p in row] for row in d["features"]],
            "sign_cluster": [int(v) for v in d["labels"]],
            "in_largest_sign_cluster": [bool(v) for v in d["sign_cluster"]],
            "clip_factor": [float(v) for v in d["clip_factors"]],
        })

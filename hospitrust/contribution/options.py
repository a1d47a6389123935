"""Contribution scoring's options (the ``contribution-scoring`` section) and the checks that tie
it to the rest of the run config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from hospitrust.options import Options

#: The run-config section of contribution scoring (the round feature ``hospitrust.features.contribution``).
SECTION = "contribution-scoring"


def selfish_ids(value: str) -> list[int]:
    """``'0,3'`` -> [0, 3]: the partition ids of simulated selfish hospitals.

    Parameters
    ----------
    value : str
        ``contribution-scoring.selfish-hospitals``: comma-separated partition ids.

    Returns
    -------
    list[int]
        The ids, in the given order.
    """
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"contribution-scoring.selfish-hospitals must be partition ids like '0' or '0,3', got {value!r}")
        ids.append(int(part))
    return ids


class ContributionScoringOptions(Options):
    """Score each hospital's contribution every round (LOO, IOI, Fair-Private, Everybody-Else,
    COS) from scalars the hospitals compute; works under secure aggregation.
    """

    enabled: bool = Field(False, description=(
        "Score each hospital's contribution every round from scalars the hospitals compute; needs a "
        "weighted-mean strategy (fedavg, fedprox, contribution)."
    ))
    utility: Literal["balanced-accuracy", "neg-loss"] = Field("balanced-accuracy", description=(
        "The utility v on each hospital's validation set: balanced-accuracy or neg-loss (minus "
        "cross-entropy)."
    ))
    selfish_hospitals: str = Field("", description=(
        "Simulation: partition ids (e.g. '0' or '0,3') of selfish hospitals that inflate the evaluations they"
        " report."
    ))
    selfish_inflation: float = Field(0.05, ge=0.0, le=1.0, description=(
        "Simulation: how much a selfish hospital inflates its reported LOO and IOI (utility units)."
    ))

    @field_validator("selfish_hospitals")
    @classmethod
    def _ids(cls, v: str) -> str:
        selfish_ids(v)
        return v


def check_contribution_settings(rule: Any, scoring: ContributionScoringOptions, secure: bool, fraction_train: float,
                                attack_kind: str | None, *, weighted_mean_rules: Sequence[str] = ()) -> None:
    """Raises ValueError naming the keys when contribution scoring or secure aggregation cannot
    work with the rest of the run config.

    Parameters
    ----------
    rule : type
        The run's rule (a ``HospitrustStrategy`` class): its ``name`` and what it can do, ``weighted_mean``
        and ``secagg_compatible``.
    scoring : ContributionScoringOptions
        The ``contribution-scoring`` section.
    secure : bool
        Whether secure aggregation is on (``secagg.enabled``).
    fraction_train : float
        The run's ``fraction-train``.
    attack_kind : str or None
        The configured attack's kind (``"data"``, ``"update"``, ``"colluding"``), or None without one.
    weighted_mean_rules : Sequence[str]
        The rules that are weighted means (named in the message when ``rule`` is not one).
    """
    if scoring.enabled and not rule.weighted_mean:
        raise ValueError(
            f"contribution-scoring.enabled needs a weighted-mean strategy ({', '.join(weighted_mean_rules)}); "
            f"strategy {rule.name!r} has no leave-one-out model M - U_i"
        )
    if secure:
        if not rule.secagg_compatible:
            raise ValueError(
                f"secagg.enabled hands the server only the sum of the updates: strategy must be 'fedavg' (the "
                f"example-weighted mean of that sum), got {rule.name!r}"
            )
        if fraction_train < 1.0:
            raise ValueError("secagg.enabled asks every hospital each round: fraction-train must be 1.0")
        if attack_kind == "colluding":
            raise ValueError("a colluding attack rewrites the stacked updates on the server, which secure aggregation "
                             "never holds: choose a data or update attack")


"""The narrow interface between a federation and contribution scoring.

Scoring sees a ``SecureRoundView`` and nothing else: the aggregate-level scalars the server
holds even under secure aggregation (the round, the hospitals in the sum and their total
weight, the server's own evaluation of M and M0 if it has one) and, per hospital, the
scalars that hospital computed on models it can build itself (``HospitalReport``). Every
field is a plain ``str``/``int``/``float``/``bool``: there is no slot where an update or a
model could be passed, and the constructors reject anything that is not a finite scalar.
``tests/test_contribution_interface.py`` checks this and that the scoring module reads
nothing else.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from hospitrust.contribution.scores import (
    everybody_else,
    everybody_else_published,
    fair_private,
    fair_private_published,
    include_one_in,
    leave_one_out,
)

# fp / ee: hospitrust's forms; fp-published / ee-published: as the paper describes them
SCORES = ("loo", "ioi", "fp", "ee", "cos", "fp-published", "ee-published")
# on the wire: the evaluate config key telling a hospital its weight, and the reply's metric keys
WEIGHT_KEY = "contribution-weight"
REPORT_KEYS = {
    "v_new": "contribution-v-new",
    "v_previous": "contribution-v-previous",
    "v_without_self": "contribution-v-without-self",
    "v_self_only": "contribution-v-self-only",
    "cosine": "contribution-cosine",
    "weight": WEIGHT_KEY,
}


def _scalar(owner: str, name: str, value: Any, kind: type) -> Any:
    if kind is str:
        if not isinstance(value, str) or not value:
            raise TypeError(f"{owner}.{name} must be a non-empty str, got {type(value).__name__}")
        return value
    if isinstance(value, bool) and kind is not bool:
        raise TypeError(f"{owner}.{name} must be a {kind.__name__}, got bool")
    if not isinstance(value, (int, float, np.integer, np.floating)) or (
        isinstance(value, np.ndarray)
    ):
        raise TypeError(f"{owner}.{name} must be a scalar {kind.__name__}, got {type(value).__name__}")
    out = kind(value)
    if kind is float and not math.isfinite(out):
        raise ValueError(f"{owner}.{name} must be finite, got {value}")
    return out


@dataclass(frozen=True)
class HospitalReport:
    """What hospital i tells the server after round t: evaluations on its own validation set.

    v_new           v_i(M): the new global model.
    v_previous      v_i(M0): the model the round started from.
    v_without_self  v_i(M - U_i): the aggregate with i's own update left out, re-weighted.
    v_self_only     v_i(M0 + U_i): the round's start plus i's own update only.
    cosine          cos(U_i, M - M0), the COS baseline.
    weight          i's aggregation weight (as the server told it).

    Parameters
    ----------
    hospital : str
        The hospital's name.
    v_new : float
        v_i(M).
    v_previous : float
        v_i(M0).
    v_without_self : float
        v_i(M - U_i).
    v_self_only : float
        v_i(M0 + U_i).
    cosine : float
        cos(U_i, M - M0), in [-1, 1].
    weight : float
        i's aggregation weight, in (0, 1].
    """

    hospital: str
    v_new: float
    v_previous: float
    v_without_self: float
    v_self_only: float
    cosine: float
    weight: float

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = str if f.name == "hospital" else float
            object.__setattr__(self, f.name, _scalar("HospitalReport", f.name, getattr(self, f.name), kind))
        if not -1.0 - 1e-9 <= self.cosine <= 1.0 + 1e-9:
            raise ValueError(f"HospitalReport.cosine must be in [-1, 1], got {self.cosine}")
        if not 0.0 < self.weight <= 1.0 + 1e-9:
            raise ValueError(f"HospitalReport.weight must be in (0, 1], got {self.weight}")


@dataclass(frozen=True)
class SecureRoundView:
    """All scoring may read about a round (aggregates and reported scalars, no updates).

    Parameters
    ----------
    round : int
        The 1-based server round.
    total_weight : float
        Total aggregation weight of the hospitals in the sum.
    reports : tuple[HospitalReport, ...]
        One report per hospital in the sum (each hospital once).
    server_v_new : float
        The server's own v(M) on its reference cohort; NaN if it has none.
    server_v_previous : float
        The server's own v(M0); NaN if it has none.
    """

    round: int
    total_weight: float
    reports: tuple[HospitalReport, ...]
    server_v_new: float = float("nan")  # the server's own v(M) on its reference cohort, if any
    server_v_previous: float = float("nan")

    def __post_init__(self) -> None:
        object.__setattr__(self, "round", _scalar("SecureRoundView", "round", self.round, int))
        object.__setattr__(self, "total_weight", _scalar("SecureRoundView", "total_weight", self.total_weight, float))
        for name in ("server_v_new", "server_v_previous"):
            v = getattr(self, name)
            if not isinstance(v, (int, float, np.floating)) or isinstance(v, bool):
                raise TypeError(f"SecureRoundView.{name} must be a float, got {type(v).__name__}")
            object.__setattr__(self, name, float(v))
        reports = tuple(self.reports)
        if not all(isinstance(r, HospitalReport) for r in reports):
            raise TypeError("SecureRoundView.reports must be HospitalReport objects")
        names = [r.hospital for r in reports]
        if len(set(names)) != len(names):
            raise ValueError(f"SecureRoundView.reports names a hospital twice: {sorted(names)}")
        object.__setattr__(self, "reports", reports)

    @property
    def hospitals(self) -> list[str]:
        return [r.hospital for r in self.reports]


@dataclass
class RoundScores:
    """One round's scores: LOO, IOI, FP, EE and COS of every hospital scored, and the round's gain.

    Parameters
    ----------
    round : int
        The 1-based server round.
    hospitals : list[str]
        The hospitals scored, in report order.
    scores : dict[str, list[float]]
        Score name (``SCORES``) -> one value per hospital, in the same order.
    total_gain : float
        The round's gain v(M) - v(M0), averaged over the evaluating hospitals.
    """

    round: int
    hospitals: list[str]
    scores: dict[str, list[float]]  # score name -> per hospital (same order)
    total_gain: float

    def by_hospital(self) -> dict[str, dict[str, float]]:
        return {h: {s: self.scores[s][k] for s in self.scores} for k, h in enumerate(self.hospitals)}

    def to_record(self) -> dict[str, Any]:
        return {"round": self.round, "total_gain": self.total_gain, "hospitals": self.by_hospital()}


def score_round(view: SecureRoundView, *, published_loo_weight: float = 0.5) -> RoundScores:
    """LOO, IOI, FP, EE, COS and the published FP and EE of every hospital in the round, from the view only.

    Parameters
    ----------
    view : SecureRoundView
        The round as scoring may see it.
    published_loo_weight : float
        The weight of LOO against IOI in the published FP and EE
        (``contribution-scoring.published-loo-weight``).

    Returns
    -------
    RoundScores
        The round's scores.
    """
    if not isinstance(view, SecureRoundView):
        raise TypeError(f"score_round takes a SecureRoundView, got {type(view).__name__}")
    reps = view.reports
    if not reps:
        return RoundScores(view.round, [], {s: [] for s in SCORES}, 0.0)
    v_new = np.array([r.v_new for r in reps])
    v_prev = np.array([r.v_previous for r in reps])
    loo = leave_one_out(v_new, [r.v_without_self for r in reps])
    ioi = include_one_in([r.v_self_only for r in reps], v_prev)
    gains = v_new - v_prev
    total_gain = float(gains.mean())  # the round's gain, averaged over the evaluators
    fp = fair_private(loo, ioi, total_gain)
    ee = everybody_else(loo, ioi, gains) if len(reps) >= 2 else np.full(len(reps), np.nan)
    cos = np.array([r.cosine for r in reps])
    fp_pub = fair_private_published(loo, ioi, total_gain, published_loo_weight)
    ee_pub = (everybody_else_published(loo, ioi, gains, published_loo_weight) if len(reps) >= 2
              else np.full(len(reps), np.nan))
    scores = {"loo": loo, "ioi": ioi, "fp": fp, "ee": ee, "cos": cos, "fp-published": fp_pub, "ee-published": ee_pub}
    return RoundScores(view.round, view.hospitals, {k: [float(x) for x in v] for k, v in scores.items()}, total_gain)


@dataclass
class ContributionLedger:
    """Scores accumulated over the run, per hospital: what a consortium could pay out on.

    Parameters
    ----------
    rounds : list[RoundScores]
        The rounds scored so far, in order.
    """

    rounds: list[RoundScores] = field(default_factory=list)

    def add(self, scores: RoundScores) -> None:
        self.rounds.append(scores)

    def totals(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for rs in self.rounds:
            for h, vals in rs.by_hospital().items():
                acc = out.setdefault(h, {s: 0.0 for s in SCORES} | {"rounds": 0})
                for s, v in vals.items():
                    if math.isfinite(v):
                        acc[s] += v
                acc["rounds"] += 1
        return dict(sorted(out.items()))

    def payout_shares(self, score: str = "fp") -> dict[str, float]:
        """Each hospital's share of a reward pool: its clipped positive accumulated score, normalized."""
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; allowed: {', '.join(SCORES)}")
        tot = {h: max(v[score], 0.0) for h, v in self.totals().items()}
        s = sum(tot.values())
        return {h: (v / s if s > 0 else 0.0) for h, v in tot.items()}

    def rows(self) -> list[dict[str, Any]]:
        shares = {s: self.payout_shares(s) for s in ("fp", "ee")}
        return [
            {"hospital": h, "rounds": int(v["rounds"]), **{s: v[s] for s in SCORES},
             "payout_share_fp": shares["fp"][h], "payout_share_ee": shares["ee"][h]}
            for h, v in self.totals().items()
        ]

    def write(self, folder: str | Path) -> tuple[Path, Path]:
        """contribution_ledger.csv (one row per hospital) and contribution_ledger.json (plus per round)."""
        folder = Path(folder)
        rows = self.rows()
        csv_path, json_path = folder / "contribution_ledger.csv", folder / "contribution_ledger.json"
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["hospital", "rounds", *SCORES, "payout_share_fp", "payout_share_ee"])
            writer.writeheader()
            writer.writerows(rows)
        json_path.write_text(json.dumps({"totals": rows, "rounds": [r.to_record() for r in self.rounds]}, indent=2,
                                        allow_nan=True))
        return csv_path, json_path

"""The simulation's ground truth as a round feature: which hospitals are malicious, and how well
the rule found them (per round in rounds.jsonl, pooled over the run in summary.json).

A hospital is *flagged* in a round when its reply was rejected or the rule left it out of
the aggregate (``selected`` false), or when the rule itself says so (a ``flagged`` entry:
trust rules flag the hospitals they down-weight). Smaller weights alone do not count: FedAvg
gives a small hospital a small weight without suspecting it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hospitrust.attacks.metrics import detection_rates, rounds_to_detection
from hospitrust.features.base import Round, RoundFeature, RunFacts
from hospitrust.records import HospitalRecord


def flagged_hospitals(clients: Sequence[HospitalRecord]) -> dict[str, bool]:
    """Hospital name -> flagged this round (rejected, left out, or ``flagged`` by the rule).

    Parameters
    ----------
    clients : Sequence[HospitalRecord]
        The round's hospital records.

    Returns
    -------
    dict[str, bool]
        Hospital -> flagged; the rule's own ``flagged`` where it gives one.
    """
    return {c.hospital: c.flagged if c.flagged is not None else (c.rejected or not c.selected) for c in clients}


def rare_class_holders(rows: Sequence[Mapping[str, Any]]) -> tuple[int | None, set[str]]:
    """The rarest class in the federation's training data, and the hospitals holding at least
    an equal share of it (total / hospitals): the specialists a robust rule must not exclude.
    """
    if not rows or not rows[0].get("train"):
        return None, set()
    counts = np.array([r["train"] for r in rows], dtype=float)
    totals = counts.sum(axis=0)
    present = np.flatnonzero(totals > 0)
    if present.size == 0:
        return None, set()
    rare = int(present[np.argmin(totals[present])])
    fair = totals[rare] / len(rows)
    return rare, {r["hospital"] for r, c in zip(rows, counts[:, rare]) if c > 0 and c >= fair}


def round_detection(flags: Mapping[str, bool], truth: Mapping[str, bool]) -> dict[str, Any]:
    """The round's detection rates of the flags against the ground truth (the hospitals in ``flags``)."""
    population = {h: truth.get(h, False) for h in flags}
    return detection_rates(flags, population)


def run_security(
    flags_per_round: Sequence[Mapping[str, bool]],
    truth: Mapping[str, bool],
    rare_holders: set[str],
) -> dict[str, Any]:
    """Whole-run detection (all hospital-rounds pooled), rounds to detection, and how often an
    honest rare-class holder was flagged.
    """
    tp = fp = fn = tn = 0
    for flags in flags_per_round:
        r = round_detection(flags, truth)
        tp, fp, fn, tn = tp + r["tp"], fp + r["fp"], fn + r["fn"], tn + r["tn"]
    honest_rare = sorted(h for h in rare_holders if not truth.get(h, False))
    rare_flags = sum(1 for flags in flags_per_round for h in honest_rare if flags.get(h, False))
    rare_rounds = sum(1 for flags in flags_per_round for h in honest_rare if h in flags)
    nan = float("nan")
    return {
        "tpr": tp / (tp + fn) if tp + fn else nan,
        "fpr": fp / (fp + tn) if fp + tn else nan,
        "precision": tp / (tp + fp) if tp + fp else nan,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "rounds_to_detection": rounds_to_detection(list(flags_per_round), dict(truth)),
        "honest_rare_class_holders": honest_rare,
        "honest_rare_class_flagged": rare_flags,
        "honest_rare_class_flag_rate": rare_flags / rare_rounds if rare_rounds else nan,
    }


class Detection(RoundFeature):
    """Marks each hospital record ``malicious`` (the ground truth), records the round's detection and,
    at the end, the run's (``security``). Every run has it; with no attack everybody is honest.

    Parameters
    ----------
    truth : Mapping[str, bool]
        Hospital name -> malicious.
    rare_holders : set[str]
        The hospitals holding at least an equal share of the rarest class.
    """

    name = "detection"
    order = 10

    @classmethod
    def for_run(cls, run: RunFacts) -> Detection:
        return cls(run.truth, rare_class_holders(run.rows)[1])

    def __init__(self, truth: Mapping[str, bool], rare_holders: set[str]) -> None:
        self.truth, self.rare_holders = dict(truth), set(rare_holders)
        self.flags_per_round: list[dict[str, bool]] = []

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        saved = checkpoint.get("features", {}).get(self.name)
        # a checkpoint of an earlier hospitrust kept the flags at its top level
        self.flags_per_round = list(saved["flags_per_round"] if saved else checkpoint.get("flags_per_round", []))

    def record(self, rnd: Round) -> dict[str, Any]:
        assert rnd.result is not None
        for c in rnd.result.clients:
            c.malicious = self.truth.get(c.hospital, False)
        flags = flagged_hospitals(rnd.result.clients)
        self.flags_per_round.append(flags)
        return {"detection": round_detection(flags, self.truth)}

    def state(self) -> dict[str, Any]:
        return {"flags_per_round": list(self.flags_per_round)}

    def summary(self) -> dict[str, Any]:
        return {"malicious_hospitals": sorted(h for h, bad in self.truth.items() if bad),
                "security": run_security(self.flags_per_round, self.truth, self.rare_holders)}


__all__ = ["Detection", "flagged_hospitals", "rare_class_holders", "round_detection", "run_security"]

"""Per-round and per-run records: participation, near-duplicates, the summary head, and the
security bookkeeping (which hospitals a rule flagged, against the ground truth).

A hospital is *flagged* in a round when its reply was rejected or the rule left it out of
the aggregate (``selected`` false), or when the rule itself says so (a ``flagged`` entry:
trust rules flag the hospitals they down-weight). Smaller weights alone do not count: FedAvg
gives a small hospital a small weight without suspecting it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.common import log

from hospitrust.attacks.metrics import detection_rates, rounds_to_detection
from hospitrust.config import RunConfig
from hospitrust.server_app.discovery import format_class_counts
from hospitrust.server_app.results import RunDirectory
from hospitrust.server_app.server_data import ServerSets
from hospitrust.tasks.task import Task

def flagged_hospitals(clients: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    return {
        c["hospital"]: bool(c["flagged"]) if "flagged" in c else bool(c.get("rejected") or not c.get("selected", True))
        for c in clients
    }


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


def participation(history: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per hospital, over the run's rounds: asked, answered with a valid update, rejected, asked
    but silent (missing), listed offline at the SuperLink (not asked), and, only where it
    happened, refused because its own privacy budget was spent (``budget_spent``).
    """
    out: dict[str, dict[str, int]] = {}

    def row(name: str) -> dict[str, int]:
        return out.setdefault(name, {"asked": 0, "valid": 0, "rejected": 0, "missing": 0, "offline": 0})

    for rec in history:
        for b in rec.get("budget_spent", []):  # asked, refused: its own privacy budget (counted only when it happens)
            r = row(b["hospital"])
            r["asked"] += 1
            r["budget_spent"] = r.get("budget_spent", 0) + 1
        for c in rec["clients"]:
            r = row(c["hospital"])
            r["asked"] += 1
            r["rejected" if c.get("rejected") else "valid"] += 1
        for name in rec.get("missing", []):
            row(name)["asked"] += 1
            row(name)["missing"] += 1
        for name in rec.get("offline", []):
            row(name)["offline"] += 1
    return dict(sorted(out.items()))


def absences(parts: dict[str, dict[str, int]], rounds: int) -> str:
    """One line per hospital that missed rounds, for the end-of-run log ('' if none did)."""
    lines = [f"{name}: valid in {p['valid']} of {rounds} rounds ({p['rejected']} rejected, {p['missing']} silent, "
             f"{p['offline']} offline" + (", its privacy budget spent" if p.get("budget_spent") else "") + ")"
             for name, p in parts.items() if p["valid"] < rounds]
    return "\n".join(lines)


def near_duplicates(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per hospital whose update a rule counted together with another's (HTA's
    ``duplicates_of``): in how many rounds, and with whom. Empty when none was.
    """
    out: dict[str, dict[str, Any]] = {}
    for rec in history:
        for c in rec["clients"]:
            if others := c.get("duplicates_of"):
                entry = out.setdefault(c["hospital"], {"rounds": 0, "with": set()})
                entry["rounds"] += 1
                entry["with"].update(others)
    return {name: {"rounds": e["rounds"], "with": sorted(e["with"])} for name, e in sorted(out.items())}


def summary_head(cfg: RunConfig, history: list[dict[str, Any]], num_hospitals: int, run_dir: RunDirectory,
                 started: float) -> dict[str, Any]:
    """The summary.json fields every run has (the final and best round, what ran, where)."""
    best = max(history, key=lambda r: (r["central"]["balanced_accuracy"], -r["round"]))
    return {
        "final": history[-1]["central"],
        "best_round": best["round"],
        "best": best["central"],
        "rounds": len(history),
        "wall_seconds": time.time() - started,
        "dataset": "" if cfg.task.custom else cfg.dataset,  # a task of the consortium's own has none
        "strategy": cfg.strategy,
        "model": cfg.model,
        "hospitals": num_hospitals,
        "run_dir": str(run_dir.path),
        "attack": cfg.attack,
        "participation": participation(history),
        "near_duplicates": near_duplicates(history),
    }


class FederationFailure(RuntimeError):
    """Every hospital's ClientApp failed: a broken app or setup, not one bad hospital."""


def fail_if_every_hospital_crashed(rnd: int, clients: list[dict[str, Any]], asked: int) -> None:
    crashed = [c for c in clients if c.get("rejected") and str(c.get("reason", "")).startswith("error reply")]
    if asked and len(crashed) == asked:
        raise FederationFailure(
            f"round {rnd}: the ClientApp failed at every hospital ({asked}); first error: {crashed[0]['reason']}"
        )


def log_hospitals(hospitals: Mapping[int, str], rows: list[dict[str, Any]], failed: list[dict[str, Any]], cfg: RunConfig,
                  task: Task) -> None:
    """The query round's result: who joined with what (and the partitioner, for simulated hospitals only)."""
    simulated = sum(1 for r in rows if r["partition_id"] >= 0)
    how = (f", {simulated} simulated (partitioner {cfg.partitioner})" if simulated else "")
    log(INFO, "hospitrust: %d hospitals, task %s%s\n%s", len(hospitals), task.name, how,
        format_class_counts(rows, task.class_names))
    for f in failed:
        log(WARNING, "hospitrust: %s left out: %s", f["hospital"], f["reason"])


def run_record(cfg: RunConfig, task: Task, sets: ServerSets, hospitals: Mapping[int, str], rows: list[dict[str, Any]],
               failed: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """config.json: the run config and what the run found (task, hospitals, their data, the server's sets)."""
    return {
        **cfg.to_flat(),
        "data-dir-resolved": str(cfg.resolved_data_dir() or ""),
        "hospitals": {str(nid): name for nid, name in hospitals.items()},
        # simulated hospitals (partition ids): the run knows which are attackers, so the console
        # can tell an honest hospital flagged from a caught one
        "ground-truth": bool(rows) and all(r["partition_id"] >= 0 for r in rows),
        "class-names": list(task.class_names),
        "task-resolved": json.loads(task.to_json()),
        "hospital-data": {r["hospital"]: {"format": r.get("format", ""), **r.get("card", {})} for r in rows},
        "failed-hospitals": failed,
        "server-device": str(device),
        "test-set": sets.test_source,
        "reference-cohort": sets.cohort_source,
        "reference-cohort-size": len(sets.cohort) if sets.cohort is not None else 0,
        "evaluation": "central" if sets.test is not None else "federated",
    }

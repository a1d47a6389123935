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

import torch
from flwr.common import log

from hospitrust.config import RunConfig
# the security bookkeeping moved to the detection feature; importable from here as before
from hospitrust.features.detection import flagged_hospitals, rare_class_holders, round_detection, run_security  # noqa: F401
from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app.discovery import format_class_counts
from hospitrust.server_app.results import RunDirectory
from hospitrust.datasets.server import ServerSets
from hospitrust.tasks.task import Task

def participation(history: Sequence[RoundRecord]) -> dict[str, dict[str, int]]:
    """Per hospital, over the run's rounds: asked, answered with a valid update, rejected, asked
    but silent (missing), listed offline at the SuperLink (not asked), and, only where it
    happened, refused because its own privacy budget was spent (``budget_spent``).
    """
    out: dict[str, dict[str, int]] = {}

    def row(name: str) -> dict[str, int]:
        return out.setdefault(name, {"asked": 0, "valid": 0, "rejected": 0, "missing": 0, "unresponsive": 0, "offline": 0})

    for rec in history:
        for b in rec.entries.get("budget_spent", []):  # asked, refused: its own privacy budget (counted only when it happens)
            r = row(b["hospital"])
            r["asked"] += 1
            r["budget_spent"] = r.get("budget_spent", 0) + 1
        for c in rec.clients:
            r = row(c.hospital)
            r["asked"] += 1
            r["rejected" if c.rejected else "valid"] += 1
        for name in rec.missing:
            row(name)["asked"] += 1
            row(name)["missing"] += 1
        for name in rec.unresponsive:  # missing, and still online at the SuperLink
            row(name)["unresponsive"] += 1
        for name in rec.offline:
            row(name)["offline"] += 1
    return dict(sorted(out.items()))


def absences(parts: dict[str, dict[str, int]], rounds: int) -> str:
    """One line per hospital that missed rounds, for the end-of-run log ('' if none did)."""
    lines = [f"{name}: valid in {p['valid']} of {rounds} rounds ({p['rejected']} rejected, {p['missing']} silent"
             + (f" ({p['unresponsive']} of them online: unresponsive)" if p.get("unresponsive") else "") + f", "
             f"{p['offline']} offline" + (", its privacy budget spent" if p.get("budget_spent") else "") + ")"
             for name, p in parts.items() if p["valid"] < rounds]
    return "\n".join(lines)


def near_duplicates(history: Sequence[RoundRecord]) -> dict[str, dict[str, Any]]:
    """Per hospital whose update a rule counted together with another's (HTA's
    ``duplicates_of``): in how many rounds, and with whom. Empty when none was.
    """
    out: dict[str, dict[str, Any]] = {}
    for rec in history:
        for c in rec.clients:
            if others := c.signal("duplicates_of"):
                entry = out.setdefault(c.hospital, {"rounds": 0, "with": set()})
                entry["rounds"] += 1
                entry["with"].update(others)
    return {name: {"rounds": e["rounds"], "with": sorted(e["with"])} for name, e in sorted(out.items())}


def summary_head(cfg: RunConfig, history: Sequence[RoundRecord], num_hospitals: int, run_dir: RunDirectory,
                 started: float) -> dict[str, Any]:
    """The summary.json fields every run has (the final and best round, what ran, where)."""
    best = max(history, key=lambda r: (r.central["balanced_accuracy"], -r.number))
    return {
        "final": history[-1].central,
        "best_round": best.number,
        "best": best.central,
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


def fail_if_every_hospital_crashed(rnd: int, clients: list[HospitalRecord], asked: int) -> None:
    crashed = [c for c in clients if c.rejected and c.reason.startswith("error reply")]
    if asked and len(crashed) == asked:
        raise FederationFailure(
            f"round {rnd}: the ClientApp failed at every hospital ({asked}); first error: {crashed[0].reason}"
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
        # each hospital's partition (-1: not simulated) and the federation's partitions: what
        # ``hospitrust unlearn`` reads to find a simulated hospital's training images
        "partitions": {r["hospital"]: r["partition_id"] for r in rows},
        "num-partitions": max([r.get("num_partitions", -1) for r in rows] + [len(rows)]),
        "failed-hospitals": failed,
        "server-device": str(device),
        "test-set": sets.test_source,
        "reference-cohort": sets.cohort_source,
        "reference-cohort-size": len(sets.cohort) if sets.cohort is not None else 0,
        "evaluation": "central" if sets.test is not None else "federated",
    }

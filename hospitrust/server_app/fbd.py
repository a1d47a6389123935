"""The server side of a FED-FBD run (strategy ``fbd``): the round loop around the warehouse.

``server_app.run_federation`` hands over here when the run config says ``strategy = "fbd"``.
The generic loop does not fit: its state is one global model, FED-FBD's is a warehouse of
colors evaluated through routing. What is shared is reused: the query round, the run
directory, the threat model, the results schema.

Run directory additions: ``fbd_plan.json`` (the validated plan), ``fbd_stamps.jsonl``
(append-only stamp log), ``warehouse.pt`` (checkpointed every round), and per round in
``rounds.jsonl`` an ``fbd`` object (schedule, per-color metrics, detection z-scores,
flagged colors, every routing mode).
"""

from __future__ import annotations

import time
from logging import INFO
from typing import Any, cast

import numpy as np

from flwr.app import ConfigRecord, Context
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust import metrics
from hospitrust.config import RunConfig, parse_run_config
from hospitrust.errors import ConfigError
from hospitrust.datasets.server import ServerSets, server_sets
from hospitrust.tasks.task import TASK_KEY, Task, resolve_task
from hospitrust.fbd.plan import ShippingPlan, make_plan, parse_plan
from hospitrust.fbd.routing import (
    ROUTING_MODES, color_losses, color_probabilities, flagged_colors, loss_zscores, parse_color_list, route,
)
from hospitrust.fbd.stamps import STAMP_LOG, StampLog
from hospitrust.fbd.warehouse import Warehouse
from hospitrust.server_app.discovery import discover_hospitals, offline_hospitals
from hospitrust.server_app.records import fail_if_every_hospital_crashed, log_hospitals, round_detection, run_record, summary_head
from hospitrust.server_app.results import RunDirectory, default_run_name
from hospitrust.strategies.fbd import FBD, FBDOptions
from hospitrust.strategies.validation import ReplyLimits
from hospitrust.attacks.threat_model import configured_attack, ground_truth
from hospitrust.models.training import pick_device, seed_everything
from hospitrust.server_app.transport import exchange

PLAN_FILE = "fbd_plan.json"
WAREHOUSE_FILE = "warehouse.pt"


def _fbd_options(cfg: RunConfig) -> FBDOptions:
    """The run's ``fbd`` section (its model is FBD.Options)."""
    return cast(FBDOptions, cfg.options("fbd"))


def plan_from_config(cfg: RunConfig, hospitals: list[str]) -> ShippingPlan:
    """The run's shipping plan: ``fbd.plan`` when given, else a generated one (:func:`make_plan`).

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (its ``fbd`` section and seed).
    hospitals : list[str]
        The hospitals that answered the query round, in schedule order.

    Returns
    -------
    ShippingPlan
        The validated plan.
    """
    fbd = _fbd_options(cfg)
    if fbd.plan.strip():
        return parse_plan(fbd.plan, hospitals, fbd.colors, fbd.redundancy, cfg.seed)
    return make_plan(hospitals, fbd.colors, fbd.redundancy, cfg.seed)


class WarehouseEvaluator:
    """Every color on the test split and the reference cohort; routing; detection.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (the federation's test split and reference cohort, ``fbd``'s routing
        and detection).
    info : Task
        The task (its classes).
    device : torch.device
        Where the colors' models run.
    sets : ServerSets
        The server's test set and reference cohort.
    """

    def __init__(self, cfg: RunConfig, info: Task, device, sets: ServerSets) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        assert sets.test is not None and sets.cohort is not None  # FBD.check_run_config requires both
        self.test, self.cohort = sets.test, sets.cohort
        self.named_exclusions = parse_color_list(_fbd_options(cfg).exclude_colors, _fbd_options(cfg).colors)

    def __call__(self, warehouse: Warehouse) -> tuple[dict[str, Any], dict[str, Any]]:
        k = self.info.num_classes
        probs = color_probabilities(warehouse, self.test.images, device=self.device)
        ref_probs = color_probabilities(warehouse, self.cohort.images, device=self.device)
        # a color that predicts NaN / Inf (a state no check caught) is broken: uniform
        # predictions for its own metrics, infinite reference loss, always left out of routing
        broken = [m for m in range(warehouse.num_colors)
                  if not (np.isfinite(probs[m]).all() and np.isfinite(ref_probs[m]).all())]
        for m in broken:
            probs[m], ref_probs[m] = 1.0 / k, 1.0 / k
        losses = color_losses(ref_probs, self.cohort.labels)
        losses[broken] = np.inf
        finite = np.isfinite(losses)
        z = np.full_like(losses, np.inf)
        z[finite] = loss_zscores(losses[finite])
        finite_idx = np.flatnonzero(finite)
        flagged = sorted({int(finite_idx[i]) for i in flagged_colors(z[finite], _fbd_options(self.cfg).detect_z)} | set(broken))
        exclude = sorted(set(self.named_exclusions) | (set(flagged) if _fbd_options(self.cfg).exclude_flagged else set()))
        if len(exclude) >= warehouse.num_colors:
            exclude = sorted(self.named_exclusions)  # never exclude everything: fall back to the named ones
        exclude = sorted(set(exclude) | set(broken)) if len(broken) < warehouse.num_colors else exclude
        colors = {}
        for m in range(warehouse.num_colors):
            rep = metrics.classification_report(self.test.labels, probs[m], k)
            colors[str(m)] = {"accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"],
                              "reference_loss": float(losses[m]) if finite[m] else None,
                              "z": float(z[m]) if finite[m] else None, "flagged": m in flagged, "broken": m in broken}
        routing = {}
        for mode in ROUTING_MODES:
            for label, ex in ((mode, ()), (f"{mode}-without-excluded", exclude)):
                if label.endswith("excluded") and not ex:
                    continue
                rep = metrics.classification_report(self.test.labels, route(probs, mode, ex), k)
                routing[label] = {"accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"]}
        central = metrics.classification_report(self.test.labels, route(probs, _fbd_options(self.cfg).routing, exclude), k)
        return central, {"colors": colors, "flagged_colors": flagged, "excluded_colors": exclude, "broken_colors": broken,
                         "routing_mode": _fbd_options(self.cfg).routing, "routing": routing}


def run_fbd_federation(grid: Grid, context: Context) -> RunDirectory:
    """A whole FED-FBD run; returns its directory.

    Parameters
    ----------
    grid : Grid
        Flower's grid (the hospitals' SuperNodes).
    context : Context
        The ServerApp's context (the run config).

    Returns
    -------
    RunDirectory
        The run directory written.
    """
    started = time.time()
    cfg = parse_run_config(context.run_config)
    task = info = resolve_task(cfg)
    if not task.default_normalization or task.augmentation:
        raise ConfigError(f"strategy fbd trains with the default normalization and no augmentation; task {task.name} "
                          "sets mean/std or augmentation")
    log(INFO, "hospitrust: %s", task.describe())
    sets = server_sets(cfg.server_data, task, cfg.federation, cfg.task.custom)
    log(INFO, "hospitrust: test set: %s; reference cohort: %s", sets.test_source, sets.cohort_source)
    seed_everything(cfg.seed)
    device = pick_device()
    run_dir = RunDirectory.create(cfg.output_dir, cfg.run_name or default_run_name(task.name, cfg.strategy))
    log(INFO, "hospitrust: run directory %s", run_dir.path)

    failed: list[dict[str, Any]] = []
    hospitals, rows = discover_hospitals(grid, cfg, task, failed)
    log_hospitals(hospitals, rows, failed, cfg, task)
    run_dir.write_class_counts(info.class_names, rows)
    plan = plan_from_config(cfg, [r["hospital"] for r in rows])
    plan.save(run_dir.path / PLAN_FILE)
    run_dir.write_config({
        **run_record(cfg, task, sets, hospitals, rows, failed, device),
        "partitions": {r["hospital"]: r["partition_id"] for r in rows},
        "num-partitions": max([r.get("num_partitions", -1) for r in rows] + [len(rows)]),
    })

    attack = configured_attack(cfg.threat_model)
    partition_of = {r["hospital"]: r["partition_id"] for r in rows}
    num_partitions = max([r.get("num_partitions", -1) for r in rows] + [len(rows)])
    truth = ground_truth(cfg.threat_model, partition_of, num_partitions)
    malicious = sorted(h for h, bad in truth.items() if bad)
    if attack is not None:
        log(INFO, "hospitrust: attack %s by %s", attack, malicious or "nobody")

    warehouse = Warehouse.create(task.model, task.channels, task.num_classes, task.image_size, _fbd_options(cfg).colors, cfg.seed)
    stamps = StampLog(run_dir.path / STAMP_LOG)
    stamps.extend({"event": "init", **s} for s in warehouse.init_stamps())
    strategy = FBD(
        hospitals, _fbd_options(cfg), plan=plan, warehouse=warehouse, stamp_log=stamps,
        train_config={"local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size, "learning-rate": cfg.learning_rate,
                      TASK_KEY: task.to_json()},
        fraction_train=1.0, min_hospitals=cfg.min_hospitals,
        limits=ReplyLimits(max_update_norm=cfg.max_update_norm, max_num_examples=cfg.max_num_examples),
        seed=cfg.seed, device=device,
    )
    strategy.summary()
    evaluator = WarehouseEvaluator(cfg, info, device, sets)  # every color on the test split: once per round, not before

    history: list[dict[str, Any]] = []
    for rnd in range(1, cfg.num_server_rounds + 1):
        history.append(_fbd_round(rnd, cfg, grid, strategy, plan, warehouse, evaluator, truth, run_dir))
    _fbd_summary(cfg, history, len(hospitals), run_dir, started, malicious, plan, warehouse)
    return run_dir


def _fbd_round(rnd: int, cfg: RunConfig, grid: Grid, strategy: FBD, plan: ShippingPlan, warehouse: Warehouse,
               evaluator: WarehouseEvaluator, truth: dict[str, bool], run_dir: RunDirectory) -> dict[str, Any]:
    """One FED-FBD round: the writes asked, received and stamped, every color evaluated; its record."""
    round_start = time.perf_counter()
    offline = offline_hospitals(rnd, grid, strategy.hospitals)
    messages = list(strategy.configure_train(rnd, None, ConfigRecord(), grid))
    replies = exchange(grid, messages, cfg.reply_timeout)
    record = strategy.aggregate_round(rnd, replies)
    fail_if_every_hospital_crashed(rnd, record.clients, len(messages))
    warehouse.save(run_dir.path / WAREHOUSE_FILE)
    central, fbd = evaluator(warehouse)
    for c in record.clients:
        c["malicious"] = truth.get(c["hospital"], False)
    answered = {c["node_id"] for c in record.clients}
    missing = [strategy.hospitals[m.metadata.dst_node_id] for m in messages if m.metadata.dst_node_id not in answered]
    fbd["schedule"] = {h: m for h, m in plan.schedule(rnd).items()}
    fbd["rejected_writes"] = sum(len(c.get("rejected_writes", [])) for c in record.clients)
    round_record = {
        "round": rnd,
        "central": central,
        "clients": record.clients,
        "aggregation_seconds": record.aggregation_seconds,
        "round_seconds": time.perf_counter() - round_start,
        "asked": len(messages),
        "missing": missing,
        "offline": offline,
        "kept_previous_model": record.kept_previous_model,
        "note": record.note,
        "hospital_accuracy": {},
        "fairness": None,
        "detection": round_detection({c["hospital"]: False for c in record.clients}, truth),
        "fbd": fbd,
    }
    run_dir.append_round(round_record)
    log(INFO, "round %3d/%d  %s auc %.4f  bal-acc %.4f  writes %d  rejected writes %d  flagged colors %s  %.1fs",
        rnd, cfg.num_server_rounds, _fbd_options(cfg).routing, central["auc"], central["balanced_accuracy"],
        sum(len(c["accepted_blocks"]) for c in record.clients), fbd["rejected_writes"], fbd["flagged_colors"],
        round_record["round_seconds"])
    return round_record


def _fbd_summary(cfg: RunConfig, history: list[dict[str, Any]], num_hospitals: int, run_dir: RunDirectory,
                 started: float, malicious: list[str], plan: ShippingPlan, warehouse: Warehouse) -> None:
    """The run's summary: the colors a malicious hospital reached, the clean ones, the final routing."""
    reached = {h: sorted({m for m, _ in warehouse.reached_by(h)}) for h in malicious}
    tainted = sorted(set().union(*reached.values())) if reached else []
    clean = [m for m in range(warehouse.num_colors) if m not in tainted]
    summary = {
        **summary_head(cfg, history, num_hospitals, run_dir, started),
        "malicious_hospitals": malicious,
        "fbd": {
            "plan": plan.to_json(),
            "colors_reached_by_malicious": tainted,
            "clean_colors": clean,
            "final_colors": history[-1]["fbd"]["colors"],
            "final_routing": history[-1]["fbd"]["routing"],
            "block_hashes": warehouse.hashes(),
            "rejected_writes": sum(r["fbd"]["rejected_writes"] for r in history),
        },
    }
    run_dir.write_summary(summary)
    log(INFO, "hospitrust: fbd finished %d rounds in %.1f s; routed (%s) auc %.4f bal-acc %.4f; clean colors %s\nresults: %s",
        len(history), summary["wall_seconds"], _fbd_options(cfg).routing, summary["final"]["auc"],
        summary["final"]["balanced_accuracy"], clean, run_dir.path)

"""The round loop: validated config -> hospitals -> strategy -> rounds -> results.

It follows ``Strategy.start`` (train, federated evaluation, central evaluation) and adds
what a consortium needs on the record: per-round progress, the run directory
(rounds.jsonl, summary.json, model.pt) and a summary table at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust import metrics
from hospitrust.attacks.interfaces import ColludingAttack
from hospitrust.attacks.threat_model import ColludingAdversary, configured_attack, ground_truth
from hospitrust.config import RunConfig, parse_run_config
from hospitrust.contribution.federation import ContributionTracker
from hospitrust.fbd.server import run_fbd_federation
from hospitrust.metrics import POOLED_KEY, pooled_report
from hospitrust.models.training import pick_device, seed_everything
from hospitrust.server_app.checkpoint import check_compatible, load_checkpoint, restore_rng_states, save_checkpoint
from hospitrust.server_app.discovery import discover_hospitals, offline_hospitals
from hospitrust.server_app.plots import plot_trust
from hospitrust.server_app.records import (
    log_hospitals, run_record,
    absences, fail_if_every_hospital_crashed, flagged_hospitals, rare_class_holders, round_detection, run_security, summary_head,
)
from hospitrust.server_app.results import RunDirectory, default_run_name
from hospitrust.server_app.secure import SecureTrainRound
from hospitrust.server_app.story import detection_line, round_story
from hospitrust.server_app.server_data import ServerSets, server_sets
from hospitrust.server_app.services import CentralEvaluator, strategy_from_config
from hospitrust.strategies.base import RoundRecord
from hospitrust.tasks.model import load_pretrained, task_model
from hospitrust.tasks.task import TASK_KEY, Task, resolve_task
from hospitrust.server_app.transport import Sent, pipelines

RUN_DIR_LOCK_TIMEOUT = 300.0  # seconds a resumed run waits for the stopped run's ServerApp to exit


def _progress_line(rnd: int, total: int, central: Mapping[str, Any], valid: int, asked: int, seconds: float) -> str:
    return (
        f"round {rnd:>3}/{total}  bal-acc {central['balanced_accuracy']:.4f}  auc {central['auc']:.4f}  "
        f"acc {central['accuracy']:.4f}  worst-recall {central['worst_class_recall']:.4f}  "
        f"valid {valid}/{asked}  {seconds:.1f}s"
    )


def format_summary_table(history: list[dict[str, Any]]) -> str:
    head = f"{'round':>5} {'accuracy':>9} {'bal-acc':>8} {'auc':>7} {'macro-f1':>9} {'worst-rec':>9} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for rec in history:
        c = rec["central"]
        lines.append(
            f"{rec['round']:>5} {c['accuracy']:>9.4f} {c['balanced_accuracy']:>8.4f} {c['auc']:>7.4f} "
            f"{c['macro_f1']:>9.4f} {c['worst_class_recall']:>9.4f} {rec['round_seconds']:>8.1f}"
        )
    return "\n".join(lines)


def reply_timing(replies: Iterable[Any], hospitals: Mapping[int, str]) -> dict[str, dict[str, float]]:
    """Per hospital, the ``timing-*`` metrics of its reply (where its time went)."""
    out: dict[str, dict[str, float]] = {}
    for reply in replies:
        if reply.has_error() or not reply.has_content() or "metrics" not in reply.content.metric_records:
            continue
        m = reply.content.metric_records["metrics"]
        timing = {k[len("timing-"):]: float(cast(float, v)) for k, v in m.items() if k.startswith("timing-")}
        if timing:
            out[hospitals.get(int(reply.metadata.src_node_id), str(reply.metadata.src_node_id))] = timing
    return out


def federated_report(replies: Iterable[Any], num_classes: int, rare: list[int]) -> dict[str, Any]:
    """The round's metrics from the hospitals' evaluation counts (no server test set); a hospital
    whose counts are missing or malformed is left out of the pool, not the round.
    """
    counts = []
    for reply in replies:
        if reply.has_error() or not reply.has_content() or "metrics" not in reply.content.metric_records:
            continue
        m = reply.content.metric_records["metrics"]
        try:
            c: dict[str, Any] = {"confusion": list(m["confusion"]), "score-histogram": list(m["score-histogram"]),
                 "loss-sum": float(m["loss-sum"])}
            pooled_report([c], num_classes)  # shape and values check, on its own
        except (KeyError, TypeError, ValueError) as exc:
            log(WARNING, "hospitrust: node %s sent no usable evaluation counts (%s): left out of the pooled metrics",
                reply.metadata.src_node_id, exc)
            continue
        counts.append(c)
    return pooled_report(counts, num_classes, rare)


def run_federation(grid: Grid, context: Context) -> RunDirectory:
    """The whole run; returns its directory. Raises on bad config or missing data before any round."""
    started = time.time()
    cfg = parse_run_config(context.run_config)
    if cfg.strategy == "fbd":  # block ownership keeps a warehouse of colors, not one global model
        return run_fbd_federation(grid, context)
    task = resolve_task(cfg)
    log(INFO, "hospitrust: %s", task.describe())
    sets = server_sets(cfg, task)  # a missing file fails here, before any hospital is contacted
    log(INFO, "hospitrust: test set: %s; reference cohort: %s", sets.test_source, sets.cohort_source)
    seed_everything(cfg.seed)
    device = pick_device()

    resume = load_checkpoint(cfg.resume_from) if cfg.resume_from else None
    if resume is not None:  # the run goes on in its own directory
        check_compatible(resume["config"], cfg.to_flat())
        run_dir = RunDirectory(resume["path"].parent)
        log(INFO, "hospitrust: resuming %s after round %d", run_dir.path, resume["round"])
    else:
        run_dir = RunDirectory.create(cfg.output_dir, cfg.run_name or default_run_name(task.name, cfg.strategy))
        log(INFO, "hospitrust: run directory %s", run_dir.path)
    # one ServerApp writes a run directory at a time: a stopped run's ServerApp may still be
    # finishing its round when the resumed one starts
    with run_dir.exclusive(timeout=RUN_DIR_LOCK_TIMEOUT):
        run_dir.clear_failure()  # a resumed run is no longer the failed one
        try:
            return _federate(grid, cfg, task, sets, device, run_dir, resume, started)
        except Exception as exc:  # on the record for the operator (the console shows it), then Flower's
            run_dir.write_failure(exc)
            raise


def _federate(grid: Grid, cfg: RunConfig, task: Task, sets: ServerSets, device: torch.device, run_dir: RunDirectory,
              resume: dict[str, Any] | None, started: float) -> RunDirectory:
    info = task
    failed: list[dict[str, Any]] = []
    hospitals, rows = discover_hospitals(grid, cfg, task, failed)
    log_hospitals(hospitals, rows, failed, cfg, task)
    run_dir.write_class_counts(info.class_names, rows)
    record_of_run = run_record(cfg, task, sets, hospitals, rows, failed, device)
    run_dir.write_config(record_of_run)

    # the threat model (simulation ground truth; all honest when no attack is configured)
    attack = configured_attack(cfg)
    partition_of = {r["hospital"]: r["partition_id"] for r in rows}
    num_partitions = max([r.get("num_partitions", -1) for r in rows] + [len(rows)])
    truth = ground_truth(cfg, partition_of, num_partitions)
    rare_class, rare_holders = rare_class_holders(rows)
    if attack is not None:
        log(INFO, "hospitrust: attack %s by %s", attack, sorted(h for h, bad in truth.items() if bad) or "nobody")

    model = task_model(task)
    privacy = None
    if cfg.privacy.mode != "off":  # refused here, before any round: delta against every hospital's size, the model
        from hospitrust.privacy.records import PrivacyRecords, check_before_training

        check_before_training(cfg.privacy, task_model(task), rows)
        privacy = PrivacyRecords(cfg.privacy, list(hospitals.values()))
    if task.pretrained and resume is None:  # read here only, on the SuperLink machine: round 1's global model
        load_pretrained(model, task.pretrained)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    strategy = strategy_from_config(cfg, hospitals, device, task, sets)
    strategy.train_config[TASK_KEY] = task.to_json()  # every train message carries the task
    if cfg.train.class_weighted_loss and cfg.train.class_weights_from == "federation":
        # every hospital weighs its classes by the federation's totals from the query round
        strategy.train_config["federation-class-counts"] = [float(c) for c in np.sum([r["train"] for r in rows], axis=0)]
    if isinstance(attack, ColludingAttack):
        strategy.adversary = ColludingAdversary(attack, {h for h, bad in truth.items() if bad}, cfg.seed)
    central_dp = None
    if cfg.privacy.central:  # Flower's server-side fixed-clipping wrapper around FedAvg
        from hospitrust.privacy.central import CentralPrivacy

        central_dp = CentralPrivacy(strategy, cfg.privacy, len(hospitals))
    trainer = central_dp if central_dp is not None else strategy
    trainer.summary()
    if cfg.privacy.mode != "off":  # the accountants and their settings, once the wrapper is built
        from hospitrust.privacy.records import settings as privacy_settings

        run_dir.write_config({**record_of_run, "privacy": privacy_settings(cfg.privacy, central_dp)})
    evaluator = CentralEvaluator(cfg, info, device, sets.test, attack) if sets.test is not None else None
    rare = list(task.rare_classes) or metrics.rare_classes(np.sum([r["train"] for r in rows], axis=0))
    if evaluator is not None:
        evaluator.rare_classes = rare
    else:
        log(INFO, "hospitrust: no server test set: federated evaluation (the hospitals' held-out images, pooled)")

    history: list[dict[str, Any]] = []
    flags_per_round: list[dict[str, bool]] = []
    resumed_at: list[int] = []
    if resume is None:
        if evaluator is not None:
            initial = evaluator(arrays)
            log(INFO, "round   0 (initial model)  bal-acc %.4f  auc %.4f", initial["balanced_accuracy"], initial["auc"])
    else:
        arrays = ArrayRecord(resume["model"])
        strategy.load_state_dict(resume["strategy_state"])
        history, flags_per_round = list(resume["history"]), list(resume["flags_per_round"])
        resumed_at = [*resume.get("resumed_at", []), resume["round"]]
        run_dir.rewrite_rounds(history)  # rounds after the checkpoint (a crash mid-round) are dropped
        restore_rng_states(resume["rng"])
        if privacy is not None:
            privacy.restore(history)
        if central_dp is not None:
            central_dp.restore(history)
    train_config = ConfigRecord()
    evaluate_config = ConfigRecord({TASK_KEY: task.to_json(), **({POOLED_KEY: True} if evaluator is None else {})})
    # contribution scores from hospitals' reported scalars; SecAgg+ hands the server the sum only
    contribution = ContributionTracker(hospitals) if cfg.contribution_scoring.enabled else None
    if contribution is not None:
        contribution.restore(history)  # a resumed run keeps its earlier rounds' scores
    secure = (SecureTrainRound(cfg.secagg, hospitals, strategy.train_config, reply_timeout=cfg.reply_timeout,
                               min_hospitals=cfg.min_hospitals, train_sizes=[sum(r["train"]) for r in rows])
              if cfg.secagg.enabled else None)
    # on a deployed grid the next round's train messages go out with this round's evaluation (one idle
    # SuperNode poll a round instead of two); not with SecAgg+ (its own stages), contribution scoring
    # (it asks with the evaluation) or central DP (Flower's wrapper keeps the round's sample size)
    pipelined = pipelines(grid) and secure is None and contribution is None and central_dp is None
    ahead: tuple[float, list[str], float, list[Message], Sent] | None = None  # this round's, pushed already
    for rnd in range(len(history) + 1, cfg.num_server_rounds + 1):
        if ahead is not None:
            round_start, offline, train_pushed_at, messages, sent = ahead
            ahead = None
        else:
            round_start = time.perf_counter()
            offline = offline_hospitals(rnd, grid, strategy.hospitals)
            train_pushed_at = time.time()
            if secure is None:
                messages = list(trainer.configure_train(rnd, arrays, train_config, grid))
                sent = Sent(grid, messages, cfg.reply_timeout)
        if secure is None:
            replies = sent.replies()
            new_arrays, _ = trainer.aggregate_train(rnd, replies)
            asked = [m.metadata.dst_node_id for m in messages]
        else:
            new_arrays, asked = secure(grid, rnd, arrays, strategy.records.setdefault(rnd, RoundRecord()))
        fail_if_every_hospital_crashed(rnd, strategy.records[rnd].clients, len(asked))
        if new_arrays is not None:
            arrays = new_arrays
        # the hospitals evaluate every federated-evaluation-every rounds, and always the last one
        hospitals_evaluate = rnd % cfg.federated_evaluation_every == 0 or rnd == cfg.num_server_rounds
        eval_messages = list(strategy.configure_evaluate(rnd, arrays, evaluate_config, grid)) if hospitals_evaluate else []
        if contribution is not None:
            eval_messages = contribution.ask(rnd, strategy.records[rnd], eval_messages)
        train_seconds = time.time() - train_pushed_at  # push, the hospitals' work, replies, aggregation
        evaluate_pushed_at = time.time()
        eval_sent = Sent(grid, eval_messages, cfg.reply_timeout)
        checkpoint_state = strategy.state_dict() if cfg.checkpoint else None  # before the next round samples
        if pipelined and rnd < cfg.num_server_rounds:
            next_start, next_pushed_at = time.perf_counter(), time.time()
            next_offline = offline_hospitals(rnd + 1, grid, strategy.hospitals)
            next_messages = list(trainer.configure_train(rnd + 1, arrays, train_config, grid))
            ahead = (next_start, next_offline, next_pushed_at, next_messages,
                     Sent(grid, next_messages, cfg.reply_timeout))
        eval_replies = eval_sent.replies()
        evaluate_seconds = time.time() - evaluate_pushed_at
        strategy.aggregate_evaluate(rnd, eval_replies)
        central_started = time.perf_counter()
        central = evaluator(arrays) if evaluator is not None else federated_report(eval_replies, task.num_classes, rare)
        record = strategy.records[rnd]
        answered = {c["node_id"] for c in record.clients} | {b["node_id"] for b in record.budget_spent}
        missing = [strategy.hospitals[nid] for nid in asked if nid not in answered]
        per_hospital = {h: v["accuracy"] for h, v in record.evaluation.items()}
        for c in record.clients:
            c["malicious"] = truth.get(c["hospital"], False)
        flags = flagged_hospitals(record.clients)
        flags_per_round.append(flags)
        round_record: dict[str, Any] = {
            "round": rnd,
            "central": central,
            "evaluation": "central" if evaluator is not None else "federated",
            "hospitals_evaluated": hospitals_evaluate,
            "clients": record.clients,
            "aggregation_seconds": record.aggregation_seconds,
            "update_norm": record.update_norm,
            "round_seconds": time.perf_counter() - round_start,
            # where the round's time went: the train exchange (with aggregation), the evaluate exchange, and
            # the server's own evaluation; *_pushed_at are wall-clock stamps (the hospitals' timing is per client)
            "timing": {"train_pushed_at": train_pushed_at, "train_seconds": train_seconds,
                       "evaluate_pushed_at": evaluate_pushed_at, "evaluate_seconds": evaluate_seconds,
                       "central_evaluation_seconds": time.perf_counter() - central_started,
                       "finished_at": time.time(), "next_round_pushed_with_evaluation": ahead is not None,
                       "evaluate_clients": reply_timing(eval_replies, strategy.hospitals)},
            "asked": len(asked),
            "missing": missing,
            "offline": offline,
            "kept_previous_model": record.kept_previous_model,
            "note": record.note,
            "hospital_accuracy": per_hospital,
            "fairness": metrics.fairness(per_hospital) if per_hospital else None,
            "detection": round_detection(flags, truth),
        }
        if record.budget_spent:  # their own privacy budget: not failed, not asked again
            round_record["budget_spent"] = record.budget_spent
        if privacy is not None:
            round_record["privacy"] = privacy.round_entry(record.clients, record.budget_spent, central_dp, rnd)
        if contribution is not None:
            round_record["contribution"] = contribution.score(rnd, eval_replies, strategy)
        run_dir.append_round(round_record)
        history.append(round_record)
        valid = sum(1 for c in record.clients if not c.get("rejected"))
        log(INFO, "%s", _progress_line(rnd, cfg.num_server_rounds, central, valid, len(asked), round_record["round_seconds"])
            + round_story(record.clients, truth if attack is not None else None))
        if cfg.checkpoint:
            save_checkpoint(run_dir.path, round=rnd, model_state=arrays.to_torch_state_dict(),
                            strategy_name=cfg.strategy, strategy_state=cast(dict[str, Any], checkpoint_state),  # taken when cfg.checkpoint
                            config=cfg.to_flat(),
                            history=history, flags_per_round=flags_per_round, resumed_at=resumed_at)

    final_state = arrays.to_torch_state_dict()
    run_dir.save_model(final_state)
    summary = {
        **summary_head(cfg, history, len(hospitals), run_dir, started),
        "fairness": history[-1]["fairness"],
        "malicious_hospitals": sorted(h for h, bad in truth.items() if bad),
        "rare_class": rare_class,
        "rare_classes": rare,
        "task": task.name,
        "evaluation": "central" if evaluator is not None else "federated",
        "failed_hospitals": failed,
        "security": run_security(flags_per_round, truth, rare_holders),
        "resumed_at": resumed_at,
    }
    if privacy is not None:
        summary["privacy"] = privacy.summary(central_dp)
    if contribution is not None:
        summary["contribution"] = contribution.summary()
        contribution.write(run_dir.path)
    run_dir.write_summary(summary)
    if cfg.strategy not in ("fedavg", "fedprox"):  # rules that weigh hospitals: draw whose update counted
        try:
            plot_trust(run_dir.path)
        except Exception as exc:  # a picture never fails a finished run
            log(WARNING, "hospitrust: trust plot not drawn: %s", exc)
    final = summary["final"]
    if missed := absences(summary["participation"], len(history)):
        log(WARNING, "hospitrust: hospitals without a valid update in every round:\n%s", missed)
    if copies := summary.get("near_duplicates"):
        log(WARNING, "hospitrust: hospitals that sent another hospital's update (counted as one voice, flagged):\n%s",
            "\n".join(f"{name}: {e['rounds']} of {len(history)} rounds, with {', '.join(e['with'])}"
                      for name, e in copies.items()))
    log(INFO, "hospitrust: finished %d rounds in %.1f s\n%s\nfinal: accuracy %.4f  balanced accuracy %.4f  AUC %.4f  "
        "worst-class recall %.4f  (best round %d)\nresults: %s",
        len(history), summary["wall_seconds"],
        format_summary_table(history) + (f"\n{detection_line(summary['security'])}" if attack is not None else ""), final["accuracy"],
        final["balanced_accuracy"], final["auc"], final["worst_class_recall"], summary["best_round"], run_dir.path)
    return run_dir


"""The round loop: validated config -> hospitals -> strategy -> rounds -> results.

It follows ``Strategy.start`` (train, federated evaluation, central evaluation) and adds what a
consortium needs on the record: per-round progress, the run directory (rounds.jsonl,
summary.json, model.pt) and a summary table at the end. Everything optional (privacy,
contribution scoring, SecAgg+, overlapping rounds, the simulated adversary) is a round feature
(``hospitrust.features``): the loop calls their hooks at named points and knows none by name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust import metrics
from hospitrust.aggregation import set_backend as set_aggregation_backend
from hospitrust.config import RunConfig, parse_run_config
from hospitrust.features import Round
from hospitrust.models.training import pick_device, seed_everything
from hospitrust.records import RoundRecord
from hospitrust.server_app.checkpoint import check_compatible, load_checkpoint, restore_rng_states, save_checkpoint
from hospitrust.server_app.discovery import offline_hospitals, round_states
from hospitrust.server_app.evaluation import reply_timing
from hospitrust.server_app.plots import plot_trust
from hospitrust.server_app.records import absences, fail_if_every_hospital_crashed, summary_head
from hospitrust.server_app.results import RunDirectory, default_run_name
from hospitrust.strategies import intake
from hospitrust.server_app.story import detection_line, round_story
from hospitrust.datasets.server import ServerSets, server_sets
from hospitrust.server_app.setup import RunSetup, set_up_run
from hospitrust.server_app.transport import Sent
from hospitrust.tasks.task import Task, resolve_task

RUN_DIR_LOCK_TIMEOUT = 300.0  # seconds a resumed run waits for the stopped run's ServerApp to exit


def _progress_line(rnd: int, total: int, central: Mapping[str, Any], valid: int, asked: int, seconds: float) -> str:
    return (
        f"round {rnd:>3}/{total}  bal-acc {central['balanced_accuracy']:.4f}  auc {central['auc']:.4f}  "
        f"acc {central['accuracy']:.4f}  worst-recall {central['worst_class_recall']:.4f}  "
        f"valid {valid}/{asked}  {seconds:.1f}s"
    )


def format_summary_table(history: Sequence[RoundRecord]) -> str:
    head = f"{'round':>5} {'accuracy':>9} {'bal-acc':>8} {'auc':>7} {'macro-f1':>9} {'worst-rec':>9} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for rec in history:
        c = rec.central
        lines.append(
            f"{rec.number:>5} {c['accuracy']:>9.4f} {c['balanced_accuracy']:>8.4f} {c['auc']:>7.4f} "
            f"{c['macro_f1']:>9.4f} {c['worst_class_recall']:>9.4f} {rec.round_seconds:>8.1f}"
        )
    return "\n".join(lines)


def run_federation(grid: Grid, context: Context) -> RunDirectory:
    """The whole run; returns its directory. Raises on bad config or missing data before any round."""
    started = time.time()
    cfg = parse_run_config(context.run_config)
    set_aggregation_backend(cfg.aggregation.backend)  # per run, not per process: a bench worker runs many
    task = resolve_task(cfg)
    log(INFO, "hospitrust: %s", task.describe())
    sets = server_sets(cfg.server_data, task, cfg.federation, cfg.task.custom)  # a missing file fails here, before any hospital is contacted
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
        run_dir.record_flower_run(context.run_id)
        try:
            return _federate(grid, cfg, task, sets, device, run_dir, resume, started)
        except Exception as exc:  # on the record for the operator (the console shows it), then Flower's
            run_dir.write_failure(exc)
            raise


def _federate(grid: Grid, cfg: RunConfig, task: Task, sets: ServerSets, device: torch.device, run_dir: RunDirectory,
              resume: dict[str, Any] | None, started: float) -> RunDirectory:
    run = set_up_run(grid, cfg, task, sets, device, run_dir, resuming=resume is not None)
    if resume is None:  # a rule may start from a model of its own (a resumed run's comes from its checkpoint)
        run.arrays = run.strategy.initial_model(run.arrays)
    rounds = RoundLoop(run, run_dir)
    if resume is None:
        if not run.strategy.runs_own_evaluation:  # a rule's own state (FED-FBD's colors) is evaluated after round 1
            run.evaluation.initial(run.arrays)
    else:
        rounds.restore(resume)
    rounds.run_rounds()
    return _finish(run, rounds, run_dir, started)


class RoundLoop:
    """The rounds of a run: for each, configure, send, receive, aggregate, evaluate, record and
    checkpoint, with the features' hooks at each point (``hospitrust.features.base`` lists them).
    """

    def __init__(self, run: RunSetup, run_dir: RunDirectory) -> None:
        self.run, self.run_dir, self.features = run, run_dir, run.features
        self.arrays: ArrayRecord = run.arrays
        self.history: list[RoundRecord] = []
        self.resumed_at: list[int] = []
        self.ahead: dict[int, tuple[Round, Any]] = {}  # rounds whose train messages went out already

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """A resumed run: the model, the strategy's and the features' state, the history so far."""
        self.arrays = ArrayRecord(checkpoint["model"])
        self.run.strategy.load_state_dict(checkpoint["strategy_state"])
        # the checkpoint holds the rounds' lines (the run directory's format); the loop keeps typed records
        self.history = [RoundRecord.from_json(line) for line in checkpoint["history"]]
        self.resumed_at = [*checkpoint.get("resumed_at", []), checkpoint["round"]]
        self.run_dir.rewrite_rounds(self.history)  # rounds after the checkpoint (a crash mid-round) are dropped
        restore_rng_states(checkpoint["rng"])
        self.features.restore({**checkpoint, "history": self.history})

    def run_rounds(self) -> None:
        for number in range(len(self.history) + 1, self.run.cfg.num_server_rounds + 1):
            rnd, sent = self.ahead.pop(number) if number in self.ahead else self.send(number)
            rnd.result = self.features.on_aggregate(rnd, self.run.trainer.receive(rnd, sent))
            fail_if_every_hospital_crashed(number, rnd.result.clients, len(rnd.asked))
            if rnd.result.arrays is not None:
                self.arrays = rnd.result.arrays
            central, strategy_state, own = self.evaluate(rnd)
            record = self.record(rnd, central, own)
            if (scores := self.features.scores()) is not None:  # e.g. contribution totals, for a rule weighted by them
                self.run.strategy.receive_scores(scores)
            self.run_dir.append_round(record)
            self.history.append(record)
            valid = sum(1 for c in rnd.result.clients if not c.rejected)
            log(INFO, "%s", _progress_line(number, self.run.cfg.num_server_rounds, central, valid, len(rnd.asked),
                                           record.round_seconds)
                + round_story(rnd.result.clients, self.run.truth if self.run.attack is not None else None))
            if self.run.cfg.checkpoint:
                save_checkpoint(self.run_dir.path, round=number, model_state=self.arrays.to_torch_state_dict(),
                                strategy_name=self.run.cfg.strategy, strategy_state=strategy_state,
                                features=self.features.state(), config=self.run.cfg.to_flat(),
                                history=[r.to_json() for r in self.history],
                                resumed_at=self.resumed_at)

    def send(self, number: int) -> tuple[Round, Any]:
        """Start a round: who is offline, the features' ``before_round``, the train messages out."""
        rnd = Round(number, self.arrays, started=time.perf_counter())
        rnd.offline = offline_hospitals(number, self.run.grid, self.run.strategy.hospitals)
        self.features.before_round(rnd)
        rnd.timing["train_pushed_at"] = time.time()
        return rnd, self.run.trainer.send(rnd)

    def send_ahead(self, number: int) -> None:
        self.ahead[number] = self.send(number)

    def overlaps_rounds(self) -> bool:
        return self.features.overlaps_rounds()

    def evaluate(self, rnd: Round) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The hospitals' and the server's evaluation of the new model; the strategy's state as it was
        before any next round sampled (for the checkpoint); the strategy's own entries of the round's
        record (a rule that ``runs_own_evaluation`` evaluates its state itself, FED-FBD's colors).
        """
        run, timing = self.run, rnd.timing
        rnd.hospitals_evaluate = run.evaluation.hospitals_evaluate(rnd.number)
        messages = (list(run.strategy.configure_evaluate(rnd.number, self.arrays, run.evaluation.config, run.grid))
                    if rnd.hospitals_evaluate else [])
        messages = self.features.on_evaluate(rnd, messages)
        timing["train_seconds"] = time.time() - timing["train_pushed_at"]  # push, the hospitals' work, replies, aggregation
        timing["evaluate_pushed_at"] = time.time()
        sent = Sent(run.grid, messages, run.cfg.reply_timeout)
        strategy_state = run.strategy.state_dict() if run.cfg.checkpoint else {}
        self.features.while_evaluating(rnd, self)
        rnd.evaluate_replies = sent.replies()
        timing["evaluate_seconds"] = time.time() - timing["evaluate_pushed_at"]
        central_started = time.perf_counter()
        own: dict[str, Any] = {}
        if run.strategy.runs_own_evaluation:
            assert rnd.result is not None
            central, own = run.strategy.own_evaluation(rnd.number, rnd.result)
        else:  # the model the rule releases: the global model, or a rule's floor where it does better
            released, own = run.strategy.released(rnd.number, self.arrays)
            central = run.evaluation(released, rnd.evaluate_replies)
        timing["central_evaluation_seconds"] = time.perf_counter() - central_started
        return central, strategy_state, own

    def record(self, rnd: Round, central: dict[str, Any], own: Mapping[str, Any] | None = None) -> RoundRecord:
        """The round's record (its line in rounds.jsonl): the loop's fields, the features' entries, the strategy's own.

        Parameters
        ----------
        rnd : Round
            The round, aggregated and evaluated.
        central : dict[str, Any]
            The central evaluation of its model.
        own : Mapping[str, Any], optional
            What the strategy's own evaluation added to the line (FBD's ``fbd``).

        Returns
        -------
        RoundRecord
            The record (the run directory writes its ``to_json``).
        """
        result, hospitals = rnd.result, self.run.strategy.hospitals
        assert result is not None
        answered = {c.node_id for c in result.clients} | rnd.answered
        missing = [nid for nid in rnd.asked if nid not in answered]
        per_hospital = {h: v["accuracy"] for h, v in
                        intake.hospital_evaluation(self.run.strategy, rnd.number, rnd.evaluate_replies).items()}
        states = round_states(rnd.number, self.run.grid, hospitals, asked=rnd.asked, answered=answered,
                              unavailable=rnd.unavailable, offline=rnd.offline, evaluated=set(per_hospital),
                              previous=self.history[-1] if self.history else None)
        # *_pushed_at are wall-clock stamps (the hospitals' timing is per client)
        rnd.timing.update(finished_at=time.time(), next_round_pushed_with_evaluation=rnd.number + 1 in self.ahead,
                          evaluate_clients=reply_timing(rnd.evaluate_replies, hospitals))
        record = RoundRecord(
            number=rnd.number, central=central, evaluation=self.run.evaluation.name,
            hospitals_evaluated=rnd.hospitals_evaluate, clients=result.clients,
            aggregation_seconds=result.aggregation_seconds, update_norm=result.update_norm,
            round_seconds=time.perf_counter() - rnd.started, timing=rnd.timing, asked=len(rnd.asked),
            # offline: not asked, offline when the round began and still at its end (rejoined: back by then)
            missing=[hospitals[nid] for nid in missing], unresponsive=states["unresponsive"],
            node_unavailable=states["node_unavailable"], offline=states["offline"], rejoined=states["rejoined"],
            kept_previous_model=result.kept_previous_model, note=result.note, hospital_accuracy=per_hospital,
            fairness=metrics.fairness(per_hospital) if per_hospital else None,
            trust_signal=self.run.strategy.trust_signal or "weight",
        )
        # the features' entries, then the strategy's own (FBD's ``fbd``); before to_json: a feature may still mark
        # the hospital records
        record.entries = {**self.features.record(rnd), **(own or {})}
        return record


def _finish(run: RunSetup, rounds: RoundLoop, run_dir: RunDirectory, started: float) -> RunDirectory:
    """The final model, summary.json, the trust plot and the closing log."""
    cfg, history = run.cfg, rounds.history
    if (final := run.strategy.final_model(rounds.arrays)) is not None:  # FED-FBD's final state: warehouse.pt
        run_dir.save_model(final)
    summary = {
        **summary_head(cfg, history, len(run.hospitals), run_dir, started),
        "fairness": history[-1].fairness,
        "rare_class": run.rare_class,
        "rare_classes": run.evaluation.rare,
        "task": run.task.name,
        "evaluation": run.evaluation.name,
        "failed_hospitals": run.failed,
        "resumed_at": rounds.resumed_at,
        **run.features.summary(),
        **run.strategy.run_summary(history, run.truth),
    }
    # a class the final model never recognises (recall 0 on the evaluation set): the first thing an imbalanced task hides
    recall = dict(zip(run.task.class_names, summary["final"].get("per_class_recall") or []))
    summary["per_class_recall"] = recall
    summary["classes_never_recognised"] = [name for name, r in recall.items() if r == 0.0]
    run.features.finish(run_dir.path)
    run_dir.write_summary(summary)
    if run.strategy.weighs_hospitals:  # draw whose update counted
        try:
            plot_trust(run_dir.path)
        except Exception as exc:  # a picture never fails a finished run
            log(WARNING, "hospitrust: trust plot not drawn: %s", exc)
    final = summary["final"]
    if recall:
        log(INFO, "hospitrust: per-class recall: %s", ", ".join(f"{name} {r:.3f}" for name, r in recall.items()))
    if summary["classes_never_recognised"]:
        log(WARNING, "hospitrust: the final model never recognises %s (recall 0 on the evaluation set): its balanced "
            "accuracy hides a class it does not learn (try train.class-weighted-loss = true)",
            ", ".join(summary["classes_never_recognised"]))
    if missed := absences(summary["participation"], len(history)):
        log(WARNING, "hospitrust: hospitals without a valid update in every round:\n%s", missed)
    if copies := summary.get("near_duplicates"):
        log(WARNING, "hospitrust: hospitals that sent another hospital's update (counted as one voice, flagged):\n%s",
            "\n".join(f"{name}: {e['rounds']} of {len(history)} rounds, with {', '.join(e['with'])}"
                      for name, e in copies.items()))
    log(INFO, "hospitrust: finished %d rounds in %.1f s\n%s\nfinal: accuracy %.4f  balanced accuracy %.4f  AUC %.4f  "
        "worst-class recall %.4f  (best round %d)\nresults: %s",
        len(history), summary["wall_seconds"],
        format_summary_table(history) + (f"\n{detection_line(summary['security'])}" if run.attack is not None else ""),
        final["accuracy"],
        final["balanced_accuracy"], final["auc"], final["worst_class_recall"], summary["best_round"], run_dir.path)
    return run_dir

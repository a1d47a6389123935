"""A run's setup before its first round: the hospitals (query round), the run's record, the
threat model, the strategy and the round features, in the order that fixes the seeded draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust import metrics
from hospitrust.attacks.threat_model import configured_attack, ground_truth
from hospitrust.config import RunConfig
from hospitrust.features import Features, Round, RunFacts, Trainer
from hospitrust.features.detection import rare_class_holders
from hospitrust.features.registry import run_features
from hospitrust.server_app.discovery import discover_hospitals
from hospitrust.server_app.evaluation import Evaluation
from hospitrust.server_app.progress import RoundProgress
from hospitrust.server_app.records import log_hospitals, run_record
from hospitrust.server_app.results import RunDirectory
from hospitrust.datasets.server import ServerSets
from hospitrust.server_app.services import CentralEvaluator, strategy_from_config
from hospitrust.server_app.transport import Sent, pipelines
from hospitrust.strategies.base import RoundResult
from hospitrust.tasks.model import load_pretrained, task_model
from hospitrust.tasks.task import TASK_KEY, Task


class StrategyTrainer:
    """The round's train exchange through the strategy: configure and push (``send``), pull and
    aggregate (``receive``), with the features' hooks on the messages, the replies and the update stack.
    """

    def __init__(self, strategy: Any, grid: Grid, features: Features, reply_timeout: float,
                 progress: RoundProgress | None = None) -> None:
        self.strategy, self.grid, self.features, self.reply_timeout = strategy, grid, features, reply_timeout
        self.progress = progress

    def send(self, rnd: Round) -> Sent:
        messages: list[Message] = self.strategy.configure_round(rnd.number, rnd.arrays, ConfigRecord(), self.grid,
                                                                rnd.excluded)
        messages = self.features.on_configure(rnd, messages)
        rnd.asked = [m.metadata.dst_node_id for m in messages]
        if self.progress is None:
            return Sent(self.grid, messages, self.reply_timeout)
        self.progress.asked(rnd.number, rnd.asked, self.reply_timeout)
        progress, number = self.progress, rnd.number
        sent = Sent(self.grid, messages, self.reply_timeout,
                    on_reply=lambda reply: progress.replied(number, reply, sent.node_of(reply)))
        return sent

    def receive(self, rnd: Round, sent: Sent) -> RoundResult:
        replies = self.features.on_replies(rnd, sent.replies())
        rnd.unavailable = dict(sent.unavailable)
        return self.strategy.aggregate_round(rnd.number, replies, self.features.update_steps(rnd))


@dataclass
class RunSetup:
    """What the rounds of a run share."""

    cfg: RunConfig
    grid: Grid
    task: Task
    hospitals: dict[int, str]
    failed: list[dict[str, Any]]
    rare_class: int | None
    arrays: ArrayRecord  # the initial global model
    strategy: Any  # the rule itself (its state is checkpointed; configure_evaluate, the hospitals' evaluation)
    trainer: Trainer  # the train exchange, through the strategy as the features wrap it
    features: Features
    evaluation: Evaluation
    truth: dict[str, bool]  # the simulation's ground truth: which hospitals attack (all False without an attack)
    attack: Any  # the configured attack, or None


def run_train_values(cfg: RunConfig, task: Task, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What every train message of the run carries besides the rule's own values: the task, and, when
    the hospitals weigh their classes by the federation's totals, those totals from the query round.
    """
    values: dict[str, Any] = {TASK_KEY: task.to_json()}
    if cfg.train.class_weighted_loss and cfg.train.class_weights_from == "federation":
        values["federation-class-counts"] = [float(c) for c in np.sum([r["train"] for r in rows], axis=0)]
    return values


def set_up_run(grid: Grid, cfg: RunConfig, task: Task, sets: ServerSets, device: torch.device, run_dir: RunDirectory,
               resuming: bool) -> RunSetup:
    """Discover the hospitals and build everything the rounds use; config.json is written."""
    failed: list[dict[str, Any]] = []
    hospitals, rows = discover_hospitals(grid, cfg, task, failed)
    log_hospitals(hospitals, rows, failed, cfg, task)
    run_dir.write_class_counts(task.class_names, rows)
    record_of_run = run_record(cfg, task, sets, hospitals, rows, failed, device)
    run_dir.write_config(record_of_run)

    # the threat model (simulation ground truth; all honest when no attack is configured)
    attack = configured_attack(cfg.threat_model)
    partition_of = {r["hospital"]: r["partition_id"] for r in rows}
    truth = ground_truth(cfg.threat_model, partition_of, max([r.get("num_partitions", -1) for r in rows] + [len(rows)]))
    if attack is not None:
        log(INFO, "hospitrust: attack %s by %s", attack, sorted(h for h, bad in truth.items() if bad) or "nobody")

    model = task_model(task)
    # a feature refuses a setting here, before any round (e.g. privacy's delta against every hospital's size)
    features = run_features(RunFacts(cfg, grid, task, hospitals, rows, truth, attack, pipelines(grid)))
    if task.pretrained and not resuming:  # read here only, on the SuperLink machine: round 1's global model
        load_pretrained(model, task.pretrained)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    strategy = strategy_from_config(cfg, hospitals, device, task, sets, run_dir.path, resuming,
                                    order=[r["hospital"] for r in rows], train_values=run_train_values(cfg, task, rows))
    wrapped = features.wrap_strategy(strategy)
    trainer = features.wrap_trainer(StrategyTrainer(wrapped, grid, features, cfg.reply_timeout,
                                                    RoundProgress(run_dir.path, hospitals)))
    wrapped.summary()
    if settings := features.settings():  # e.g. the accountants and their settings, once the wrappers are built
        run_dir.write_config({**record_of_run, **settings})
    central = CentralEvaluator(cfg, task, device, sets.test, attack) if sets.test is not None else None
    rare = list(task.rare_classes) or metrics.rare_classes(np.sum([r["train"] for r in rows], axis=0))
    evaluation = Evaluation(task, rare, cfg.federated_evaluation_every, cfg.num_server_rounds, central)
    return RunSetup(cfg, grid, task, hospitals, failed, rare_class_holders(rows)[0], arrays, strategy, trainer,
                    features, evaluation, dict(truth), attack)


__all__ = ["RunSetup", "StrategyTrainer", "set_up_run"]

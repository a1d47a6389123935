"""The round's evaluation of the new global model: on the server's test split (central) or, with
no test split, pooled from the hospitals' evaluation counts (federated).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import log

from hospitrust.metrics import POOLED_KEY, pooled_report
from hospitrust.server_app.services import CentralEvaluator
from hospitrust.tasks.task import TASK_KEY, Task


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


class Evaluation:
    """How the run evaluates each round's model; the hospitals evaluate it every ``every`` rounds
    and in the last one (federated evaluation: fairness, and the pooled metrics without a test split).

    Parameters
    ----------
    task : Task
        The run's task (every evaluate message carries it).
    rare : list[int]
        The rare classes (their macro F1 is reported).
    every : int
        ``federated-evaluation-every``.
    num_rounds : int
        The run's last round.
    central : CentralEvaluator or None
        The server's test split; None: federated evaluation.
    """

    def __init__(self, task: Task, rare: list[int], every: int, num_rounds: int,
                 central: CentralEvaluator | None) -> None:
        self.task, self.rare, self.every, self.num_rounds, self.central = task, rare, every, num_rounds, central
        self.name = "central" if central is not None else "federated"
        if central is not None:
            central.rare_classes = rare
        else:
            log(INFO, "hospitrust: no server test set: federated evaluation (the hospitals' held-out images, pooled)")
        self.config = ConfigRecord({TASK_KEY: task.to_json(), **({POOLED_KEY: True} if central is None else {})})

    def hospitals_evaluate(self, server_round: int) -> bool:
        return server_round % self.every == 0 or server_round == self.num_rounds

    def initial(self, arrays: ArrayRecord) -> None:
        """Round 0 (the initial model) on the test split, logged; nothing without one."""
        if self.central is not None:
            initial = self.central(arrays)
            log(INFO, "round   0 (initial model)  bal-acc %.4f  auc %.4f", initial["balanced_accuracy"], initial["auc"])

    def __call__(self, arrays: ArrayRecord, replies: Iterable[Any]) -> dict[str, Any]:
        if self.central is not None:
            return self.central(arrays)
        return federated_report(replies, self.task.num_classes, self.rare)


__all__ = ["Evaluation", "federated_report", "reply_timing"]

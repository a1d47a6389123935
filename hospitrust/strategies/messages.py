"""The Flower side of a rule: which hospitals a round asks, what its messages carry, and Flower's
``aggregate_*`` forms of the round's intake (:mod:`hospitrust.strategies.intake`).

:class:`~hospitrust.strategies.base.HospitrustStrategy` takes it as its Flower ``Strategy``; the loop asks
:meth:`RoundMessages.configure_round` and :meth:`RoundMessages.aggregate_round`, Flower's wrappers (central DP) the
``configure_*`` / ``aggregate_*`` pairs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Sequence
from logging import INFO
from typing import Any, ClassVar, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from hospitrust.strategies import intake
from hospitrust.strategies.rounds import RoundResult, Rule, UpdateStep
from hospitrust.strategies.validation import ReplyLimits


class RoundMessages(Strategy):
    """Sampling (by hospital name, with the rule's seeded rng), the train and evaluate messages, and
    Flower's Strategy interface on top of the round's intake.
    """

    name: ClassVar[str]
    hospitals: dict[int, str]
    train_config: dict[str, Any]
    fraction_train: float
    min_hospitals: int
    limits: ReplyLimits
    rng: random.Random
    global_state: dict[str, torch.Tensor] | None

    def summary(self) -> None:
        log(INFO, "\t├── Strategy: %s (%s)", self.name, type(self).__name__)
        log(INFO, "\t├── Hospitals: %d, fraction-train %.2f, min-hospitals %d", len(self.hospitals),
            self.fraction_train, self.min_hospitals)
        ratio = self.limits.max_norm_over_median
        log(INFO, "\t└── Reply bounds: update norm <= %g%s, num-examples <= %d", self.limits.max_update_norm,
            f" and <= {ratio:g} x the round's median" if ratio else "", self.limits.max_num_examples)

    def sample_hospitals(self, grid: Grid, excluded: Collection[str] = ()) -> list[int]:
        """Node ids to ask this round, chosen by hospital name with the seeded rng (node ids are random),
        among the online hospitals not ``excluded`` (names a round feature keeps out, e.g. a spent budget).
        """
        online = set(grid.get_node_ids())
        candidates = sorted((name, nid) for nid, name in self.hospitals.items() if nid in online and name not in excluded)
        k = min(len(candidates), max(math.ceil(self.fraction_train * len(candidates)), self.min_hospitals))
        chosen = self.rng.sample(candidates, k) if k < len(candidates) else candidates
        return [nid for _, nid in sorted(chosen)]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.configure_round(server_round, arrays, config, grid)

    def configure_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        excluded: Collection[str] = ()) -> list[Message]:
        """The round's train messages, to the sampled hospitals not ``excluded`` (hospital names)."""
        self.global_state = arrays.to_torch_state_dict()
        cfg = ConfigRecord({**self.train_config, **dict(config), "server-round": server_round})
        content = RecordDict({"arrays": arrays, "config": cfg})
        return [
            Message(content, dst_node_id=nid, message_type=MessageType.TRAIN)
            for nid in self.sample_hospitals(grid, excluded)
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's form of :meth:`aggregate_round`: (new model or None, metrics)."""
        result = self.aggregate_round(server_round, replies)
        return result.arrays, result.metrics

    def aggregate_round(self, server_round: int, replies: Iterable[Message],
                        update_steps: Sequence[UpdateStep] = (), *, equal_weights: bool = False,
                        round_bound: bool = True) -> RoundResult:
        """The round's intake with this rule (:func:`~hospitrust.strategies.intake.aggregate_round`); a rule whose
        replies are no stack of updates (FED-FBD's blocks) replaces it.
        """
        return intake.aggregate_round(cast(Rule, self), server_round, replies, update_steps,
                                      equal_weights=equal_weights, round_bound=round_bound)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        cfg = ConfigRecord({**dict(config), "server-round": server_round})
        content = RecordDict({"arrays": arrays, "config": cfg})
        online = set(grid.get_node_ids())
        return [
            Message(content, dst_node_id=nid, message_type=MessageType.EVALUATE)
            for nid in sorted(self.hospitals)
            if nid in online
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's form of :func:`~hospitrust.strategies.intake.hospital_evaluation`: the mean and spread of the
        hospitals' accuracy.
        """
        per_hospital = intake.hospital_evaluation(cast(Rule, self), server_round, replies)
        if not per_hospital:
            return None
        accs = np.array([v["accuracy"] for v in per_hospital.values()])
        return MetricRecord({"mean-accuracy": float(accs.mean()), "accuracy-spread": float(accs.max() - accs.min())})

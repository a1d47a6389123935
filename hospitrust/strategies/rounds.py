"""What a round passes between the loop and a rule: the rule's result (:class:`Aggregate`), the round's
(:class:`RoundResult`), and the steps on the stacked updates before the rule sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from flwr.app import ArrayRecord, MetricRecord

from hospitrust.records import HospitalRecord
from hospitrust.strategies.validation import ReplyLimits


@dataclass(frozen=True)
class RoundContext:
    """What a rule may know of a round besides its updates and their weights: data, no reply, record or loop.

    Parameters
    ----------
    server_round : int
        The round.
    hospitals : tuple[str, ...]
        Who sent each row, in row order (a row that stands for a group of replies: its first member).
    metrics : tuple[Mapping[str, Any], ...]
        Each row's reply metrics, in row order (``class-counts``, ``benchmark-error``, ``num-examples``, ...).
    """

    server_round: int
    hospitals: tuple[str, ...]
    metrics: tuple[Mapping[str, Any], ...]


@dataclass
class Aggregate:
    """What a rule returns: the aggregated update and, per accepted reply, its weight and selection.

    Parameters
    ----------
    update : torch.Tensor
        ``(d,)`` the aggregated update.
    weights : torch.Tensor
        ``(n,)`` each accepted reply's share in the aggregate (sums to 1 for averaging rules).
    selected : torch.Tensor
        ``(n,)`` bool: whether the reply took part.
    extra : dict[str, list[Any]]
        Per-client signals by name (one value per reply), recorded in its :class:`HospitalRecord`
        under the rule's name (``trust`` and ``flagged`` as the record's own fields).
    """

    update: torch.Tensor  # (d,)
    weights: torch.Tensor  # (n,) share of each accepted reply in the aggregate (sums to 1 for averaging rules)
    selected: torch.Tensor  # (n,) bool: did the reply take part
    extra: dict[str, list[Any]] = field(default_factory=dict)  # per-client signals, recorded in the hospital records


@dataclass
class RoundResult:
    """What a round's aggregation decided, returned by ``HospitrustStrategy.aggregate_round``.

    Parameters
    ----------
    arrays : ArrayRecord or None
        The new global model; None keeps the previous one.
    clients : list[HospitalRecord]
        One record per reply (accepted or rejected): hospital, weight, selected, reason, the
        rule's per-hospital signals.
    metrics : MetricRecord or None
        Flower's aggregate metrics (valid replies, train loss).
    aggregation_seconds : float
        Time spent aggregating.
    kept_previous_model : bool
        Whether the previous model was kept (too few valid replies, nothing released).
    note : str
        Why the previous model was kept ('' otherwise).
    update_norm : float or None
        L2 norm of the round's aggregated update (how far the global model moved); None when
        the previous model was kept.
    """

    arrays: ArrayRecord | None = None
    clients: list[HospitalRecord] = field(default_factory=list)
    metrics: MetricRecord | None = None
    aggregation_seconds: float = 0.0
    kept_previous_model: bool = False
    note: str = ""
    update_norm: float | None = None

    def keep_previous(self, why: str) -> None:
        """No new model this round, and why (appended to an earlier note)."""
        self.arrays, self.update_norm, self.kept_previous_model = None, None, True
        self.note = (self.note + "; " if self.note else "") + why


#: A step on the stacked updates before the rule sees them: (round, (n, d) updates, hospital
#: names in row order) -> updates. Round features supply them (the simulated colluding adversary;
#: pre-aggregation); ``aggregate_round`` applies them in order.
RowStep = Callable[[int, torch.Tensor, list[str]], torch.Tensor]


@dataclass(frozen=True)
class AttackerRows:
    """An update step that puts rows of its own in hospitals' places (the simulated colluding adversary).

    The server never decoded those rows from a reply, so ``aggregate_round`` holds every row the step
    returns to the reply checks (:func:`~hospitrust.strategies.validation.check_update_row`): a row
    that fails is rejected and recorded as a rejected reply is, its hospital leaves the round, and
    min-hospitals is checked again. A deployed server would have rejected such a reply; a simulated
    attacker gets no more than a real one.

    Parameters
    ----------
    step : RowStep
        The step itself (it keeps the number and order of the rows).
    """

    step: RowStep

    def __call__(self, server_round: int, updates: torch.Tensor, hospitals: list[str]) -> torch.Tensor:
        return self.step(server_round, updates, hospitals)


@dataclass(frozen=True)
class GroupedRows:
    """An update step that hands the rule fewer rows than replies, each row standing for a group of them
    (ByzFL's bucketing: the rule gets the bucket means, ``bucketing.rule-input = "bucket-means"``).

    ``step(round, updates, hospitals)`` returns the ``(k, d)`` rows and, per row, the indices of the
    replies it carries (every reply in exactly one group). It must be the last update step. The rule
    aggregates the rows (:func:`~hospitrust.strategies.intake.aggregate_grouped`), and each member's record gets
    its group's weight split equally among the members, its group's selection and signals.

    Parameters
    ----------
    step : callable
        ``(round, (n, d) updates, names) -> ((k, d) rows, k groups of reply indices)``.
    """

    step: Callable[[int, torch.Tensor, list[str]], tuple[torch.Tensor, list[list[int]]]]


#: What ``aggregate_round`` takes: steps that keep one row per reply (:data:`RowStep`, an
#: :class:`AttackerRows` among them), the last one possibly a :class:`GroupedRows`.
UpdateStep = RowStep | GroupedRows


class Rule(Protocol):
    """What a round's intake (:mod:`hospitrust.strategies.intake`) asks of the rule it runs: every
    :class:`~hospitrust.strategies.base.HospitrustStrategy` has it.
    """

    name: ClassVar[str]
    trust_signal: ClassVar[str | None]
    reads_who_sent: ClassVar[bool]
    central_dp_compatible: ClassVar[bool]
    hospitals: dict[int, str]
    min_hospitals: int
    limits: ReplyLimits
    device: Any
    global_state: dict[str, torch.Tensor] | None
    _global_vector: tuple[dict[str, torch.Tensor], torch.Tensor] | None  # the round's model flattened, kept

    @property
    def signal_source(self) -> str: ...

    def required_replies(self) -> int: ...

    def hospital_name(self, node_id: int) -> str: ...

    def aggregate(self, updates: torch.Tensor, example_weights: torch.Tensor, context: RoundContext) -> Aggregate: ...

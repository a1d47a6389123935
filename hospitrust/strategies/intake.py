"""A round's intake, the part of every rule's round that is no rule's math.

The loop hands a round's replies to :func:`aggregate_round` with the rule: every reply is checked (a bad reply
is rejected with a reason, never an exception), the accepted updates are stacked into an ``(n, d)`` tensor in
hospital order, the round's update steps (the simulated adversary, pre-aggregation) apply to the stack, the rule's
``aggregate`` combines it, and each hospital's record says what happened. A rule implements its math
only; what a round does around it lives here, not in the rule's base class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common import log

from hospitrust.aggregation.vectorize import FlatSpec, flatten_state, unflatten_state
from hospitrust.records import HospitalRecord, mean_of_signal
from hospitrust.strategies.rounds import Aggregate, AttackerRows, GroupedRows, RoundContext, RoundResult, Rule, UpdateStep
from hospitrust.strategies.validation import (CheckedReply, RejectedReply, check_train_reply, check_update_row,
                                               round_median_norm)


def aggregate_round(rule: Rule, server_round: int, replies: Iterable[Message],
                    update_steps: Sequence[UpdateStep] = (), *, equal_weights: bool = False,
                    round_bound: bool = True) -> RoundResult:
    """Check every reply, stack the accepted updates, apply ``update_steps`` to the stack, run the
    rule; the result says what the round decided, per hospital and as a whole.

    The rule weighs each reply by its example count, or with ``equal_weights`` every reply alike (central DP: its
    noise ``z C / n`` is calibrated for the equal-weight mean of n clipped updates): an input of the round, so a
    rule keeps no such setting.

    Parameters
    ----------
    rule : Rule
        The round's rule (its ``global_state`` is the model the round sent).
    server_round : int
        The round.
    replies : Iterable[Message]
        The hospitals' train replies, in any order (taken in hospital order).
    update_steps : Sequence[UpdateStep]
        Steps on the stack before the rule sees it (the simulated adversary, pre-aggregation), in order.
    equal_weights : bool
        Weigh every reply alike instead of by its example count (only a ``central_dp_compatible`` rule).
    round_bound : bool
        Apply ``round-norm-bound.over-median`` (the rule's ``limits``); central DP turns it off: which replies enter would
        then depend on the other hospitals' norms, a release decision its accounting does not count.

    Returns
    -------
    RoundResult
        The new model (None: the previous one kept, ``note`` says why) and one record per reply.
    """
    if equal_weights and not rule.central_dp_compatible:
        raise ValueError(f"the {rule.name} rule cannot weigh every reply equally (central_dp_compatible is False)")
    started = time.perf_counter()
    record = RoundResult()
    accepted: list[CheckedReply] = []
    if rule.global_state is not None:
        global_vec, spec = flatten_state(rule.global_state)
        global_vec = global_vec.to(rule.device)
        rule._global_vector = (rule.global_state, global_vec)
    # replies arrive in whatever order the hospitals finish; floating-point sums depend on
    # the order of their terms, so the same seed gives the same model only in a fixed order
    for reply in in_hospital_order(rule, replies):
        node_id = int(reply.metadata.src_node_id)
        if node_id not in rule.hospitals and reply.has_error():
            # the SuperLink answers for a node that is gone ("node unavailable"): that
            # hospital is missing this round, not a hospital that sent something bad
            log(WARNING, "Round %d: no reply from a hospital: %s", server_round, (reply.error.reason or "").strip()[:200])
            continue
        try:
            if rule.global_state is None:
                raise RejectedReply("no global model was sent this round")
            accepted.append(check_train_reply(reply, rule.global_state, global_vec, rule.limits))
        except RejectedReply as rej:
            _reject(rule, server_round, record, node_id, rej.reason)
        except Exception as exc:  # a check itself failed on odd input: still the hospital's fault
            _reject(rule, server_round, record, node_id, f"unreadable reply: {type(exc).__name__}: {exc}")

    if _too_few(rule, server_round, record, accepted, started):
        return record

    updates = torch.stack([cast(torch.Tensor, r.update) for r in accepted])  # set by check_train_reply
    for r in accepted:
        r.update = None  # the stacked copy is the only one kept
    groups: list[list[int]] | None = None
    bound = rule.limits.max_norm_over_median if round_bound else 0.0
    if not any(isinstance(step, AttackerRows) for step in update_steps):  # else once the attacker's rows are in
        updates, accepted = _norm_outliers(rule, server_round, record, updates, accepted, bound)
        if _too_few(rule, server_round, record, accepted, started):
            return record
    for step in update_steps:
        if groups is not None:
            raise ValueError("an update step that groups rows (GroupedRows) must be the last update step")
        names = [rule.hospital_name(r.node_id) for r in accepted]
        if isinstance(step, GroupedRows):
            updates, groups = step.step(server_round, updates, names)
            continue
        updates = step(server_round, updates, names)
        if isinstance(step, AttackerRows):  # rows no reply check has seen: held to the same checks
            updates, accepted = _checked_rows(rule, server_round, record, updates, accepted, global_vec, spec)
            updates, accepted = _norm_outliers(rule, server_round, record, updates, accepted, bound)
            if _too_few(rule, server_round, record, accepted, started):
                return record
    num_examples = torch.tensor([r.num_examples for r in accepted], dtype=torch.float64, device=rule.device)
    rule_weights = torch.ones_like(num_examples) if equal_weights else num_examples
    # what each hospital's update (as the rule saw it) and the aggregate weigh: step lengths for the record
    row_norms = torch.linalg.vector_norm(updates, dim=1).tolist()
    if groups is None:
        norms = row_norms
        result = rule.aggregate(updates, rule_weights, round_context(rule, server_round, accepted))
    else:
        if len(groups) < rule.required_replies():
            _kept(rule, server_round, record, accepted, started, f"{len(groups)} rows after the pre-aggregation < the "
                       f"{rule.name} rule's minimum of {rule.required_replies()} (assumed malicious f)")
            return record
        norms = [0.0] * len(accepted)
        for row, members in enumerate(groups):
            for i in members:
                norms[i] = row_norms[row]
        result = aggregate_grouped(rule, server_round, updates, groups, rule_weights, accepted)
    record.update_norm = float(torch.linalg.vector_norm(result.update))

    new_vec = global_vec + result.update.to(global_vec.dtype)
    template = _integer_buffers(rule, accepted, result.selected)
    new_state = unflatten_state(new_vec.cpu(), spec, template)
    record.aggregation_seconds = time.perf_counter() - started
    for i, r in enumerate(accepted):
        record.clients.append(hospital_record(rule,
            r.node_id, reply=r, weight=float(result.weights[i]), selected=bool(result.selected[i]),
            update_norm=norms[i], signals={k: v[i] for k, v in result.extra.items()}))
    losses = [float(r.metrics.get("train-loss", float("nan"))) for r in accepted]
    total = float(num_examples.sum())
    train_loss = float(sum(loss * n for loss, n in zip(losses, num_examples.tolist())) / total) if total else math.nan
    record.arrays = ArrayRecord(new_state)
    record.metrics = MetricRecord({"valid-replies": len(accepted), "train-loss": train_loss})
    return record


def _too_few(rule: Rule, server_round: int, record: RoundResult, accepted: list[CheckedReply], started: float) -> bool:
    """Whether ``accepted`` is below min-hospitals (or the rule's minimum); if so ``record`` says the
    previous model is kept and lists the valid replies with weight 0.
    """
    needed = max(rule.min_hospitals, rule.required_replies())
    if len(accepted) >= needed:
        return False
    why = (f"min-hospitals {rule.min_hospitals}" if needed == rule.min_hospitals
           else f"the {rule.name} rule's minimum of {needed} (assumed malicious f)")
    _kept(rule, server_round, record, accepted, started, f"{len(accepted)} valid replies < {why}")
    return True

def _reject(rule: Rule, server_round: int, record: RoundResult, node_id: int, reason: str) -> None:
    """One reply (or a simulated attacker's row) rejected: recorded with its reason, and logged."""
    record.clients.append(hospital_record(rule, node_id, rejected=True, reason=reason))
    log(WARNING, "Round %d: rejected %s: %s", server_round, rule.hospital_name(node_id), reason)


def _kept(rule: Rule, server_round: int, record: RoundResult, accepted: list[CheckedReply], started: float,
          why: str) -> None:
    """``record``: the previous model kept because ``why``; the valid replies listed with weight 0."""
    record.kept_previous_model = True
    record.note = f"{why}: kept the previous model"
    log(WARNING, "Round %d: %s", server_round, record.note)
    for r in accepted:
        record.clients.append(hospital_record(rule, r.node_id, reply=r, weight=0.0, selected=False))
    record.aggregation_seconds = time.perf_counter() - started
    record.metrics = MetricRecord({"valid-replies": len(accepted)})

def _checked_rows(rule: Rule, server_round: int, record: RoundResult, updates: torch.Tensor,
                  accepted: list[CheckedReply], global_vec: torch.Tensor, spec: FlatSpec
                  ) -> tuple[torch.Tensor, list[CheckedReply]]:
    """Every row of ``updates`` held to the reply checks (``check_update_row``); the rows that fail are
    rejected, recorded as a rejected reply is, and dropped with their replies.
    """
    if updates.shape[0] != len(accepted):
        raise ValueError(f"an attacker's update step returned {updates.shape[0]} rows for {len(accepted)} replies")
    keep: list[int] = []
    for i, r in enumerate(accepted):
        try:
            check_update_row(updates[i], global_vec, spec, rule.limits)
            keep.append(i)
        except RejectedReply as rej:
            _reject(rule, server_round, record, r.node_id, rej.reason)
    if len(keep) == len(accepted):
        return updates, accepted
    return updates[keep], [accepted[i] for i in keep]

def _norm_outliers(rule: Rule, server_round: int, record: RoundResult, updates: torch.Tensor,
                   accepted: list[CheckedReply], ratio: float) -> tuple[torch.Tensor, list[CheckedReply]]:
    """The rows whose norm exceeds ``ratio`` (``round-norm-bound.over-median``; 0: none) times the median norm of the round's
    rows rejected, recorded as a rejected reply is, and dropped with their replies (the bound is measured from the
    round itself: while fewer than half the rows are an attacker's, the median lies within the honest norms).
    """
    if ratio <= 0.0 or len(accepted) < 2:
        return updates, accepted
    norms = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64).tolist()
    median = round_median_norm(norms)
    if median is None:  # half the rows or more did not move: no scale to measure against
        return updates, accepted
    bound = ratio * median
    keep = [i for i, norm in enumerate(norms) if norm <= bound]
    for i, r in enumerate(accepted):
        if norms[i] > bound:
            _reject(rule, server_round, record, r.node_id, f"update norm {norms[i]:.4g} exceeds {ratio:g} x the round's "
                    f"median update norm {median:.4g} (round-norm-bound)")
    if len(keep) == len(accepted):
        return updates, accepted
    return updates[keep], [accepted[i] for i in keep]


def aggregate_grouped(rule: Rule, server_round: int, rows: torch.Tensor, groups: Sequence[Sequence[int]],
                      num_examples: torch.Tensor, replies: list[CheckedReply]) -> Aggregate:
    """The rule on ``(k, d)`` rows that each stand for a group of replies (ByzFL's bucket means), its
    result given per reply.

    The rule sees k rows; a row's example count is the sum of its members', and the reply it is
    handed carries that count and its first member's node id (nothing else: a rule that reads who
    sent a row, ``reads_who_sent``, is refused). Each member gets its group's weight divided by the
    group's size (a bucket is its members' plain mean, so that is each member's share in the
    aggregate), its group's selection and its group's per-row signals.

    Parameters
    ----------
    server_round : int
        The round.
    rows : torch.Tensor
        ``(k, d)`` the rows the rule aggregates.
    groups : sequence of sequences of int
        For every row, the indices (into ``replies``) of the replies it stands for.
    num_examples : torch.Tensor
        ``(n,)`` the replies' example counts.
    replies : list of CheckedReply
        The n accepted replies.

    Returns
    -------
    Aggregate
        The rule's update, with weights, selection and signals per reply (``(n,)``).
    """
    if rule.reads_who_sent:
        raise ValueError(f"the {rule.name} rule reads who sent each row (state kept per hospital, or a reply's "
                         "metrics): it cannot take rows that stand for several hospitals (bucketing.rule-input = "
                         "'bucket-means'); use bucketing.rule-input = 'member-rows'")
    n = len(replies)
    if rows.shape[0] != len(groups) or sorted(i for g in groups for i in g) != list(range(n)):
        raise ValueError(f"{len(groups)} groups for {rows.shape[0]} rows must hold every one of the {n} replies once")
    counts = torch.stack([num_examples[list(g)].sum() for g in groups])
    handed = [CheckedReply(replies[g[0]].node_id, {}, None, int(c), {"num-examples": int(c)})
              for g, c in zip(groups, counts.tolist())]
    agg = rule.aggregate(rows, counts, round_context(rule, server_round, handed))
    row_weights, row_selected = agg.weights.detach().cpu().double(), agg.selected.detach().cpu()
    weights = torch.zeros(n, dtype=torch.float64)
    selected = torch.zeros(n, dtype=torch.bool)
    extra: dict[str, list[Any]] = {k: [None] * n for k in agg.extra}
    for row, members in enumerate(groups):
        for i in members:
            weights[i] = row_weights[row] / len(members)
            selected[i] = bool(row_selected[row])
            for k, v in agg.extra.items():
                extra[k][i] = v[row]
    return Aggregate(agg.update, weights, selected, extra)


def round_context(rule: Rule, server_round: int, replies: Sequence[CheckedReply]) -> RoundContext:
    """What ``rule`` knows of the round's rows besides the updates: who sent each, and its reply's metrics.

    Parameters
    ----------
    rule : Rule
        The round's rule (it names the hospitals by node id).
    server_round : int
        The round.
    replies : Sequence[CheckedReply]
        The rows' replies, in row order.

    Returns
    -------
    RoundContext
    """
    return RoundContext(server_round, tuple(rule.hospital_name(r.node_id) for r in replies),
                        tuple(r.metrics for r in replies))


def hospital_evaluation(rule: Rule, server_round: int, replies: Iterable[Message]) -> dict[str, dict[str, float]]:
    """Hospital name -> its accuracy, example count and balanced accuracy of the global model on
    its local validation set (fairness); malformed replies are left out.

    Parameters
    ----------
    rule : Rule
        The round's rule (it names the hospitals by node id).
    server_round : int
        The round.
    replies : Iterable[Message]
        The hospitals' evaluate replies.

    Returns
    -------
    dict[str, dict[str, float]]
        ``accuracy``, ``num_examples`` and ``balanced_accuracy`` per hospital.
    """
    per_hospital: dict[str, dict[str, float]] = {}
    for reply in in_hospital_order(rule, replies):
        if reply.has_error() or not reply.has_content() or "metrics" not in reply.content.metric_records:
            continue
        m = reply.content.metric_records["metrics"]
        try:
            # a list value raises TypeError: left out below
            acc = float(cast(float, m["accuracy"]))
            n = int(cast(int, m["num-examples"]))
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(acc) and 0.0 <= acc <= 1.0 and n > 0:
            per_hospital[rule.hospital_name(int(reply.metadata.src_node_id))] = {
                "accuracy": acc,
                "num_examples": n,
                "balanced_accuracy": float(cast(float, m.get("balanced-accuracy", float("nan")))),
            }
    return per_hospital


def hospital_record(
    rule: Rule,
    node_id: int,
    *,
    reply: CheckedReply | None = None,
    weight: float = 0.0,
    selected: bool = False,
    rejected: bool = False,
    reason: str = "",
    update_norm: float | None = None,
    signals: Mapping[str, Any] | None = None,
) -> HospitalRecord:
    """The record of one hospital's reply this round, with ``rule``'s signals: the one place it is built.

    Parameters
    ----------
    node_id : int
        The node that replied.
    reply : CheckedReply, optional
        The reply, where it passed the checks (its example count and metrics are recorded).
    weight : float
        Its share in the aggregate.
    selected : bool
        Whether its update took part.
    rejected : bool
        Whether the reply was rejected (``reason`` says why).
    reason : str
        Why it was rejected.
    update_norm : float, optional
        L2 norm of its update as the rule saw it.
    signals : Mapping, optional
        The rule's per-hospital signals (an :class:`Aggregate`'s ``extra`` for this reply): ``trust``
        and ``flagged`` go to the record's own fields, the rest under the rule's name; the value of the
        rule's :attr:`trust_signal` is also the record's ``trust``.

    Returns
    -------
    HospitalRecord
        The record.
    """
    record = HospitalRecord.from_reply(
        rule.hospital_name(node_id), node_id, reply.num_examples if reply is not None else 0,
        reply.metrics if reply is not None else None, weight=weight, selected=selected, rejected=rejected,
        reason=reason, update_norm=update_norm)
    values = dict(signals or {})
    trust, flagged = values.pop("trust", None), values.pop("flagged", None)
    if rule.trust_signal is not None and rule.trust_signal != "trust":  # it stays among the signals too
        trust = mean_of_signal(values.get(rule.trust_signal))
    if trust is not None:
        record.trust = float(trust)
    if flagged is not None:
        record.flagged = bool(flagged)
    if values:
        record.add_signals(rule.signal_source, values)
    return record


def in_hospital_order(rule: Rule, replies: Iterable[Message]) -> list[Message]:
    """Replies sorted by hospital name (then node id): arrival order must not change a result.

    Parameters
    ----------
    rule : Rule
        The round's rule (it names the hospitals by node id).
    replies : Iterable[Message]
        The replies, in arrival order.

    Returns
    -------
    list[Message]
    """
    def key(reply: Message) -> tuple[str, int]:
        node_id = int(reply.metadata.src_node_id)
        return rule.hospital_name(node_id), node_id

    return sorted(replies, key=key)


def _integer_buffers(rule: Rule, accepted: list[CheckedReply], selected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Non-float tensors (BatchNorm counters) are copied, never averaged: the largest among
    the selected replies, so a counter only moves forward.
    """
    assert rule.global_state is not None
    template = dict(rule.global_state)
    chosen = [r for r, s in zip(accepted, selected.tolist()) if s] or accepted
    for name, ref in rule.global_state.items():
        if not ref.is_floating_point():
            template[name] = torch.stack([r.state[name] for r in chosen]).amax(dim=0)
    return template

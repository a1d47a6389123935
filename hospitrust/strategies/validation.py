"""Every reply from a hospital is untrusted input: check it before any math touches it.

``check_train_reply`` returns the reply's state dict and example count, or raises
``RejectedReply`` with a reason that goes into the log and ``rounds.jsonl``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, Message
from pydantic import Field, field_validator

from hospitrust.aggregation.vectorize import FlatSpec, flatten_state
from hospitrust.options import Options


class RejectedReply(Exception):
    """A hospital's reply cannot be used this round; ``reason`` says why.

    Parameters
    ----------
    reason : str
        Why the reply is rejected (one line).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RoundNormBoundOptions(Options):
    """A reply bound measured from each round: a multiple of the median update norm of its checked replies."""

    over_median: float = Field(4.0, ge=0.0, description=(
        "A reply whose update norm exceeds this multiple of the median update norm of the round's checked replies (a "
        "simulated attacker's rows included) is rejected; fewer than half the replies cannot move that median beyond "
        "the honest norms. 0: off (max-update-norm alone); else at least 1. Not applied (the log says so) under secure "
        "aggregation or central DP, nor to FED-FBD's blocks. The default 4 was chosen on validation splits "
        "(docs/experiments/2026-12-07-default-bound.md)."
    ))

    @field_validator("over_median")
    @classmethod
    def _ratio(cls, v: float) -> float:
        if v != 0.0 and not 1.0 <= v < math.inf:
            raise ValueError(f"{v:g}: expected 0 (off) or a finite number of at least 1 (below 1 the median reply "
                             "itself would be rejected)")
        return v


@dataclass(frozen=True)
class ReplyLimits:
    """Bounds every train reply is checked against (run config ``max-update-norm``, ``max-num-examples``).

    Parameters
    ----------
    max_update_norm : float
        Largest L2 norm of the update (returned - global) over the float tensors.
    max_num_examples : int
        Largest number of training examples a reply may claim.
    max_norm_over_median : float
        Largest ratio of an update's norm to the median norm of the round's checked updates (run config
        ``round-norm-bound.over-median``; 0: no such bound). A round-level check: :func:`hospitrust.strategies.intake.aggregate_round`.
    """

    max_update_norm: float = 1e4  # L2 norm of (returned - global) over float tensors
    max_num_examples: int = 10_000_000
    max_norm_over_median: float = 0.0

    def __post_init__(self) -> None:
        if self.max_norm_over_median != 0.0 and not 1.0 <= self.max_norm_over_median < math.inf:
            raise ValueError(f"round-norm-bound.over-median must be 0 (off) or a finite number of at least 1, got "
                             f"{self.max_norm_over_median!r}: below 1 it would reject the median reply itself")


def round_median_norm(norms: list[float]) -> float | None:
    """The median of a round's update norms, the scale ``round-norm-bound.over-median`` multiplies; None where it
    gives none (half the rows or more did not move, or the median is not finite).

    Parameters
    ----------
    norms : list[float]
        The L2 norms of the round's update rows (the attacker told its bound passes ``inf`` for its own rows).
    """
    if not norms:
        return None
    median = statistics.median(norms)
    return median if 0.0 < median < math.inf else None


@dataclass
class CheckedReply:
    """A train reply that passed every check (:func:`check_train_reply`).

    Parameters
    ----------
    node_id : int
        The node that sent it.
    state : dict[str, torch.Tensor]
        Its decoded state dict.
    update : torch.Tensor or None
        ``(d,)`` float32: returned minus global, over the float tensors; None once stacked.
    num_examples : int
        The examples it trained on (> 0).
    metrics : dict
        Its MetricRecord ``metrics``, as a dict.
    """

    node_id: int
    state: dict[str, torch.Tensor]
    update: torch.Tensor | None  # (d,) float32: returned minus global, over the float tensors; None once stacked
    num_examples: int
    metrics: dict


#: A hospital's gate refusing a message (hospitrust.ops.deploy.gate), inside Flower's "<class '...'>:<'reason'>".
_REFUSED = re.compile(r"^<class '[\w.]*\.Refused'>:<'(?P<why>refused[^\n]*?)'>\s*$", re.S)


def error_reason(reason: object) -> str:
    """An error reply's reason as recorded: a hospital's refusal (its approval or site policy) as the hospital
    stated it, ``refused ...``; anything else as ``error reply: ...``.

    Parameters
    ----------
    reason : object
        The error reply's reason (Flower wraps an exception as ``<class '...'>:<'message'>``).

    Returns
    -------
    str
        One line for the round's record.
    """
    text = str(reason or "").strip()
    refused = _REFUSED.search(text)
    return shorten(refused.group("why")) if refused else f"error reply: {shorten(text)}"


def shorten(text: object, limit: int = 300) -> str:
    """One line of at most ``limit`` characters: a reason that fits a log line and rounds.jsonl.

    Parameters
    ----------
    text : object
        The reason (any object: ``str`` of it is taken).
    limit : int
        The most characters kept.

    Returns
    -------
    str
        The shortened single line.
    """
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def negative_running_var(name: str, t: torch.Tensor) -> bool:
    """A BatchNorm ``running_var`` below zero: not a state any training produces, and
    sqrt(var + eps) of it turns every prediction of the model into NaN.

    Parameters
    ----------
    name : str
        The state dict key.
    t : torch.Tensor
        Its tensor.

    Returns
    -------
    bool
        True for a ``running_var`` with a negative entry.
    """
    return name.endswith("running_var") and t.is_floating_point() and bool((t < 0).any())


def check_update_norm(norm: float, limits: ReplyLimits, nonfinite_arrays: Callable[[], list[str]]) -> None:
    """The bound on an update's norm: RejectedReply when it is not finite or exceeds ``max-update-norm``.

    Parameters
    ----------
    norm : float
        The L2 norm of the update (returned - global) over the float tensors.
    limits : ReplyLimits
        The bounds.
    nonfinite_arrays : callable
        ``() ->`` the names of the returned model's tensors holding NaN or Inf (called only for a
        non-finite norm); none named: the norm itself overflowed.
    """
    if not math.isfinite(norm):
        bad = nonfinite_arrays()
        raise RejectedReply(f"arrays contain NaN or Inf: {bad[:5]}" if bad else "update norm overflows (Inf)")
    if norm > limits.max_update_norm:
        raise RejectedReply(f"update norm {norm:.4g} exceeds the bound {limits.max_update_norm:g} (max-update-norm)")


def check_update_row(update: torch.Tensor, global_vector: torch.Tensor, spec: FlatSpec, limits: ReplyLimits) -> None:
    """The checks :func:`check_train_reply` makes of a reply's update, made of one row of the update stack.

    For a row the server did not decode from a reply: a simulated colluding attacker's, put in a
    malicious hospital's place after the replies were checked. The row is held to what a reply is
    held to, with the same reasons: the model it makes (global + row) has no BatchNorm variance
    below zero and no NaN or Inf, and its norm is at most ``max-update-norm``. RejectedReply
    when it fails one.

    Parameters
    ----------
    update : torch.Tensor
        ``(d,)`` the row (an update: model - global, over the float tensors).
    global_vector : torch.Tensor
        ``(d,)`` the round's global model flattened (:func:`flatten_state`).
    spec : FlatSpec
        Its layout (which slice is which tensor).
    limits : ReplyLimits
        The run's bounds.
    """
    model = global_vector + update.to(device=global_vector.device, dtype=global_vector.dtype)
    tensors = {k: model[o:o + math.prod(shape)] for k, shape, o in zip(spec.keys, spec.shapes, spec.offsets)}
    for name, t in tensors.items():
        if negative_running_var(name, t):
            raise RejectedReply(f"array {name!r} (a BatchNorm variance) has negative entries")
    check_update_norm(float(torch.linalg.vector_norm(update)), limits,
                      lambda: [k for k, t in tensors.items() if not bool(torch.isfinite(t).all())])


def check_train_reply(
    reply: Message,
    global_state: Mapping[str, torch.Tensor],
    global_vector: torch.Tensor,
    limits: ReplyLimits,
    arrays_key: str = "arrays",
    metrics_key: str = "metrics",
) -> CheckedReply:
    """Check one train reply against the global model; RejectedReply with the reason when it is unusable.

    Parameters
    ----------
    reply : Message
        The hospital's train reply.
    global_state : Mapping[str, torch.Tensor]
        The global model sent this round (keys, shapes and dtypes the reply must match).
    global_vector : torch.Tensor
        ``(d,)`` the global model's float tensors, flattened (:func:`flatten_state`).
    limits : ReplyLimits
        The bounds on the update norm and the example count.
    arrays_key : str
        The name of the reply's one ArrayRecord.
    metrics_key : str
        The name of its MetricRecord.

    Returns
    -------
    CheckedReply
        The decoded reply, its update and example count.
    """
    node_id = int(reply.metadata.src_node_id)
    if reply.has_error():
        raise RejectedReply(error_reason(reply.error.reason))
    if not reply.has_content():
        raise RejectedReply("empty reply")
    content = reply.content
    arrays = content.array_records
    if arrays_key not in arrays or len(arrays) != 1:
        raise RejectedReply(f"expected exactly one ArrayRecord named {arrays_key!r}, got {sorted(arrays)}")
    record: ArrayRecord = arrays[arrays_key]
    got_keys, want_keys = set(record.keys()), set(global_state.keys())
    if got_keys != want_keys:
        missing, extra = sorted(want_keys - got_keys), sorted(got_keys - want_keys)
        raise RejectedReply(f"array keys differ from the global model: missing {missing[:5]}, extra {extra[:5]}")
    try:
        state = record.to_torch_state_dict()
    except Exception as exc:  # undecodable bytes
        raise RejectedReply(f"arrays cannot be decoded: {type(exc).__name__}: {shorten(exc)}") from None

    for name, ref in global_state.items():
        t = state[name]
        if tuple(t.shape) != tuple(ref.shape):
            raise RejectedReply(f"array {name!r} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise RejectedReply(f"array {name!r} has dtype {t.dtype}, expected {ref.dtype}")
        if negative_running_var(name, t):
            raise RejectedReply(f"array {name!r} (a BatchNorm variance) has negative entries")

    # One pass for the update, one for its norm; a NaN or Inf anywhere makes the norm non-finite.
    update = flatten_state(state)[0].to(global_vector.device) - global_vector
    check_update_norm(float(torch.linalg.vector_norm(update)), limits, lambda: [
        k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())])

    metric_records = content.metric_records
    if metrics_key not in metric_records:
        raise RejectedReply(f"no MetricRecord named {metrics_key!r}")
    metrics = dict(metric_records[metrics_key])
    if "num-examples" not in metrics:
        raise RejectedReply("metrics lack 'num-examples'")
    n = metrics["num-examples"]
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        raise RejectedReply(f"'num-examples' is not a number: {shorten(repr(n), 60)}")
    if not math.isfinite(float(n)) or n < 0 or float(n) != int(n):
        raise RejectedReply(f"'num-examples' must be a non-negative integer, got {n!r}")
    if n > limits.max_num_examples:
        raise RejectedReply(f"'num-examples' {n} exceeds the bound {limits.max_num_examples}")
    if n == 0:
        raise RejectedReply("'num-examples' is 0: nothing was trained")
    return CheckedReply(node_id=node_id, state=state, update=update, num_examples=int(n), metrics=metrics)

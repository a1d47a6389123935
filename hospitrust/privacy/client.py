"""A hospital's side of local DP: plan the round's DP-SGD, check it against the hospital's own
budget, write it to its ledger, and say what it spent (or why it did not train).

The run's own spending lives in ``context.state`` (one run); the ledger adds every run's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from hospitrust.errors import HospitalError
from hospitrust.privacy.ledger import PrivacyLedger, Spending, content_hash, ledger_for
from hospitrust.privacy.local import PrivacyEvent, epsilon_of, planned_event
from hospitrust.privacy.options import PrivacyOptions

#: The reply metric that says a hospital refused to train: its privacy budget is spent.
BUDGET_SPENT_KEY = "privacy-budget-spent"
#: ``context.state`` key of this run's DP-SGD events at this hospital.
RUN_STATE = "hospitrust-privacy"
#: The reply's config record that carries the reason in words.
REASON_RECORD = "privacy"


class PrivacyInputError(HospitalError, ValueError):
    """A DP setting that cannot hold for this hospital's data (the message names the key; counts only, so public)."""


def check_delta(delta: float, num_examples: int, hospital: str) -> None:
    """PrivacyInputError unless ``delta < 1 / num_examples`` (a larger delta lets the mechanism
    publish one patient's record outright with probability delta and still meet the definition).
    """
    if num_examples > 0 and not delta < 1.0 / num_examples:
        raise PrivacyInputError(f"privacy.delta = {delta:g} is not below 1 / (training-set size) = 1 / {num_examples} = "
                                f"{1.0 / num_examples:.3g} at hospital {hospital!r}: with delta that large the guarantee "
                                "allows one patient's record to leak outright; lower privacy.delta")


def data_key(hospital: Any) -> str:
    """The content hash of a hospital's data (``HospitalContext``): from its data card when it has
    its own files, else from its simulated share's arrays.
    """
    key = hospital.card.get("content-hash")
    if key:
        return str(key)
    import numpy as np

    data = hospital.data
    return content_hash(np.concatenate([np.asarray(data.train.images), np.asarray(data.val.images)]) if len(data.val)
                        else data.train.images,
                        np.concatenate([np.asarray(data.train.labels), np.asarray(data.val.labels)]))


def run_events(context: Context) -> list[PrivacyEvent]:
    """The run's DP-SGD events at this hospital (``context.state``: one run)."""
    if RUN_STATE not in context.state:
        return []
    raw = json.loads(str(cast(ConfigRecord, context.state[RUN_STATE])["events"]))
    return [PrivacyEvent.from_dict(e) for e in raw]


def _save_run_events(context: Context, events: list[PrivacyEvent]) -> None:
    context.state[RUN_STATE] = ConfigRecord({"events": json.dumps([e.as_dict() for e in events])})


@dataclass
class RoundPlan:
    """A round the hospital may train: its event and where it is written."""

    event: PrivacyEvent
    key: str
    ledger: PrivacyLedger | None
    lifetime_before: Spending
    run_before: list[PrivacyEvent]
    max_epsilon: float | None


@dataclass
class Refusal:
    """Why the hospital does not train this round."""

    reason: str
    spent: float
    projected: float
    max_epsilon: float


def plan_round(context: Context, hospital: Any, options: PrivacyOptions, *, num_examples: int, batch_size: int,
               epochs: int, rounds: int) -> RoundPlan | Refusal:
    """The round's DP-SGD event, or a Refusal when it would pass the hospital's budget."""
    check_delta(options.delta, num_examples, hospital.node.hospital_name)
    event = planned_event(num_examples, batch_size, epochs, noise_multiplier=options.noise_multiplier,
                          target_epsilon=options.target_epsilon, delta=options.delta, rounds=rounds)
    key = data_key(hospital)
    ledger = ledger_for(hospital.node)
    before = run_events(context)
    lifetime = ledger.spending(key, options.delta) if ledger is not None else Spending(key, tuple(before), options.delta)
    cap = hospital.node.privacy_max_epsilon
    if cap is not None:
        spent = lifetime.epsilon
        projected = lifetime.with_event(event).epsilon
        if projected > cap:
            reason = (f"privacy budget spent: hospital {hospital.node.hospital_name!r} has spent epsilon {spent:.3f} "
                      f"(delta {options.delta:g}) on this data; this round would bring it to {projected:.3f}, over its "
                      f"privacy-max-epsilon {cap:g}")
            return Refusal(reason, spent, projected, cap)
    return RoundPlan(event, key, ledger, lifetime, before, cap)


def commit_round(context: Context, plan: RoundPlan, options: PrivacyOptions, *, hospital: str, server_round: int) -> Spending:
    """Write the round to the ledger (before it trains) and to this run's state; the lifetime total."""
    _save_run_events(context, [*plan.run_before, plan.event])
    if plan.ledger is None:
        return plan.lifetime_before.with_event(plan.event)
    return plan.ledger.record(plan.key, plan.event, hospital=hospital, delta=options.delta, server_round=server_round,
                              run=str(context.run_id))


def round_metrics(context: Context, plan: RoundPlan, lifetime: Spending, options: PrivacyOptions, taken: PrivacyEvent
                  ) -> dict[str, float | int]:
    """What the reply says about the round's privacy: this run's epsilon so far, the lifetime total, the event."""
    out: dict[str, float | int] = {
        "privacy-epsilon": epsilon_of(run_events(context), options.delta),
        "privacy-delta": float(options.delta),
        "privacy-lifetime-epsilon": float(lifetime.epsilon),
        "privacy-noise-multiplier": float(taken.noise_multiplier),
        "privacy-sample-rate": float(taken.sample_rate),
        "privacy-steps": int(taken.steps),
    }
    if plan.max_epsilon is not None:
        out["privacy-max-epsilon"] = float(plan.max_epsilon)
    return out


def refusal_reply(msg: Message, refusal: Refusal, options: PrivacyOptions, context: Context) -> Message:
    """The reply of a hospital whose budget is spent: no model, a metric saying so, and the reason."""
    metrics = MetricRecord({
        BUDGET_SPENT_KEY: 1,
        "privacy-epsilon": epsilon_of(run_events(context), options.delta),
        "privacy-lifetime-epsilon": float(refusal.spent),
        "privacy-next-epsilon": float(refusal.projected),
        "privacy-max-epsilon": float(refusal.max_epsilon),
        "privacy-delta": float(options.delta),
    })
    return Message(RecordDict({"metrics": metrics, REASON_RECORD: ConfigRecord({"reason": refusal.reason})}), reply_to=msg)


__all__ = ["BUDGET_SPENT_KEY", "PrivacyInputError", "REASON_RECORD", "Refusal", "RoundPlan", "check_delta", "commit_round",
           "data_key", "plan_round", "refusal_reply", "round_metrics", "run_events"]

"""Differential privacy as a round feature: each hospital's (epsilon, delta) on the record, the
hospitals whose own budget is spent (recorded, not asked again), and central DP (Flower's
server-side fixed-clipping wrapper around the strategy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common import log

from hospitrust.features.base import Round, RoundFeature, RunFacts
from hospitrust.privacy.client import BUDGET_SPENT_KEY
from hospitrust.privacy.options import SECTION, PrivacyOptions
from hospitrust.privacy.records import PrivacyRecords, check_before_training, settings
from hospitrust.records import PRIVACY_METRICS


def budget_spent_entry(reply: Message, hospital: str) -> dict[str, Any] | None:
    """The record of a reply that says the hospital's privacy budget is spent, else None.

    Parameters
    ----------
    reply : Message
        A train reply (untrusted: only finite numbers are kept, the reason is cut to 500 characters).
    hospital : str
        The replying hospital's name.

    Returns
    -------
    dict or None
        ``hospital``, ``node_id``, ``reason`` and the privacy metrics it sent (``PRIVACY_METRICS``' names).
    """
    if reply.has_error() or not reply.has_content() or "metrics" not in reply.content.metric_records:
        return None
    metrics = reply.content.metric_records["metrics"]
    if not metrics.get(BUDGET_SPENT_KEY):
        return None
    reason_record = reply.content.config_records.get("privacy")
    reason = str(reason_record.get("reason", "")) if reason_record is not None else ""
    entry: dict[str, Any] = {"hospital": hospital, "node_id": int(reply.metadata.src_node_id),
                             "reason": reason[:500] or "privacy budget spent"}
    for key, name in PRIVACY_METRICS.items():
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            entry[name] = float(value)
    return entry


class DifferentialPrivacy(RoundFeature):
    """The ``privacy`` section at the server (any mode but off).

    Parameters
    ----------
    options : PrivacyOptions
        The ``privacy`` section.
    hospitals : Mapping[int, str]
        Node id -> hospital name (the query round).
    model : torch.nn.Module
        A fresh model of the task (checked against Opacus before any round).
    rows : Sequence[Mapping[str, Any]]
        The query round's class counts (delta is checked against every hospital's training-set size).
    """

    name = "privacy"
    order = 30
    section, Options, doc = SECTION, PrivacyOptions, "privacy.md"

    @classmethod
    def for_run(cls, run: RunFacts) -> DifferentialPrivacy | None:
        options = run.cfg.section(PrivacyOptions)
        if options.mode == "off":
            return None
        from hospitrust.tasks.model import task_model

        return cls(options, run.hospitals, task_model(run.task), run.rows)

    def __init__(self, options: PrivacyOptions, hospitals: Mapping[int, str], model: Any,
                 rows: Sequence[Mapping[str, Any]]) -> None:
        check_before_training(options, model, rows)  # refused here, before any round
        self.options, self.hospitals = options, dict(hospitals)
        self.records = PrivacyRecords(options, list(self.hospitals.values()))
        self.central: Any | None = None  # the central-DP wrapper, once around the strategy
        # hospitals whose own privacy budget is spent: recorded, and not asked again in this run
        self.spent: dict[str, dict[str, Any]] = {}
        # round -> its budget-spent replies (the next round may start before this one is recorded)
        self.spent_in_round: dict[int, list[dict[str, Any]]] = {}
        self.overlaps_rounds = not options.central  # Flower's wrapper keeps the round's sample size

    def wrap_strategy(self, strategy: Any) -> Any:
        if not self.options.central:
            return strategy
        from hospitrust.features.central_privacy import CentralPrivacy

        self.central = CentralPrivacy(strategy, self.options, len(self.hospitals), feature=self.name)
        return self.central

    def settings(self) -> dict[str, Any]:
        return {"privacy": settings(self.options, self.central)}

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        history = checkpoint["history"]
        self.records.restore(history)
        if self.central is not None:
            self.central.restore(history)
        saved = checkpoint.get("features", {}).get(self.name)
        # a checkpoint of an earlier hospitrust kept the spent budgets in the strategy's state
        self.spent = dict(saved["budget_spent"] if saved else checkpoint.get("strategy_state", {}).get("budget_spent", {}))

    def before_round(self, rnd: Round) -> None:
        rnd.excluded |= set(self.spent)

    def on_replies(self, rnd: Round, replies: list[Message]) -> list[Message]:
        """A hospital that refused to train for its own budget: not a failure, not a bad update."""
        kept, spent = [], self.spent_in_round.setdefault(rnd.number, [])
        for reply in replies:
            node_id = int(reply.metadata.src_node_id)
            entry = budget_spent_entry(reply, self.hospitals.get(node_id, f"unknown-node-{node_id}"))
            if entry is None:
                kept.append(reply)
                continue
            spent.append(entry)
            self.spent[entry["hospital"]] = {"round": rnd.number, **entry}
            rnd.answered.add(node_id)
            log(WARNING, "Round %d: %s did not train: %s", rnd.number, entry["hospital"], entry["reason"])
        spent.sort(key=lambda e: (e["hospital"], e["node_id"]))  # hospital order, as the client entries
        return kept

    def record(self, rnd: Round) -> dict[str, Any]:
        assert rnd.result is not None
        spent = self.spent_in_round.pop(rnd.number, [])
        out: dict[str, Any] = {"budget_spent": spent} if spent else {}  # their own budget: not failed, not asked again
        out["privacy"] = self.records.round_entry(rnd.result.clients, spent, self.central, rnd.number)
        return out

    def state(self) -> dict[str, Any]:
        return {"budget_spent": dict(self.spent)} if self.spent else {}

    def summary(self) -> dict[str, Any]:
        return {"privacy": self.records.summary(self.central)}


__all__ = ["DifferentialPrivacy", "budget_spent_entry"]

"""The server's side of contribution scoring in a Flower round.

After aggregation the server tells each hospital in the aggregate its weight (in the
evaluate message); each replies with the scalars of ``client.hospital_report``. The server
turns the replies into a ``SecureRoundView`` (every value checked; a bad report is left
out with a reason) and scores it. This code reads the reply's metric record only: it has
no access to the hospitals' updates, and under secure aggregation there are none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, cast

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log

from hospitrust.contribution.interface import (
    REPORT_KEYS,
    WEIGHT_KEY,
    ContributionLedger,
    HospitalReport,
    SecureRoundView,
    score_round,
)
from hospitrust.records import HospitalRecord, RoundRecord


def round_weights(clients: Iterable[HospitalRecord]) -> dict[int, float]:
    """Node id -> aggregation weight of the hospitals whose update is in this round's aggregate.

    Parameters
    ----------
    clients : Iterable[HospitalRecord]
        The round's hospital records (``RoundResult.clients``).

    Returns
    -------
    dict[int, float]
        Node id -> weight, for the hospitals with a positive weight.
    """
    return {c.node_id: float(c.weight) for c in clients if not c.rejected and c.selected and c.weight > 0.0}


def with_weights(messages: Iterable[Message], weights: Mapping[int, float]) -> list[Message]:
    """The evaluate messages, each hospital in the aggregate also told its own weight.

    Parameters
    ----------
    messages : Iterable[Message]
        The strategy's evaluate messages.
    weights : Mapping[int, float]
        Node id -> aggregation weight (:func:`round_weights`).

    Returns
    -------
    list[Message]
        The messages, those to a weighted hospital rebuilt with ``contribution-weight`` in their config.
    """
    out = []
    for m in messages:
        nid = int(m.metadata.dst_node_id)
        if nid not in weights:
            out.append(m)
            continue
        # an evaluate message (strategies.base.configure_evaluate): its "config" is a ConfigRecord
        config = ConfigRecord({**dict(cast(ConfigRecord, m.content["config"])), WEIGHT_KEY: float(weights[nid])})
        content = RecordDict({"arrays": m.content["arrays"], "config": config})
        out.append(Message(content, dst_node_id=nid, message_type=m.metadata.message_type))
    return out


def parse_report(hospital: str, metrics: Mapping[str, Any], expected_weight: float) -> HospitalReport:
    """A hospital's reported scalars; raises ValueError with the reason when unusable.

    Parameters
    ----------
    hospital : str
        The hospital's name.
    metrics : Mapping[str, Any]
        Its evaluate reply's metrics.
    expected_weight : float
        The weight the server sent it (its report must repeat it).

    Returns
    -------
    HospitalReport
        The checked report.
    """
    missing = [k for k in REPORT_KEYS.values() if k not in metrics]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    values = {field: metrics[key] for field, key in REPORT_KEYS.items()}
    report = HospitalReport(hospital=hospital, **values)
    if not math.isclose(report.weight, expected_weight, rel_tol=1e-6, abs_tol=1e-9):
        raise ValueError(f"reports weight {report.weight}, the server sent {expected_weight}")
    return report


class ContributionTracker:
    """Collects the reports round by round, scores them and keeps the ledger.

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name.
    """

    def __init__(self, hospitals: Mapping[int, str]) -> None:
        self.hospitals = dict(hospitals)
        self.ledger = ContributionLedger()
        self.weights: dict[int, dict[int, float]] = {}  # round -> node id -> weight sent

    def restore(self, history: Iterable[RoundRecord]) -> None:
        """Rebuild the ledger from earlier rounds' records (a resumed run)."""
        from hospitrust.contribution.interface import SCORES, RoundScores

        self.ledger = ContributionLedger()
        for rec in history:
            c = rec.entries.get("contribution") or {}
            if c.get("scored"):
                names = list(c["hospitals"])
                self.ledger.add(RoundScores(int(c["round"]), names,
                                            {s: [float(c["hospitals"][h].get(s, math.nan)) for h in names] for s in SCORES},
                                            float(c["total_gain"])))

    def ask(self, server_round: int, record, messages: Iterable[Message]) -> list[Message]:
        """The round's evaluate messages, with each hospital in the aggregate told its weight.
        ``record`` is the strategy's RoundResult (``clients``, ``kept_previous_model``).
        """
        weights = {} if record.kept_previous_model else round_weights(record.clients)
        self.weights[server_round] = weights
        return with_weights(messages, weights)

    def score(self, server_round: int, replies: Iterable[Message]) -> dict[str, Any]:
        """The round's record for rounds.jsonl: scores per hospital, left-out reports with
        reasons (the ledger's totals, :meth:`totals`, include the round's scores).
        """
        return self._score(server_round, self.weights.pop(server_round, {}), replies)

    def totals(self) -> dict[str, dict[str, float]]:
        """Hospital name -> score name -> its total over the rounds scored so far (the ledger's)."""
        return self.ledger.totals()

    def _score(self, server_round: int, weights: Mapping[int, float], replies: Iterable[Message]) -> dict[str, Any]:
        reports, problems = [], {}
        for reply in replies:
            nid = int(reply.metadata.src_node_id)
            if nid not in weights:
                continue
            name = self.hospitals.get(nid, f"unknown-node-{nid}")
            try:
                if reply.has_error():
                    raise ValueError(f"error reply: {(reply.error.reason or '').strip()[:200]}")
                metrics = reply.content.metric_records.get("metrics")
                if metrics is None:
                    raise ValueError("no metrics record")
                reports.append(parse_report(name, dict(metrics), weights[nid]))
            except (ValueError, TypeError) as exc:
                problems[name] = str(exc)
                log(WARNING, "Round %d: contribution report of %s left out: %s", server_round, name, exc)
        for nid in weights:
            name = self.hospitals.get(nid, f"unknown-node-{nid}")
            if name not in problems and name not in {r.hospital for r in reports}:
                problems[name] = "no evaluate reply"
        if len(reports) < 2:
            return {"round": server_round, "scored": False, "left_out": problems,
                    "note": f"{len(reports)} usable contribution report(s): at least 2 are needed"}
        view = SecureRoundView(round=server_round, total_weight=float(sum(r.weight for r in reports)), reports=tuple(reports))
        scores = score_round(view)
        self.ledger.add(scores)
        return {"scored": True, **scores.to_record(), "left_out": problems}

    def summary(self) -> dict[str, Any]:
        return {"totals": self.ledger.totals(), "payout_share_fp": self.ledger.payout_shares("fp"),
                "payout_share_ee": self.ledger.payout_shares("ee"), "rounds_scored": len(self.ledger.rounds)}

    def write(self, folder: str | Path) -> None:
        csv_path, json_path = self.ledger.write(folder)
        log(INFO, "hospitrust: contribution ledger %s", csv_path)

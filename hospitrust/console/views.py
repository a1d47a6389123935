"""What the console and the report show, computed from a run's records (pure functions of its
rounds, ``rounds.jsonl`` read as :class:`~hospitrust.records.RoundRecord`): the metrics per round, one row per hospital and round, each
hospital's trust over the rounds, and the alerts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app.plots import run_trust_signal

PRE_AGGREGATION = "pre-aggregation"  # the pre-aggregation feature's name: its signals in a hospital record
METRICS = ("balanced_accuracy", "auc", "accuracy", "worst_class_recall", "macro_f1", "rare_class_macro_f1",
           "attack_success_rate")
# a rule's signals: (its name in a hospital record, the label shown); the present ones are shown
SIGNALS = (
    ("s", "s"), ("m", "m"), ("v", "v"), ("reputation", "reputation"),       # HTA (and EARN's HTA base)
    ("earn_trust", "EARN trust"), ("evidence", "evidence"),                  # EARN: per rare class
    ("benchmark_error_used", "E"), ("divergence", "D"), ("trust", "trust"),  # FedAgain (trust also FLTrust)
    ("krum_score", "Krum score"), ("clip_factor", "clip"),                   # Multi-Krum, centered clipping
    ("accumulated_score", "score"),                                          # contribution-weighted
)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def metric_series(rounds: Sequence[RoundRecord]) -> dict[str, list[float | None]]:
    """Per metric, its value in each round (central evaluation; the hospitals' mean accuracy too)."""
    out: dict[str, list[float | None]] = {"round": [float(r.number) for r in rounds]}
    for metric in METRICS:
        values = [_num(r.central.get(metric)) for r in rounds]
        if any(v is not None for v in values):
            out[metric] = values
    fed = [_num((r.fairness or {}).get("mean")) for r in rounds]
    if any(v is not None for v in fed):
        out["hospital_mean_accuracy"] = fed
    return out


def trust_series(rounds: Sequence[RoundRecord], hospitals: Sequence[str]) -> dict[str, Any]:
    """Each hospital's trust per round: the signal the rule names (reputation, trust), else its weight."""
    values: dict[str, list[float | None]] = {h: [] for h in hospitals}
    marks: dict[str, list[int]] = {h: [] for h in hospitals}  # rounds where it was rejected, left out or flagged
    for r in rounds:
        seen = {}
        for c in r.clients:
            if (value := r.trust_of(c)) is not None:
                seen[c.hospital] = value
            if c.rejected or c.flagged or not c.selected:
                marks.setdefault(c.hospital, []).append(r.number)
        for h in hospitals:
            values.setdefault(h, []).append(seen.get(h))
    return {"signal": run_trust_signal(rounds), "values": values, "marks": marks}


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping):
        parts = [f"{k}: {_fmt(v)}" for k, v in value.items()]
        return "{" + ", ".join(parts) + "}" if parts else ""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value[:10]) + (", ..." if len(value) > 10 else "") + "]"
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else "nan"
    return str(value)


def pre_aggregation_text(entry: Mapping[str, Any]) -> str:
    """A client entry's ``pre_aggregation`` in a line: what each step of the chain did to its row."""
    parts = []
    for step in entry.get("steps") or []:
        name = str(step.get("step", "?"))
        if "factor" in step:
            parts.append(f"{name} x{_fmt(float(step['factor']))}" if step.get("clipped") else f"{name} unclipped")
        elif "neighbours" in step:
            parts.append(f"{name} mean of {', '.join(map(str, step['neighbours']))}")
        elif "bucket" in step:
            parts.append(f"bucket {' + '.join(map(str, step['bucket']))}")
        else:
            parts.append(name)
    return " -> ".join(parts)


def signals_of(client: HospitalRecord, trust_signal: str = "trust") -> list[list[str]]:
    """[label, value] of the rule's signals recorded for this hospital in this round (and what
    pre-aggregation did to its update before the rule saw it). The record's ``trust`` is shown as
    ``trust`` only where the rule's trust signal is that (else it repeats the signal it names).
    """
    out = []
    for key, label in SIGNALS:
        if key == "trust":
            value = client.trust if trust_signal == "trust" else client.signal("trust")
        else:
            value = client.signal(key)
        if value is not None:
            out.append([label, _fmt(value)])
    chain = client.signals.get(PRE_AGGREGATION)
    if chain:
        out.append(["pre-aggregation", pre_aggregation_text(chain)])
    return out


NODE_UNAVAILABLE = "Flower answered Node Unavailable: its SuperNode sent no heartbeat (killed, or its machine down)"


def hospital_rows(record: RoundRecord, hospitals: Sequence[str], ground_truth: bool) -> list[dict[str, Any]]:
    """One row per hospital of the federation for one round: what happened to it and why."""
    by_name = {c.hospital: c for c in record.clients}
    missing, offline = set(record.missing), set(record.offline)
    unavailable, rejoined = set(record.node_unavailable), set(record.rejoined)
    unresponsive = set(record.unresponsive)
    accuracy = record.hospital_accuracy
    contribution = ((record.entries.get("contribution") or {}).get("hospitals")) or {}
    spent = {b["hospital"]: b for b in record.entries.get("budget_spent", [])}
    privacy = ((record.entries.get("privacy") or {}).get("hospitals")) or {}
    rows = []
    for name in hospitals:
        c = by_name.get(name)
        if c is not None:
            status = "rejected" if c.rejected else ("excluded" if not c.selected else "replied")
            reason = c.reason or c.exclusion_reason()
        elif name in spent:  # its own privacy budget: not failed
            status, reason = "budget spent", str(spent[name].get("reason", "privacy budget spent"))
        elif (privacy.get(name) or {}).get("budget_spent"):  # ran out in an earlier round: not asked again
            status = "budget spent"
            reason = f"since round {privacy[name].get('budget_spent_round', '?')}: {privacy[name].get('reason', '')}".rstrip(": ")
        elif name in unavailable:  # Flower's own error reply: its SuperNode stopped sending heartbeats
            status, reason = "node unavailable", NODE_UNAVAILABLE
        elif name in missing:
            status, reason = "missing", "asked, no reply within reply-timeout" + (
                " though online at the SuperLink (unresponsive)" if name in unresponsive else "")
        elif name in offline:
            status, reason = "offline", "offline at the SuperLink: not asked"
        elif name in rejoined:
            status, reason = "rejoined", "offline when the round began (not asked), back online by its end"
        else:
            status, reason = "not asked", ""
        if name in rejoined and status == "replied":
            reason = reason or "back after missing the previous round"
        rows.append({
            "hospital": name,
            "status": status,
            "reason": reason,
            "online": status not in ("offline", "node unavailable"),
            "weight": _num(c.weight) if c is not None else None,
            "num_examples": c.num_examples if c is not None else None,
            "flagged": bool(c is not None and c.flagged),
            "malicious": bool(c is not None and c.malicious) if ground_truth else None,
            "signals": signals_of(c, record.trust_signal) if c is not None else [],
            "duplicates_of": list((c.signal("duplicates_of") if c is not None else None) or []),
            "accuracy": None if status in ("offline", "node unavailable") else _num(accuracy.get(name)),
            "contribution": {k: _num(v) for k, v in (contribution.get(name) or {}).items()
                             if k in ("fp", "ee", "loo", "ioi", "cos")},
            # local DP: the (epsilon, delta) its own accountant reports after this round (None without DP)
            "privacy": ({"epsilon": _num(privacy[name].get("epsilon")), "delta": _num(privacy[name].get("delta")),
                         "budget_spent": bool(privacy[name].get("budget_spent"))} if name in privacy else None),
        })
    return rows


def rare_holders(class_counts: Mapping[str, Sequence[int]]) -> set[str]:
    """The hospitals holding at least a fair share of the federation's rarest class."""
    if not class_counts:
        return set()
    rows = [list(v) for v in class_counts.values()]
    totals = [sum(col) for col in zip(*rows)]
    present = [i for i, t in enumerate(totals) if t > 0]
    if not present:
        return set()
    rare = min(present, key=lambda i: totals[i])
    fair = totals[rare] / len(rows)
    return {h for h, counts in class_counts.items() if counts[rare] > 0 and counts[rare] >= fair}


def round_alerts(record: RoundRecord, *, offline_before: set[str], ground_truth: bool,
                 rare: set[str]) -> list[dict[str, Any]]:
    """What an operator should see at once about one round."""
    rnd = record.number
    out: list[dict[str, Any]] = []
    for c in record.clients:
        name = c.hospital
        reason = c.reason
        if c.rejected and ("NaN" in reason or "Inf" in reason or "overflows" in reason):
            out.append({"round": rnd, "kind": "non-finite", "hospital": name,
                        "text": f"round {rnd}: {name}'s update was rejected: {reason}"})
        elif c.rejected:
            out.append({"round": rnd, "kind": "rejected", "hospital": name, "text": f"round {rnd}: {name} rejected: {reason}"})
        if c.signal("excluded") or c.excluded:
            why = c.exclusion_reason() or "left out of the aggregate"
            out.append({"round": rnd, "kind": "excluded", "hospital": name, "text": f"round {rnd}: {name} excluded: {why}"})
        if ground_truth and name in rare and c.flagged and not c.malicious:
            out.append({"round": rnd, "kind": "rare-holder-flagged", "hospital": name,
                        "text": f"round {rnd}: {name}, an honest holder of the rarest class, was flagged"})
    for b in record.entries.get("budget_spent", []):
        out.append({"round": rnd, "kind": "budget-spent", "hospital": b["hospital"],
                    "text": f"round {rnd}: {b['hospital']} did not train: {b.get('reason', 'privacy budget spent')}"})
    for name in sorted(set(record.offline) - offline_before):
        out.append({"round": rnd, "kind": "offline", "hospital": name,
                    "text": f"round {rnd}: {name} went offline at the SuperLink (not asked)"})
    unavailable = set(record.node_unavailable)
    for name in record.missing:
        if name in unavailable:
            out.append({"round": rnd, "kind": "node-unavailable", "hospital": name,
                        "text": f"round {rnd}: {name} unavailable: {NODE_UNAVAILABLE}"})
        else:
            out.append({"round": rnd, "kind": "missing", "hospital": name, "text": f"round {rnd}: {name} did not reply"})
    for name in record.rejoined:
        out.append({"round": rnd, "kind": "rejoined", "hospital": name, "text": f"round {rnd}: {name} rejoined"})
    if record.kept_previous_model:
        out.append({"round": rnd, "kind": "kept-model", "hospital": "", "text": f"round {rnd}: {record.note}"})
    return out


def all_alerts(rounds: Iterable[RoundRecord], *, ground_truth: bool, rare: set[str],
               left_out: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every round's alerts, after the hospitals that could not join (the query round, ``left_out``)."""
    out: list[dict[str, Any]] = [
        {"round": 0, "kind": "left-out", "hospital": f.get("hospital", ""),
         "text": f"{f.get('hospital', 'a hospital')} could not join: {f.get('reason', '')}"} for f in left_out]
    offline: set[str] = set()
    for record in rounds:
        out += round_alerts(record, offline_before=offline, ground_truth=ground_truth, rare=rare)
        offline = set(record.offline)
    return out

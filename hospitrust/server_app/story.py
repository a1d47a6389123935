"""What the terminal says a rule did: per round, the hospitals rejected, excluded or down-weighted
by name, and under a simulated attack the flagged hospitals against the true attackers; at the end,
the run's detection rates. Plain functions of a round's hospital records (``RoundRecord.clients``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hospitrust.records import HospitalRecord
from hospitrust.server_app.records import flagged_hospitals

MAX_NAMES = 6  # names shown per list; the rest as "+N more" (rounds.jsonl has them all)


def _names(hospitals: Sequence[str]) -> str:
    shown = ", ".join(hospitals[:MAX_NAMES])
    return shown + (f" +{len(hospitals) - MAX_NAMES} more" if len(hospitals) > MAX_NAMES else "")


def rule_actions(clients: Sequence[HospitalRecord]) -> dict[str, list[str]]:
    """The round's hospitals by what happened to their reply: ``rejected`` (failed validation),
    ``excluded`` (valid, left out by the rule), ``down-weighted`` (kept, but flagged by the rule or
    given less than half the share FedAvg would give it: its examples over the kept replies').
    """
    out: dict[str, list[str]] = {"rejected": [], "excluded": [], "down-weighted": []}
    kept = [c for c in clients if not c.rejected and c.selected]
    examples = sum(float(c.num_examples) for c in kept)
    for c in clients:
        if c.rejected:
            out["rejected"].append(c.hospital)
        elif not c.selected:
            out["excluded"].append(c.hospital)
        elif c.flagged or (examples > 0 and c.weight < 0.5 * float(c.num_examples) / examples):
            out["down-weighted"].append(c.hospital)
    return {k: sorted(v, key=_natural) for k, v in out.items()}


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def round_story(clients: Sequence[HospitalRecord], truth: Mapping[str, bool] | None) -> str:
    """``" | excluded hospital-6, hospital-7 | attackers flagged 2/2 ..."``: what follows a round's
    progress line; ``truth`` (hospital -> attacker) only for a simulated attack.
    """
    actions = rule_actions(clients)
    did = [f"{what} {_names(names)}" for what, names in actions.items() if names]
    parts = ["; ".join(did) if did else "rule kept every reply"]
    if truth is not None:
        flagged = {h for h, bad in flagged_hospitals(clients).items() if bad}  # as the run's detection rates count
        present = [c.hospital for c in clients]
        attackers = sorted((h for h in present if truth.get(h, False)), key=_natural)
        caught = [h for h in attackers if h in flagged]
        missed = [h for h in attackers if h not in flagged]
        honest = sorted((h for h in flagged if not truth.get(h, False)), key=_natural)
        text = f"attackers flagged {len(caught)}/{len(attackers)}"
        if missed:
            text += f" (missed {_names(missed)})"
        text += f", honest flagged {len(honest)}" + (f" ({_names(honest)})" if honest else "")
        parts.append(text)
    return "  | " + " | ".join(parts)


def detection_line(security: Mapping[str, Any]) -> str:
    """The summary table's last line under an attack: TPR and FPR over all hospital-rounds."""
    def rate(value: float) -> str:
        return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"

    tp, fn, fp, tn = (int(security[k]) for k in ("tp", "fn", "fp", "tn"))
    return (f"detection over all hospital-rounds: TPR {rate(security['tpr'])} ({tp} of {tp + fn} attacker replies "
            f"flagged)  FPR {rate(security['fpr'])} ({fp} of {fp + tn} honest replies flagged)")

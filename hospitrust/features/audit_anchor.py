"""The hospitals' audit-log heads, as their train replies carry them: the federation's copy of each log's progress.

A hospital's gate (``hospitrust.ops.deploy.gate``, with ``deploy supernode --audit-log``) adds to each train reply the
head of its audit log at that message (:data:`hospitrust.ops.deploy.audit.ANCHOR_RECORD`: the number of entries and
the last entry's MAC, nothing else). This feature records them per hospital in the round's line of rounds.jsonl
(``audit_heads``), so that ``hospitrust deploy audit LOG --against RUN_DIR`` can check a hospital's log against what
the federation saw: a log rolled back to an older copy no longer holds the entries the federation saw (issue 61).
A reply without one (no audit log, a simulation) records nothing; a malformed one is recorded as such, never raised.
"""

from __future__ import annotations

import re
from typing import Any

from flwr.app import Message

from hospitrust.features.base import Round, RoundFeature, RunFacts

ANCHOR_RECORD = "audit-head"  # hospitrust.ops.deploy.audit.ANCHOR_RECORD (kept apart: the server imports no deploy code)
_MAC = re.compile(r"[0-9a-f]{64}")


def anchor_of(reply: Message) -> dict[str, Any] | None:
    """The audit head a reply carries ({"entries", "mac"}), {"malformed": True} for one that is not a head, or None."""
    if not reply.has_content():
        return None
    record = reply.content.config_records.get(ANCHOR_RECORD)
    if record is None:
        return None
    entries, mac = record.get("entries"), record.get("mac")
    if isinstance(entries, int) and not isinstance(entries, bool) and entries >= 0 and isinstance(mac, str) \
            and _MAC.fullmatch(mac):
        return {"entries": entries, "mac": mac}
    return {"malformed": True}


class AuditAnchors(RoundFeature):
    """Records the audit-log head each hospital's train reply carries, per round (``audit_heads`` in rounds.jsonl).

    Parameters
    ----------
    hospitals : dict[int, str]
        Node id -> hospital name.
    """

    name = "audit-anchors"
    order = 5  # before the features that drop replies (a budget refusal still carries the head it was sent with)

    @classmethod
    def for_run(cls, run: RunFacts) -> AuditAnchors:
        return cls(run.hospitals)

    def __init__(self, hospitals: dict[int, str]) -> None:
        self.hospitals = dict(hospitals)
        self.heads: dict[int, dict[str, dict[str, Any]]] = {}

    def on_replies(self, rnd: Round, replies: list[Message]) -> list[Message]:
        for reply in replies:
            anchor = anchor_of(reply)
            if anchor is not None:
                node_id = int(reply.metadata.src_node_id)
                self.heads.setdefault(rnd.number, {})[self.hospitals.get(node_id, f"node {node_id}")] = anchor
        return replies

    def record(self, rnd: Round) -> dict[str, Any]:
        heads = self.heads.pop(rnd.number, None)
        return {"audit_heads": dict(sorted(heads.items()))} if heads else {}

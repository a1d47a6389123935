"""The round in flight, as it goes: ``RUN_DIR/progress.jsonl``, one line per event, appended and flushed.

``asked`` (the round, the hospitals asked, the reply timeout), then one ``replied`` or ``error`` line per
reply as it arrives (an error carries the reason as recorded: a hospital's refusal as it stated it), or
``unavailable`` when Flower's SuperLink answered for the hospital "Node Unavailable" (its SuperNode stopped
sending heartbeats: killed, or its machine down).
``rounds.jsonl`` still holds the round's record once it is done; this file is what the console shows
while it is not: who has been asked, who replied, who is late (past a share of ``reply-timeout``),
who refused and why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Message

from hospitrust.server_app.transport import node_unavailable
from hospitrust.strategies.validation import error_reason

PROGRESS = "progress.jsonl"  # read by hospitrust.console.progress (which imports no torch nor Flower)


class RoundProgress:
    """Writes the events of the rounds' train exchanges (``Sent``'s ``on_reply`` calls ``replied``)."""

    def __init__(self, run_dir: Path, hospitals: Mapping[int, str]) -> None:
        self.path, self.hospitals = Path(run_dir) / PROGRESS, dict(hospitals)

    def _write(self, event: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"time": round(time.time(), 3), **event}) + "\n")

    def asked(self, rnd: int, node_ids: list[int], reply_timeout: float) -> None:
        self._write({"round": rnd, "event": "asked", "reply_timeout": reply_timeout,
                     "hospitals": [self.hospitals.get(int(n), f"node {n}") for n in node_ids]})

    def replied(self, rnd: int, reply: Message, node_id: int | None = None) -> None:
        """One reply; ``node_id``: the hospital it is about (the SuperLink's own error replies come from node 1)."""
        nid = int(reply.metadata.src_node_id) if node_id is None else int(node_id)
        name = self.hospitals.get(nid, f"node {nid}")
        if node_unavailable(reply):
            self._write({"round": rnd, "event": "unavailable", "hospital": name,
                         "reason": "node unavailable: Flower's SuperLink got no heartbeat from its SuperNode"})
        elif reply.has_error():
            self._write({"round": rnd, "event": "error", "hospital": name, "reason": error_reason(reply.error.reason)})
        else:
            self._write({"round": rnd, "event": "replied", "hospital": name})

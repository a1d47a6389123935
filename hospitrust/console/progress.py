"""The round in flight, read from ``RUN_DIR/progress.jsonl`` (written by ``hospitrust.server_app.progress``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

PROGRESS = "progress.jsonl"
LATE_SHARE = 0.5  # a hospital still silent after this share of reply-timeout is shown late


def round_in_flight(path: Path, rounds_done: int, *, late_share: float = LATE_SHARE, now: float | None = None) -> dict[str, Any] | None:
    """The latest round ``progress.jsonl`` shows that ``rounds.jsonl`` does not hold yet: asked, replied,
    refused (errors, with reasons), unavailable (Flower answered "Node Unavailable" for it), and waiting, each
    waiting hospital late once ``late_share`` of the reply timeout has passed since it was asked. None when no
    round is in flight (the caller also shows none once the run stopped or failed).
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    current = max((e["round"] for e in events if e.get("event") == "asked"), default=0)
    if current <= rounds_done:
        return None
    mine = [e for e in events if e.get("round") == current]
    asked = next(e for e in mine if e["event"] == "asked")
    replied = [e["hospital"] for e in mine if e["event"] == "replied"]
    errors = {e["hospital"]: e["reason"] for e in mine if e["event"] == "error"}
    unavailable = {e["hospital"]: e["reason"] for e in mine if e["event"] == "unavailable"}
    waiting = [h for h in asked["hospitals"] if h not in replied and h not in errors and h not in unavailable]
    waited = (time.time() if now is None else now) - asked["time"]
    late = waited > late_share * float(asked.get("reply_timeout") or float("inf"))
    return {"round": current, "asked": asked["hospitals"], "replied": replied, "errors": errors,
            "unavailable": unavailable, "waiting": waiting,
            "late": waiting if late else [], "waited_seconds": round(waited, 1), "reply_timeout": asked.get("reply_timeout")}

"""A grid folder's event log, ``bench.jsonl``: worker start-up, cells done or failed with their timings, interruptions."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def append_event(out: Path, event: dict[str, Any]) -> None:
    """One event line in ``bench.jsonl``, stamped with the time."""
    with open(out / "bench.jsonl", "a") as fh:
        fh.write(json.dumps({"time": time.time(), **event}) + "\n")


def read_events(out: Path) -> list[dict[str, Any]]:
    """The grid folder's events (``bench.jsonl``) in order; a line cut short by a kill is skipped."""
    path = Path(out) / "bench.jsonl"
    events = []
    for raw in path.read_text().splitlines() if path.is_file() else []:
        try:
            events.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return events

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


def code_version() -> dict[str, Any]:
    """The code a grid session runs: the git commit of hospitrust's checkout and whether tracked files differ from
    it (``dirty``), else the installed package's version: every part of a grid records what it ran.
    """
    import subprocess

    import hospitrust

    root = Path(hospitrust.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        commit = None
    if commit is not None and commit.returncode == 0 and status.returncode == 0:
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    return {"version": getattr(hospitrust, "__version__", "unknown")}

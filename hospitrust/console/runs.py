"""Reading run directories as they grow, for the console and the static report.

A run directory is written by the ServerApp (``hospitrust.server_app.results``); the console
only reads it: ``rounds.jsonl`` incrementally (the bytes appended since the last read, whole
lines only), ``config.json``, ``summary.json``, ``class_counts.csv`` and ``failed.json``. It
never writes there and never takes the ServerApp's lock for longer than a non-blocking probe.
A run that failed in its query round has only ``failed.json`` (and ``flower-runs.jsonl``): it is
listed too, with its error.

Flower knows a SuperNode by node id only; a hospital's name is what its SuperNode said in a query
round. A node id fixed by the hospital's registered key keeps it across runs, so the console names a
``node N`` (a hospital silent or unavailable at the query round) from any run that learnt its name.
"""

from __future__ import annotations

import csv
import fcntl
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hospitrust.config import legacy
from hospitrust.records import RoundRecord

RUNNING_GRACE = 900.0  # seconds without a new round after which an unlocked, unfinished run counts as stopped
FLOWER_POLL = 10.0  # seconds between two questions to the SuperLink about one run's status
FLOWER_RUNS = "flower-runs.jsonl"  # hospitrust.server_app.results.FLOWER_RUNS (the console imports no torch)
FlowerStatus = Callable[[int], tuple[str, str]]


#: the files any run directory has, whatever the stage it reached (failed.json: a failure in the query round)
RUN_FILES = ("config.json", "rounds.jsonl", "failed.json")
_NODE = re.compile(r"\bnode (\d+)\b")


def is_run_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_FILES)


def name_nodes(text: str, names: dict[str, str]) -> str:
    """``text`` with each ``node N`` whose name is known written ``NAME (node N)``."""
    if not names or "node " not in text:
        return text
    return _NODE.sub(lambda m: f"{names[m.group(1)]} (node {m.group(1)})" if m.group(1) in names else m.group(0), text)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


class RunReader:
    """One run directory, read incrementally: ``refresh`` parses the rounds appended since."""

    def __init__(self, path: Path, run_id: str, flower_status: FlowerStatus | None = None,
                 names: Callable[[], dict[str, str]] | None = None) -> None:
        self.path, self.id = Path(path), run_id
        self.names = names or dict  # node id -> hospital name, from every run the console reads
        self.flower_status = flower_status  # Flower run id -> (status, details), through the operator's connection
        self._flower: tuple[float, tuple[str, str] | None] = (0.0, None)
        self.rounds: list[RoundRecord] = []
        self._names: set[str] = set()  # every hospital the rounds mention
        self._offset = 0
        self._head = b""  # the file's first bytes: a rewritten rounds.jsonl (a resume) starts over
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.failure: dict[str, Any] | None = None
        self.class_counts: dict[str, list[int]] = {}
        self.class_names: list[str] = []

    # ---- reading ---------------------------------------------------------------------
    def refresh(self) -> int:
        """Read what changed; returns the number of new rounds."""
        if not self.config:
            raw = _read_json(self.path / "config.json")
            if raw:
                self.config, _ = legacy.translate(raw)
                self.class_names = [str(n) for n in self.config.get("class-names", [])]
        if not self.class_counts:
            self.class_counts = self._read_class_counts()
        if self.summary is None:
            self.summary = _read_json(self.path / "summary.json")
        self.failure = _read_json(self.path / "failed.json")
        return self._read_rounds()

    def _read_rounds(self) -> int:
        path = self.path / "rounds.jsonl"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return 0
        with open(path, "rb") as fh:
            head = fh.read(64)
            if size < self._offset or (self._head and not head.startswith(self._head[: len(head)])):
                self.rounds, self._offset, self._names = [], 0, set()  # rewritten (a resume drops rounds after its checkpoint)
            self._head = head
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n")
        if end < 0:
            return 0
        new = 0
        for line in chunk[: end + 1].splitlines():
            if line.strip():
                try:
                    record = RoundRecord.from_json(line)
                except (json.JSONDecodeError, ValueError, TypeError, KeyError):
                    continue  # a line cut short by a crash, or not a round: the next whole line still counts
                self.rounds.append(record)
                self._names |= {c.hospital for c in record.clients}
                self._names |= set(record.missing) | set(record.offline)
                self._names |= {b["hospital"] for b in record.entries.get("budget_spent", [])}
                new += 1
        self._offset += end + 1
        return new

    def _read_class_counts(self) -> dict[str, list[int]]:
        path = self.path / "class_counts.csv"
        out: dict[str, list[int]] = {}
        try:
            with open(path, newline="") as fh:
                rows = list(csv.reader(fh))
        except OSError:
            return out
        for row in rows[1:]:
            if len(row) >= 3 and row[1] == "train":
                try:
                    out[row[0]] = [int(v) for v in row[2:-1]]
                except ValueError:
                    continue
        return out

    # ---- what it says ------------------------------------------------------------------
    def lock_held(self) -> bool:
        """Whether a ServerApp holds the run directory's lock (a non-blocking probe, released at once)."""
        lock = self.path / ".lock"
        if not lock.exists():
            return False
        try:
            with open(lock, "a+") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(fh, fcntl.LOCK_UN)
        except OSError:
            return False
        return False

    def flower_run_id(self) -> int | None:
        """The Flower run that writes (or last wrote) this directory, from ``flower-runs.jsonl``."""
        try:
            lines = (self.path / FLOWER_RUNS).read_text().splitlines()
            return int(json.loads(lines[-1])["run_id"]) if lines else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def flower_state(self) -> tuple[str, str] | None:
        """Flower's own (status, details) of the run, asked at most every ``FLOWER_POLL`` seconds; None when there
        is no connection to ask, no run id on record, or the SuperLink did not answer.
        """
        run_id = self.flower_run_id() if self.flower_status is not None else None
        if run_id is None or self.flower_status is None:
            return None
        asked, state = self._flower
        if time.monotonic() - asked >= FLOWER_POLL or state is None:
            answer = self.flower_status(run_id)
            state = None if answer[0] == "unknown" else answer
            self._flower = (time.monotonic(), state)
        return state

    @property
    def status(self) -> str:
        """running, completed, failed, or stopped: from the run's own records, then Flower's status of its run
        (when the console has the operator's connection), then its lock and how recently it wrote.
        """
        if self.summary is not None:
            return "completed"
        if self.failure is not None:
            return "failed"
        flower = self.flower_state()
        if flower is not None and flower[0].startswith("finished"):
            # an orphaned ServerApp may still hold the lock; a run Flower completed without a summary failed here
            return "stopped" if flower[0] == "finished:stopped" else "failed"
        if flower is not None:
            return "running"
        if self.lock_held():
            return "running"
        path = self.path / "rounds.jsonl" if (self.path / "rounds.jsonl").exists() else self.path / "config.json"
        try:
            recent = time.time() - path.stat().st_mtime < RUNNING_GRACE
        except OSError:
            recent = False
        return "running" if recent else "stopped"

    @property
    def resumed_at(self) -> list[int]:
        if self.summary:
            return [int(r) for r in self.summary.get("resumed_at", [])]
        return []

    @property
    def hospitals(self) -> list[str]:
        known = self.config.get("hospitals")
        names = set(known.values()) if isinstance(known, dict) else set()
        return sorted(names | self._names, key=_natural)

    @property
    def ground_truth(self) -> bool:
        """Whether the run recorded its malicious set (a simulation): only then can the console
        tell an honest hospital from an attacker.
        """
        return bool(self.config.get("ground-truth", False))

    def _flower_failure(self, status: str) -> str:
        return _flower_failure_text(self._flower[1]) if status in ("stopped", "failed") else ""

    def row(self) -> dict[str, Any]:
        """The run list's row."""
        central = self.rounds[-1].central if self.rounds else {}
        status = self.status
        return {
            "id": self.id,
            "name": self.path.name,
            "status": status,
            "resumed_at": self.resumed_at,
            "strategy": self.config.get("strategy", (self.summary or {}).get("strategy", "")),
            # the task (a dataset flag is a built-in task): what the run learned
            "task": (self.config.get("task-resolved") or {}).get("name")
            or self.config.get("dataset", (self.summary or {}).get("dataset", "")),
            "left_out": self.left_out,
            "attack": self.config.get("attack", "none"),
            "privacy": self.config.get("privacy.mode", "off"),  # differential privacy (docs/privacy.md)
            "hospitals": len(self.hospitals),
            "rounds_done": len(self.rounds),
            "rounds_total": self.config.get("num-server-rounds"),
            "balanced_accuracy": central.get("balanced_accuracy"),
            "failure": name_nodes((self.failure or {}).get("error", "") or self._flower_failure(status), self.names()),
            "updated": _mtime(self.path / "rounds.jsonl") or _mtime(self.path / "config.json")
            or _mtime(self.path / "failed.json"),
        }

    @property
    def left_out(self) -> list[dict[str, Any]]:
        """The hospitals left out at the query round, a ``node N`` named where another run learnt its name."""
        names = self.names()
        out = []
        for f in self.config.get("failed-hospitals", []):
            nid = str(f.get("node_id", ""))
            hospital = str(f.get("hospital", ""))
            if hospital == f"node {nid}" and nid in names:
                hospital = f"{names[nid]} (node {nid})"
            out.append({**f, "hospital": hospital, "reason": name_nodes(str(f.get("reason", "")), names)})
        return out

    def node_names(self) -> dict[str, str]:
        """Node id -> hospital name, from this run's query round."""
        known = self.config.get("hospitals")
        return {str(k): str(v) for k, v in known.items()} if isinstance(known, dict) else {}


def _flower_failure_text(state: tuple[str, str] | None) -> str:
    if state is None:
        return ""
    status, details = state
    if status == "finished:stopped":
        return "stopped by the operator (flwr stop)" + (f": {details}" if details else "")
    return f"{status}: {details}" if details else status


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _natural(name: str) -> tuple:
    """hospital-2 before hospital-10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)


class RunIndex:
    """Every run directory under a path (the path itself, when it is one), kept up to date."""

    def __init__(self, root: Path, flower_status: FlowerStatus | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.flower_status = flower_status
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root} is not a folder (give a run directory or an output directory of runs)")
        self.readers: dict[str, RunReader] = {}

    def scan(self) -> None:
        if is_run_dir(self.root):
            found = {self.root.name: self.root}
        else:
            found = {}
            for name in RUN_FILES:  # a run that failed in its query round has only failed.json
                for record in sorted(self.root.glob(f"*/{name}")) + sorted(self.root.glob(f"*/*/{name}")):
                    run = record.parent
                    found.setdefault(str(run.relative_to(self.root)), run)
        for run_id, path in found.items():
            if run_id not in self.readers:
                self.readers[run_id] = RunReader(path, run_id, self.flower_status, self.node_names)
        for reader in self.readers.values():
            reader.refresh()

    def node_names(self) -> dict[str, str]:
        """Node id -> hospital name, from every run's query round (the newest run that saw a node id names it)."""
        out: dict[str, str] = {}
        for reader in sorted(self.readers.values(), key=lambda r: _mtime(r.path / "config.json") or 0):
            out.update(reader.node_names())
        return out

    def get(self, run_id: str) -> RunReader:
        if run_id not in self.readers:
            self.scan()
        try:
            reader = self.readers[run_id]
        except KeyError:
            raise KeyError(f"no run {run_id!r} under {self.root}") from None
        reader.refresh()
        return reader

    def rows(self) -> list[dict[str, Any]]:
        self.scan()
        return sorted((r.row() for r in self.readers.values()), key=lambda row: -(row["updated"] or 0))

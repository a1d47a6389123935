"""A hospital's tamper-evident audit log: one JSON line per message its SuperNode handled, hash-chained.

Each line holds what ran and what went back, never pixel values, paths or patient ids: the time, run id,
app bundle hash, message type and round, accepted or refused and why, and the reply's array names, shapes
and bytes and metric names. Its ``hash`` is the SHA-256 of the previous line's hash and this line's other
fields (canonical JSON), so an edited, inserted or deleted line breaks the chain from there on:
``hospitrust deploy audit PATH`` verifies it and names the first line that does not fit.

ClientApps are forked children of the warm launcher: each appends under an exclusive ``flock``, so two
messages in flight never interleave or fork the chain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

GENESIS = "0" * 64


def _digest(previous: str, entry: dict) -> str:
    body = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((previous + body).encode()).hexdigest()


def _last_hash(fh) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    if size == 0:
        return GENESIS
    back = min(size, 65536)
    fh.seek(size - back)
    lines = fh.read(back).splitlines()
    for line in reversed(lines):
        if line.strip():
            return str(json.loads(line)["hash"])
    return GENESIS


def append(path: Path, entry: dict) -> dict:
    """Append ``entry`` (plus ``time`` and the chained ``hash``) to the log at ``path`` (0600, in a 0700 folder)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            record = {"time": round(time.time(), 3), **{k: v for k, v in entry.items() if k != "hash"}}
            record["hash"] = _digest(_last_hash(fh), record)
            fh.write((json.dumps(record, sort_keys=True) + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return record


def verify(path: Path) -> tuple[list[dict], str | None]:
    """The log's entries, and None when the chain holds, else where and how it breaks (1-based line)."""
    entries: list[dict] = []
    previous = GENESIS
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            return entries, f"line {n}: empty line in the log"
        try:
            record = json.loads(line)
        except ValueError:
            return entries, f"line {n}: not JSON"
        claimed = record.pop("hash", None)
        if claimed != _digest(previous, record):
            return entries, (f"line {n}: its hash does not follow from line {n - 1}'s (the line was edited, or a line "
                             f"before it was inserted or deleted)")
        entries.append({**record, "hash": claimed})
        previous = str(claimed)
    return entries, None


def describe_reply(message) -> dict:
    """What a reply carries, without its values: array names, shapes, dtypes and bytes; metric and config names."""
    if message is None:
        return {}
    if message.has_error():
        return {"error": str(message.error.reason)[:300]}
    out: dict[str, object] = {}
    content = message.content
    arrays = {}
    for record_name, record in content.array_records.items():
        for name, array in record.items():
            arrays[f"{record_name}/{name}"] = {"shape": list(array.shape), "dtype": str(array.dtype), "bytes": len(array.data)}
    if arrays:
        out["arrays"] = arrays
    metrics = sorted(f"{r}/{k}" for r, record in content.metric_records.items() for k in record)
    if metrics:
        out["metrics"] = metrics
    configs = sorted(f"{r}/{k}" for r, record in content.config_records.items() for k in record)
    if configs:
        out["configs"] = configs
    return out

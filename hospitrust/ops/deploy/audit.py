"""A hospital's tamper-evident audit log: one JSON line per message its SuperNode handled, keyed and anchored.

Each line holds what ran and what went back, never pixel values, paths or patient ids: the time, run id,
app bundle hash, message type and round, accepted or refused and why, the ClientApp's exit status, and what
the ClientApp says its reply carried (array names, shapes and bytes and metric names; ``reply_claimed_by_app``:
the ClientApp reports it after the bundle's code ran, so it is the app's own claim).

Format 2 (this module writes only it):

- each line carries ``v: 2``, its 1-based index ``n`` and ``mac``: HMAC-SHA256, under the log's key, of the
  previous line's ``mac`` (64 zeros for the first) and this line's other fields (canonical JSON). Editing,
  inserting, deleting or reordering a line, or rewriting the whole log without the key, breaks it;
- the key is ``PATH.key`` (32 random bytes as hex, created 0600 at the first start) unless the hospital gives
  one (``--audit-key``);
- the *head*, ``PATH.head``, records the number of entries and the last ``mac``, with its own HMAC; it is
  replaced atomically (write, fsync, rename) after each append. A log cut at the end or emptied no longer
  reaches the head's count; a head edited to match does not verify without the key.

``hospitrust deploy audit PATH`` verifies all of it and names the first entry that does not fit. A log of
format 1 (unkeyed SHA-256 ``hash`` chain, no head) is still read and printed, and always reported as not
verifiable: its chain can be recomputed by anyone and it cannot show that it was not cut.

The writer is the warm launcher (``hospitrust.supervision.launcher``), which never imports an app bundle:
each ClientApp child sends it the gate's decision before the bundle's code is imported. Appends take an
exclusive ``flock`` on the log, so two writers never interleave or fork the chain. A crash between the
line and its head leaves one keyed line past the head: the next append and ``verify`` accept it (it is
keyed, so it hides nothing).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

from hospitrust.errors import DeployError

GENESIS = "0" * 64
VERSION = 2
KEY_BYTES = 32


def key_path(log: Path, key: Path | None = None) -> Path:
    """The log's key file: ``key`` when the hospital gave one, else ``LOG.key`` beside the log."""
    return Path(key) if key is not None else Path(log).with_name(Path(log).name + ".key")


def head_path(log: Path) -> Path:
    return Path(log).with_name(Path(log).name + ".head")


def ensure_key(log: Path, key: Path | None = None) -> Path:
    """The key file, created (0600, in a 0700 folder) when it is the default one and absent; a key the hospital
    named must exist. Refuses a key readable by others.
    """
    path = key_path(log, key)
    if not path.exists():
        if key is not None:
            raise DeployError(f"audit key {path} not found (give an existing key file, or leave --audit-key out and "
                              f"hospitrust creates {key_path(log)})")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it meanwhile
            return path
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    read_key(path)
    return path


def read_key(path: Path) -> bytes:
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text(errors="replace").strip()
    except OSError as exc:
        raise DeployError(f"audit key {path}: cannot read it ({exc.strerror})") from None
    if mode & 0o077:
        raise DeployError(f"audit key {path} is readable or writable by others (mode {mode:o}): chmod 600 it")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise DeployError(f"audit key {path}: expected at least {2 * KEY_BYTES} hex digits on one line")
    return key


def _mac(key: bytes, previous: str, record: dict) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, (previous + body).encode(), hashlib.sha256).hexdigest()


def _head_mac(key: bytes, entries: int, last: str) -> str:
    return hmac.new(key, f"hospitrust-audit-head:{entries}:{last}".encode(), hashlib.sha256).hexdigest()


def _read_head(log: Path, key: bytes) -> tuple[int, str] | None:
    """(entries, last mac) from the head file, None when there is none; raises when it does not verify."""
    path = head_path(log)
    if not path.exists():
        return None
    try:
        head = json.loads(path.read_text(errors="replace"))
        entries, last, claimed = int(head["entries"]), str(head["mac"]), str(head["head_mac"])
    except (OSError, ValueError, KeyError, TypeError):
        raise DeployError(f"head file {path}: not a head this module wrote (edited or damaged)") from None
    if not hmac.compare_digest(claimed, _head_mac(key, entries, last)):
        raise DeployError(f"head file {path}: its MAC does not verify (the head was edited, or the key is not this "
                          f"log's)")
    return entries, last


def _write_head(log: Path, key: bytes, entries: int, last: str) -> None:
    """Replace the head atomically: a reader sees the old head or the new one, never a torn one."""
    path = head_path(log)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"v": VERSION, "entries": entries, "mac": last,
                             "head_mac": _head_mac(key, entries, last)}, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _last_line(fh) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    back = min(size, 1 << 20)
    fh.seek(size - back)
    lines = [line for line in fh.read(back).splitlines() if line.strip()]
    return lines[-1].decode(errors="replace") if lines else ""


def _successor(key: bytes, line: str, entries: int, last: str) -> str | None:
    """The line's mac when it is the keyed entry ``entries + 1`` following ``last`` (an append whose head update a
    crash cut short), else None.
    """
    try:
        record = json.loads(line)
        claimed = record.pop("mac")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if record.get("n") != entries + 1 or not hmac.compare_digest(str(claimed), _mac(key, last, record)):
        return None
    return str(claimed)


def check(log: Path, key: Path | None = None) -> None:
    """At the writer's start: the key exists (created when it is the default one), and an existing log is of
    this format with its head; otherwise a clear error, before any message is handled.
    """
    log = Path(log)
    secret = read_key(ensure_key(log, key))
    if not log.exists() or log.stat().st_size == 0:
        if head_path(log).exists() and (_read_head(log, secret) or (0, GENESIS))[0] > 0:
            raise DeployError(f"audit log {log} is empty or missing but its head records entries: it was emptied; "
                              f"verify it (hospitrust deploy audit {log}) and move log and head aside")
        return
    with open(log, "rb") as fh:
        first = fh.readline()
    try:
        version = json.loads(first).get("v")
    except (ValueError, AttributeError):
        version = None
    if version != VERSION:
        raise DeployError(f"audit log {log} is not of format {VERSION} (an older, unkeyed hash-chained log?): move it "
                          f"aside (hospitrust deploy audit still reads it) and start a new one")
    if _read_head(log, secret) is None:
        raise DeployError(f"audit log {log} has entries but its head {head_path(log)} is missing: the log may have "
                          f"been cut; verify it (hospitrust deploy audit {log}) and move it aside")


def append(path: Path, entry: dict, key: Path | None = None) -> dict:
    """Append ``entry`` (plus ``v``, ``n``, ``time`` and the keyed ``mac``) to the log at ``path`` (0600, in a 0700
    folder) and move its head on. The key file is read at each append and not kept in memory.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = read_key(ensure_key(path, key))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            head = _read_head(path, secret)
            tail = _last_line(fh)
            if head is None:
                if tail:
                    raise DeployError(f"audit log {path} has entries but no head {head_path(path)}: not appending "
                                      f"(verify it with hospitrust deploy audit {path}, move it aside)")
                head = (0, GENESIS)
            entries, last = head
            if tail and (recovered := _successor(secret, tail, entries, last)) is not None:
                entries, last = entries + 1, recovered  # the previous append's head update did not happen
            record = {"time": round(time.time(), 3),
                      **{k: v for k, v in entry.items() if k not in ("mac", "hash", "n", "v")},
                      "v": VERSION, "n": entries + 1}
            record["mac"] = _mac(secret, last, {k: v for k, v in record.items()})
            fh.write((json.dumps(record, sort_keys=True) + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
            _write_head(path, secret, entries + 1, record["mac"])
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return record


def _verify_v1(lines: list[str]) -> tuple[list[dict], str]:
    """A format-1 log (unkeyed ``hash`` chain): its entries, and why it cannot be trusted."""
    entries: list[dict] = []
    previous = GENESIS
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            claimed = record.pop("hash", None)
        except (ValueError, AttributeError):
            return entries, f"entry {n}: not JSON (a format-1 log, unkeyed)"
        body = json.dumps(record, sort_keys=True, separators=(",", ":"))
        if claimed != hashlib.sha256((previous + body).encode()).hexdigest():
            return entries, f"entry {n}: its hash does not follow from entry {n - 1}'s (a format-1 log, unkeyed)"
        entries.append({**record, "hash": claimed})
        previous = str(claimed)
    return entries, (f"entry 1: a format-1 log (unkeyed SHA-256 chain, no head): its {len(entries)} entries chain, "
                     f"but anyone can recompute that chain and cutting its end leaves no trace; it cannot be verified")


def verify(path: Path, key: Path | None = None) -> tuple[list[dict], str | None]:
    """The log's entries, and None when every entry's MAC holds and the head accounts for all of them, else the
    first entry (1-based) that does not fit and why.
    """
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines()
    try:
        first = json.loads(lines[0]) if lines else {}
    except ValueError:
        first = {}
    if isinstance(first, dict) and "hash" in first and "mac" not in first:
        return _verify_v1(lines)
    try:
        secret = read_key(key_path(path, key))
    except DeployError as exc:
        return [], f"entry 1: cannot be checked: {exc}"
    entries: list[dict] = []
    previous = GENESIS
    for n, line in enumerate(lines, 1):
        if not line.strip():
            return entries, f"entry {n}: an empty line in the log"
        try:
            record = json.loads(line)
            claimed = record.pop("mac")
        except (ValueError, KeyError, TypeError, AttributeError):
            return entries, f"entry {n}: not an entry of this log (not JSON, or no mac)"
        if record.get("n") != n or not hmac.compare_digest(str(claimed), _mac(secret, previous, record)):
            return entries, (f"entry {n}: its MAC does not verify (the entry was edited, an entry before it inserted "
                             f"or deleted, or the log rewritten without its key)")
        entries.append({**record, "mac": claimed})
        previous = str(claimed)
    try:
        head = _read_head(path, secret)
    except DeployError as exc:
        return entries, f"entry {len(entries) + 1}: cannot be shown absent: {exc}"
    if head is None:
        return entries, (f"entry {len(entries) + 1}: cannot be shown absent: the head {head_path(path)} is missing (the "
                         f"log may have been cut)")
    count, last = head
    if len(entries) < count:
        what = "emptied" if not entries else "cut"
        return entries, (f"entry {len(entries) + 1}: missing: the head records {count} entries, the log has "
                         f"{len(entries)} (the log was {what})")
    if count == 0 and last != GENESIS or count and entries[count - 1]["mac"] != last:
        return entries, f"entry {count}: is not the entry the head records (the log was rewritten)"
    if len(entries) > count + 1:
        return entries, (f"entry {count + 2}: past the head, which records {count} entries (the head was rolled "
                         f"back, or a writer that is not the launcher appended)")
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

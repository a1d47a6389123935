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

The log's *state* file records, outside the log's folder, that this log was started:
``$XDG_STATE_HOME/hospitrust/audit/NAME.<16 hex of the log's full path>.state`` (default ``~/.local/state``; under the
systemd unit, whose HOME is /var/lib/hospitrust: ``/var/lib/hospitrust/.local/state/hospitrust/audit/``), 0600 in a
0700 folder: the log's path, when it was started, whether it has entries and its key's id (an HMAC of a constant
under the key, not the key). It is the service user's state, not a file beside the log or the default key: whoever
can empty the log's folder (log, head and default key) removes the log but not the record that it existed, and the
paths a hospital configures (``--audit-log``, ``--audit-key``) name no other folder that is sure to be elsewhere.
At the start (:func:`check`) and at each append:

- a missing log whose state records entries was wiped: refused, never begun again from the first entry;
- a missing key is never made anew once the state exists (nor beside an existing log or head): put it back;
- a key whose id is not the state's, once the log has entries, is refused (another key cannot verify them);
- a default key with neither log nor state is refused too: the key is made together with the state, so that is a
  log wiped with its state, or a key an older hospitrust made at a start that logged nothing (remove it then);
- a log and key without a state (a hospital upgrading from a version that wrote none) start normally and get one.

Whoever can also delete the service user's state can start a log afresh unseen here; the launcher's ``audited``
lines (the head, in the SuperNode's journal) still show that a log existed.

``hospitrust deploy audit PATH`` verifies all of it and names the first entry that does not fit; for a missing log
whose state records entries it says the log was wiped (not "not found", as for a mistyped path). An entry is read as
strict JSON: a key that appears twice in one object (``"decision"`` twice: a reader takes one value, the MAC covers
the other) does not verify, and the message names the line and the key. A log of format 1 (unkeyed SHA-256 ``hash``
chain, no head) is still read and printed, and always reported as not verifiable: its chain can be recomputed by
anyone and it cannot show that it was not cut.

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
from typing import Any

from hospitrust.errors import DeployError

GENESIS = "0" * 64
VERSION = 2
KEY_BYTES = 32
STATE_VERSION = 1


class DuplicateKey(ValueError):
    """A JSON object that names a key twice: readers disagree on its value, so it is not an entry this module wrote."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses an object with a duplicated key (:class:`DuplicateKey`, a ValueError)."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


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
        state = read_state(log)
        # (re-checked: another writer may have made the key, then the state or the log's first entry, meanwhile)
        if state is not None and not path.exists():  # a new key would start a new log silently over the old one
            raise DeployError(f"audit key {path} is missing, but {state_path(log)} records that log {log} was started "
                              f"({state['started']}) under a key with id {state['key_id']}: the key was deleted; put "
                              f"it back from the hospital's backup (a new key is made only for a log never started)")
        if (_has_content(log) or head_path(log).exists()) and not path.exists():
            raise DeployError(f"audit key {path} is missing but log {log} or its head exists: put the key back (a new "
                              f"key cannot verify the entries written under the old one)")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # written aside, then linked into place: another writer never reads a key file not yet written
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process created it meanwhile: theirs is the key
            pass
        finally:
            tmp.unlink()
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


def key_id(secret: bytes) -> str:
    """What the state file records of the key: an HMAC of a constant under it (names the key, reveals nothing)."""
    return hmac.new(secret, b"hospitrust-audit-key-id", hashlib.sha256).hexdigest()[:32]


def _has_content(log: Path) -> bool:
    return log.exists() and log.stat().st_size > 0


def state_dir() -> Path:
    """Where the logs' state files are: ``$XDG_STATE_HOME/hospitrust/audit`` (default ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hospitrust" / "audit"


def state_path(log: Path) -> Path:
    """The log's state file: in :func:`state_dir`, named for the log and a hash of its full path (one per log)."""
    full = Path(log).expanduser().resolve()
    return state_dir() / f"{full.name}.{hashlib.sha256(str(full).encode()).hexdigest()[:16]}.state"


def read_state(log: Path) -> dict | None:
    """The log's state (``log``, ``started``, ``entries``: whether it has any, ``key_id``), None when it has none."""
    path = state_path(log)
    if not path.exists():
        return None
    try:
        state = loads(path.read_text(errors="replace"))
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION or not isinstance(state.get("entries"), bool):
            raise ValueError
        for name in ("log", "started", "key_id"):
            if not isinstance(state.get(name), str):
                raise ValueError
    except (OSError, ValueError):
        raise DeployError(f"audit state {path}: not a state file this module wrote (edited or damaged); it records "
                          f"that log {log} was started: move it aside only once you know that log holds no entry"
                          ) from None
    return state


def _write_state(log: Path, secret: bytes, entries: bool, started: str | None = None) -> None:
    """Record (atomically, 0600 in a 0700 folder) that the log was started, and whether it has entries."""
    path = state_path(log)
    record = {"v": STATE_VERSION, "log": str(Path(log).expanduser().resolve()), "key_id": key_id(secret),
              "entries": entries,
              "started": started or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise DeployError(f"audit state {path}: cannot write it ({exc.strerror}); it records, outside the log's "
                          f"folder, that log {log} was started: give the service user a writable $XDG_STATE_HOME "
                          f"(or HOME)") from None


def _check_state_key(log: Path, state: dict | None, secret: bytes, key: Path) -> None:
    """A log with entries is verified under the key it was started with: another key is refused, by name."""
    if state is not None and state["entries"] and not hmac.compare_digest(state["key_id"], key_id(secret)):
        raise DeployError(f"audit key {key} is not the key log {log} was started under ({state_path(log)} "
                          f"records key id {state['key_id']}, this key's is {key_id(secret)}): the key was replaced; "
                          f"put the log's own key back (or give it with --audit-key)")


def _wiped(log: Path, state: dict | None) -> str | None:
    if state is None or not state["entries"]:
        return None
    return (f"audit log {log} and its head are missing, but {state_path(log)} records that this log was started "
            f"({state['started']}) and has entries: it was wiped")


def wiped(log: Path) -> str | None:
    """Why a missing log is not a mistyped path (its state records entries: it was wiped), else None."""
    try:
        state = read_state(log)
    except DeployError as exc:
        return str(exc)
    why = _wiped(Path(log), state)
    return f"entry 1: missing: {why}" if why else None


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
        head = loads(path.read_text(errors="replace"))
        entries, last, claimed = int(head["entries"]), str(head["mac"]), str(head["head_mac"])
    except (OSError, ValueError, KeyError, TypeError):  # DuplicateKey is a ValueError
        raise DeployError(f"head file {path}: not a head this module wrote (edited or damaged)") from None
    if not hmac.compare_digest(claimed, _head_mac(key, entries, last)):
        raise DeployError(f"head file {path}: its MAC does not verify (the head was edited, or the key is not this "
                          f"log's)")
    return entries, last


def current_head(log: Path, key: Path | None = None) -> tuple[int, str]:
    """(entries, last mac) the head records now ((0, GENESIS) before the first entry); raises a DeployError when it
    cannot be read or does not verify. What a reply carries to the federation (:data:`ANCHOR_RECORD`).
    """
    head = _read_head(Path(log), read_key(key_path(Path(log), key)))
    return head if head is not None else (0, GENESIS)


#: The record a train reply carries (added by the hospital's gate, not the app): the audit log's head at the time of
#: the message, so that the federation's records of a run can show a later rollback of the log (:func:`against`).
ANCHOR_RECORD = "audit-head"


def against(entries: list[dict], anchors: list[dict]) -> list[str]:
    """What does not fit between a log's (verified) entries and the heads the federation recorded for its hospital
    (``anchors``: ``{"run", "round", "entries", "mac"}`` each): one line per anchor the log does not hold, [] when
    every one is there. A log rolled back to an older copy misses the later anchors' entries; one rolled back and
    written on has other MACs at their places.
    """
    problems = []
    for anchor in sorted(anchors, key=lambda a: (int(a["entries"]), str(a.get("run")), int(a.get("round") or 0))):
        n, mac = int(anchor["entries"]), str(anchor["mac"])
        where = f"run {anchor.get('run')} round {anchor.get('round')}"
        if n == 0:
            continue
        if len(entries) < n:
            problems.append(f"entry {n}: missing: the federation saw {n} entries at {where}, the log has "
                            f"{len(entries)} (the log was rolled back or cut)")
        elif not hmac.compare_digest(str(entries[n - 1]["mac"]), mac):
            problems.append(f"entry {n}: is not the entry the federation saw at {where} (the log was replaced, or "
                            f"rolled back and written on)")
    return problems


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
        record = loads(line)
        claimed = record.pop("mac")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if record.get("n") != entries + 1 or not hmac.compare_digest(str(claimed), _mac(key, last, record)):
        return None
    return str(claimed)


def check(log: Path, key: Path | None = None) -> None:
    """At the writer's start: the key exists (created, with the log's state, when it is the default one and the log
    was never started), an existing log is of this format with its head, and a missing one was not wiped (its state);
    otherwise a clear error, before any message is handled. A log without a state (an upgrade) gets one.
    """
    log = Path(log)
    state = read_state(log)
    if _has_content(log):
        with open(log, "rb") as fh:
            first = fh.readline()
        try:
            version = json.loads(first).get("v")
        except (ValueError, AttributeError):
            version = None
        if version != VERSION:
            raise DeployError(f"audit log {log} is not of format {VERSION} (an older, unkeyed hash-chained log?): move "
                              f"it aside (hospitrust deploy audit still reads it) and start a new one")
    existed = key_path(log, key).exists()
    path = ensure_key(log, key)  # never made anew once the state exists, nor beside a log or head
    secret = read_key(path)
    _check_state_key(log, state, secret, path)
    if not _has_content(log):
        if head_path(log).exists() and (_read_head(log, secret) or (0, GENESIS))[0] > 0:
            raise DeployError(f"audit log {log} is empty or missing but its head records entries: it was emptied; "
                              f"verify it (hospitrust deploy audit {log}) and move log and head aside")
        if (why := _wiped(log, state)) is not None:
            raise DeployError(f"{why}; not starting a new log over it: find out who removed it (hospitrust deploy audit "
                              f"{log} says the same), restore log and head from a backup, or move the state file aside "
                              f"once the incident is recorded")
        if state is None and existed and key is None:  # the key is made together with the state: this state was lost
            raise DeployError(f"audit log {log} is missing but its key {path} exists and no state ({state_path(log)}) "
                              f"records the log: the log was wiped with its head and state, or an older hospitrust "
                              f"made the key at a start that logged nothing; in that case only, remove the key and "
                              f"start again")
        if state is None or not hmac.compare_digest(state["key_id"], key_id(secret)):
            _write_state(log, secret, entries=False, started=state["started"] if state else None)
        return
    if _read_head(log, secret) is None:
        raise DeployError(f"audit log {log} has entries but its head {head_path(log)} is missing: the log may have "
                          f"been cut; verify it (hospitrust deploy audit {log}) and move it aside")
    if state is None or not state["entries"]:  # a log begun before the state file existed: from now on it has one
        _write_state(log, secret, entries=True, started=state["started"] if state else None)


def append(path: Path, entry: dict, key: Path | None = None) -> dict:
    """Append ``entry`` (plus ``v``, ``n``, ``time`` and the keyed ``mac``) to the log at ``path`` (0600, in a 0700
    folder) and move its head on. The key file is read at each append and not kept in memory. The log's state
    records that it has entries before its first entry is written; a log its state says was wiped is not begun again.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    kpath = ensure_key(path, key)
    secret = read_key(kpath)
    state = read_state(path)
    _check_state_key(path, state, secret, kpath)
    if not path.exists() and not head_path(path).exists() and (why := _wiped(path, state)) is not None:
        raise DeployError(f"{why}: not appending, which would begin a new log over it (verify it with hospitrust "
                          f"deploy audit {path})")  # before the open, which would leave an empty log in its place
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            state = read_state(path)
            _check_state_key(path, state, secret, kpath)
            head = _read_head(path, secret)
            tail = _last_line(fh)
            if head is None:
                if tail:
                    raise DeployError(f"audit log {path} has entries but no head {head_path(path)}: not appending "
                                      f"(verify it with hospitrust deploy audit {path}, move it aside)")
                if (why := _wiped(path, state)) is not None:
                    raise DeployError(f"{why}: not appending, which would begin a new log over it (verify it with "
                                      f"hospitrust deploy audit {path})")
                head = (0, GENESIS)
            if state is None or not state["entries"] or not hmac.compare_digest(state["key_id"], key_id(secret)):
                _write_state(path, secret, entries=True, started=state["started"] if state else None)
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
            record = loads(line)
            claimed = record.pop("hash", None)
        except DuplicateKey as exc:
            return entries, f"entry {n} (line {n}): {exc} in it (a format-1 log, unkeyed)"
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
            record = loads(line)
            claimed = record.pop("mac")
        except DuplicateKey as exc:  # a reader takes one value, the MAC covers the other: the entry was edited
            return entries, (f"entry {n} (line {n}): {exc} in it, so readers disagree on its value (an entry this "
                             f"module wrote names each key once: the entry was edited)")
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
        try:
            state = read_state(path)
        except DeployError:
            state = None
        if not entries and state is not None and state["entries"]:  # its state, outside its folder, says it had some
            return entries, (f"entry 1: missing: the head {head_path(path)} is gone and {state_path(path)} records "
                             f"that this log has entries (the log was wiped, its head deleted)")
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
    from hospitrust import wire  # Flower's records: imported where a reply is described, not with the log

    out: dict[str, object] = {}
    content = message.content
    arrays: dict[str, dict[str, object]] = {}
    for record_name, record in content.array_records.items():
        if wire.is_packed(record):  # the arrays it carries, by its manifest (hospitrust.wire)
            try:
                described = [(name, shape, dtype, size) for name, dtype, shape, _, size in wire.manifest(record)]
            except wire.PackingError as exc:
                arrays[f"{record_name}/{wire.PACKED_KEY}"] = {"unreadable": str(exc)[:300]}
                continue
        else:
            described = [(name, a.shape, a.dtype, len(a.data)) for name, a in record.items()]
        for name, shape, dtype, size in described:
            arrays[f"{record_name}/{name}"] = {"shape": list(shape), "dtype": str(dtype), "bytes": size}
    if arrays:
        out["arrays"] = arrays
    metrics = sorted(f"{r}/{k}" for r, record in content.metric_records.items() for k in record)
    if metrics:
        out["metrics"] = metrics
    configs = sorted(f"{r}/{k}" for r, record in content.config_records.items() for k in record)
    if configs:
        out["configs"] = configs
    return out

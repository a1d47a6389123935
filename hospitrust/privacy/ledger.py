"""A hospital's privacy budget: what local DP has spent on its data, on its own machine.

The ledger is a small JSON file (node config ``privacy-ledger``, default
``$HOSPITRUST_PRIVACY_LEDGER``, else ``~/.local/share/hospitrust/privacy-ledger.json``: not a
cache folder, which a clean-up may empty). It holds, per content hash of a hospital's data,
every round's DP-SGD event ``(sigma, q, steps)``; the epsilon spent is their RDP composition at
the asking run's delta, so it adds up across rounds, runs and restarts (``context.state``
lives for one run only). A round is written *before* it trains (a crash mid-round counts as
spent: over-counting is the safe side), atomically (a temporary file renamed over the old one,
under an exclusive lock), so a killed process never leaves a half-written ledger. The ledger and
its lock are 0600; a folder the ledger creates is 0700, and the default folder
(``~/.local/share/hospitrust``) is set to 0700 when it exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hospitrust.private import FILE_MODE, open_private, private_dir, tighten_path
from hospitrust.privacy.local import PrivacyEvent, epsilon_of

LEDGER_ENV = "HOSPITRUST_PRIVACY_LEDGER"
FORMAT = 1


def default_ledger_path() -> Path:
    """``$HOSPITRUST_PRIVACY_LEDGER``, else ``$XDG_DATA_HOME/hospitrust/privacy-ledger.json`` (~/.local/share)."""
    raw = os.environ.get(LEDGER_ENV, "")
    if raw:
        return Path(raw).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "hospitrust" / "privacy-ledger.json"


def content_hash(images: Any, labels: np.ndarray, digests: np.ndarray | None = None) -> str:
    """sha256 of a hospital's data: its images' own digests in sorted order when it has them
    (decoded local data: the order of files does not matter), else its image bytes, with the labels.
    """
    h = hashlib.sha256()
    if digests is not None and len(digests):
        for d in sorted(str(x) for x in digests):
            h.update(d.encode())
    else:
        for start in range(0, len(labels), 4096):
            h.update(np.ascontiguousarray(np.asarray(images[start:start + 4096])).tobytes())
    h.update(np.asarray(labels).astype(np.int64).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Spending:
    """A hospital's spending on one dataset: its events and their epsilon at ``delta``."""

    key: str
    events: tuple[PrivacyEvent, ...]
    delta: float

    @property
    def epsilon(self) -> float:
        return epsilon_of(self.events, self.delta)

    def with_event(self, event: PrivacyEvent) -> "Spending":
        return Spending(self.key, (*self.events, event), self.delta)


class PrivacyLedger:
    """The JSON ledger at ``path``: ``{"format": 1, "data": {hash: {"hospital", "rounds": [...]}}}``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        # hospitrust's own folder may be tightened; a folder the hospital chose is left as it is
        self._own_folder = self.path == default_ledger_path() and not os.environ.get(LEDGER_ENV, "")

    # ---- reading ----------------------------------------------------------------------------
    def read(self) -> dict[str, Any]:
        """The whole ledger (an empty one when the file does not exist); ValueError for a corrupt file."""
        if not self.path.is_file():
            return {"format": FORMAT, "data": {}}
        tighten_path(self.path, FILE_MODE)  # a ledger written before ledgers were private
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"privacy ledger {self.path} cannot be read ({exc}); it holds the hospital's spent "
                             "privacy budget, so training stops until it is repaired or restored") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise ValueError(f"privacy ledger {self.path} is not a ledger (expected an object with 'data')")
        return doc

    def spending(self, key: str, delta: float) -> Spending:
        entry = self.read()["data"].get(key, {})
        return Spending(key, tuple(PrivacyEvent.from_dict(r) for r in entry.get("rounds", [])), delta)

    # ---- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        private_dir(self.path.parent, tighten=self._own_folder)
        with open_private(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, doc: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # mkstemp made it 0600
            tighten_path(self.path, FILE_MODE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def record(self, key: str, event: PrivacyEvent, *, hospital: str, delta: float, server_round: int,
               run: str = "") -> Spending:
        """Add one round's event to ``key``'s spending (atomically) and return the new total."""
        with self._locked():
            doc = self.read()
            entry = doc["data"].setdefault(key, {"hospital": hospital, "rounds": []})
            entry["hospital"] = hospital
            entry["rounds"].append({**event.as_dict(), "round": int(server_round), "run": run, "delta": float(delta),
                                    "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            spent = Spending(key, tuple(PrivacyEvent.from_dict(r) for r in entry["rounds"]), delta)
            entry["epsilon"] = spent.epsilon  # at this run's delta, for a reader without the accountant
            entry["delta"] = float(delta)
            self._write(doc)
        return spent

    # ---- what ``hospitrust data check`` prints ------------------------------------------------
    def format(self, key: str | None = None, max_epsilon: float | None = None) -> str:
        """One line per dataset in the ledger (or ``key``'s only): rounds, epsilon at its last delta, the cap."""
        try:
            data = self.read()["data"]
        except ValueError as exc:
            return f"privacy budget: {exc}"
        cap = f" of the budget {max_epsilon:g}" if max_epsilon is not None else " (no privacy-max-epsilon: no cap)"
        if key is not None:
            data = {key: data[key]} if key in data else {}
        if not data:
            return (f"privacy budget: nothing spent on this data yet{cap}" + f" (ledger {self.path})")
        lines = [f"privacy budget (ledger {self.path}):"]
        for k, entry in sorted(data.items()):
            events = [PrivacyEvent.from_dict(r) for r in entry.get("rounds", [])]
            delta = float(entry.get("delta", 1e-5))
            eps = epsilon_of(events, delta)
            left = f", {max(max_epsilon - eps, 0.0):.3f} left" if max_epsilon is not None else ""
            lines.append(f"  {entry.get('hospital', '?')} data {k[:12]}: {len(events)} rounds, {sum(e.steps for e in events)}"
                         f" DP-SGD steps, epsilon {eps:.3f} at delta {delta:g} spent{cap}{left}")
        return "\n".join(lines)


def ledger_for(node: Any) -> PrivacyLedger | None:
    """A hospital's ledger from its node config: ``privacy-ledger``, else the default path for a
    hospital with its own data; a simulated hospital keeps one only when the key is set.
    """
    if node.privacy_ledger:
        return PrivacyLedger(node.privacy_ledger)
    if node.data_path:
        return PrivacyLedger(default_ledger_path())
    return None


def budget_report(path: str | Path, data_format: str, task: Any, *, cache_dir: str | Path | None = None,
                  ledger: str | Path | None = None, max_epsilon: float | None = None, warm_cache: bool = False,
                  skip_unreadable: float = 0.0) -> str:
    """What ``hospitrust data check`` prints about a hospital's privacy budget: the data read as the
    ClientApp reads it (``load_local``), its content hash, and the ledger's line for it. The decode
    cache is read if it is there, and written only with ``warm_cache`` (then a line says where).
    """
    from hospitrust.datasets.local import load_local

    data = load_local(path, data_format, task, cache_dir, skip_unreadable=skip_unreadable, write_cache=warm_cache)
    key = content_hash(data.images, data.labels, data.digests)
    text = PrivacyLedger(ledger or default_ledger_path()).format(key, max_epsilon)
    if warm_cache and data.cache is not None:
        text += (f"\ndecoded image cache: {data.cache} ({len(data)} images, "
                 f"{'decoded now' if data.decoded else 'already there'}; 0600 files in a 0700 folder)")
    return text


__all__ = ["LEDGER_ENV", "PrivacyLedger", "Spending", "budget_report", "content_hash", "default_ledger_path", "ledger_for"]

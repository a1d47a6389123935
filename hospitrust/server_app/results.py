"""The run directory: what every run leaves behind, in a documented, stable schema.

``<output-dir>/<run-name>/``
  - ``config.json``        the resolved run config (kebab-case keys) plus the hospital map
  - ``class_counts.csv``   per hospital, local train/val counts per class
  - ``rounds.jsonl``       one JSON object per round (ROUND_FIELDS; ``clients``: CLIENT_FIELDS), written and
                           read as ``hospitrust.records.RoundRecord`` (``schema`` says which version)
  - ``summary.json``       SUMMARY_FIELDS
  - ``model.pt``           the final global model (torch state_dict)
  - ``checkpoint.pt``      server state after the last finished round (hospitrust.server_app.checkpoint)
  - ``failed.json``        only when the run stopped on an error: the error and its traceback
  - ``server.log``         the ServerApp's log (hospitrust's and Flower's lines) while it held the directory,
                           appended by a resumed run, without colour codes
  - ``flower-runs.jsonl``  the Flower run id of each ServerApp that wrote the directory (a resumed run adds one)

Later features add fields; none is ever renamed. NaN and infinities are written as null
(JSON has no NaN).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hospitrust.records import RoundRecord

CENTRAL_METRICS = ("accuracy", "balanced_accuracy", "macro_f1", "auc", "worst_class_recall", "per_class_recall", "loss")
FLOWER_RUNS = "flower-runs.jsonl"  # the Flower run ids that wrote the directory, one line each, the last one current
ROUND_FIELDS = ("round", "central", "clients", "aggregation_seconds", "round_seconds")
CLIENT_FIELDS = ("hospital", "node_id", "num_examples", "weight", "train_loss")
SUMMARY_FIELDS = ("final", "best_round", "rounds", "wall_seconds", "dataset", "strategy")


def jsonable(value: Any) -> Any:
    """Plain JSON types; NaN/inf -> None; tensors and numpy values -> Python numbers/lists."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def default_run_name(dataset: str, strategy: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{dataset}-{strategy}"


class RunDirectory:
    """Writes one run's results; every write is complete or absent (written then renamed)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, output_dir: str | Path, run_name: str) -> "RunDirectory":
        base = Path(output_dir).expanduser().resolve()
        path = base / run_name
        suffix = 1
        while (path / "summary.json").exists() or (path / "rounds.jsonl").exists():
            suffix += 1  # never overwrite an earlier run's results
            path = base / f"{run_name}-{suffix}"
        return cls(path)

    @contextlib.contextmanager
    def exclusive(self, timeout: float = 0.0, poll: float = 1.0):
        """Hold ``.lock`` in the directory (an OS file lock: a killed holder releases it);
        waits up to ``timeout`` seconds for another holder, then raises RuntimeError.
        """
        import fcntl

        fh = open(self.path / ".lock", "a+")
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise RuntimeError(f"run directory {self.path} is in use by another ServerApp "
                                           f"(waited {timeout:.0f} s for its lock)") from None
                    time.sleep(poll)
            with self.server_log():
                yield self
        finally:
            fh.close()  # releases the lock

    @contextlib.contextmanager
    def server_log(self):
        """Copy Flower's logger (the ServerApp's lines: hospitrust's and Flower's) to ``server.log`` meanwhile.

        A deployed ServerApp's output otherwise reaches only ``flwr log`` and the SuperLink's own log;
        the file keeps it beside the records, plain (Flower colours only its console handler).
        """
        import logging

        from flwr.common.logger import FLOWER_LOGGER

        handler = logging.FileHandler(self.path / "server.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))
        handler.setLevel(logging.INFO)
        FLOWER_LOGGER.addHandler(handler)
        try:
            yield
        finally:
            FLOWER_LOGGER.removeHandler(handler)
            handler.close()

    def _write_atomic(self, name: str, text: str) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, target)
        return target

    def write_config(self, config: Mapping[str, Any]) -> Path:
        return self._write_atomic("config.json", json.dumps(jsonable(config), indent=2, sort_keys=True) + "\n")

    def append_round(self, record: RoundRecord) -> None:
        """The round's line at the end of rounds.jsonl (the record's ``to_json``, NaN as null), synced to disk."""
        if not isinstance(record, RoundRecord):
            raise TypeError(f"a round is appended as a RoundRecord, not {type(record).__name__}")
        line = json.dumps(jsonable(record.to_json()), allow_nan=False)
        with open(self.path / "rounds.jsonl", "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def rewrite_rounds(self, records: Iterable[RoundRecord]) -> Path:
        """rounds.jsonl with exactly these records (a resumed run drops rounds after its checkpoint)."""
        lines = "".join(json.dumps(jsonable(r.to_json()), allow_nan=False) + "\n" for r in records)
        return self._write_atomic("rounds.jsonl", lines)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        missing = [k for k in SUMMARY_FIELDS if k not in summary]
        if missing:
            raise ValueError(f"summary lacks {missing}")
        return self._write_atomic("summary.json", json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n")

    def write_failure(self, exc: BaseException) -> Path:
        """``failed.json``: the run stopped on an error (the ServerApp then fails as Flower reports it)."""
        import traceback

        return self._write_atomic("failed.json", json.dumps({
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "traceback": "".join(traceback.format_exception(exc))[-8000:],
        }, indent=2) + "\n")

    def clear_failure(self) -> None:
        (self.path / "failed.json").unlink(missing_ok=True)

    def record_flower_run(self, run_id: int) -> None:
        """Append the Flower run id that writes this directory now (a resumed run adds its own): the console asks
        the SuperLink for that run's status when the records end without a summary.
        """
        with (self.path / FLOWER_RUNS).open("a") as fh:
            fh.write(json.dumps({"run_id": int(run_id), "started": round(time.time(), 3)}) + "\n")

    def save_model(self, state_dict: Mapping[str, torch.Tensor]) -> Path:
        target = self.path / "model.pt"
        tmp = self.path / "model.pt.tmp"
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, tmp)
        os.replace(tmp, target)
        return target

    def write_class_counts(self, class_names: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> Path:
        names = list(class_names)
        target = self.path / "class_counts.csv"
        with open(target, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["hospital", "split", *names, "total"])
            for row in rows:
                for split in ("train", "val"):
                    counts = list(row[split])
                    writer.writerow([row["hospital"], split, *counts, sum(counts)])
        return target


def read_round_records(run_dir: str | Path) -> list[RoundRecord]:
    """The run's rounds.jsonl as typed records, whichever schema wrote each line: the one reader of a run's
    rounds (the console, the plots, the benchmark store, the benchmarks and the tests read these).
    """
    with open(Path(run_dir) / "rounds.jsonl") as fh:
        return [RoundRecord.from_json(line) for line in fh if line.strip()]


def read_round_lines(run: str | Path, **loads: Any) -> list[dict[str, Any]]:
    """The raw schema view: each line of rounds.jsonl as the JSON object written, keys as on disk.

    Only for what checks the written schema itself (the keys a line holds, null for NaN, strict JSON,
    a schema 1 file as it was written); everything else reads :func:`read_round_records`.

    Parameters
    ----------
    run : str or Path
        A run's folder, or a rounds file itself (a ``.jsonl`` of the same lines).
    **loads
        Keyword arguments for ``json.loads`` (``parse_constant``: to fail on a non-standard constant).

    Returns
    -------
    list[dict]
        One parsed line per non-blank line, in order.
    """
    path = Path(run)
    if path.is_dir():
        path = path / "rounds.jsonl"
    with open(path) as fh:
        return [json.loads(line, **loads) for line in fh if line.strip()]


def round_periods(rounds: Sequence[RoundRecord]) -> list[float]:
    """Each round's period: from the previous round's record to its own (``timing.finished_at``);
    the first round, and a round without the stamps (older runs), count their ``round_seconds``.
    On a deployed or in-process grid the next round's train messages go out with this round's
    evaluation, so ``round_seconds`` overlap there and do not add up to the run's time; periods do.
    """
    out: list[float] = []
    before = None
    for rec in rounds:
        now = rec.timing.get("finished_at")
        out.append(float(now - before) if before is not None and now is not None else float(rec.round_seconds or 0.0))
        before = now
    return out


def late_mean(rounds: Sequence[RoundRecord], metric: str, last: int) -> float | None:
    """A central metric averaged over the last ``last`` rounds that report it (None if none do).
    At a small budget the model swings by several points from round to round, so the final
    round alone is a noisy reading of where a run got to.
    """
    vals = [float(r.central[metric]) for r in rounds if isinstance(r.central.get(metric), (int, float))]
    return sum(vals[-last:]) / len(vals[-last:]) if vals else None


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def read_config(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "config.json").read_text())

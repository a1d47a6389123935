"""The pooled reference of one run: how far federating is from pooling the hospitals' data.

``hospitrust reference pooled RUN_DIR`` (or ``hospitrust simulate --pooled-reference``) trains the
leaderboard's ``pooled`` control (:func:`hospitrust.bench.controls.train_pooled`: the same model, the
hospitals' recipe, the union of the honest hospitals' training partitions in one place) for the run
config a simulated run's ``config.json`` records, evaluates it on the run's test split after each
epoch, and writes ``RUN_DIR/pooled-reference.json``. ``hospitrust report RUN_DIR`` and the end of
``hospitrust simulate`` then print one line: the reference's final balanced accuracy, the run's, and
the gap (the run minus the reference); without the file, one line saying how to make it.

The budget is matched to the federated run unless given: ``num-server-rounds x local-epochs``
epochs over the union, the passes over their data every hospital makes when all of them train every
round, at the run's learning rate. The leaderboard's controls instead train ``control-epochs``
chosen on tuning seeds (``--epochs`` and ``--learning-rate`` take those).

Only a simulation has the hospitals' data in one place: a run of real hospitals (a task of the
consortium's own, or hospitals with data of their own) has no pooled reference.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the file in the run directory
REFERENCE_FILE = "pooled-reference.json"
#: run config keys that do not change what the reference trains (where and how long the run waited, its files)
_IRRELEVANT = ("output-dir", "run-name", "resume-from", "reply-timeout", "min-hospitals", "data-dir", "checkpoint")


class PooledReferenceError(ValueError):
    """No pooled reference can be made for this run; the message says why and what was expected."""


def reference_path(run_dir: str | Path) -> Path:
    """Where a run's pooled reference is written: ``RUN_DIR/pooled-reference.json``."""
    return Path(run_dir) / REFERENCE_FILE


def _saved_config(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise PooledReferenceError(f"{run_dir} is not a folder: give a run directory (`hospitrust simulate` prints it last, "
                             "after `results:`)")
    path = run_dir / "config.json"
    if not path.is_file():
        raise PooledReferenceError(f"{run_dir} has no config.json: give a run directory (the folder holding config.json, "
                             "rounds.jsonl and summary.json)")
    try:
        saved = json.loads(path.read_text())
    except ValueError as exc:
        raise PooledReferenceError(f"{path} is not JSON ({exc})") from None
    if not isinstance(saved, dict):
        raise PooledReferenceError(f"{path} holds no run config (expected a JSON object)")
    return saved


def _not_poolable(saved: dict[str, Any]) -> str | None:
    """Why the hospitals' data of this run cannot be pooled on this machine; None if it can."""
    if saved.get("control"):
        return (f"this run directory is the leaderboard's {saved['control']!r} control, not a federated run: a pooled "
                "reference is what a federation is measured against")
    if str(saved.get("task.file", "")).strip() or str(saved.get("task.classes", "")).strip():
        return ("this run's task is the consortium's own (task.file / task.classes): the pooled reference needs the "
                "hospitals' training data in one place, which only a simulation (`hospitrust simulate`, dataset = "
                "FLAG) has; real hospitals keep theirs")
    own = sorted(h for h, pid in (saved.get("partitions") or {}).items() if not isinstance(pid, int) or pid < 0)
    if own:
        return (f"{', '.join(own)} trained on data of their own (no simulated partition): the pooled reference needs the "
                "hospitals' training data in one place, which only a simulation (`hospitrust simulate`) has")
    return None


def run_setting(run_dir: str | Path) -> tuple[dict[str, Any], int]:
    """The run config and the number of simulated hospitals a run directory records (``config.json``).

    Parameters
    ----------
    run_dir : str or Path
        A run directory.

    Returns
    -------
    tuple[dict[str, Any], int]
        The flat run config (the keys the run config knows; a missing one at its default) and ``num-partitions``.
    """
    from hospitrust.config import RunConfig

    run_dir = Path(run_dir)
    saved = _saved_config(run_dir)
    if (why := _not_poolable(saved)) is not None:
        raise PooledReferenceError(why)
    hospitals = saved.get("num-partitions")
    if not isinstance(hospitals, int) or isinstance(hospitals, bool) or hospitals < 1:
        raise PooledReferenceError(f"{run_dir / 'config.json'} does not say how many hospitals the training split was divided "
                             f"among (num-partitions, a positive integer; got {hospitals!r}): was it written by a "
                             "simulated run?")
    defaults = RunConfig().to_flat()  # a key an older run did not record takes its default
    return {**defaults, **{k: v for k, v in saved.items() if k in defaults}}, hospitals


def config_fingerprint(run_config: dict[str, Any]) -> str:
    """A short hash of the run config keys the reference depends on (a changed run config is noticed)."""
    kept = {k: v for k, v in sorted(run_config.items()) if k not in _IRRELEVANT}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def matched_epochs(run_config: dict[str, Any]) -> int:
    """The federated run's budget as epochs over the union: ``num-server-rounds x local-epochs``."""
    return int(run_config["num-server-rounds"]) * int(run_config["local-epochs"])


def make_pooled_reference(run_dir: str | Path, *, epochs: int | None = None, learning_rate: float | None = None,
                          on_epoch: Callable[[int, int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train the pooled reference of the run in ``run_dir`` and write ``RUN_DIR/pooled-reference.json``.

    Parameters
    ----------
    run_dir : str or Path
        A simulated run's directory (its ``config.json``).
    epochs : int or None
        Epochs over the union; None: matched to the run (``num-server-rounds x local-epochs``).
    learning_rate : float or None
        None: the run's ``learning-rate``.
    on_epoch : callable or None
        Called with (epoch, epochs, central report) after each epoch.

    Returns
    -------
    dict[str, Any]
        What was written.
    """
    from hospitrust.bench.controls import CEILING, Control, train_pooled

    run_dir = Path(run_dir).expanduser().resolve()
    run_config, hospitals = run_setting(run_dir)
    matched = epochs is None
    control = Control.from_keys({"control": CEILING, "control-epochs": matched_epochs(run_config) if matched else epochs,
                                 **({"control-learning-rate": learning_rate} if learning_rate is not None else {})})
    assert control is not None and control.epochs is not None  # control = "pooled" was given
    total = control.epochs
    started = time.time()
    history, facts = train_pooled(run_config, hospitals, control,
                                  None if on_epoch is None else lambda e, report: on_epoch(e, total, report))
    final = history[-1]
    record: dict[str, Any] = {
        "reference": CEILING,
        "run": run_dir.name,
        "config_fingerprint": config_fingerprint(run_config),
        "dataset": run_config.get("dataset"), "model": run_config.get("model"), "seed": run_config.get("seed"),
        "hospitals": hospitals,
        "pooled_hospitals": facts["honest_hospitals"],
        "pooled_images": facts["pooled_images"],
        "epochs": total,
        "learning_rate": control.learning_rate or run_config.get("learning-rate"),
        "budget": (f"matched: num-server-rounds {run_config['num-server-rounds']} x local-epochs "
                   f"{run_config['local-epochs']}" if matched else "given (--epochs)"),
        "final": final,
        "per_class_recall": dict(zip(facts["class_names"], final.get("per_class_recall") or [])),
        "history": [{"epoch": i, "balanced_accuracy": r["balanced_accuracy"], "auc": r["auc"]}
                    for i, r in enumerate(history, start=1)],
        "device": facts["device"],
        "wall_seconds": time.time() - started,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    gap = run_gap(run_dir, record)
    if gap is not None:
        record["this_run"], record["gap"] = gap
    from hospitrust.server_app.results import jsonable

    path = reference_path(run_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(jsonable(record), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)
    return record


def read_reference(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's pooled reference (``pooled-reference.json``), or None where there is none (or it is unreadable)."""
    path = reference_path(run_dir)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("final"), dict) else None


def _value(report: Any, key: str) -> float:
    value = report.get(key) if isinstance(report, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def run_gap(run_dir: str | Path, reference: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]] | None:
    """The run's final balanced accuracy and AUC and the run minus the reference, from ``summary.json``.

    None while the run has no summary; a metric written as null (NaN) is NaN here.
    """
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or not isinstance(summary.get("final"), dict):
        return None
    run = {k: _value(summary["final"], k) for k in ("balanced_accuracy", "auc")}
    return run, {k: run[k] - _value(reference.get("final"), k) for k in run}


def _number(value: Any, sign: str = "") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # NaN: n/a
        return f"{value:{sign}.4f}"
    return "n/a"


def count(n: Any, word: str) -> str:
    """``1 epoch``, ``2 epochs``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def gap_line(run_dir: str | Path) -> str:
    """One line for the end of a run's output or report.

    The pooled reference, this run and the gap when the reference exists; otherwise how to make it (or why a
    run of real hospitals has none).
    """
    run_dir = Path(run_dir)
    reference = read_reference(run_dir)
    if reference is None:
        try:
            why = _not_poolable(_saved_config(run_dir))
        except PooledReferenceError:
            why = None
        if why is not None:
            return f"pooled reference: none can be made for this run ({why})"
        return (f"pooled reference: none yet; `hospitrust reference pooled {run_dir}` trains it (the same model and "
                "recipe on the hospitals' training images in one place) and this line then shows the gap")
    ref = reference["final"]
    head = (f"pooled reference: balanced accuracy {_number(ref.get('balanced_accuracy'))} "
            f"(AUC {_number(ref.get('auc'))})")
    where = (f"{count(reference.get('epochs', '?'), 'epoch')} on {count(reference.get('pooled_images', '?'), 'image')} "
             f"of {count(len(reference.get('pooled_hospitals') or []), 'hospital')}")
    gap = run_gap(run_dir, reference)
    if gap is None:
        return f"{head}; this run: no summary.json yet ({where})"
    run, diff = gap
    line = (f"{head}; this run: {_number(run['balanced_accuracy'])} (AUC {_number(run['auc'])}); "
            f"gap: {_number(diff['balanced_accuracy'], '+')} (AUC {_number(diff['auc'], '+')}) "
            f"(this run minus the reference; {where})")
    made_for = reference.get("config_fingerprint")
    try:
        changed = made_for is not None and made_for != config_fingerprint(run_setting(run_dir)[0])
    except PooledReferenceError:
        changed = False
    if changed:
        line += (f"; the run's config changed since the reference was made: `hospitrust reference pooled {run_dir} "
                 "--force` trains it again")
    return line

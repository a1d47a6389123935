"""The results store of a grid: one row per cell and round, with the cell's config columns.

Written from the run directories (never appended to, so a resumed grid cannot duplicate a row):

- ``results.csv``     table ``rounds``: one row per cell and round
- ``cells.csv``       table ``cells``: one row per cell (final metrics, status, timings, error)
- ``results.sqlite``  tables ``rounds``, ``cells`` and ``clients`` (one row per cell, round and
  hospital: malicious, selected, rejected, weight, trust, reputation, flagged)

Config columns: the grid's axes (a table axis by its label), ``hospitals``, and every run config
key whose value differs between cells, plus strategy, attack, malicious-fraction, seed,
dataset, partitioner and dirichlet.alpha always (old flat keys read under their new names). Works on a grid directory written by
``hospitrust bench`` (``cells/<cell>/``) and on a folder of run directories (e.g. the output of
``benchmarks/attack_matrix.py``).
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from hospitrust.bench.events import read_events
from hospitrust.config import legacy
from hospitrust.records import RoundRecord
from hospitrust.server_app.results import read_round_records, round_periods

ALWAYS = ("strategy", "attack", "malicious-fraction", "seed", "dataset", "partitioner", "dirichlet.alpha",
          "num-server-rounds")
NOT_CONFIG = {"run-name", "output-dir", "data-dir", "data-dir-resolved", "resume-from", "server-device", "class-names", "ground-truth",
              "hospitals", "reference-cohort-size"}
CENTRAL = ("balanced_accuracy", "accuracy", "auc", "macro_f1", "worst_class_recall", "rare_class_macro_f1", "loss",
           "attack_success_rate")


def cell_dirs(grid_dir: Path) -> list[Path]:
    """Run directories of a grid folder: ``cells/*`` (hospitrust bench) or ``*`` (a folder of runs)."""
    grid_dir = Path(grid_dir)
    base = grid_dir / "cells" if (grid_dir / "cells").is_dir() else grid_dir
    return sorted(p for p in base.iterdir() if p.is_dir() and (p / "config.json").is_file())


def run_configs(grid_dir: Path) -> dict[str, dict[str, Any]]:
    """Cell name -> its run config (``config.json``, old flat keys of a 0.1 run translated)."""
    return {p.name: legacy.translate(json.loads((p / "config.json").read_text()))[0] for p in cell_dirs(grid_dir)}


def is_option(key: str, value: Any) -> bool:
    """Whether a run-config entry is an option a results table shows (a scalar setting, not a path or a name)."""
    return key not in NOT_CONFIG and isinstance(value, (str, int, float, bool))


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return sum(vals) / len(vals) if vals else math.nan


def _grid_meta(grid_dir: Path) -> dict[str, Any]:
    path = grid_dir / "grid.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _cell_events(grid_dir: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Last 'done' and last 'failed' event per cell from bench.jsonl."""
    done: dict[str, dict] = {}
    failed: dict[str, dict] = {}
    for ev in read_events(grid_dir):
        if ev.get("event") == "cell":
            (done if ev.get("status") == "done" else failed)[ev["cell"]] = ev
    return done, failed


def collect(grid_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(rounds, cells, clients) data frames of a grid folder."""
    grid_dir = Path(grid_dir)
    meta = _grid_meta(grid_dir)
    axes_by_cell = {c["cell"]: {**c.get("axes", {}), "hospitals": c.get("hospitals")} for c in meta.get("cells", [])}
    done_events, failed_events = _cell_events(grid_dir)
    dirs = {p.name: p for p in cell_dirs(grid_dir)}
    configs = run_configs(grid_dir)
    # cells named in grid.json that never started (or failed before writing config.json)
    names = list(dict.fromkeys([*axes_by_cell, *dirs]))
    scalar_keys = sorted({k for cfg in configs.values() for k, v in cfg.items() if is_option(k, v)})
    varying = [k for k in scalar_keys if len({json.dumps(cfg.get(k)) for cfg in configs.values()}) > 1]
    axis_cols = list(dict.fromkeys(k for c in axes_by_cell.values() for k in c))
    config_cols = list(dict.fromkeys([*axis_cols, *[k for k in ALWAYS if k in scalar_keys], *varying]))
    if "hospitals" not in config_cols:
        config_cols.append("hospitals")

    round_rows, cell_rows, client_rows = [], [], []
    for name in names:
        cfg = configs.get(name, {})
        cols: dict[str, Any] = {"cell": name}
        for key in config_cols:
            axes = axes_by_cell.get(name, {})
            if key in axes:
                cols[key] = axes[key]
            elif key == "hospitals":
                cols[key] = len(cfg.get("hospitals", {})) or None
            else:
                cols[key] = cfg.get(key)
        path = dirs.get(name)
        summary_path = path / "summary.json" if path else None
        status = "done" if summary_path and summary_path.is_file() else (
            "failed" if name in failed_events or (grid_dir / "failed" / f"{name}.json").is_file() else "pending")
        rounds: list[RoundRecord] = []
        if path and (path / "rounds.jsonl").is_file() and status == "done":
            rounds = read_round_records(path)
        for rec in rounds:
            central = rec.central
            det = rec.entries.get("detection") or {}
            fair = rec.fairness or {}
            clients = rec.clients
            row = {**cols, "round": rec.number, **{m: _num(central.get(m)) for m in CENTRAL},
                   "detection_tpr": _num(det.get("tpr")), "detection_fpr": _num(det.get("fpr")),
                   "hospital_acc_min": _num(fair.get("min")), "hospital_acc_max": _num(fair.get("max")),
                   "hospital_acc_mean": _num(fair.get("mean")), "hospital_acc_std": _num(fair.get("std")),
                   "hospital_acc_spread": _num(fair.get("spread")),
                   "round_seconds": _num(rec.round_seconds),
                   "aggregation_seconds": _num(rec.aggregation_seconds),
                   "kept_previous_model": rec.kept_previous_model,
                   # the rule's own trust (the signal it names; NaN for a rule that gives none)
                   "trust_honest": _mean([_num(c.trust) for c in clients if not c.malicious]),
                   "trust_malicious": _mean([_num(c.trust) for c in clients if c.malicious])}
            round_rows.append(row)
            for c in clients:
                client_rows.append({"cell": name, "round": rec.number, "hospital": c.hospital,
                                    "malicious": bool(c.malicious), "selected": c.selected,
                                    "rejected": c.rejected, "flagged": bool(c.flagged),
                                    "weight": _num(c.weight), "trust": _num(c.trust),
                                    "reputation": _num(c.signal("reputation")),
                                    "hospital_accuracy": _num(rec.hospital_accuracy.get(c.hospital))})
        cell = dict(cols, status=status)
        if status == "done":
            assert summary_path is not None  # status done: the file is there
            summary = json.loads(summary_path.read_text())
            final, sec, fair = summary.get("final", {}), summary.get("security") or {}, summary.get("fairness") or {}
            train = sum(round_periods(rounds))  # round_seconds overlap where rounds do
            ev = done_events.get(name, {})
            if ev.get("seconds") is None:  # no event, or one logged late without its timing
                ev = {}
            cell_seconds = _num(ev.get("seconds")) if ev else _num(summary.get("wall_seconds"))
            cell.update({f"final_{m}": _num(final.get(m)) for m in CENTRAL})
            cell.update(rounds=len(rounds), best_round=summary.get("best_round"),
                        detection_tpr=_num(sec.get("tpr")), detection_fpr=_num(sec.get("fpr")),
                        hospital_acc_spread=_num(fair.get("spread")), hospital_acc_min=_num(fair.get("min")),
                        run_seconds=_num(summary.get("wall_seconds")), cell_seconds=cell_seconds,
                        round_seconds_total=train, overhead_seconds=cell_seconds - train,
                        timing_source="bench" if ev else "summary", worker_cell_index=ev.get("worker_cell_index"),
                        worker_setup_seconds=_num(ev.get("worker_setup_seconds")), error="")
        elif status == "failed":
            failed_ev = failed_events.get(name)
            if failed_ev is None and (grid_dir / "failed" / f"{name}.json").is_file():
                failed_ev = json.loads((grid_dir / "failed" / f"{name}.json").read_text())
            cell.update(error=(failed_ev or {}).get("error", ""), cell_seconds=_num((failed_ev or {}).get("seconds")))
        cell_rows.append(cell)
    return pd.DataFrame(round_rows), pd.DataFrame(cell_rows), pd.DataFrame(client_rows)


def build_store(grid_dir: str | Path, grid=None) -> list[Path]:
    """Write results.csv, cells.csv and results.sqlite (replaced whole, atomically)."""
    grid_dir = Path(grid_dir)
    rounds, cells, clients = collect(grid_dir)
    written = []
    for frame, name in ((rounds, "results.csv"), (cells, "cells.csv")):
        tmp = grid_dir / f".{name}.tmp"
        frame.to_csv(tmp, index=False)
        tmp.replace(grid_dir / name)
        written.append(grid_dir / name)
    tmp = grid_dir / ".results.sqlite.tmp"
    tmp.unlink(missing_ok=True)
    with sqlite3.connect(tmp) as con:
        for frame, table in ((rounds, "rounds"), (cells, "cells"), (clients, "clients")):
            if len(frame):
                frame.to_sql(table, con, index=False)
            else:
                con.execute(f"CREATE TABLE {table} (cell TEXT)")
    tmp.replace(grid_dir / "results.sqlite")
    written.append(grid_dir / "results.sqlite")
    return written


def overhead_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per backend-independent view: cell wall time, time inside rounds, and the overhead share."""
    done = cells[cells["status"] == "done"] if len(cells) and "status" in cells else cells
    if not len(done) or "cell_seconds" not in done:
        return pd.DataFrame()
    total = done["cell_seconds"].sum()
    rounds = done["round_seconds_total"].sum()
    return pd.DataFrame([{
        "cells": len(done), "mean_cell_seconds": done["cell_seconds"].mean(),
        "mean_round_seconds_total": done["round_seconds_total"].mean(),
        "mean_overhead_seconds": done["overhead_seconds"].mean(),
        "overhead_share": (total - rounds) / total if total else math.nan,
        "first_cell_of_worker_overhead": done.loc[done.get("worker_cell_index", pd.Series(dtype=float)) == 1,
                                                  "overhead_seconds"].mean() if "worker_cell_index" in done else math.nan,
        "later_cell_overhead": done.loc[done.get("worker_cell_index", pd.Series(dtype=float)) > 1,
                                        "overhead_seconds"].mean() if "worker_cell_index" in done else math.nan,
        "mean_worker_setup_seconds": done.loc[done["worker_setup_seconds"] > 0, "worker_setup_seconds"].mean()
        if "worker_setup_seconds" in done else math.nan,
        "timing_source": ",".join(sorted(set(done.get("timing_source", pd.Series(["?"])).dropna()))),
    }])


def overhead_summary(grid_dir: str | Path) -> str:
    """One line: how much of the cells' wall time was spent in rounds and how much around them."""
    cells_csv = Path(grid_dir) / "cells.csv"
    if not cells_csv.is_file():
        return ""
    table = overhead_table(pd.read_csv(cells_csv))
    if not len(table):
        return ""
    t = table.iloc[0]
    return (f"overhead: {int(t.cells)} finished cells, mean {t.mean_cell_seconds:.1f} s per cell, of which "
            f"{t.mean_round_seconds_total:.1f} s in rounds (train + aggregate + evaluate) and "
            f"{t.mean_overhead_seconds:.1f} s around them: overhead share {100 * t.overhead_share:.1f} % "
            f"(first cell of a worker {t.first_cell_of_worker_overhead:.1f} s, later cells {t.later_cell_overhead:.1f} s; "
            f"worker start-up {t.mean_worker_setup_seconds:.1f} s once per worker)")

"""``hospitrust deploy hospitals``: the federation's hospitals by name, as the operator sees them.

Flower's SuperLink knows SuperNodes by node id only (``flwr supernode list`` shows owner ``none`` in
the open-source distribution); a hospital's name is what its SuperNode tells the ServerApp in a run's
query round, and the run records it in ``config.json`` (``hospitals``: node id -> name, and
``hospital-data``: each hospital's data card; ``failed-hospitals``: those left out, with the reason).
This joins the two: the SuperLink's list through the operator's connection, and the run directories
on the SuperLink machine. A SuperNode keeps its node id across restarts (it is fixed by its registered
key), so the newest run that saw a node id names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hospitrust.errors import DeployError


@dataclass
class HospitalRecord:
    """What the run directories say about one hospital."""

    name: str
    node_id: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # the data card of the newest run it answered the query of
    data_run: str = ""  # that run
    runs: list[str] = field(default_factory=list)  # runs it took part in, oldest first
    left_out: list[str] = field(default_factory=list)  # "run: reason" for each run that left it out


def _run_dirs(runs_dir: Path) -> list[Path]:
    """Run directories (those with a config.json), oldest first by their config's time."""
    if not runs_dir.is_dir():
        raise DeployError(f"--runs-dir {runs_dir} is not a folder (the runs' output-dir on the SuperLink machine)")
    dirs = [p.parent for p in runs_dir.glob("*/config.json")]
    return sorted(dirs, key=lambda d: ((d / "config.json").stat().st_mtime, d.name))


def _class_counts(run: Path) -> dict[str, dict[str, Any]]:
    """``class_counts.csv`` of a run: hospital -> {"train-class-counts": [...], "val-class-counts": [...],
    "class-names": [...]}; empty when the run has none.
    """
    import csv

    path = run / "class_counts.csv"
    if not path.is_file():
        return {}
    out: dict[str, dict[str, Any]] = {}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        names = [c for c in (reader.fieldnames or []) if c not in ("hospital", "split", "total")]
        for row in reader:
            split = row.get("split", "")
            if split in ("train", "val"):
                entry = out.setdefault(row["hospital"], {"class-names": names})
                entry[f"{split}-class-counts"] = [int(row[c]) for c in names]
    return out


def read_runs(runs_dir: Path) -> dict[str, HospitalRecord]:
    """Every hospital named in the runs under ``runs_dir``, by name."""
    out: dict[str, HospitalRecord] = {}
    for run in _run_dirs(Path(runs_dir)):
        try:
            config = json.loads((run / "config.json").read_text())
        except (OSError, ValueError):
            continue  # a run still writing its config, or a stray file: not a record to read
        names = config.get("hospitals") or {}
        data = config.get("hospital-data") or {}
        for node_id, name in names.items():
            rec = out.setdefault(name, HospitalRecord(name))
            rec.node_id = str(node_id)
            rec.runs.append(run.name)
            if name in data:  # counts from the data card, or else the run's class_counts.csv
                rec.data, rec.data_run = {**_class_counts(run).get(name, {}), **data[name]}, run.name
        for failed in config.get("failed-hospitals") or []:
            name = str(failed.get("hospital", ""))
            if not name:
                continue
            rec = out.setdefault(name, HospitalRecord(name))
            if failed.get("node_id") is not None:
                rec.node_id = str(failed["node_id"])
            rec.left_out.append(f"{run.name}: {failed.get('reason', '')}")
    return _merge_placeholders(out)


def _placeholder(rec: HospitalRecord) -> bool:
    """A record named ``node N`` after its node id: a hospital left out before it said its name."""
    return bool(rec.node_id) and rec.name == f"node {rec.node_id}"


def _merge_placeholders(records: dict[str, HospitalRecord]) -> dict[str, HospitalRecord]:
    """A ``node N`` record whose node id a run named (earlier or later) is that hospital: its reasons for being
    left out go to the named record, so the name is never lost to the placeholder.
    """
    named = {rec.node_id: rec for rec in records.values() if rec.node_id and not _placeholder(rec)}
    out = {}
    for name, rec in records.items():
        if _placeholder(rec) and rec.node_id in named:
            named[rec.node_id].left_out.extend(rec.left_out)
        else:
            out[name] = rec
    return out


def _last_seen(node: dict[str, Any]) -> str:
    status = node.get("status", "")
    if status == "online":
        return f"now (online since {node.get('online-at') or '?'})"
    if status == "offline":
        return str(node.get("offline-at") or "?")
    if status == "registered":
        return "never connected"
    return str(node.get("deleted-at") or "")


def federation_hospitals(nodes: list[dict[str, Any]], records: dict[str, HospitalRecord]) -> list[dict[str, Any]]:
    """One row per SuperNode the SuperLink lists (named from the runs), then the hospitals of the runs
    whose node the SuperLink no longer lists.
    """
    by_node = {rec.node_id: rec for rec in records.values() if rec.node_id and _placeholder(rec)}
    by_node |= {rec.node_id: rec for rec in records.values() if rec.node_id and not _placeholder(rec)}  # a name wins
    rows, seen = [], set()
    for node in nodes:
        node_id = str(node.get("node-id", ""))
        rec = by_node.get(node_id)
        seen.add(node_id)
        rows.append(_row(rec.name if rec else "", node_id, str(node.get("status", "")), _last_seen(node), rec))
    for rec in records.values():
        if rec.node_id not in seen:
            rows.append(_row(rec.name, rec.node_id, "not listed", "", rec))
    return rows


def _row(name: str, node_id: str, status: str, last_seen: str, rec: HospitalRecord | None) -> dict[str, Any]:
    data = rec.data if rec else {}
    return {
        "hospital": name, "node-id": node_id, "status": status, "last-seen": last_seen,
        "data-format": data.get("format", ""), "images": data.get("images"),
        "train-class-counts": data.get("train-class-counts"), "val-class-counts": data.get("val-class-counts"),
        "data-from-run": rec.data_run if rec else "", "runs": list(rec.runs) if rec else [],
        "left-out": list(rec.left_out) if rec else [],
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table, then each hospital's runs and reasons for being left out."""
    if not rows:
        return "no SuperNodes registered and no runs found"
    head = ("hospital", "node id", "status", "last seen", "data (last query)", "runs")
    table = []
    for r in rows:
        counts = ""
        if r["train-class-counts"] is not None:
            counts = f", train {r['train-class-counts']} val {r['val-class-counts']}"
        data = f"{r['data-format']}: {r['images']} images{counts}" if r["data-format"] else ""
        table.append((r["hospital"] or "(no run yet)", r["node-id"], r["status"], r["last-seen"], data,
                      str(len(r["runs"]))))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in (head, *table)]
    for r in rows:
        if r["runs"]:
            lines.append(f"{r['hospital']}: took part in {', '.join(r['runs'])}")
        for reason in r["left-out"]:
            lines.append(f"{r['hospital'] or r['node-id']}: left out of {reason}")
    return "\n".join(lines)


def list_nodes(connection: str, *, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``flwr supernode list CONNECTION --format json``: every registered SuperNode; DeployError with
    flwr's answer when it cannot be read (a tunnel not running, a connection not written).
    """
    from hospitrust.ops import flwr

    res = flwr.flwr_cli(["supernode", "list", connection, "--format", "json"], env=env)
    try:
        answer = json.loads(res.stdout)
    except ValueError:
        answer = {}
    if not answer.get("success", False) or "nodes" not in answer:
        detail = (answer.get("error-message") or res.stdout + res.stderr).strip()[-1500:]
        raise DeployError(f"flwr supernode list {connection} failed: {detail} (is the tunnel running? "
                          f"hospitrust deploy tunnel {connection})")
    return list(answer["nodes"])

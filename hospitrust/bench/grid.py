"""A benchmark grid: a TOML file that expands into named cells, each a complete run config.

    [grid]
    name = "smoke"
    backend = "inprocess"          # inprocess (default) | simulation
    workers = 2                    # cells in flight
    aggregation-backend = "auto"   # each cell's aggregation.backend: auto compiles where it pays, eager never
    hospitals = 4                  # simulated hospitals per cell (or an axis, below)
    metric = "balanced_accuracy"   # the report's headline metric
    baseline = "fedavg"            # paired differences are taken against this strategy

    [base]                         # run config for every cell (over pyproject's defaults)
    num-server-rounds = 2
    assumed-malicious = "auto"     # max(1, round(malicious-fraction x hospitals))

    [axes]                         # the cartesian product of these
    strategy = ["fedavg", "median"]
    attack = ["none", "sign-flip"]
    seed = [1, 2]
    heterogeneity = [              # an axis of tables sets several keys at once; `label` names it
        { label = "iid", partitioner = "iid" },
        { label = "dir0.1", partitioner = "dirichlet", "dirichlet.alpha" = 0.1 },
    ]

    # a control, a row trained without federating (hospitrust.bench.controls), is an axis table with
    # `control` (and, trained to convergence, control-epochs and control-learning-rate), e.g. in a
    # strategy axis of tables: { label = "pooled", control = "pooled", control-epochs = 60, control-learning-rate = 0.01 }

    [[when]]                       # applied to every cell in order, after the axes
    if = { attack = "none" }       # a list value means any of
    set = { malicious-fraction = 0.0 }
    # skip = true                  # or drop the matching cells

A component's options are written with their section (``hta.exclusion-mads = 1.0``, or quoted
as one key); a cell keeps only the keys of the components it selects, so ``[base]`` can hold the
options of every rule of a strategy axis. Old flat keys (``hta-lambda``) are translated with a
deprecation line.

A cell's name is ``key=value`` for every axis, joined by ``__`` (values as resolved after the
``when`` rules, table axes by their label); cells that resolve to the same name must have the
same config and are run once. Every cell's run config is validated with
``hospitrust.config.parse_run_config`` when the grid is loaded, before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hospitrust.config import ConfigError, legacy, parse_run_config
from hospitrust.config.run import preset_key_problems, restrict_to_active
from hospitrust.errors import did_you_mean
from hospitrust.ops.simulate import app_config_defaults, flatten_sections

BACKENDS = ("inprocess", "simulation")
GRID_KEYS = {"name", "description", "backend", "workers", "hospitals", "metric", "baseline", "keep-models", "timeout",
             "threads-per-worker", "reuse-workers", "shared-superlink", "aggregation-backend"}
AXIS_ONLY_KEYS = {"hospitals"}  # axes that are not run config keys
# a control (hospitrust.bench.controls): a cell trained without federating, a row beside the rules
from hospitrust.bench.controls import CONTROL_KEYS, Control, ControlError  # noqa: E402
from hospitrust.bench.names import METRICS  # noqa: E402 - defined where the CLI reads it without the run config
_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-]")


class GridError(ValueError):
    """The grid file is wrong; the message names the table, key or cell and what is allowed."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid: its name, its axis values (for tables and plots) and its run config."""

    name: str
    axes: dict[str, Any]
    run_config: dict[str, Any]
    hospitals: int
    control: dict[str, Any] = field(default_factory=dict)  # a control's keys (control, control-epochs, ...); {} for a rule

    def columns(self) -> dict[str, Any]:
        return {"cell": self.name, **self.axes, "hospitals": self.hospitals}


@dataclass
class Grid:
    name: str
    path: Path | None
    backend: str
    workers: int
    metric: str
    baseline: str
    keep_models: bool
    timeout: float
    threads_per_worker: int
    reuse_workers: bool
    shared_superlink: bool
    aggregation_backend: str
    description: str
    axes: dict[str, list[Any]]
    cells: list[Cell] = field(default_factory=list)
    skipped: int = 0
    duplicates: int = 0

    @property
    def axis_names(self) -> list[str]:
        return list(self.axes)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return _UNSAFE.sub("_", str(value))


def cell_name(axis_values: Mapping[str, Any]) -> str:
    """``key=value__key=value``: readable, safe as a folder name, stable across runs of the grid."""
    name = "__".join(f"{k}={_format_value(v)}" for k, v in axis_values.items()) or "cell"
    if len(name) > 200:  # folder names stop at 255 bytes; keep them unique
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[:180]}__{digest}"
    return name


def _matches(condition: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    for key, wanted in condition.items():
        have = values.get(key)
        options = wanted if isinstance(wanted, list) else [wanted]
        if not any(have == o or (isinstance(have, (int, float)) and isinstance(o, (int, float)) and math.isclose(have, o))
                   for o in options):
            return False
    return True


def parse_grid(source: str | Path | Mapping[str, Any], *, app_dir: Path | None = None,
               validate: bool = True) -> Grid:
    """Read a grid (a TOML path or an already-parsed dict), expand it into cells, validate every cell."""
    path = None
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise GridError(f"grid file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise GridError(f"{path}: not valid TOML: {exc}") from None
    unknown_tables = sorted(set(data) - {"grid", "base", "axes", "when"})
    if unknown_tables:
        raise GridError(f"unknown table(s) {unknown_tables}; a grid has [grid], [base], [axes] and [[when]]")
    meta = dict(data.get("grid", {}))
    bad = sorted(set(meta) - GRID_KEYS)
    if bad:
        raise GridError(f"[grid]: unknown key(s) {bad}; known: {', '.join(sorted(GRID_KEYS))}")
    backend = meta.get("backend", "inprocess")
    if backend not in BACKENDS:
        raise GridError(f"[grid] backend = {backend!r}; allowed: {', '.join(BACKENDS)}")
    if meta.get("aggregation-backend", "auto") not in ("auto", "eager", "compile"):
        raise GridError(f"[grid] aggregation-backend = {meta['aggregation-backend']!r}; allowed: auto, eager, compile "
                        "(each cell's run config aggregation.backend: eager never compiles the aggregation kernels, auto where it pays)")
    metric = meta.get("metric", "balanced_accuracy")
    if metric not in METRICS:
        raise GridError(f"[grid] metric = {metric!r}; allowed: {', '.join(METRICS)}")
    workers = meta.get("workers", 2)
    if not isinstance(workers, int) or workers < 1:
        raise GridError(f"[grid] workers = {workers!r}: must be an integer >= 1")
    default_hospitals = meta.get("hospitals", 10)

    defaults = app_config_defaults(app_dir)
    # a dotted key (hta.exclusion-mads = 1.0) is a nested table in TOML: flatten it as Flower does
    base = _translated(flatten_sections(dict(data.get("base", {}))), "[base]")
    axes_raw = {k: ([flatten_sections(v) if isinstance(v, dict) else v for v in vals] if isinstance(vals, list) else vals)
                for k, vals in flatten_sections(dict(data.get("axes", {}))).items()}
    for key, values in axes_raw.items():
        if not isinstance(values, list) or not values:
            raise GridError(f"[axes] {key} must be a non-empty list, got {values!r}")
        if any(isinstance(v, dict) for v in values) and not all(isinstance(v, dict) for v in values):
            raise GridError(f"[axes] {key}: mix of tables and plain values; use one or the other")
        if all(isinstance(v, dict) for v in values):
            table_labels = [v.get("label") for v in values]
            if any(not isinstance(lbl, str) or not lbl for lbl in table_labels):
                raise GridError(f"[axes] {key}: every table needs a `label` (a short name for the cell names)")
            if len(set(table_labels)) != len(table_labels):
                raise GridError(f"[axes] {key}: labels repeat: {table_labels}")
        elif key not in defaults and key not in AXIS_ONLY_KEYS and key not in CONTROL_KEYS and not legacy.new_names(key):
            raise GridError(_unknown_key_message(f"[axes] {key}", key, defaults))
    base_control = {k: base.pop(k) for k in list(base) if k in CONTROL_KEYS}
    for key in base:
        if key not in defaults:
            raise GridError(_unknown_key_message(f"[base] {key}", key, defaults))
    rules = data.get("when", [])
    if not isinstance(rules, list):
        raise GridError("[[when]] must be an array of tables: [[when]] if = {...} set = {...}")
    for i, clause in enumerate(rules):  # a [[when]] clause (not a rule of aggregation)
        extra = sorted(set(clause) - {"if", "set", "skip"})
        if extra or "if" not in clause or not ({"set", "skip"} & set(clause)):
            raise GridError(f"[[when]] #{i + 1}: needs `if` and `set` or `skip` (got keys {sorted(clause)})")
        clause["if"] = flatten_sections(dict(clause["if"]))
        if "set" in clause:
            clause["set"] = flatten_sections(dict(clause["set"]))

    grid = Grid(
        name=str(meta.get("name", path.stem if path else "grid")), path=path, backend=backend, workers=workers,
        metric=metric, baseline=str(meta.get("baseline", "fedavg")), keep_models=bool(meta.get("keep-models", False)),
        timeout=float(meta.get("timeout", 3600.0)), threads_per_worker=int(meta.get("threads-per-worker", 0)),
        reuse_workers=bool(meta.get("reuse-workers", True)), shared_superlink=bool(meta.get("shared-superlink", True)),
        aggregation_backend=str(meta.get("aggregation-backend", "auto")),
        description=str(meta.get("description", "")), axes=axes_raw,
    )
    errors: list[str] = []
    seen: dict[str, Cell] = {}
    keys = list(axes_raw)
    for combo in itertools.product(*(axes_raw[k] for k in keys)):
        config = {**defaults, **base}
        hospitals = default_hospitals
        control = dict(base_control)
        labels: dict[str, Any] = {}
        cell_keys = set(base)  # the keys this cell sets (a preset's value is overridden only by a set key)
        for key, value in zip(keys, combo):
            if isinstance(value, dict):
                labels[key] = value["label"]
                for k, v in value.items():
                    if k == "label":
                        continue
                    if k == "hospitals":
                        hospitals = v
                    elif k in CONTROL_KEYS:
                        control[k] = v
                    elif k not in defaults and not legacy.new_names(k):
                        errors.append(_unknown_key_message(f"[axes] {key} ({value['label']})", k, defaults))
                    else:
                        config[k] = v
                        cell_keys.add(k)
            elif key == "hospitals":
                hospitals = value
            elif key in CONTROL_KEYS:
                control[key] = value
            else:
                config[key] = value
                cell_keys.add(key)
        skip = False
        view: dict[str, Any] | None = None
        for rule in rules:
            if view is None:  # built again only after a clause set something: the next clause sees it
                view = {**legacy.translate(config)[0], **config, **control, **labels, "hospitals": hospitals}
            if _matches(rule["if"], view):
                if rule.get("skip"):
                    skip = True
                    break
                view = None
                for k, v in rule.get("set", {}).items():
                    if k == "hospitals":
                        hospitals = v
                    elif k in CONTROL_KEYS:
                        control[k] = v
                    elif k not in defaults and not legacy.new_names(k):
                        errors.append(_unknown_key_message("[[when]] set", k, defaults))
                    else:
                        config[k] = v
                        cell_keys.add(k)
        if skip:
            grid.skipped += 1
            continue
        if not isinstance(hospitals, int) or hospitals < 1:
            errors.append(f"hospitals = {hospitals!r}: must be an integer >= 1")
            continue
        if config.get("assumed-malicious") == "auto":
            config["assumed-malicious"] = max(1, round(float(config.get("malicious-fraction", 0.0)) * hospitals))
        axis_values = {k: labels.get(k, hospitals if k == "hospitals" else config.get(k)) for k in keys}
        name = cell_name(axis_values)
        # old flat keys under their new names (the cell's own selection decides the shared ones), and a
        # shared key of a component this cell does not select left out of its config
        translated = _translated(config, f"cell {name}", quiet=True)
        errors += [f"cell {name}: {p}" for p in preset_key_problems(translated, legacy.translate_keys(cell_keys, translated))]
        config = restrict_to_active(translated)
        config["run-name"] = name
        try:
            Control.from_keys(control)
        except ControlError as exc:
            errors.append(f"cell {name}: {exc}")
        cell = Cell(name=name, axes=axis_values, run_config=config, hospitals=hospitals, control=control)
        if name in seen:
            if seen[name].run_config != config or seen[name].hospitals != hospitals or seen[name].control != control:
                errors.append(f"cell {name}: two axis combinations give this name with different run configs")
            grid.duplicates += 1
            continue
        seen[name] = cell
        grid.cells.append(cell)

    if validate:
        errors += validate_cells(grid.cells)
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise GridError(f"grid {grid.name}: {len(errors)} problem(s), nothing was run:\n" + "\n".join(shown))
    if not grid.cells:
        raise GridError(f"grid {grid.name} has no cells (every combination was skipped)")
    return grid


def _translated(values: dict[str, Any], where: str, quiet: bool = False) -> dict[str, Any]:
    """Old flat keys under their new names; one line per old key in a grid file."""
    out, notes = legacy.translate(values)
    if not quiet:
        for note in notes:
            print(f"hospitrust bench: {where}: {note}", file=sys.stderr)
    return out


def validate_cells(cells: list[Cell]) -> list[str]:
    """Every cell's run config through parse_run_config (and the hospital count against it)."""
    errors = []
    for cell in cells:
        try:
            cfg = parse_run_config(cell.run_config)
        except ConfigError as exc:
            errors.append(f"cell {cell.name}: {exc}")
            continue
        if cfg.min_hospitals > cell.hospitals:
            errors.append(f"cell {cell.name}: min-hospitals = {cfg.min_hospitals} but hospitals = {cell.hospitals}")
    return errors


def _unknown_key_message(where: str, key: str, defaults: Mapping[str, Any]) -> str:
    return f"{where}: unknown run config key {key!r}{did_you_mean(key, [*defaults, 'hospitals', *CONTROL_KEYS])}"


def grid_fingerprint(grid: Grid) -> str:
    """A short hash of all cells' configs, stored beside the results to notice an edited grid."""
    blob = json.dumps([[c.name, c.hospitals, c.run_config, *([c.control] if c.control else [])] for c in grid.cells],
                      sort_keys=True, default=str)  # a rule's cell hashes as before controls existed
    return hashlib.sha1(blob.encode()).hexdigest()[:12]

"""``hospitrust report --leaderboard GRID_DIR [GRID_DIR ...]``: which rule, and how sure are we.

Reads one or several grid folders (``hospitrust bench --out``; several parts of one
leaderboard combine, each (condition, rule, attack, seed) counted once) and writes
``leaderboard.md`` with its PNGs, ``leaderboard_cells.csv`` (the table every number comes
from) and ``leaderboard_summary.csv`` (per condition and rule: the worst-case ranking). The
statistics are :mod:`hospitrust.bench.stats`'s; docs/benchmark.md explains them.

The roles of a cell's columns:

- **rule**: a grid axis named ``rule`` where the cells have one (a table axis: ``rule = [{ label =
  "nnm+hta", strategy = "hta", pre-aggregation = "nnm" }]``), else ``strategy``, with the options of
  a rule section (``hta.exclusion-mads``) that take several values among that strategy's cells
  ("hta (hta.exclusion-mads=1)": each setting is a rule of its own here) and a pre-aggregation
  other than none;
- **attack**: ``attack``, with an attack's options that vary within that attack, and the
  attacker fraction (``@0.3``) when the attacked cells have several;
- **seed**;
- **condition**: a grid axis named ``condition`` when the cells have one (name your
  conditions with a table axis: ``condition = [{ label = "pneumonia-dir0.5", ... }]``), else
  every other config column that varies across the cells (dataset, partitioner, hospitals,
  ...), a column that adds nothing to the ones before it (a table axis's label and the keys it
  sets) left out.

Metrics per cell: the headline metric of the final model (``final_<metric>``), its mean over
the last ``last_k`` rounds (from rounds.jsonl), the rare-class macro-F1 and the backdoor's
attack success rate of the final model where the runs report them, and the whole run's
detection false-positive rate (honest hospitals flagged, rejected or left out) for the rules
that flag anyone.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hospitrust.bench import stats
from hospitrust.bench.report import CHANCE_TOLERANCE
from hospitrust.bench.stats import Interval

LAST_K = 3
LOWER_IS_BETTER = {"attack_success_rate", "detection_fpr", "loss"}
NOT_CONDITION = {"cell", "grid", "grid_dir", "seed", "status", "run-name", "strategy", "attack", "malicious-fraction",
                 "assumed-malicious", "rule", "attack_label", "condition"}


class LeaderboardError(ValueError):
    """A folder is not a grid folder, has no finished cells, or two parts hold the same cell."""


@dataclass
class GridInfo:
    path: Path
    name: str
    done: int
    total: int
    wall_seconds: float  # the sum of its starts' wall times (bench.jsonl `end` events)


@dataclass
class Board:
    """The leaderboard's input: one row per finished cell, with its roles and metric values."""

    cells: pd.DataFrame
    grids: list[GridInfo]
    metric: str
    last_k: int
    notes: list[str] = field(default_factory=list)

    @property
    def conditions(self) -> list[str]:
        return sorted(self.cells["condition"].unique(), key=_natural)


def _natural(text: str) -> list:
    """Sort key that orders the numbers inside a label by value ("rounds=4" before "rounds=16")."""
    return [(0, float(part), "") if re.fullmatch(r"\d+(\.\d+)?", part) else (1, 0.0, part)
            for part in re.split(r"(\d+(?:\.\d+)?)", text) if part]


def _section_kind(key: str) -> str | None:
    from hospitrust.config.legacy import new_names
    from hospitrust.config.sections import all_sections, section_of

    name = (new_names(key) or [key])[0]
    section = section_of(name)
    if name.startswith("pre-aggregation"):
        return "rule"
    if section is None:
        return None
    found = all_sections().get(section)
    if found is None:
        return None
    if found.kind == "attack" or section == "attack-schedule":
        return "attack"
    return "rule" if found.kind not in ("service", "partitioner") else None


def _option_defaults() -> dict[str, Any]:
    """The run config's defaults (the app's pyproject), or none where the app is not found."""
    from hospitrust.ops.simulate import SimulationError, app_config_defaults

    try:
        return app_config_defaults()
    except (SimulationError, OSError, KeyError):
        return {}


def last_k_mean(rounds: pd.DataFrame, metric: str, k: int) -> pd.Series:
    """Per cell, the mean of ``metric`` over its last ``k`` rounds (all rounds when it has fewer)."""
    if not len(rounds) or metric not in rounds:
        return pd.Series(dtype=float)
    ordered = rounds.sort_values(["cell", "round"])
    return ordered.groupby("cell")[metric].apply(lambda s: float(s.dropna().tail(k).mean()) if s.notna().any() else math.nan)


def _chance(grid_dir: Path, cell: str, metric: str) -> float:
    """The metric's chance level for a cell (balanced accuracy 1/K from its config's class names), NaN if unknown."""
    from hospitrust.bench.report import chance_level

    for run in (grid_dir / "cells" / cell, grid_dir / cell):  # a bench grid folder, or a folder of runs
        if (run / "config.json").is_file():
            try:
                classes = json.loads((run / "config.json").read_text()).get("class-names") or []
            except (OSError, ValueError, AttributeError):
                classes = []
            level = chance_level(metric, len(classes) or None)
            return math.nan if level is None else level
    return math.nan


def _wall_seconds(grid_dir: Path) -> float:
    from hospitrust.bench.events import read_events

    ends = [float(ev["wall_seconds"]) for ev in read_events(grid_dir)
            if ev.get("event") == "end" and isinstance(ev.get("wall_seconds"), (int, float))]
    return sum(ends) if ends else math.nan


def _label_rows(frame: pd.DataFrame, base: str, extra: list[str], within: str | list[str], always: tuple[str, ...] = (),
                hide: Mapping[str, Any] | None = None) -> pd.Series:
    """``base`` plus each ``extra`` column that takes several values among the rows of the same
    ``within`` value(s), and each ``always`` column whatever its spread (unless empty or "none");
    a value equal to its entry in ``hide`` (an option's default) is not shown.
    """
    keys = [within] if isinstance(within, str) else list(within)
    varying = {(w if isinstance(w, tuple) else (w,)): [c for c in extra if c in sub and sub[c].nunique(dropna=True) > 1]
               for w, sub in frame.groupby(keys)}
    hidden = hide or {}

    def shown(row, c: str) -> bool:
        value = row[c]
        if value != value or value is None:
            return False
        if c in hidden and _fmt(value) == _fmt(hidden[c]):
            return False
        return c in varying.get(tuple(row[k] for k in keys), []) or (c in always and str(value) not in ("", "none", "off"))

    def one(row) -> str:
        parts = [f"{c}={_fmt(row[c])}" for c in extra if shown(row, c)]
        return f"{row[base]} ({', '.join(parts)})" if parts else str(row[base])

    return frame.apply(one, axis=1) if len(frame) else pd.Series(dtype=str)


def _fmt(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _condition_columns(frame: pd.DataFrame, candidates: list[str]) -> list[str]:
    """The varying candidates, in order, without one that the kept ones already determine."""
    view = frame[candidates].astype(object).where(frame[candidates].notna(), "-").astype(str) if candidates else frame
    kept: list[str] = []
    for col in candidates:
        if view[col].nunique() < 2:
            continue
        if kept and view.groupby(kept)[col].nunique().max() <= 1:
            continue  # its value follows from the columns kept so far
        kept.append(col)
    return kept


def _constant_options(frame: pd.DataFrame, grid_dir: Path) -> dict[str, Any]:
    """The options a grid's finished cells all set to one value: what its results store leaves out
    (it keeps the options that vary within the grid).
    """
    from hospitrust.bench.store import is_option, run_configs

    names = set(frame["cell"])
    configs = [cfg for name, cfg in run_configs(grid_dir).items() if name in names]
    if not configs:
        return {}
    first = configs[0]
    return {key: value for key, value in first.items() if is_option(key, value) and key not in frame
            and all(key in cfg and json.dumps(cfg[key]) == json.dumps(value) for cfg in configs)}


def _fill_constant_options(frames: list[pd.DataFrame], constants: list[dict[str, Any]], config_cols: list[str]) -> None:
    """Give every part the columns of the options another part varies, or sets to another constant.

    A grid's results store keeps only the options that vary within it; merged as they are, an option
    one part varies would be missing (NaN) for another part's cells, and an option two parts each keep
    at a different value would vanish, pooling their cells. Filled from each part's run configs, the
    parts' cells compare (conditions and labels) on every option they set.
    """
    differing = {key for const in constants for key in const
                 if len({json.dumps(c.get(key)) for c in constants if key in c}) > 1
                 or any(key in frame for frame in frames)}
    for key in sorted(differing):
        if key not in config_cols:
            config_cols.append(key)
        for frame, const in zip(frames, constants):
            if key not in frame and key in const:  # a part whose runs lack the option keeps NaN, as in its store
                frame[key] = const[key]


def load(grid_dirs: Sequence[str | Path], *, metric: str = "balanced_accuracy", last_k: int = LAST_K,
         progress: Callable[[str], None] | None = None, condition_of: Callable[[str], str] | None = None) -> Board:
    """Read the grid folders' finished cells into one :class:`Board` (clear errors for folders without results).

    ``condition_of``: a grid's name (grid.json) -> the condition of all its cells, for parts whose
    conditions are told apart by the part rather than by an option (the v2 leaderboard's parts).
    """
    from hospitrust.bench.store import collect

    say = progress or (lambda _line: None)
    if last_k < 1:
        raise LeaderboardError(f"last-k = {last_k}: must be an integer >= 1 (the rounds averaged at the end of a run)")
    frames, grids, config_cols = [], [], []
    problems = []
    for raw in grid_dirs:
        path = Path(raw).resolve()
        if not path.is_dir():
            problems.append(f"{raw}: not a folder (give the --out folder of `hospitrust bench`)")
            continue
        rounds, cells, _ = collect(path)
        if not len(cells) or "status" not in cells:
            problems.append(f"{raw}: no cells (neither cells/<cell>/config.json nor grid.json): is it a grid folder?")
            continue
        done = cells[cells["status"] == "done"].copy()
        meta_path = path / "grid.json"
        name = json.loads(meta_path.read_text()).get("name", path.name) if meta_path.is_file() else path.name
        say(f"[leaderboard] {raw}: grid {name}, {len(done)} of {len(cells)} cells finished")
        if not len(done):
            problems.append(f"{raw}: none of its {len(cells)} cells has finished (no cells/<cell>/summary.json yet): "
                            f"run `hospitrust bench GRID.toml --out {raw}` first")
            continue
        if f"final_{metric}" not in done:
            problems.append(f"{raw}: its cells have no final {metric}")
            continue
        cols = list(cells.columns)
        config_cols += [c for c in cols[1:cols.index("status")] if c not in config_cols]
        done["last_k"] = done["cell"].map(last_k_mean(rounds, metric, last_k))
        done["chance"] = [_chance(path, cell, metric) for cell in done["cell"]]
        done["grid"] = name
        done["grid_dir"] = str(path)
        if condition_of is not None:
            done["condition"] = condition_of(name)
        frames.append(done)
        grids.append(GridInfo(path, name, len(done), len(cells), _wall_seconds(path)))
    if problems:
        raise LeaderboardError("no leaderboard:\n  " + "\n  ".join(problems))
    _fill_constant_options(frames, [_constant_options(frame, info.path) for frame, info in zip(frames, grids)], config_cols)
    cells = pd.concat(frames, ignore_index=True)
    for col, default in (("attack", "none"), ("seed", 0), ("strategy", "?")):
        if col not in cells:
            cells[col] = default
    kinds = {c: _section_kind(c) for c in config_cols}
    rule_cols = [c for c in config_cols if kinds[c] == "rule"]
    attack_cols = [c for c in config_cols if kinds[c] == "attack"]
    derived = _label_rows(cells, "strategy", rule_cols, "strategy", always=tuple(c for c in rule_cols if c.startswith("pre-aggregation")))
    # a grid axis named `rule` (a table axis: label = "nnm+hta", strategy = "hta", pre-aggregation = "nnm") names its cells
    cells["rule"] = cells["rule"].where(cells["rule"].notna(), derived).astype(str) if "rule" in cells else derived
    if "condition" in cells and cells["condition"].notna().all():  # a `condition` axis names every cell's
        cells["condition"] = cells["condition"].astype(str)
    else:
        candidates = [c for c in config_cols if c not in NOT_CONDITION and kinds[c] is None and c in cells]
        if "condition" in cells:  # some parts name their conditions, others do not
            candidates.insert(0, "condition")
        condition_cols = _condition_columns(cells, candidates)
        if "dataset" in cells and "dataset" not in condition_cols:
            condition_cols.insert(0, "dataset")
        cells["condition"] = cells.apply(
            lambda r: ", ".join(f"{c}={_fmt(r[c])}" for c in condition_cols if r[c] == r[c] and r[c] is not None) or "all cells",
            axis=1)
    # an attack's option is part of its label where it varies within one condition and differs from its
    # default there ("ipm (ipm.copy-noise=1)" beside plain "ipm"), not because two conditions set it apart
    cells["attack_label"] = _label_rows(cells, "attack", attack_cols, ["condition", "attack"], hide=_option_defaults())
    if "malicious-fraction" in cells:
        for _, sub in cells[cells["attack"] != "none"].groupby("condition"):
            if sub["malicious-fraction"].nunique() > 1:  # the attacker fraction varies within the condition
                cells.loc[sub.index, "attack_label"] = [f"{a} @{f:g}" for a, f in zip(sub["attack_label"], sub["malicious-fraction"])]
    dup = cells[cells.duplicated(["condition", "rule", "attack_label", "seed"], keep=False)]
    if len(dup):
        first = dup.iloc[0]
        where = sorted(set(dup[(dup["condition"] == first["condition"]) & (dup["rule"] == first["rule"])
                               & (dup["attack_label"] == first["attack_label"]) & (dup["seed"] == first["seed"])]["grid_dir"]))
        raise LeaderboardError(f"{len(dup)} cells share a (condition, rule, attack, seed), e.g. {first['condition']} / "
                               f"{first['rule']} / {first['attack_label']} / seed {first['seed']} in {', '.join(where)}: "
                               "a leaderboard counts each once (give each part other cells, or a `condition` axis "
                               "that tells them apart)")
    board = Board(cells=cells, grids=grids, metric=metric, last_k=last_k)
    for g in grids:
        if g.done < g.total:
            board.notes.append(f"grid {g.name} has not finished ({g.done} of {g.total} cells): a rule's worst case covers "
                               "only the attacks finished for it (column \"attacks\" of the rankings), and the ranks only "
                               "the blocks where every ranked rule has finished")
    short = cells.groupby("condition")["seed"].nunique()
    for cond, n in short.items():
        if n < 2:
            board.notes.append(f"{cond}: one seed only: no confidence intervals, no tie calls")
    rounds = cells["rounds"] if "rounds" in cells else pd.Series(dtype=float)
    if len(rounds) and rounds.min() < last_k:
        board.notes.append(f"some cells ran fewer than {last_k} rounds: their last-k mean is over all their rounds")
    return board


# ---------------------------------------------------------------- the numbers of one condition


@dataclass
class MetricTable:
    """One metric over rules x attacks of a condition: intervals, the per-seed worst case, calls."""

    name: str
    higher_is_better: bool
    cells: dict[tuple[str, str], Interval]          # (rule, attack) -> mean over seeds
    best_in_attack: dict[str, set[str]]              # attack -> the best rule and those tied with it
    worst: dict[str, Interval]                       # rule -> per-seed worst case over attacks, summarised
    worst_attack: dict[str, str]                     # rule -> the attack most often the worst over its seeds
    per_seed_worst: pd.DataFrame                      # rule, seed, worst, worst_attack
    rules: list[str]
    attacks: list[str]
    by_seed: dict[tuple[str, str], pd.Series] = field(default_factory=dict)  # (rule, attack) -> value per seed


def _sign(higher_is_better: bool) -> float:
    return 1.0 if higher_is_better else -1.0


def metric_table(frame: pd.DataFrame, column: str, *, higher_is_better: bool = True, name: str = "",
                 attacked_only_worst: bool = True, **kw) -> MetricTable:
    """Intervals per (rule, attack), the best per attack with the rules tied with it (paired by
    seed), and the per-seed worst case over the attacks (attacked cells only, when there are some).
    """
    data = frame.dropna(subset=[column])
    attacks = attack_order(data["attack_label"])
    rules = sorted(data["rule"].unique())
    cells: dict[tuple[str, str], Interval] = {}
    best: dict[str, set[str]] = {}
    by_seed: dict[tuple[str, str], pd.Series] = {}
    for attack in attacks:
        sub = data[data["attack_label"] == attack]
        series = {r: g.groupby("seed")[column].mean() for r, g in sub.groupby("rule")}
        for r, s in series.items():
            cells[(r, attack)] = stats.bootstrap_ci(s.to_numpy(), **kw)
            by_seed[(r, attack)] = s
        if series:
            leader = max(series, key=lambda r: _sign(higher_is_better) * cells[(r, attack)].mean)
            best[attack] = {leader} | {r for r, s in series.items() if r != leader and stats.call(
                stats.paired_difference(_sign(higher_is_better) * s, _sign(higher_is_better) * series[leader], **kw)) == "tie"}
    scope = data[data["attack_label"] != "none"] if attacked_only_worst and (data["attack_label"] != "none").any() else data
    per_seed = stats.worst_case_per_seed(scope, value=column, higher_is_better=higher_is_better, attack="attack_label")
    worst = {r: stats.bootstrap_ci(g["worst"].to_numpy(), **kw) for r, g in per_seed.groupby("rule")}
    worst_attack = {r: str(g["worst_attack"].mode().iloc[0]) for r, g in per_seed.groupby("rule")}
    return MetricTable(name or column, higher_is_better, cells, best, worst, worst_attack, per_seed, rules, attacks, by_seed)


def attack_order(labels: pd.Series | Sequence[str]) -> list[str]:
    found = list(dict.fromkeys(labels))
    return (["none"] if "none" in found else []) + sorted(a for a in found if a != "none")


def worst_case_ranking(table: MetricTable, baseline: str, **kw) -> pd.DataFrame:
    """The rules by their per-seed worst case, best first, each set against the best, the rule
    above and the baseline by paired differences (seed by seed) with their CIs and tie calls.
    """
    sign = _sign(table.higher_is_better)
    order = sorted(table.worst, key=lambda r: -sign * table.worst[r].mean)
    series = {r: g.set_index("seed")["worst"] for r, g in table.per_seed_worst.groupby("rule")}
    rows = []
    leader = order[0] if order else None
    for i, rule in enumerate(order):
        vs_best = stats.paired_difference(series[rule], series[leader], **kw) if leader is not None and i else None
        vs_above = stats.paired_difference(series[rule], series[order[i - 1]], **kw) if i else None
        vs_base = (stats.paired_difference(series[rule], series[baseline], **kw)
                   if baseline in series and rule != baseline else None)
        if vs_best is None:
            verdict = "best"
        else:
            verdict = {"tie": "tie with best", "no call": "no call (one seed)"}.get(_call_text(vs_best, sign), "below best")
        rows.append({"rule": rule, "worst case": table.worst[rule], "seeds": table.worst[rule].n,
                     "attacks": int(table.per_seed_worst.loc[table.per_seed_worst["rule"] == rule, "attacks"].max()),
                     "worst attack": table.worst_attack[rule], "minus best": vs_best, "verdict": verdict,
                     "minus the rule above": vs_above,
                     "vs above": "" if vs_above is None else _call_text(vs_above, sign),
                     f"minus {baseline}": vs_base})
    first = sum(row["verdict"] in ("best", "tie with best") for row in rows)
    for i, row in enumerate(rows):
        row["rank"] = ("1 (tie)" if first > 1 else "1") if row["verdict"] in ("best", "tie with best") else str(i + 1)
    return pd.DataFrame(rows, columns=["rank", "rule", "worst case", "seeds", "attacks", "worst attack", "minus best", "verdict",
                                       "minus the rule above", "vs above", f"minus {baseline}"])


# The protocol's screen (docs/leaderboard.md, "Rules" and "Attacks"): the rules every part keeps,
# and how far below the best worst case a screened rule may fall and still enter the full grid.
KEPT_RULES = ("fedavg", "median", "multi-krum", "fltrust", "hta", "earn")
SCREEN_MARGIN = 0.10
BACKDOOR_ATTACKS = ("backdoor", "neurotoxin", "dba")


@dataclass
class ScreenDecision:
    """Which rules and attacks a one-seed screen sends to a condition's full grid, and why."""

    best_worst: float                      # the best rule's worst case over the attacks
    rules_in: dict[str, str]               # rule -> why it enters (kept set, best new rule, within the margin)
    rules_out: dict[str, float]            # rule -> how far its worst case is below the best's
    best_new_rule: str | None              # the best worst case outside the kept set
    attacks_in: dict[str, list[str]]       # attack -> the rules it is the worst case of (or why it enters)


def screen_decision(table: MetricTable, *, kept: Sequence[str] = KEPT_RULES, margin: float = SCREEN_MARGIN,
                    tolerance: float = 1e-9) -> ScreenDecision:
    """Apply the protocol's dropping and attack-screening rules to a screen's table.

    A rule outside ``kept`` whose worst case is more than ``margin`` below the best rule's worst
    case is dropped; the best rule outside ``kept`` always enters. An attack enters when it is the
    worst case of at least one rule (every attack tied at that rule's worst counts), and so do no
    attack and one backdoor (the first of :data:`BACKDOOR_ATTACKS` the screen ran).
    """
    if not table.worst:
        raise LeaderboardError("the screen has no worst case for any rule: it needs attacked cells")
    sign = _sign(table.higher_is_better)
    worst = {r: iv.mean for r, iv in table.worst.items()}
    best = max(worst.values(), key=lambda v: sign * v)
    outside = [r for r in worst if r not in kept]
    best_new = max(outside, key=lambda r: sign * worst[r]) if outside else None
    rules_in: dict[str, str] = {}
    rules_out: dict[str, float] = {}
    for rule in sorted(worst, key=lambda r: -sign * worst[r]):
        gap = sign * (best - worst[rule])
        if rule in kept:
            rules_in[rule] = "kept in every part"
        elif rule == best_new:
            rules_in[rule] = "the best rule outside the kept set"
        elif gap <= margin + tolerance:
            rules_in[rule] = f"within {margin:g} of the best worst case"
        else:
            rules_out[rule] = gap
    attacks_in: dict[str, list[str]] = {}
    for (rule, attack), cell in sorted(table.cells.items()):
        if attack != "none" and rule in worst and abs(cell.mean - worst[rule]) <= tolerance:
            attacks_in.setdefault(attack, []).append(rule)
    if "none" in table.attacks:
        attacks_in.setdefault("none", []).append("(no attack: the price of a defence)")
    backdoors = [a for a in BACKDOOR_ATTACKS if a in table.attacks]
    if backdoors and not any(a in attacks_in for a in backdoors):
        attacks_in[backdoors[0]] = ["(one backdoor, scored by its success rate)"]
    return ScreenDecision(best, rules_in, rules_out, best_new, attacks_in)


def _screen_lines(decision: ScreenDecision, table: MetricTable) -> list[str]:
    lines = ["### Screen decision (one seed: the protocol's dropping and attack-screening rules)", "",
             f"Best worst case {decision.best_worst:.3f}. A rule outside the kept set ({', '.join(KEPT_RULES)}) "
             f"enters the full grid when its worst case is within {SCREEN_MARGIN:g} of it; the best rule outside "
             "the kept set always enters. An attack enters when it is some rule's worst case, and so do no attack "
             "and one backdoor.", ""]
    lines += md_table(["rule", "worst case", "worst attack", "decision"],
                       [[r, f"{table.worst[r].mean:.3f}", table.worst_attack[r], f"in: {why}"]
                        for r, why in decision.rules_in.items()]
                       + [[r, f"{table.worst[r].mean:.3f}", table.worst_attack[r], f"out: {gap:.3f} below the best"]
                          for r, gap in decision.rules_out.items()])
    lines += md_table(["attack", "enters because it is the worst case of"],
                       [[a, ", ".join(rules)] for a, rules in sorted(decision.attacks_in.items(),
                                                                      key=lambda kv: (kv[0] != "none", -len(kv[1]), kv[0]))])
    out = [a for a in table.attacks if a not in decision.attacks_in]
    if out:
        lines += [f"Attacks out (no rule's worst case): {', '.join(out)}.", ""]
    return lines


def _call_text(diff: Interval, sign: float) -> str:
    """:func:`stats.call` of a difference, oriented so that "above" is better whatever the metric's direction."""
    low, high = sorted((sign * diff.low, sign * diff.high))
    return stats.call(Interval(sign * diff.mean, low, high, diff.n))


@dataclass
class RankAnalysis:
    values: pd.DataFrame       # blocks x rules
    ranks: pd.DataFrame
    mean_ranks: pd.Series
    friedman: stats.Friedman
    pairs: pd.DataFrame
    cliques: list[list[str]]
    dropped: list[str]         # rules missing from more than half the blocks
    dropped_blocks: list[str] = field(default_factory=list)  # blocks missing one of the rules kept


def rank_analysis(frame: pd.DataFrame, column: str, blocks: list[str], *, higher_is_better: bool = True,
                  alpha: float = stats.ALPHA) -> RankAnalysis:
    """Mean ranks over blocks (each block: the mean of ``column`` over the rows it holds), Friedman's
    test and the Wilcoxon-Holm pairs; rules absent from a block are left out (listed in ``dropped``).
    """
    values = frame.dropna(subset=[column]).pivot_table(index=blocks, columns="rule", values=column, aggfunc="mean")
    # Friedman and Wilcoxon need every rule in every block: a rule missing from more than half the
    # blocks is left out, then a block missing one of the rules kept (an attack run against one rule only)
    coverage = values.notna().mean()
    dropped = sorted(c for c in values.columns if coverage[c] < 0.5)
    values = values.drop(columns=dropped)
    incomplete = values.isna().any(axis=1)
    dropped_blocks = [" / ".join(map(str, b)) if isinstance(b, tuple) else str(b) for b in values.index[incomplete]]
    values = values[~incomplete]
    ranks = stats.rank_rows(values, higher_is_better=higher_is_better)
    mean_ranks = ranks.mean().sort_values()
    pairs = stats.wilcoxon_holm(values, alpha=alpha) if values.shape[1] >= 2 and len(values) >= 1 else pd.DataFrame(
        columns=["a", "b", "pvalue", "p_holm", "significant"])
    return RankAnalysis(values, ranks, mean_ranks, stats.friedman(values), pairs,
                        stats.cliques(mean_ranks, pairs) if len(mean_ranks) else [], dropped, dropped_blocks)


# ---------------------------------------------------------------- drawing and writing


def cd_diagram(analysis: RankAnalysis, title: str, test: str = "Wilcoxon") -> bytes:
    """The critical-difference diagram: rules on a mean-rank axis (1 = best, left), a bar under
    each group of rules that no Holm-corrected Wilcoxon test separates.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    ranks = analysis.mean_ranks
    k = max(len(ranks), 2)
    names = list(ranks.index)
    half = math.ceil(len(names) / 2)
    height = 1.4 + 0.28 * max(half, len(names) - half) + 0.18 * len(analysis.cliques)
    fig, ax = plt.subplots(figsize=(7.5, height))
    ax.set_xlim(0.5, k + 0.5)
    ax.axis("off")
    ax.hlines(0, 1, k, color="black", lw=1)
    for r in range(1, k + 1):
        ax.vlines(r, 0, 0.12, color="black", lw=1)
        ax.text(r, 0.2, str(r), ha="center", va="bottom", fontsize=8)
    bar_y = -0.35
    for group in analysis.cliques:
        lo, hi = ranks[group].min(), ranks[group].max()
        ax.hlines(bar_y, lo - 0.03, hi + 0.03, color="black", lw=3.5)
        bar_y -= 0.3
    label_top = bar_y - 0.2
    for i, name in enumerate(names):
        x = ranks[name]
        left = i < half
        y = label_top - 0.55 * (i if left else len(names) - 1 - i)
        end = 0.5 if left else k + 0.5
        ax.plot([x, x, end], [0, y, y], color="0.3", lw=0.8)
        ax.text(end + (-0.05 if left else 0.05), y, f"{name} ({x:.2f})", ha="right" if left else "left", va="center",
                fontsize=8)
    ax.set_ylim(label_top - 0.55 * max(half, len(names) - half) - 0.1, 0.6)
    fried = analysis.friedman
    sub = (f"Friedman p = {fried.pvalue:.3g} over {fried.blocks} blocks" if fried.pvalue == fried.pvalue else fried.note)
    ax.set_title(f"{title}\nmean rank (1 = best); bars: no Holm-corrected {test} difference at {stats.ALPHA}; {sub}",
                 fontsize=8.5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _iv(value: Interval | None, digits: int = 3, signed: bool = False) -> str:
    if value is None or value.mean != value.mean:
        return "-"
    text = value.text(digits)
    return ("+" + text if signed and value.mean >= 0 else text)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines (and a blank line after it); a ``|`` inside a cell becomes ``/``."""
    def clean(cell: str) -> str:
        return str(cell).replace("|", "/")

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(clean(c) for c in row) + " |" for row in rows], ""]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "condition"


def _chance_mark(value: Interval | None, chance: float | None) -> str:
    from hospitrust.bench.report import at_chance

    return " (chance)" if value is not None and chance is not None and at_chance(value.mean, chance) else ""


def _matrix_lines(table: MetricTable, order: list[str], worst_title: str, digits: int = 3,
                  chance: float | None = None) -> list[str]:
    header = ["rule", *table.attacks, worst_title]
    rows = []
    for rule in order:
        row = [rule]
        for attack in table.attacks:
            iv = table.cells.get((rule, attack))
            text = _iv(iv, digits)
            text = f"**{text}**" if iv is not None and rule in table.best_in_attack.get(attack, set()) else text
            row.append(text + _chance_mark(iv, chance))
        row.append(_iv(table.worst.get(rule), digits) + _chance_mark(table.worst.get(rule), chance))
        rows.append(row)
    return md_table(header, rows)


METRIC_NAMES = {"balanced_accuracy": "balanced accuracy", "accuracy": "accuracy", "auc": "AUC", "macro_f1": "macro-F1",
                "worst_class_recall": "worst-class recall", "rare_class_macro_f1": "rare-class macro-F1"}


def render(board: Board, out_dir: str | Path, *, baseline: str = "fedavg", resamples: int = stats.RESAMPLES,
           progress: Callable[[str], None] | None = None, statistics: str = "v1") -> Path:
    """Write ``leaderboard.md``, its PNGs and ``leaderboard_cells.csv`` into ``out_dir``; returns the Markdown's path.

    ``statistics = "v2"`` adds the v2 protocol's section (:func:`v2_lines`) after the v1 page.
    """
    if statistics not in STATISTICS:
        raise LeaderboardError(f"statistics = {statistics!r}: expected one of {', '.join(STATISTICS)}")
    say = progress or (lambda _line: None)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = {"resamples": resamples}
    metric = board.metric
    mname = METRIC_NAMES.get(metric, metric)
    col = f"final_{metric}"
    cells = board.cells
    seeds = sorted(cells["seed"].unique().tolist())
    md = ["# hospitrust leaderboard", ""]
    md += [f"Headline metric: final {mname} (the final global model on the test split). "
           f"Every interval is a 95 % percentile bootstrap CI over seeds ({resamples} resamples, rng seed {stats.RNG_SEED}); "
           "rules are compared paired by seed, and two rules whose paired-difference CI contains 0 are a **tie**. "
           "The worst case is taken per seed (the worst attack of that seed's runs, attacked cells only) and then summarised. "
           "See docs/benchmark.md#leaderboard-statistics.", ""]
    md += md_table(["grid", "folder", "cells finished", "wall time (bench.jsonl: its starts, summed)"],
                    [[g.name, _shown_path(g.path), f"{g.done} / {g.total}",
                      "-" if g.wall_seconds != g.wall_seconds else f"{g.wall_seconds / 60:.1f} min"] for g in board.grids])
    md += [f"Conditions: {len(board.conditions)}; rules: {cells['rule'].nunique()}; attacks: {cells['attack_label'].nunique()}; "
           f"seeds: {', '.join(str(s) for s in seeds)}; last-k mean over the last {board.last_k} rounds.", ""]
    md += [f"- note: {n}" for n in board.notes] + ([""] if board.notes else [])

    # across conditions
    overall = rank_analysis(cells, col, ["condition", "attack_label"])
    say(f"[leaderboard] ranks over {len(overall.values)} (condition, attack) cells, {len(overall.mean_ranks)} rules")
    md += ["## Across conditions: mean ranks", "",
           f"Each (condition, attack) cell ranks the rules by their mean final {mname} over seeds (1 = best, ties share "
           "the average rank). Friedman's test asks whether the ranks differ at all; each pair of rules is then compared "
           "with a Wilcoxon signed-rank test over the cells, Holm-corrected for the number of pairs. "
           "A bar in the diagram joins rules that no corrected test separates.", ""]
    md += _friedman_lines(overall)
    per_condition: dict[str, MetricTable] = {}
    rankings: dict[str, pd.DataFrame] = {}
    for cond in board.conditions:
        per_condition[cond] = metric_table(cells[cells["condition"] == cond], col, name=mname, **kw)
        rankings[cond] = worst_case_ranking(per_condition[cond], baseline, **kw)
    rows = []
    for rule in overall.mean_ranks.index.tolist() + overall.dropped:
        row = [rule, f"{overall.mean_ranks[rule]:.2f}" if rule in overall.mean_ranks else "- (missing cells)"]
        for cond in board.conditions:
            ranked = rankings[cond].set_index("rule")
            row.append(f"{_iv(ranked.loc[rule, 'worst case'])} (#{str(ranked.loc[rule, 'rank']).replace(' (tie)', ', tie')})" if rule in ranked.index else "-")
        rows.append(row)
    md += ["**Mean rank over (condition, attack) cells, and each condition's per-seed worst case [95 % CI] "
           "(#its rank by worst case there; \"#1, tie\": tied with the best)**", ""]
    md += md_table(["rule", "mean rank", *[f"worst case: {c}" for c in board.conditions]], rows)
    md += _dropped_lines(overall)
    if len(overall.mean_ranks) >= 2:
        name = "cd_all_conditions.png"
        (out / name).write_bytes(cd_diagram(overall, "all conditions: (condition, attack) cells"))
        md += [f"![critical-difference diagram, all conditions]({name})", ""]
        md += _pairs_lines(overall)

    for c_i, cond in enumerate(board.conditions):
        say(f"[leaderboard] condition {c_i + 1}/{len(board.conditions)}: {cond}")
        frame = cells[cells["condition"] == cond]
        table = per_condition[cond]
        ranking = rankings[cond]
        order = list(ranking["rule"]) + [r for r in table.rules if r not in set(ranking["rule"])]
        n_seeds = frame["seed"].nunique()
        levels = set(frame["chance"].dropna()) if "chance" in frame else set()
        chance = levels.pop() if len(levels) == 1 else None
        md += [f"## {cond}", "", f"{len(frame)} cells: {_n(len(table.rules), 'rule')} x {_n(len(table.attacks), 'attack')} x "
               f"{_n(n_seeds, 'seed')} ({', '.join(sorted(set(frame['grid'])))}).", ""]
        md += [f"### Final {mname}: rules x attacks", "",
               "Mean over seeds [95 % CI]. **Bold**: the best rule of that attack and every rule tied with it (paired "
               "difference CI contains 0). The last column is the per-seed worst case over the attacks, summarised.", ""]
        if chance is not None and any(_chance_mark(iv, chance) for iv in [*table.cells.values(), *table.worst.values()]):
            md += [f"\"(chance)\": within {CHANCE_TOLERANCE} of chance level ({chance:.3g}): the model learned nothing "
                   "there, and the order of such rules means nothing.", ""]
        md += _matrix_lines(table, order, "worst case (per seed)", chance=chance)
        incomplete = [r for r in table.rules if r not in table.worst]
        if incomplete:
            md += [f"No worst case for {', '.join(incomplete)}: no seed of theirs has every attack they were run with (or they ran without attack only).", ""]
        md += [f"### Ranking by worst case: {cond}", "",
               "Best first. \"tie with best\": the paired difference to the best rule's per-seed worst case has a CI "
               "containing 0, so the two are not ordered; rank \"1 (tie)\" is shared by every rule tied with the best. "
               "\"vs above\": the same call against the rule in the row above.", ""]
        if ranking["attacks"].nunique() > 1:
            md += ["The rules were run with different numbers of attacks here (column \"attacks\"; an attack aimed at "
                   "one rule, or an unfinished grid): each rule's worst case is over its own.", ""]
        md += md_table(["rank", "rule", "worst case [95 % CI]", "seeds", "attacks", "worst attack (mode)", "minus best [CI]",
                         "verdict", "vs above", f"minus {baseline} [CI]"],
                        [[r["rank"], r["rule"], _iv(r["worst case"]) + _chance_mark(r["worst case"], chance), str(r["seeds"]),
                          str(r["attacks"]), r["worst attack"],
                          _iv(r["minus best"], signed=True), r["verdict"], r["vs above"] or "-",
                          _iv(r[f"minus {baseline}"], signed=True)] for r in ranking.to_dict("records")])
        if n_seeds == 1 and table.worst:
            md += _screen_lines(screen_decision(table), table)
        md += _paired_lines(table, order, baseline, kw)
        extra = [("last_k", f"Mean {mname} of the last {board.last_k} rounds", True, "none"),
                 ("final_rare_class_macro_f1", "Rare-class macro-F1 of the final model", True, "none"),
                 ("final_attack_success_rate", "Backdoor attack success rate (lower is better)", False, "success"),
                 ("detection_fpr", "Detection false-positive rate: honest hospitals flagged, whole run (lower is better)",
                  False, "fpr")]
        for column, title, higher, kind in extra:
            if column not in frame or frame[column].isna().all():
                continue
            sub = frame.dropna(subset=[column])
            if kind == "fpr":
                flaggers = _rules_that_flag(sub)
                if not flaggers:
                    continue
                sub = sub[sub["rule"].isin(flaggers)]
            t = metric_table(sub, column, higher_is_better=higher, attacked_only_worst=kind != "fpr", **kw)
            md += [f"### {title}", ""]
            if kind == "success":
                md += ["Only the attacks whose runs report a success rate (backdoors, targeted label flips); "
                       "**bold**: the lowest and the rules tied with it; worst case: the highest per seed.", ""]
            elif kind == "fpr":
                md += ["Only the rules that flagged, rejected or left out a hospital in some cell; clean runs included; "
                       "worst case: the highest per seed over all attacks.", ""]
            md += _matrix_lines(t, [r for r in order if r in t.rules], "worst case (per seed)",
                                chance=chance if column == "last_k" else None)
        within = rank_analysis(frame, col, ["attack_label", "seed"])
        if len(within.mean_ranks) >= 2:
            name = f"cd_{c_i}_{_safe(cond)}.png"
            (out / name).write_bytes(cd_diagram(within, f"{cond}: (attack, seed) blocks"))
            md += [f"### Critical-difference diagram: {cond}", "",
                   f"Blocks: every (attack, seed) run of this condition, ranked by final {mname}.", ""]
            md += _friedman_lines(within) + _dropped_lines(within)
            md += [f"![critical-difference diagram, {cond}]({name})", ""]
            md += _pairs_lines(within)
    if statistics == "v2":
        say("[leaderboard] v2 statistics: per-seed worst cases, (condition, seed) blocks")
        md += v2_lines(cells, col, board.conditions, metric_name=mname)
    cells.drop(columns=[c for c in ("error",) if c in cells]).to_csv(out / "leaderboard_cells.csv", index=False)
    _summary_frame(rankings, overall).to_csv(out / "leaderboard_summary.csv", index=False)
    path = out / "leaderboard.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _summary_frame(rankings: dict[str, pd.DataFrame], overall: RankAnalysis) -> pd.DataFrame:
    """One row per condition and rule: the worst-case ranking's numbers, and the rule's mean rank
    over all (condition, attack) cells (for the README's summary table).
    """
    rows = []
    for cond, ranking in rankings.items():
        for r in ranking.to_dict("records"):
            worst, best = r["worst case"], r["minus best"]
            rows.append({"condition": cond, "rank": r["rank"], "rule": r["rule"], "worst_case": worst.mean,
                         "worst_case_low": worst.low, "worst_case_high": worst.high, "seeds": r["seeds"],
                         "attacks": r["attacks"], "worst_attack": r["worst attack"], "verdict": r["verdict"],
                         "minus_best": best.mean if best else 0.0, "minus_best_low": best.low if best else 0.0,
                         "minus_best_high": best.high if best else 0.0,
                         "mean_rank_all_conditions": overall.mean_ranks.get(r["rule"], math.nan)})
    return pd.DataFrame(rows)


def _shown_path(path: Path) -> str:
    """The folder relative to the working directory when it is under it (a page in the repository), else as is."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _rules_that_flag(frame: pd.DataFrame) -> list[str]:
    rates = frame[[c for c in ("detection_tpr", "detection_fpr") if c in frame]].fillna(0).to_numpy()
    return sorted(set(frame.loc[(rates > 0).any(axis=1), "rule"])) if rates.size else []


def _paired_lines(table: MetricTable, order: list[str], baseline: str, kw: dict) -> list[str]:
    """Per attack, each rule minus the baseline and minus that attack's best rule, paired by seed."""
    if len(table.rules) < 2:
        return []
    lines: list[str] = []
    leaders = {a: max((r for r in table.rules if (r, a) in table.cells), key=lambda r: table.cells[(r, a)].mean)
               for a in table.attacks}
    for to_baseline in (True, False):
        if to_baseline and baseline not in table.rules:
            lines += [f"No {baseline} cells in this condition: no paired differences to it.", ""]
            continue
        title = f"Paired difference to {baseline}, per attack" if to_baseline else "Paired difference to the attack's best rule"
        what = f"{baseline}'s" if to_baseline else "the best rule's (by mean) under that attack"
        lines += [f"### {title}", "", f"Final metric minus {what} on the same seed and attack, mean [95 % CI]; "
                  "\"tie\" where the CI contains 0." + ("" if to_baseline else " The best rule's own cell says \"best\"."), ""]

        def reference(attack: str, to_baseline: bool = to_baseline) -> str:
            return baseline if to_baseline else leaders[attack]

        rows = []
        for rule in order:
            if rule == baseline and to_baseline:
                continue
            row = [rule]
            for attack in table.attacks:
                ref = reference(attack)
                if rule == ref:
                    row.append("best")
                    continue
                a, b = table.by_seed.get((rule, attack)), table.by_seed.get((ref, attack))
                if a is None or b is None:
                    row.append("-")
                    continue
                d = stats.paired_difference(a, b, **kw)
                row.append(f"{_iv(d, signed=True)}{' tie' if stats.call(d) == 'tie' else ''}")
            rows.append(row)
        lines += md_table(["rule", *table.attacks], rows)
    return lines


def _dropped_lines(analysis: RankAnalysis) -> list[str]:
    lines = []
    if analysis.dropped:
        lines += [f"Left out of the ranks (missing from more than half the blocks): {', '.join(analysis.dropped)}.", ""]
    if analysis.dropped_blocks:
        shown = analysis.dropped_blocks[:10]
        more = f" and {len(analysis.dropped_blocks) - 10} more" if len(analysis.dropped_blocks) > 10 else ""
        lines += [f"Blocks left out of the ranks (a ranked rule has no cell there): {'; '.join(shown)}{more}.", ""]
    return lines


def _friedman_lines(analysis: RankAnalysis) -> list[str]:
    return _friedman_text(analysis.friedman)


def _friedman_text(f: stats.Friedman) -> list[str]:
    if f.pvalue != f.pvalue:
        return [f"Friedman: {f.note}.", ""]
    verdict = "the rules' ranks differ" if f.pvalue < stats.ALPHA else "no evidence that the rules' ranks differ"
    return [f"Friedman chi-square = {f.statistic:.2f}, p = {f.pvalue:.3g} over {f.blocks} blocks and {f.rules} rules: "
            f"{verdict} (at {stats.ALPHA}).{' ' + f.note if f.note else ''}", ""]


def _pairs_lines(analysis: RankAnalysis) -> list[str]:
    pairs = analysis.pairs
    if not len(pairs):
        return []
    significant = pairs[pairs["significant"]].sort_values("p_holm")
    lines = [f"Wilcoxon-Holm: {len(significant)} of {len(pairs)} pairs differ at {stats.ALPHA}"
             + (":" if len(significant) else "."), ""]
    if len(significant):
        ranks = analysis.mean_ranks
        lines += md_table(["better (mean rank)", "worse (mean rank)", "Wilcoxon p", "Holm p"],
                           [[f"{a} ({ranks[a]:.2f})", f"{b} ({ranks[b]:.2f})", f"{p:.3g}", f"{ph:.3g}"]
                            for a, b, p, ph in ((r.a, r.b, r.pvalue, r.p_holm) if ranks[r.a] <= ranks[r.b]
                                                else (r.b, r.a, r.pvalue, r.p_holm) for r in significant.itertuples())])
    groups = [g for g in analysis.cliques]
    if groups:
        lines += ["Not separated (the diagram's bars): " + "; ".join("{" + ", ".join(g) + "}" for g in groups) + ".", ""]
    return lines


STATISTICS = ("v1", "v2")


def _v2_ranking_lines(values: pd.DataFrame, higher_is_better: bool, what: str) -> list[str]:
    """A rank-range table of ``values`` (blocks x rules), its significant pairs, under a heading's text."""
    pairs = stats.paired_tests(values)
    ranges = stats.rank_ranges(values, pairs, higher_is_better=higher_is_better)
    rows = [[r["rank"], rule, _iv(stats.t_interval(values[rule].to_numpy())), f"{r['mean_rank']:.2f}"]
            for rule, r in ranges.to_dict("index").items()]
    lines = md_table(["rank (range)", "rule", f"{what} [95 % t CI]", "mean rank"], rows)
    sign = 1.0 if higher_is_better else -1.0
    separated = [f"{(p.a if sign * p.mean > 0 else p.b)} over {(p.b if sign * p.mean > 0 else p.a)}: "
                 f"{abs(p.mean):.3f} [{min(abs(p.low), abs(p.high)):.3f}, {max(abs(p.low), abs(p.high)):.3f}], "
                 f"p (Holm) = {p.p_holm:.3g}" for p in pairs.itertuples() if p.significant]
    lines += [f"Pairs separated by the Holm-corrected sign-flip tests at {stats.ALPHA}: "
              + ("; ".join(separated) if separated else "none") + ".", ""]
    return lines


def v2_lines(cells: pd.DataFrame, column: str, conditions: Sequence[str], *, higher_is_better: bool = True,
             metric_name: str = "balanced accuracy") -> list[str]:
    """The v2 protocol's statistics as a section of leaderboard.md (``--statistics v2``).

    The seed is the unit of replication: per rule, condition and seed, the worst case over that
    seed's attacked runs. Across conditions, Friedman's test over (condition, seed) blocks and rank
    ranges from Holm-corrected sign-flip tests over the same blocks; per condition, the same over its
    seeds, with each rule's mean per-seed worst case and its t interval.

    Parameters
    ----------
    cells : pandas.DataFrame
        The board's cells (condition, rule, attack_label, seed and ``column``).
    column : str
        The metric's column.
    conditions : sequence of str
        The conditions in page order.
    higher_is_better : bool
        The metric's direction.
    metric_name : str
        The metric's name in the text.

    Returns
    -------
    list of str
        Markdown lines.
    """
    data = cells.dropna(subset=[column])
    attacked = data[data["attack_label"] != "none"] if (data["attack_label"] != "none").any() else data
    blocks = stats.worst_case_blocks(attacked, value=column, higher_is_better=higher_is_better, attack="attack_label")
    md = ["## v2 statistics: per-seed worst cases", "",
          f"The seed is the unit of replication: per rule, condition and seed, the worst final {metric_name} over that "
          "seed's attacked runs. Intervals: Student's t 95 % over seeds (or blocks); pairs of rules: the paired mean "
          "difference with its t interval and the sign-flip permutation test (exact up to "
          f"{stats.SIGN_FLIP_EXACT_MAX} pairs, else {stats.SIGN_FLIP_RESAMPLES} random sign patterns), Holm-corrected over "
          "all pairs; a rule's rank is the range those tests support (1 + the rules significantly better, to the rules "
          "not significantly worse), so tied rules share a range. docs/leaderboard.md, \"v2 protocol\".", ""]
    if blocks.empty or blocks.shape[1] < 2:
        return md + ["No (condition, seed) block has a worst case for two rules: nothing to compare.", ""]
    md += [f"### Across conditions: {len(blocks)} (condition, seed) blocks", ""]
    md += _friedman_text(stats.friedman(blocks))
    md += _v2_ranking_lines(blocks, higher_is_better, "mean of the blocks' worst cases")
    for cond in conditions:
        if cond not in set(blocks.index.get_level_values(0)):
            continue
        per_seed = blocks.xs(cond, level=0)
        md += [f"### {cond}: {len(per_seed)} seeds", ""]
        md += _v2_ranking_lines(per_seed, higher_is_better, "per-seed worst case")
    return md


def make_leaderboard(grid_dirs: Sequence[str | Path], out_dir: str | Path, *, metric: str = "balanced_accuracy",
                     baseline: str = "fedavg", last_k: int = LAST_K, resamples: int = stats.RESAMPLES,
                     progress: Callable[[str], None] | None = None, without_attacks: Sequence[str] = (),
                     statistics: str = "v1") -> Path:
    """Load the grid folders and write the leaderboard into ``out_dir``; returns leaderboard.md's path.

    ``without_attacks``: attack labels left out (a threat model without them); each must name an attack of the cells.
    ``statistics``: "v2" adds the v2 protocol's statistics (:func:`v2_lines`).
    """
    if resamples < 100:
        raise LeaderboardError(f"resamples = {resamples}: use at least 100 bootstrap resamples (default {stats.RESAMPLES})")
    board = load(grid_dirs, metric=metric, last_k=last_k, progress=progress)
    if without_attacks:
        known = set(board.cells["attack_label"])
        unknown = sorted(set(without_attacks) - known)
        if unknown:
            raise LeaderboardError(f"--without-attacks {', '.join(unknown)}: no such attack in these grids "
                                   f"(their attacks: {', '.join(attack_order(sorted(known)))})")
        board.cells = board.cells[~board.cells["attack_label"].isin(without_attacks)].reset_index(drop=True)
        board.notes.append(f"attacks left out (a threat model without them): {', '.join(without_attacks)}")
    return render(board, out_dir, baseline=baseline, resamples=resamples, progress=progress, statistics=statistics)


__all__ = ["KEPT_RULES", "SCREEN_MARGIN", "Board", "LeaderboardError", "MetricTable", "RankAnalysis", "ScreenDecision",
           "cd_diagram", "last_k_mean", "load", "make_leaderboard", "metric_table", "rank_analysis", "render",
           "screen_decision", "v2_lines", "worst_case_ranking"]

"""Markdown tables of a finished bench grid: a final-round metric per rule and group, and the paired difference
against a baseline rule.

For every cell of the grid folder (``hospitrust bench --out``) it reads ``cells/<cell>/summary.json`` and takes
``final[METRIC]``; the cell's key names its axes (``strategy=...__scenario=...__seed=...``). It prints

- the mean ± standard deviation over seeds per rule (rows) and group (columns: the values of the ``--by`` axes);
- the difference to ``--baseline`` in the same group and seed, mean ± standard deviation over seeds.

    python benchmarks/grid_table.py runs/bench/fedagain-corruption-cpu --metric balanced_accuracy --baseline fedavg --by scenario
    python benchmarks/grid_table.py runs/bench/hta-ablation --baseline hta-published --by skew,attack --only dataset=retinamnist
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path


def cell_values(out: Path, metric: str, by: list[str], only: dict[str, str] | None = None
                ) -> dict[tuple[str, tuple[str, ...], str], float]:
    """``(strategy, group, seed) -> final[metric]`` for every finished cell of the grid folder ``out`` (only the
    cells whose axes have the values in ``only``).
    """
    values: dict[tuple[str, tuple[str, ...], str], float] = {}
    for path in glob.glob(str(out / "cells" / "*" / "summary.json")):
        key = Path(path).parent.name
        axes = dict(part.split("=", 1) for part in key.split("__"))
        if any(axes.get(k) != v for k, v in (only or {}).items()):
            continue
        value = json.loads(Path(path).read_text())["final"].get(metric)
        if value is not None:  # the rule axis: `strategy`, or a labelled `rule` axis (rule variants of one strategy)
            rule = axes.get("strategy", axes.get("rule", "-"))
            values[(rule, tuple(axes[b] for b in by), axes.get("seed", "-"))] = float(value)
    return values


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def tables(values: dict, baseline: str) -> str:
    """The two Markdown tables (see the module docstring)."""
    rules = sorted({k[0] for k in values})
    groups = sorted({k[1] for k in values})
    header = "| rule | " + " | ".join("/".join(g) for g in groups) + " |\n|---|" + "---:|" * len(groups) + "\n"
    lines = [header]
    for rule in rules:
        lines.append(f"| {rule} | " + " | ".join(_mean_std([v for (r, g, _), v in values.items() if r == rule and g == grp])
                                                 for grp in groups) + " |\n")
    lines.append(f"\nPaired difference against {baseline} (same group and seed), mean ± std over seeds:\n\n{header}")
    for rule in rules:
        if rule == baseline:
            continue
        cells = []
        for grp in groups:
            diffs = [v - values[(baseline, g, s)] for (r, g, s), v in values.items()
                     if r == rule and g == grp and (baseline, g, s) in values]
            # round first: -1e-17 would print as -0.000
            cells.append(f"{round(statistics.mean(diffs), 3) + 0.0:+.3f} ± {statistics.stdev(diffs):.3f}" if len(diffs) > 1
                         else "-")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |\n")
    return "".join(lines)


def main() -> None:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid_folder", type=Path)
    parser.add_argument("--metric", default="balanced_accuracy", help="a key of summary.json's final (default balanced_accuracy)")
    parser.add_argument("--baseline", default="fedavg", help="the rule the paired differences are taken against")
    parser.add_argument("--by", default="scenario", help="comma list of the axes that make the columns (default scenario)")
    parser.add_argument("--only", default="", help="comma list of AXIS=VALUE: only those cells (e.g. dataset=retinamnist)")
    args = parser.parse_args()
    only = dict(item.split("=", 1) for item in args.only.split(",") if "=" in item)
    values = cell_values(args.grid_folder, args.metric, [b.strip() for b in args.by.split(",") if b.strip()], only)
    if not values:
        raise SystemExit(f"no finished cell with final.{args.metric} under {args.grid_folder}/cells")
    print(tables(values, args.baseline), end="")


if __name__ == "__main__":
    main()

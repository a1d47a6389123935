"""Issue 60's decision rule for the default reply bound (``round-norm-bound.over-median``), applied to the design grid's
cells (``norm-bound.toml``: validation split, seeds 1-3). The rule is on docs/experiments/2026-12-07-default-bound.md,
committed with this script before the grid ran.

    python benchmarks/defaults/choose_bound.py runs/defaults-norm-bound

The rule, per ratio of the grid's ``bound`` axis but ``off`` (the reference; an unbounded default is what issue 60
replaces):
1. eligible when, in every condition, its clean runs cost at most 0.005 of balanced accuracy against ``off``'s (mean
   over the seeds, paired by seed);
2. its score is the mean over the seeds of its worst balanced accuracy over the attacked cells (every condition's);
3. the eligible ratio with the highest score is chosen; within 0.005 of the highest, the larger ratio (the looser
   bound, the fewer honest replies it can reject). None eligible: the default stays off, and the page says so.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
DESIGN = HERE / "norm-bound.toml"
OFF, CLEAN = "off", "none"
CLEAN_SLACK = 0.005
TIE = 0.005


def bounds(grid: Path = DESIGN) -> dict[str, float]:
    """The grid's ``bound`` axis: label -> round-norm-bound.over-median (``max-norm-over-median``, the key's name when
    the grid ran, in its archived copy)."""
    axis = tomllib.loads(grid.read_text())["axes"]["bound"]
    return {b["label"]: float(b.get("round-norm-bound.over-median", b.get("max-norm-over-median"))) for b in axis}


def read_cells(run: Path) -> dict[tuple[str, str, str, int], float]:
    """(condition, bound, attack, seed) -> final balanced accuracy, for the finished cells."""
    out = {}
    with open(run / "cells.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("status") == "done":
                key = (row["condition"], row["bound"], row["attack"], int(row["seed"]))
                out[key] = float(row["final_balanced_accuracy"])
    return out


def decide(cells: dict[tuple[str, str, str, int], float], ratios: dict[str, float]) -> tuple[str, list[dict]]:
    """The chosen label (``off`` when none is eligible) and one row per bound with its figures and verdict."""
    conditions = sorted({c for c, _, _, _ in cells})
    seeds = sorted({s for _, _, _, s in cells})
    # what each condition runs: its attacks as the grid's cells say (the off bound's cells name them)
    attacked = sorted({(c, a) for c, _, a, _ in cells if a != CLEAN})
    needed = [(c, b, a, s) for b in ratios for s in seeds for c, a in [(c, CLEAN) for c in conditions] + attacked]
    missing = [k for k in needed if k not in cells]
    if missing:
        raise SystemExit(f"choose_bound: {len(missing)} cells are not finished, e.g. {missing[:3]}: run the grid to its end")
    rows = []
    for label, ratio in ratios.items():
        row: dict = {"bound": label, "ratio": ratio}
        costs = []
        for c in conditions:
            row[f"{c} clean"] = statistics.fmean(cells[(c, label, CLEAN, s)] for s in seeds)
            costs.append(statistics.fmean(cells[(c, label, CLEAN, s)] - cells[(c, OFF, CLEAN, s)] for s in seeds))
        for c, a in attacked:
            row[f"{c} {a}"] = statistics.fmean(cells[(c, label, a, s)] for s in seeds)
        row["clean_cost"] = min(costs)  # the condition where the bound costs most
        row["worst"] = statistics.fmean(min(cells[(c, label, a, s)] for c, a in attacked) for s in seeds)
        row["eligible"] = label != OFF and row["clean_cost"] >= -CLEAN_SLACK
        rows.append(row)
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        return OFF, rows
    best = max(r["worst"] for r in eligible)
    near = [r for r in eligible if r["worst"] >= best - TIE]
    return max(near, key=lambda r: r["ratio"])["bound"], rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the design grid's folder (hospitrust bench --out)")
    parser.add_argument("--grid", type=Path, default=DESIGN, help="the design grid (its bound axis)")
    args = parser.parse_args(argv)
    chosen, rows = decide(read_cells(args.run), bounds(args.grid))
    columns = [k for k in rows[0] if k not in {"bound", "ratio", "clean_cost", "worst", "eligible"}]
    print("| bound | ratio | " + " | ".join(columns) + " | clean - off (worst condition) | mean worst case | eligible |")
    print("|---" * (5 + len(columns)) + "|")
    for r in rows:
        print(f"| {r['bound']} | {r['ratio']:g} | " + " | ".join(f"{r[k]:.3f}" for k in columns)
              + f" | {r['clean_cost']:+.3f} | {r['worst']:.3f} | {'yes' if r['eligible'] else 'no'} |")
    print(f"chosen: {chosen} (round-norm-bound.over-median = {bounds(args.grid)[chosen]:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 60's decision rule for the default reply bound (``max-norm-over-median``), applied to the design grid's
cells (``norm-bound.toml``: validation split, seeds 1-3). The rule is on docs/experiments/2026-12-07-default-bound.md,
committed with this script before the grid ran.

    python benchmarks/defaults/choose_bound.py runs/defaults-norm-bound

The rule, per ratio of the grid's ``bound`` axis but ``off`` (the reference; an unbounded default is what issue 60
replaces):
1. eligible when its clean runs cost at most 0.005 of balanced accuracy against ``off``'s (mean over the seeds,
   paired by seed);
2. its score is the mean over the seeds of its worst balanced accuracy over the attacks;
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
    """The grid's ``bound`` axis: label -> max-norm-over-median."""
    return {b["label"]: float(b["max-norm-over-median"]) for b in tomllib.loads(grid.read_text())["axes"]["bound"]}


def read_cells(run: Path) -> dict[tuple[str, str, int], float]:
    """(bound, attack, seed) -> final balanced accuracy, for the finished cells."""
    out = {}
    with open(run / "cells.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("status") == "done":
                out[(row["bound"], row["attack"], int(row["seed"]))] = float(row["final_balanced_accuracy"])
    return out


def decide(cells: dict[tuple[str, str, int], float], ratios: dict[str, float]) -> tuple[str, list[dict]]:
    """The chosen label (``off`` when none is eligible) and one row per bound with its figures and verdict."""
    attacks = sorted({a for _, a, _ in cells} - {CLEAN})
    seeds = sorted({s for _, _, s in cells})
    missing = [(b, a, s) for b in ratios for a in [CLEAN, *attacks] for s in seeds if (b, a, s) not in cells]
    if missing:
        raise SystemExit(f"choose_bound: {len(missing)} cells are not finished, e.g. {missing[:3]}: run the grid to its end")
    rows = []
    for label, ratio in ratios.items():
        clean_cost = statistics.fmean(cells[(label, CLEAN, s)] - cells[(OFF, CLEAN, s)] for s in seeds)
        worst = statistics.fmean(min(cells[(label, a, s)] for a in attacks) for s in seeds)
        rows.append({"bound": label, "ratio": ratio, "clean": statistics.fmean(cells[(label, CLEAN, s)] for s in seeds),
                     "clean_cost": clean_cost, "worst": worst,
                     "eligible": label != OFF and clean_cost >= -CLEAN_SLACK,
                     **{a: statistics.fmean(cells[(label, a, s)] for s in seeds) for a in attacks}})
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
    attacks = [k for k in rows[0] if k not in {"bound", "ratio", "clean", "clean_cost", "worst", "eligible"}]
    print("| bound | ratio | clean | clean - off | " + " | ".join(attacks) + " | mean worst case | eligible |")
    print("|---" * (6 + len(attacks)) + "|")
    for r in rows:
        print(f"| {r['bound']} | {r['ratio']:g} | {r['clean']:.3f} | {r['clean_cost']:+.3f} | "
              + " | ".join(f"{r[a]:.3f}" for a in attacks) + f" | {r['worst']:.3f} | {'yes' if r['eligible'] else 'no'} |")
    print(f"chosen: {chosen} (max-norm-over-median = {bounds(args.grid)[chosen]:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 62's decision rule for the default run, applied to the design grid's cells (validation split, seeds 1-3),
and the evaluation grid it leads to (test split, seeds 101-103). The rule is on docs/experiments/2026-12-07-defaults.md,
committed with this script before the design grid ran.

    python benchmarks/defaults/choose.py runs/defaults-design                 # the table and the choice
    python benchmarks/defaults/choose.py runs/defaults-design --write-evaluation benchmarks/defaults/evaluation.toml

The rule, per candidate (every label of the grid's ``candidate`` axis but ``pooled``):
1. eligible when, on both datasets, every class is recalled on every seed (worst-class recall > 0), its mean balanced
   accuracy is at least today's, its mean AUC at least today's minus 0.01, and its mean run time at most 1.05x
   today's (the same grid, the same machine);
2. its score is its worse dataset's mean gap to the pooled reference in balanced accuracy (paired by seed);
3. the eligible candidate with the highest score is chosen; within 0.005 of the highest, the one with fewer changed
   keys, then the earlier in the axis. None eligible: today's defaults stay.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
DESIGN = HERE / "design.toml"
TODAY, POOLED = "today", "pooled"
TIE = 0.005
AUC_SLACK = 0.01
TIME_RATIO = 1.05
EVALUATION_SEEDS = (101, 102, 103)


def candidates(grid: Path = DESIGN) -> list[dict]:
    """The design grid's candidate entries, in axis order."""
    return tomllib.loads(grid.read_text())["axes"]["candidate"]


def read_cells(run: Path) -> dict[tuple[str, str, int], dict[str, float]]:
    """(candidate, dataset, seed) -> the cell's final figures, for the finished cells."""
    out = {}
    with open(run / "cells.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("status") != "done":
                continue
            figures = {}
            for key in ("final_balanced_accuracy", "final_auc", "final_worst_class_recall", "run_seconds"):
                try:
                    figures[key] = float(row[key])
                except (KeyError, TypeError, ValueError):
                    figures[key] = float("nan")
            out[(row["candidate"], row["dataset"], int(row["seed"]))] = figures
    return out


def decide(cells: dict[tuple[str, str, int], dict[str, float]], entries: list[dict]) -> tuple[str, list[dict]]:
    """The chosen label (``today`` when none is eligible) and one row per candidate with its figures and verdict."""
    datasets = sorted({d for _, d, _ in cells})
    seeds = sorted({s for _, _, s in cells})
    missing = [(c["label"], d, s) for c in entries for d in datasets for s in seeds if (c["label"], d, s) not in cells]
    if missing:
        raise SystemExit(f"choose: {len(missing)} design cells are not finished, e.g. {missing[:3]}: run the grid to its end")

    def mean(label: str, dataset: str, key: str) -> float:
        return statistics.fmean(cells[(label, dataset, s)][key] for s in seeds)

    today_seconds = statistics.fmean(cells[(TODAY, d, s)]["run_seconds"] for d in datasets for s in seeds)
    rows = []
    for entry in entries:
        label = entry["label"]
        if label == POOLED:
            continue
        gaps = {d: statistics.fmean(cells[(label, d, s)]["final_balanced_accuracy"]
                                    - cells[(POOLED, d, s)]["final_balanced_accuracy"] for s in seeds) for d in datasets}
        seconds = statistics.fmean(cells[(label, d, s)]["run_seconds"] for d in datasets for s in seeds)
        why = []
        for d in datasets:
            if any(not cells[(label, d, s)]["final_worst_class_recall"] > 0 for s in seeds):
                why.append(f"{d}: a class never recalled")
            if mean(label, d, "final_balanced_accuracy") < mean(TODAY, d, "final_balanced_accuracy"):
                why.append(f"{d}: balanced accuracy below today's")
            if mean(label, d, "final_auc") < mean(TODAY, d, "final_auc") - AUC_SLACK:
                why.append(f"{d}: AUC more than {AUC_SLACK} below today's")
        if seconds > TIME_RATIO * today_seconds:
            why.append(f"run time {seconds / today_seconds:.2f}x today's")
        changed = len([k for k in entry if k != "label"]) - (1 if entry.get("train.class-weighted-loss") is False else 0)
        rows.append({"label": label, "score": min(gaps.values()), "gaps": gaps, "seconds": seconds,
                     "changed": changed, "eligible": not why, "why": "; ".join(why),
                     **{f"ba {d}": mean(label, d, "final_balanced_accuracy") for d in datasets},
                     **{f"auc {d}": mean(label, d, "final_auc") for d in datasets}})
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        return TODAY, rows
    best = max(r["score"] for r in eligible)
    near = [r for r in eligible if r["score"] >= best - TIE]
    chosen = min(near, key=lambda r: (r["changed"], rows.index(r)))
    return chosen["label"], rows


def evaluation_grid(chosen: dict, design: Path = DESIGN) -> str:
    """The evaluation grid: the chosen candidate, today's and the pooled reference on the test split, seeds
    101-103 (the design grid's settings otherwise)."""
    data = tomllib.loads(design.read_text())
    keep = [e for e in data["axes"]["candidate"] if e["label"] in {TODAY, POOLED, chosen["label"]}]

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        return repr(v)

    def table(entry: dict) -> str:
        return "{ " + ", ".join(f'{k if k.replace("-", "").isalnum() else chr(34) + k + chr(34)} = {value(v)}'
                                for k, v in entry.items()) + " }"

    lines = ["# Issue 62: the defaults' evaluation grid (generated by benchmarks/defaults/choose.py from the design grid's",
             f"# choice, {chosen['label']}): the test split, evaluation seeds {', '.join(map(str, EVALUATION_SEEDS))}.",
             f"# Budget stated before it ran: {len(keep) * 2 * len(EVALUATION_SEEDS)} cells; within 1.5 h on 2 cores.",
             "#   hospitrust bench benchmarks/defaults/evaluation.toml --out runs/defaults-evaluation",
             "[grid]", 'name = "defaults-evaluation"',
             'description = "The chosen default run, today\'s and the pooled reference on the test split, seeds 101-103"']
    lines += [f"{k} = {value(v)}" for k, v in data["grid"].items() if k not in ("name", "description")]
    lines += ["", "[base]", "checkpoint = false", "", "[axes]", f"seed = [{', '.join(map(str, EVALUATION_SEEDS))}]",
              'dataset = ["pneumoniamnist", "retinamnist"]', "candidate = ["]
    lines += [f"    {table(e)}," for e in keep] + ["]"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the design grid's folder (hospitrust bench ... --out RUN)")
    parser.add_argument("--write-evaluation", type=Path, metavar="TOML", help="write the evaluation grid here")
    args = parser.parse_args(argv)
    if not (args.run / "cells.csv").is_file():
        print(f"choose: {args.run} has no cells.csv (run the design grid first)", file=sys.stderr)
        return 2
    entries = candidates()
    chosen, rows = decide(read_cells(args.run), entries)
    datasets = sorted({k.split(" ", 1)[1] for r in rows for k in r if k.startswith("ba ")})
    print(f"{'candidate':<18} " + " ".join(f"{'BA ' + d[:6]:>10} {'gap':>7}" for d in datasets)
          + f" {'score':>7} {'s/run':>6}  verdict")
    for r in rows:
        print(f"{r['label']:<18} " + " ".join(f"{r['ba ' + d]:>10.4f} {r['gaps'][d]:>+7.4f}" for d in datasets)
              + f" {r['score']:>+7.4f} {r['seconds']:>6.0f}  {'eligible' if r['eligible'] else r['why']}")
    print(f"chosen: {chosen}" + (" (none eligible: today's defaults stay)" if chosen == TODAY else ""))
    if args.write_evaluation:
        args.write_evaluation.write_text(evaluation_grid(next(e for e in entries if e["label"] == chosen)))
        print(f"wrote {args.write_evaluation}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

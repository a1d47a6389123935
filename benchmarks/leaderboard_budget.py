"""The leaderboard v2's budget from its tuning grids: each rule's learning rate and rounds to the plateau.

Reads the per-round curves of one or more tuning grid folders (``hospitrust bench`` output: every
rule without attack at a few learning rates, on tuning seeds, evaluated on the val split), and
writes into ``--out``: ``budget.md`` (the page's budget table), ``budget.csv`` and ``curves.png``
(balanced accuracy against the round per rule at its chosen rate: each seed thin, the mean thick,
the plateau as a dashed line). The rules are in ``benchmarks/study/budget.py``. Each rule's
``max-update-norm`` bound (amendment 5: twice the largest honest update norm of its clean tuning runs at
its chosen rate, rounded up at two significant digits) is a column of both tables.

    python benchmarks/leaderboard_budget.py runs/leaderboard-v2/tune-pneumonia-a runs/leaderboard-v2/tune-pneumonia-b \
        --out docs/results/leaderboard/v2/budget
    python benchmarks/leaderboard_budget.py runs/leaderboard-v3/plateau-retina --candidates 40 80 \\
        --out docs/results/leaderboard/v3/plateau-retina
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "study"))  # the studies' own code (not in the wheel)


def main(argv: list[str] | None = None) -> int:
    from budget import CANDIDATE_ROUNDS, TOLERANCE, BudgetError, budget_table, rule_budgets
    from hospitrust.bench.store import collect

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grids", nargs="+", help="tuning grid folders")
    ap.add_argument("--out", required=True, help="folder for budget.md, budget.csv and curves.png")
    ap.add_argument("--metric", default="balanced_accuracy")
    ap.add_argument("--last-k", type=int, default=3, help="rounds averaged at a curve's round (default 3)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--candidates", type=int, nargs="+", default=list(CANDIDATE_ROUNDS), metavar="R",
                    help="the rounds R whose doubling R -> 2R is measured (default: %(default)s; a rounds probe of 160 "
                         "rounds: 40 80)")
    args = ap.parse_args(argv)

    frames = []
    for grid in args.grids:
        if not Path(grid, "grid.json").is_file():
            print(f"leaderboard_budget: {grid} is not a grid folder (no grid.json); expected hospitrust bench's --out",
                  file=sys.stderr)
            return 2
        frames.append(collect(grid)[0])
    rounds = pd.concat(frames, ignore_index=True)
    try:
        budgets = rule_budgets(rounds, metric=args.metric, k=args.last_k, candidates=tuple(args.candidates),
                               tolerance=args.tolerance)
    except BudgetError as exc:
        print(f"leaderboard_budget: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    norms = largest_update_norms([Path(g) for g in args.grids])
    bounds = {b.rule: update_bound(norms.get((b.rule, float(b.learning_rate)))) for b in budgets}
    table = budget_table(budgets) + "\n\n" + "\n".join(
        ["| rule | learning rate | largest honest update norm | max-update-norm |", "|---|---|---|---|"]
        + [f"| {b.rule} | {b.learning_rate:g} | {norms.get((b.rule, float(b.learning_rate)), float('nan')):.3g} | "
           f"{bounds[b.rule]:g} |" for b in budgets])
    (out / "budget.md").write_text(table + "\n")
    pd.DataFrame([{"rule": b.rule, "learning-rate": b.learning_rate, "value": b.value, "plateau": b.plateau,
                   "seeds": b.seeds, "max-update-norm": bounds[b.rule], **{f"lr={r:g}": v for r, v in b.by_rate.items()},
                   **{f"doubling R={c}": d for c, d in b.doubling.items()}} for b in budgets]).to_csv(
        out / "budget.csv", index=False)
    _plot(rounds, budgets, args.metric, out / "curves.png")
    print(table)
    print(f"wrote {out / 'budget.md'}, {out / 'budget.csv'}, {out / 'curves.png'}")
    return 0


def largest_update_norms(grids: list[Path]) -> dict[tuple[str, float], float]:
    """(rule, learning rate) -> the largest update norm any hospital sent in those grids' cells (clean runs:
    every hospital honest), from each cell's ``config.json`` and ``rounds.jsonl``.
    """
    import json

    from hospitrust.server_app.results import read_round_records

    out: dict[tuple[str, float], float] = {}
    for grid in grids:
        for cell in sorted(Path(grid, "cells").iterdir()):
            config, rounds = cell / "config.json", cell / "rounds.jsonl"
            if not (config.is_file() and rounds.is_file()):
                continue
            cfg = json.loads(config.read_text())
            key = (str(cfg["strategy"]), float(cfg["learning-rate"]))
            for record in read_round_records(cell):
                for client in record.clients:
                    if client.update_norm is not None and not client.malicious:
                        out[key] = max(out.get(key, 0.0), float(client.update_norm))
    return out


def update_bound(norm: float | None) -> float:
    """Twice ``norm`` rounded up at two significant digits (2 x 0.309 -> 0.62, 2 x 6.4 -> 13); NaN without one."""
    import math

    if norm is None or not norm > 0:
        return float("nan")
    twice = 2.0 * norm
    step = 10.0 ** (math.floor(math.log10(twice)) - 1)
    return round(math.ceil(twice / step - 1e-9) * step, 10)


def _plot(rounds: pd.DataFrame, budgets, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = (len(budgets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), sharey=True, squeeze=False)
    for ax, b in zip(axes.flat, budgets):
        mine = rounds[(rounds["strategy"] == b.rule) & (rounds["learning-rate"].astype(float) == b.learning_rate)]
        for _, seed in mine.groupby("seed"):
            ax.plot(seed["round"], seed[metric], color="tab:blue", alpha=0.3, linewidth=0.8)
        mean = mine.groupby("round")[metric].mean()
        ax.plot(mean.index, mean.values, color="tab:blue", linewidth=2)
        if b.plateau is not None:
            ax.axvline(b.plateau, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{b.rule} (lr {b.learning_rate:g})", fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(budgets):]:
        ax.axis("off")
    axes[0][0].set_ylabel(metric.replace("_", " "))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

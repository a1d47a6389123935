"""Issue 60's decision test on sentinel's evaluation grids, as docs/leaderboard.md ("Issue 60: sentinel's
evaluation") declares it before the seeds run: per condition, 3 one-sided exact paired sign-flip tests over the
seeds, Holm over the 3 at 0.05.

    python benchmarks/leaderboard/v3/sentinel_verdict.py main runs/leaderboard-v3/sentinel-main-s*
    python benchmarks/leaderboard/v3/sentinel_verdict.py alpha0.1 runs/leaderboard-v3/sentinel-alpha0.1-s*

1. sentinel's worst case (its lowest final balanced accuracy over the nine common attacks and its two aware
   attacks) minus ``cohort-only-converged`` > 0;
2. its clean balanced accuracy minus FedAvg's, plus 0.01, > 0;
3. its clean AUC minus FedAvg's, plus 0.005, > 0.
It holds in the condition when all three are significant after Holm.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sentinel_parts as parts  # noqa: E402  (the suite and the rows: one source)

from hospitrust.bench import stats  # noqa: E402

WORST_OVER = (*parts.NINE, *(label for label, _, _ in parts.OWN))
CONTROL = "cohort-only-converged"
BASELINE = "fedavg"
MARGINS = {"worst case - cohort-only-converged": 0.0, "clean balanced accuracy - FedAvg's": 0.01,
           "clean AUC - FedAvg's": 0.005}
ALPHA = 0.05


class IncompleteGrid(ValueError):
    """A seed lacks a cell the test needs; the message names them."""


def differences(cells: pd.DataFrame) -> dict[str, pd.Series]:
    """The three paired differences per seed (without their margins) from one condition's cells
    (columns: rule, seed, attack_label, final_balanced_accuracy, final_auc).
    """
    def one(rule: str, attack: str, column: str) -> pd.Series:
        sub = cells[(cells["rule"] == rule) & (cells["attack_label"] == attack)]
        return sub.set_index("seed")[column].astype(float)

    attacked = cells[(cells["rule"] == "sentinel") & cells["attack_label"].isin(WORST_OVER)]
    wide = attacked.pivot_table(index="seed", columns="attack_label", values="final_balanced_accuracy")
    seeds = sorted(set(cells["seed"]))
    missing = [f"seed {s}: sentinel x {a}" for s in seeds for a in WORST_OVER
               if s not in wide.index or a not in wide.columns or pd.isna(wide.loc[s, a])]
    for rule, attack in (("sentinel", "none"), (BASELINE, "none"), (CONTROL, "none")):
        have = set(cells[(cells["rule"] == rule) & (cells["attack_label"] == attack)]["seed"])
        missing += [f"seed {s}: {rule} x {attack}" for s in seeds if s not in have]
    if missing:
        raise IncompleteGrid(f"{len(missing)} cells missing: " + "; ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    worst = wide[list(WORST_OVER)].min(axis=1)
    names = list(MARGINS)
    return {
        names[0]: worst - one(CONTROL, "none", "final_balanced_accuracy"),
        names[1]: one("sentinel", "none", "final_balanced_accuracy") - one(BASELINE, "none", "final_balanced_accuracy"),
        names[2]: one("sentinel", "none", "final_auc") - one(BASELINE, "none", "final_auc"),
    }


def verdict(cells: pd.DataFrame) -> tuple[bool, pd.DataFrame]:
    """(whether sentinel holds, one row per comparison: mean difference, t interval, seeds above the margin,
    one-sided p, Holm-adjusted p, significant).
    """
    diffs = differences(cells)
    rows = []
    for name, d in diffs.items():
        margin = MARGINS[name]
        iv = stats.t_interval(d.to_numpy())
        rows.append({"comparison": name, "margin": -margin, "mean": float(d.mean()), "low": iv.low, "high": iv.high,
                     "seeds_above": int((d + margin > 0).sum()), "seeds": int(d.notna().sum()),
                     "p": stats.sign_flip_pvalue((d + margin).to_numpy(), alternative="greater")})
    table = pd.DataFrame(rows)
    table["p_holm"] = stats.holm(table["p"].tolist())
    table["significant"] = table["p_holm"] < ALPHA
    return bool(table["significant"].all()), table


def read_cells(folders: list[Path]) -> pd.DataFrame:
    """The finished cells of sentinel's evaluation parts (rule = the strategy axis' label)."""
    from hospitrust.bench.store import collect

    frames = []
    for folder in folders:
        _, cells, _ = collect(folder)
        done = cells[cells["status"] == "done"].copy()
        done["rule"] = done["strategy"].astype(str)
        done["attack_label"] = done["attack"].astype(str)
        frames.append(done[["rule", "seed", "attack_label", "final_balanced_accuracy", "final_auc"]])
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("condition", choices=list(parts.CONDITIONS))
    parser.add_argument("folders", nargs="+", type=Path, help="the condition's part folders (hospitrust bench --out)")
    args = parser.parse_args(argv)
    try:
        holds, table = verdict(read_cells(args.folders))
    except IncompleteGrid as exc:
        print(f"sentinel_verdict.py: {exc}", file=sys.stderr)
        return 2
    print(f"condition {args.condition}: sentinel {'holds' if holds else 'does not hold'} (Holm over 3 at {ALPHA})")
    for r in table.itertuples():
        print(f"  {r.comparison}: {r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}] (margin {r.margin:+.3f}), "
              f"{r.seeds_above} of {r.seeds} seeds above it, one-sided p {r.p:.4f}, Holm {r.p_holm:.4f}"
              f"{'' if r.significant else ' (not significant)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

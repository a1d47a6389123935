"""The leaderboard's budget (docs/leaderboard.md, "Trained rules: the budget"), from tuning grids.

A tuning grid runs every rule without attack at a few learning rates for ``max_round`` rounds on
tuning seeds, evaluated every round on a held-out split. From its per-round curves:

- a curve's value at round R is the mean of the metric over rounds R-k+1 .. R (the leaderboard's
  last-k mean, so one noisy round does not decide);
- a rule's **learning rate** is the one with the best mean over seeds at the last round;
- its **rounds to the plateau** are the smallest candidate R such that, for R and every larger
  candidate R' with 2R' within the curve, doubling R' changes the mean over seeds by less than
  ``tolerance``: a curve still at chance early (flat, then rising) is not a plateau, because a
  later doubling moves it.

Pure pandas: no plotting here (``benchmarks/leaderboard_budget.py`` draws the curves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

CANDIDATE_ROUNDS = (5, 10, 15, 20, 25, 30)
TOLERANCE = 0.01


class BudgetError(ValueError):
    """A tuning table that cannot give a budget (columns missing, no finished cell)."""


def window_mean(curve: pd.Series, round_: int, k: int) -> float:
    """Mean of ``curve`` (indexed by round) over rounds ``round_ - k + 1`` .. ``round_``; NaN when any is missing."""
    wanted = range(round_ - k + 1, round_ + 1)
    if round_ < k or any(r not in curve.index for r in wanted):
        return math.nan
    return float(curve.loc[list(wanted)].mean())


@dataclass(frozen=True)
class RuleBudget:
    rule: str
    learning_rate: float
    value: float  # mean over seeds at the last round, at the chosen rate
    by_rate: dict[float, float]  # every rate's mean over seeds at the last round
    plateau: int | None  # rounds to the plateau, None when not reached within the curve
    doubling: dict[int, float]  # candidate R -> mean(2R) - mean(R), at the chosen rate
    seeds: int


def _check(rounds: pd.DataFrame, metric: str, rule: str, rate: str) -> None:
    missing = [c for c in ("cell", "seed", "round", metric, rule, rate) if c not in rounds]
    if missing:
        raise BudgetError(f"the tuning table has no column {', '.join(missing)}; expected one row per cell and "
                          f"round with cell, seed, round, {rule}, {rate} and {metric}")
    if not len(rounds):
        raise BudgetError("the tuning table has no finished cell")


def rule_budgets(rounds: pd.DataFrame, *, metric: str = "balanced_accuracy", k: int = 3, rule: str = "strategy",
                 rate: str = "learning-rate", candidates: Sequence[int] = CANDIDATE_ROUNDS,
                 tolerance: float = TOLERANCE) -> list[RuleBudget]:
    """Per rule, the chosen learning rate and its rounds to the plateau (see the module's docstring).

    ``rounds``: one row per (cell, round) with the cell's seed, rule and learning rate, as
    ``hospitrust.bench.store.collect`` gives a grid's rounds.
    """
    _check(rounds, metric, rule, rate)
    out = []
    for name, by_rule in rounds.groupby(rule, sort=True):
        last = int(by_rule["round"].max())
        curves = {(float(r), s): g.set_index("round")[metric].sort_index()
                  for (r, s), g in by_rule.groupby([rate, "seed"])}
        rates = sorted({r for r, _ in curves})
        by_rate = {r: _seed_mean(curves, r, last, k) for r in rates}
        best = max(rates, key=lambda r: (-math.inf if math.isnan(by_rate[r]) else by_rate[r], -r))
        doubling = {c: _seed_mean(curves, best, 2 * c, k) - _seed_mean(curves, best, c, k)
                    for c in candidates if 2 * c <= last and c >= k}
        plateau = None
        for c in sorted(doubling):
            if all(abs(d) < tolerance for cc, d in doubling.items() if cc >= c):
                plateau = c
                break
        out.append(RuleBudget(str(name), best, by_rate[best], by_rate, plateau, doubling,
                              len({s for r, s in curves if r == best})))
    return out


def _seed_mean(curves: dict[tuple[float, object], pd.Series], rate: float, round_: int, k: int) -> float:
    values = [window_mean(c, round_, k) for (r, _), c in curves.items() if r == rate]
    values = [v for v in values if not math.isnan(v)]
    return float(sum(values) / len(values)) if values else math.nan


def budget_table(budgets: Sequence[RuleBudget]) -> str:
    """The page's budget table (Markdown)."""
    rates = sorted({r for b in budgets for r in b.by_rate})
    candidates = sorted({c for b in budgets for c in b.doubling})
    head = (["rule", "learning rate", "value at the last round"] + [f"lr {r:g}" for r in rates]
            + [f"R={c}: m(2R)-m(R)" for c in candidates] + ["rounds to plateau", "seeds"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in budgets:
        cells = [b.rule, f"{b.learning_rate:g}", f"{b.value:.3f}"]
        cells += [f"{b.by_rate[r]:.3f}" if r in b.by_rate else "" for r in rates]
        cells += [f"{b.doubling[c]:+.3f}" if c in b.doubling else "" for c in candidates]
        cells += [str(b.plateau) if b.plateau is not None else "not reached", str(b.seeds)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

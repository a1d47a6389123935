"""The leaderboard's budget from tuning curves (benchmarks/study/budget.py), on hand-made curves."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from budget import BudgetError, budget_table, rule_budgets, window_mean


def _rows(rule: str, rate: float, seed: int, curve) -> list[dict]:
    return [{"cell": f"{rule}-{rate}-{seed}", "seed": seed, "round": r, "strategy": rule, "learning-rate": rate,
             "balanced_accuracy": v} for r, v in enumerate(curve, start=1)]


def test_the_window_mean_is_the_last_k_rounds_and_nan_before_k_or_with_a_gap():
    curve = pd.Series([0.5, 0.6, 0.7, 0.9], index=[1, 2, 3, 4])
    assert window_mean(curve, 4, 3) == pytest.approx((0.6 + 0.7 + 0.9) / 3)
    assert math.isnan(window_mean(curve, 2, 3)) and math.isnan(window_mean(curve.drop(3), 4, 3))


def test_rate_and_plateau_by_hand():
    # rate 0.01: chance for rounds 1-4, then 0.8 (seed 1) and 0.82 (seed 2); rate 0.03: 0.7 flat
    late = [0.5] * 4 + [0.8] * 16
    rows = _rows("a", 0.01, 1, late) + _rows("a", 0.01, 2, [0.5] * 4 + [0.82] * 16)
    rows += _rows("a", 0.03, 1, [0.7] * 20) + _rows("a", 0.03, 2, [0.7] * 20)
    # rule b: a tie between its rates: the smaller one is kept; still rising at the end: no plateau
    rising = [0.5 + 0.01 * r for r in range(20)]
    rows += _rows("b", 0.01, 1, rising) + _rows("b", 0.1, 1, rising)
    a, b = rule_budgets(pd.DataFrame(rows), candidates=(5, 10))
    assert a.rule == "a" and a.learning_rate == 0.01 and a.value == pytest.approx(0.81)
    assert a.by_rate == {0.01: pytest.approx(0.81), 0.03: pytest.approx(0.7)}
    # R = 5: m(5) = mean over seeds of (0.5, 0.5, 0.8|0.82) = (0.6 + 0.6067) / 2; m(10) = 0.81
    assert a.doubling[5] == pytest.approx(0.81 - (0.6 + (0.5 + 0.5 + 0.82) / 3) / 2)
    assert a.doubling[10] == pytest.approx(0.0) and a.plateau == 10 and a.seeds == 2
    assert b.learning_rate == 0.01 and b.plateau is None
    assert b.doubling[10] == pytest.approx(0.10)  # 0.01 a round over 10 rounds
    table = budget_table([a, b])
    assert "| a | 0.01 | 0.810 | 0.810 | 0.700 |  | +0.2" in table and "| not reached | 1 |" in table


def test_a_plateau_must_hold_at_every_larger_doubling():
    # flat at chance to round 10 (doubling 5 -> 10: 0), then rising: R = 5 is no plateau, nor is any
    curve = [0.5] * 10 + [0.5 + 0.03 * r for r in range(1, 11)]
    (b,) = rule_budgets(pd.DataFrame(_rows("c", 0.01, 1, curve)), candidates=(5, 10))
    assert b.doubling[5] == pytest.approx(0.0) and b.plateau is None


def test_a_table_without_the_columns_or_rows_is_refused_naming_them():
    with pytest.raises(BudgetError, match="no column learning-rate"):
        rule_budgets(pd.DataFrame([{"cell": "x", "seed": 1, "round": 1, "strategy": "a", "balanced_accuracy": 0.5}]))
    with pytest.raises(BudgetError, match="no finished cell"):
        rule_budgets(pd.DataFrame(columns=["cell", "seed", "round", "strategy", "learning-rate", "balanced_accuracy"]))


def _budget_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "leaderboard_budget.py"
    spec = importlib.util.spec_from_file_location("leaderboard_budget", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bound_is_twice_the_largest_honest_norm_rounded_up_at_two_digits():
    bound = _budget_script().update_bound
    assert bound(0.309) == 0.62 and bound(6.4) == 13.0 and bound(1.55) == 3.1 and bound(0.05) == 0.1
    assert bound(0.3101) == 0.63  # rounded up, never down: an honest update stays inside
    assert math.isnan(bound(None)) and math.isnan(bound(0.0))


def test_the_largest_honest_norm_per_rule_and_rate_skips_malicious_hospitals(tmp_path):
    import json

    def cell(name, rule, rate, rounds):
        d = tmp_path / "g" / "cells" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"strategy": rule, "learning-rate": rate}))
        lines = [{"clients": [{"hospital": f"hospital-{i}", **entry} for i, entry in enumerate(c)]} for c in rounds]
        (d / "rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    cell("a", "fedavg", 0.01, [[{"update_norm": 0.2}, {"update_norm": 0.5}], [{"update_norm": 0.4}]])
    cell("b", "fedavg", 0.01, [[{"update_norm": 0.7}, {"update_norm": 9.0, "malicious": True}]])
    cell("c", "median", 0.03, [[{"update_norm": 1.5}, {"rejected": True}]])
    (tmp_path / "g" / "cells" / "unfinished").mkdir()
    norms = _budget_script().largest_update_norms([tmp_path / "g"])
    assert norms == {("fedavg", 0.01): 0.7, ("median", 0.03): 1.5}

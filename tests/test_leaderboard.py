"""The leaderboard's statistics on hand-computed tables, and the leaderboard rendered from small
grid folders written in the bench store's format (hospitrust/bench/stats.py, leaderboard.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from hospitrust.bench import stats
from hospitrust.bench.grid import parse_grid
from hospitrust.bench.leaderboard import (KEPT_RULES, LeaderboardError, MetricTable, last_k_mean, load, make_leaderboard, metric_table, rank_analysis,
                                          screen_decision, worst_case_ranking)
from hospitrust.cli.main import main

# ------------------------------------------------------------------ bootstrap CI


def test_bootstrap_ci_hand_cases():
    # two values 0 and 1: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the
    # 2.5th and 97.5th percentiles of 10,000 resample means are 0 and 1
    iv = stats.bootstrap_ci([0.0, 1.0])
    assert (iv.mean, iv.low, iv.high, iv.n) == (0.5, 0.0, 1.0, 2)
    one = stats.bootstrap_ci([0.7])
    assert one.mean == 0.7 and not one.has_ci and one.text() == "0.700 (n=1)"
    same = stats.bootstrap_ci([0.6, 0.6, 0.6])
    assert (same.low, same.high) == (0.6, 0.6) and same.contains(0.6)
    assert stats.bootstrap_ci([math.nan, 0.4, 0.6]).n == 2  # NaN (a missing value) dropped
    assert stats.bootstrap_ci([]).text() == "-"
    assert stats.Interval(-0.017, -0.034, -0.0003, 5).text() == "-0.017 [-0.034, -0.00030]"  # not "-0.000": 0 is outside


def test_bootstrap_ci_contains_the_mean_and_narrows_with_less_spread():
    wide = stats.bootstrap_ci([0.70, 0.74, 0.82, 0.86, 0.88])
    assert wide.mean == pytest.approx(0.80)
    assert 0.70 <= wide.low < wide.mean < wide.high <= 0.88  # a mean of resampled values stays within min .. max
    # the same seeds at half the distance from the mean: the fixed rng draws the same resamples,
    # so every resample mean is 0.80 + (m - 0.80) / 2 and the interval is exactly half as wide
    narrow = stats.bootstrap_ci([0.75, 0.77, 0.81, 0.83, 0.84])
    assert narrow.mean == pytest.approx(0.80)
    assert narrow.high - narrow.low == pytest.approx((wide.high - wide.low) / 2)
    assert stats.bootstrap_ci([0.70, 0.74, 0.82, 0.86, 0.88]) == wide  # reproducible: a fixed rng seed


# ------------------------------------------------------------------ paired differences and ties


def test_paired_difference_by_seed():
    a = pd.Series({1: 0.80, 2: 0.90, 3: 0.70})
    b = pd.Series({1: 0.78, 2: 0.86, 3: 0.69, 4: 0.50})  # seed 4 has no partner: left out
    diffs = stats.paired_differences(a, b)
    assert list(diffs.index) == [1, 2, 3] and diffs.to_numpy() == pytest.approx([0.02, 0.04, 0.01])
    d = stats.paired_difference(a, b)
    assert d.mean == pytest.approx(0.07 / 3) and d.n == 3
    # three diffs: a resample of all three the smallest (or largest) has probability 1/27 = 3.7 % > 2.5 %,
    # so the interval's ends are the smallest and the largest difference
    assert (d.low, d.high) == pytest.approx((0.01, 0.04)) and stats.call(d) == "above"
    assert stats.call(stats.paired_difference(b, a)) == "below"
    assert stats.call(stats.paired_difference(a.iloc[:1], b)) == "no call"


def test_a_difference_smaller_than_the_seed_spread_is_a_tie_unless_every_seed_agrees():
    a = pd.Series([0.70, 0.80, 0.90, 0.75, 0.85], index=[1, 2, 3, 4, 5])  # std over seeds 0.079
    noisy = a - pd.Series([-0.01, 0.02, -0.01, 0.02, -0.01], index=a.index)  # 0.002 apart on average, either way
    d = stats.paired_difference(a, noisy)
    assert d.mean == pytest.approx(0.002) and d.low < 0 < d.high and stats.call(d) == "tie"
    steady = a - pd.Series([0.010, 0.012, 0.009, 0.011, 0.010], index=a.index)  # 0.0104 apart, on every seed
    assert stats.call(stats.paired_difference(a, steady)) == "above"  # pairing by seed removes the seeds' spread


# ------------------------------------------------------------------ worst case per seed


def test_worst_case_is_taken_per_seed_then_summarised():
    # seed 1 suffers under X, seed 2 under Y: each attack's mean is 0.7, but every run's worst is 0.5
    table = pd.DataFrame([
        {"rule": "r", "attack": "X", "seed": 1, "value": 0.9}, {"rule": "r", "attack": "Y", "seed": 1, "value": 0.5},
        {"rule": "r", "attack": "X", "seed": 2, "value": 0.5}, {"rule": "r", "attack": "Y", "seed": 2, "value": 0.9},
        # rule q lacks attack Y on seed 2: that seed is left out of q's worst case
        {"rule": "q", "attack": "X", "seed": 1, "value": 0.8}, {"rule": "q", "attack": "Y", "seed": 1, "value": 0.6},
        {"rule": "q", "attack": "X", "seed": 2, "value": 0.7},
        # rule p was run with X only (an attack aimed at it alone would look the same): its worst case is over X
        {"rule": "p", "attack": "X", "seed": 1, "value": 0.4}, {"rule": "p", "attack": "X", "seed": 2, "value": 0.6},
    ])
    per_attack_means = table[table["rule"] == "r"].groupby("attack")["value"].mean()
    assert per_attack_means.min() == pytest.approx(0.7)  # the min of means: no run had it
    worst = stats.worst_case_per_seed(table)
    r = worst[worst["rule"] == "r"].set_index("seed")
    assert r["worst"].tolist() == [0.5, 0.5] and r["worst_attack"].tolist() == ["Y", "X"]
    assert stats.bootstrap_ci(r["worst"]).mean == 0.5
    q = worst[worst["rule"] == "q"]
    assert q["seed"].tolist() == [1] and q["worst"].tolist() == [0.6]
    p = worst[worst["rule"] == "p"]
    assert p["worst"].tolist() == [0.4, 0.6] and p["attacks"].tolist() == [1, 1]
    lower = stats.worst_case_per_seed(table[table["rule"] == "r"], higher_is_better=False)  # e.g. backdoor success
    assert lower["worst"].tolist() == [0.9, 0.9]


def test_the_screen_drops_a_rule_more_than_the_margin_below_the_best_and_keeps_each_rules_worst_attack():
    # one seed; worst cases (attacked cells): fedavg 0.60 (X), median 0.55 (Y), new-a 0.70 (Y and Z tie),
    # new-b 0.61 (X): 0.09 below the best, within the 0.10 margin; new-c 0.55 (Z): 0.15 below, dropped.
    # The kept set here is fedavg and median: both stay whatever their worst case.
    values = {
        "fedavg": {"none": 0.80, "X": 0.60, "Y": 0.70, "Z": 0.75, "backdoor": 0.78},
        "median": {"none": 0.70, "X": 0.65, "Y": 0.55, "Z": 0.60, "backdoor": 0.69},
        "new-a": {"none": 0.75, "X": 0.72, "Y": 0.70, "Z": 0.70, "backdoor": 0.74},
        "new-b": {"none": 0.74, "X": 0.61, "Y": 0.66, "Z": 0.64, "backdoor": 0.70},
        "new-c": {"none": 0.78, "X": 0.60, "Y": 0.58, "Z": 0.55, "backdoor": 0.71},
    }
    frame = pd.DataFrame([{"rule": r, "attack_label": a, "seed": 1, "v": v}
                          for r, by in values.items() for a, v in by.items()])
    decision = screen_decision(metric_table(frame, "v"), kept=("fedavg", "median"), margin=0.10)
    assert decision.best_worst == pytest.approx(0.70)
    assert decision.best_new_rule == "new-a"
    assert set(decision.rules_in) == {"fedavg", "median", "new-a", "new-b"}
    assert list(decision.rules_out) == ["new-c"] and decision.rules_out["new-c"] == pytest.approx(0.15)
    # X: worst of fedavg and new-b; Y: median and new-a (tied with Z); Z: new-a and new-c (a dropped rule counts too)
    assert decision.attacks_in["X"] == ["fedavg", "new-b"]
    assert decision.attacks_in["Y"] == ["median", "new-a"]
    assert decision.attacks_in["Z"] == ["new-a", "new-c"]
    assert "none" in decision.attacks_in
    # the backdoor is no rule's worst case here, and enters as the protocol's one backdoor
    assert decision.attacks_in["backdoor"] == ["(one backdoor, scored by its success rate)"]
    empty = MetricTable("v", True, {}, {}, {}, {}, pd.DataFrame(), [], [])
    with pytest.raises(LeaderboardError, match="no worst case"):
        screen_decision(empty)


# ------------------------------------------------------------------ ranks, Friedman, Wilcoxon-Holm


def test_ranks_with_ties():
    values = pd.DataFrame([[0.8, 0.9, 0.8, 0.7], [0.5, 0.5, 0.5, 0.5]], columns=list("ABCD"))
    ranks = stats.rank_rows(values)
    assert ranks.iloc[0].tolist() == [2.5, 1.0, 2.5, 4.0]  # 1 = best; the two 0.8 share (2 + 3) / 2
    assert ranks.iloc[1].tolist() == [2.5] * 4
    assert stats.rank_rows(values, higher_is_better=False).iloc[0].tolist() == [2.5, 4.0, 2.5, 1.0]


FRIEDMAN_TABLE = pd.DataFrame({"A": [0.90, 0.85, 0.70, 0.90], "B": [0.80, 0.80, 0.75, 0.80], "C": [0.70, 0.60, 0.50, 0.85]})


def test_friedman_by_hand():
    # ranks per block (1 = best): A 1,1,2,1 -> 5; B 2,2,1,3 -> 8; C 3,3,3,2 -> 11; n = 4 blocks, k = 3 rules
    # chi2 = 12 / (n k (k + 1)) * sum(R^2) - 3 n (k + 1) = 12 / 48 * (25 + 64 + 121) - 48 = 4.5
    # p = chi2(df = 2).sf(4.5) = exp(-4.5 / 2)
    assert stats.rank_rows(FRIEDMAN_TABLE).sum().tolist() == [5.0, 8.0, 11.0]
    f = stats.friedman(FRIEDMAN_TABLE)
    assert f.statistic == pytest.approx(4.5) and f.pvalue == pytest.approx(math.exp(-2.25))
    assert (f.blocks, f.rules) == (4, 3)
    assert math.isnan(stats.friedman(FRIEDMAN_TABLE[["A", "B"]]).pvalue)  # two rules: no Friedman test


def test_holm_by_hand():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept monotone: 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert stats.holm([]) == []


def test_wilcoxon_holm_and_the_diagrams_bars():
    def table(blocks: int) -> pd.DataFrame:
        base = np.linspace(0.6, 0.9, blocks)
        # A beats B and B beats C in every block, by differences of distinct sizes
        return pd.DataFrame({"A": base + 0.05 + 0.001 * np.arange(blocks), "B": base,
                             "C": base - 0.03 - 0.002 * np.arange(blocks)})

    # 6 blocks, all one way: exact two-sided p = 2 / 2^6 = 0.03125 per pair; Holm over 3 pairs: 0.09375
    six = stats.wilcoxon_holm(table(6))
    assert six["pvalue"].tolist() == pytest.approx([0.03125] * 3)
    assert six["p_holm"].tolist() == pytest.approx([0.09375] * 3) and not six["significant"].any()
    ranks6 = stats.rank_rows(table(6)).mean()
    assert stats.cliques(ranks6, six) == [["A", "B", "C"]]
    # 8 blocks: p = 2 / 256 = 0.0078125, x 3 = 0.0234 < 0.05: every pair separated, no bar
    eight = stats.wilcoxon_holm(table(8))
    assert eight["p_holm"].tolist() == pytest.approx([3 * 2 / 256] * 3) and eight["significant"].all()
    assert stats.cliques(stats.rank_rows(table(8)).mean(), eight) == []
    # scipy's own value for one pair, for the record
    t = table(8)
    assert eight["pvalue"].iloc[0] == pytest.approx(sps.wilcoxon(t["A"], t["B"]).pvalue)
    # equal in every block: nothing to test, p = 1
    assert stats.wilcoxon_holm(pd.DataFrame({"A": [0.5, 0.6], "B": [0.5, 0.6]}))["pvalue"].tolist() == [1.0]


def test_cliques_by_hand():
    ranks = pd.Series({"A": 1.2, "B": 1.9, "C": 2.9, "D": 4.0})
    pairs = pd.DataFrame([{"a": a, "b": b, "significant": frozenset((a, b)) in {frozenset("AC"), frozenset("AD"), frozenset("BD")}}
                          for a, b in [("A", "B"), ("A", "C"), ("A", "D"), ("B", "C"), ("B", "D"), ("C", "D")]])
    assert stats.cliques(ranks, pairs) == [["A", "B"], ["B", "C"], ["C", "D"]]


def test_rank_analysis_leaves_out_a_rare_rule_and_a_one_rule_block():
    rows = []
    for attack, values in (("x", {"A": 0.9, "B": 0.8, "C": 0.7}), ("y", {"A": 0.6, "B": 0.8, "C": 0.7}),
                           ("z", {"A": 0.9, "B": 0.7, "C": 0.7, "D": 0.95}), ("aimed-at-A", {"A": 0.3})):
        for rule, value in values.items():
            for seed in (1, 2):  # a block's value is the mean over its seeds
                rows.append({"condition": "c", "attack_label": attack, "rule": rule, "seed": seed,
                             "v": value + (0.01 if seed == 1 else -0.01)})
    analysis = rank_analysis(pd.DataFrame(rows), "v", ["condition", "attack_label"])
    assert analysis.dropped == ["D"]  # in 1 of 4 blocks
    assert analysis.dropped_blocks == ["c / aimed-at-A"]  # B and C were not run there
    # ranks: x A1 B2 C3, y B1 C2 A3, z A1 B2.5 C2.5 -> A 5/3, B 5.5/3, C 7.5/3
    assert analysis.mean_ranks.to_dict() == pytest.approx({"A": 5 / 3, "B": 5.5 / 3, "C": 7.5 / 3})
    assert (analysis.friedman.blocks, analysis.friedman.rules) == (3, 3)


# ------------------------------------------------------------------ the store's last-k mean


def test_last_k_mean_from_the_rounds():
    rounds = pd.DataFrame({"cell": ["c"] * 5 + ["d"] * 2, "round": [3, 1, 2, 5, 4, 1, 2],
                           "balanced_accuracy": [0.7, 0.5, 0.6, 0.9, 0.8, 0.4, 0.6]})
    assert last_k_mean(rounds, "balanced_accuracy", 3).to_dict() == pytest.approx({"c": 0.8, "d": 0.5})
    assert last_k_mean(rounds, "balanced_accuracy", 1).to_dict() == pytest.approx({"c": 0.9, "d": 0.6})


# ------------------------------------------------------------------ the report from grid folders

SEEDS = (1, 2, 3, 4, 5)
# final balanced accuracy per rule and attack, one value per seed. hta and median differ by less
# than the seeds' spread (their differences change sign from seed to seed): a tie. fedavg falls
# under sign-flip on every seed.
VALUES = {
    ("fedavg", "none"): [0.86, 0.84, 0.88, 0.85, 0.87],
    ("fedavg", "sign-flip"): [0.50, 0.505, 0.50, 0.51, 0.50],  # at chance level (balanced accuracy 1/2)
    ("fedavg", "label-flip"): [0.80, 0.78, 0.82, 0.79, 0.81],
    ("hta", "none"): [0.85, 0.83, 0.87, 0.84, 0.86],
    ("hta", "sign-flip"): [0.80, 0.70, 0.78, 0.72, 0.79],
    ("hta", "label-flip"): [0.76, 0.74, 0.81, 0.75, 0.80],
    ("median", "none"): [0.84, 0.82, 0.86, 0.83, 0.85],
    ("median", "sign-flip"): [0.78, 0.73, 0.77, 0.74, 0.78],
    ("median", "label-flip"): [0.77, 0.72, 0.80, 0.77, 0.79],
}


def write_grid(folder, cells, name="lb", end_seconds=60.0, config=None):
    """A grid folder as `hospitrust bench` writes it: grid.json, bench.jsonl, cells/<cell>/{config,rounds,summary};
    ``config(strategy, attack, seed)`` gives more run-config keys of a cell."""
    (folder / "cells").mkdir(parents=True)
    meta_cells = []
    for (strategy, attack), values in cells.items():
        for seed, value in zip(SEEDS, values):
            cell = f"strategy={strategy}__attack={attack}__seed={seed}"
            meta_cells.append({"cell": cell, "axes": {"strategy": strategy, "attack": attack, "seed": seed}, "hospitals": 4})
            run = folder / "cells" / cell
            run.mkdir()
            (run / "config.json").write_text(json.dumps({
                "strategy": strategy, "attack": attack, "seed": seed, "dataset": "pneumoniamnist",
                "malicious-fraction": 0.0 if attack == "none" else 0.25, "num-server-rounds": 3,
                "class-names": ["normal", "pneumonia"], "hospitals": {str(i): f"hospital-{i}" for i in range(4)},
                **(config(strategy, attack, seed) if config else {})}))
            lines = []
            for rnd, v in ((1, value - 0.1), (2, value - 0.05), (3, value)):
                central = {"balanced_accuracy": v, "accuracy": v, "auc": 0.9, "macro_f1": v, "worst_class_recall": 0.5,
                           "rare_class_macro_f1": v - 0.1}
                lines.append(json.dumps({"round": rnd, "central": central, "clients": [], "round_seconds": 1.0,
                                         "timing": {"train_pushed_at": float(rnd - 1), "finished_at": float(rnd)}}))
            (run / "rounds.jsonl").write_text("\n".join(lines) + "\n")
            fpr = 0.0 if strategy == "fedavg" else 0.05 * seed
            (run / "summary.json").write_text(json.dumps({
                "final": json.loads(lines[-1])["central"], "wall_seconds": 3.0, "best_round": 3,
                "security": {"tpr": 0.0 if strategy == "fedavg" else 1.0, "fpr": fpr}}))
    (folder / "grid.json").write_text(json.dumps({"name": name, "metric": "balanced_accuracy", "baseline": "fedavg",
                                                  "axes": {"strategy": [], "attack": [], "seed": list(SEEDS)},
                                                  "cells": meta_cells}))
    (folder / "bench.jsonl").write_text(json.dumps({"event": "end", "wall_seconds": end_seconds}) + "\n")
    return folder


def test_the_ranking_calls_the_close_pair_a_tie(tmp_path):
    board = load([write_grid(tmp_path / "g", VALUES)])
    frame = board.cells
    assert set(frame["condition"]) == {"dataset=pneumoniamnist"} and len(frame) == 45
    table = metric_table(frame, "final_balanced_accuracy")
    # per-seed worst over the attacked cells: hta min(sign-flip, label-flip) = 0.76, 0.70, 0.78, 0.72, 0.79
    hta = table.per_seed_worst[table.per_seed_worst["rule"] == "hta"]
    assert hta["worst"].tolist() == pytest.approx([0.76, 0.70, 0.78, 0.72, 0.79])
    assert table.worst["hta"].mean == pytest.approx(0.75)
    # median: 0.77, 0.72, 0.77, 0.74, 0.78 -> 0.756; hta - median per seed: -0.01, -0.02, 0.01, -0.02, 0.01
    assert table.worst["median"].mean == pytest.approx(0.756)
    ranking = worst_case_ranking(table, "fedavg").set_index("rule")
    assert ranking.loc["median", "verdict"] == "best" and ranking.loc["hta", "verdict"] == "tie with best"
    assert ranking.loc["hta", "rank"] == ranking.loc["median", "rank"] == "1 (tie)"
    assert ranking.loc["fedavg", "verdict"] == "below best" and ranking.loc["fedavg", "rank"] == "3"
    assert ranking.loc["hta", "minus fedavg"].low > 0


def test_the_leaderboard_renders_from_two_grid_parts(tmp_path, capsys):
    # two parts of one leaderboard: fedavg and hta in one grid, median in another
    first = write_grid(tmp_path / "part1", {k: v for k, v in VALUES.items() if k[0] != "median"}, name="lb-part1")
    second = write_grid(tmp_path / "part2", {k: v for k, v in VALUES.items() if k[0] == "median"}, name="lb-part2",
                        end_seconds=30.0)
    out = tmp_path / "board"
    assert main(["report", "--leaderboard", str(first), str(second), "--out", str(out), "--resamples", "2000"]) == 0
    printed = capsys.readouterr().out
    assert "[leaderboard]" in printed and str(out / "leaderboard.md") in printed
    md = (out / "leaderboard.md").read_text()
    assert "| 1 (tie) | median |" in md and "| 1 (tie) | hta |" in md and "tie with best" in md
    assert "| 3 | fedavg | 0.503 [0.500, 0.507] (chance) |" in md and "below best" in md
    assert "within 0.01 of chance level (0.5)" in md
    # under sign-flip, hta minus median (the best there) seed by seed: +0.02 -0.03 +0.01 -0.02 +0.01 -> -0.002, a tie
    assert re.search(r"\| hta \| [^\n]*\| -0\.002 \[-0\.\d+, 0\.\d+\] tie \|", md)
    assert "lb-part1" in md and "lb-part2" in md and "1.0 min" in md and "0.5 min" in md
    assert "Friedman chi-square" in md and "Wilcoxon-Holm" in md
    assert "Mean balanced accuracy of the last 3 rounds" in md and "Rare-class macro-F1" in md
    assert "Detection false-positive rate" in md
    for png in ("cd_all_conditions.png", "cd_0_dataset_pneumoniamnist.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({png})" in md
    summary = pd.read_csv(out / "leaderboard_summary.csv").set_index("rule")
    assert summary.loc["hta", "verdict"] == "tie with best" and summary.loc["hta", "worst_case"] == pytest.approx(0.75)
    assert summary.loc["median", "rank"] == "1 (tie)" and summary.loc["fedavg", "rank"] == "3"
    cells = pd.read_csv(out / "leaderboard_cells.csv")
    assert len(cells) == 45 and set(cells["grid"]) == {"lb-part1", "lb-part2"}
    # the same cells twice: refused, naming both folders
    assert main(["report", "--leaderboard", str(first), str(first / ".." / "part1"), "--out", str(out)]) == 2
    assert "share a (condition, rule, attack, seed)" in capsys.readouterr().err


def test_an_option_one_part_keeps_constant_and_another_varies_is_filled_in(tmp_path):
    # part 1 runs every cell at train-subsample 0.25 (its store drops the constant column); part 2 runs the
    # median at 0.25 on seeds 1-3 and 0.5 on seeds 4-5: part 1's cells belong with the median's 0.25 cells
    first = write_grid(tmp_path / "part1", {k: v for k, v in VALUES.items() if k[0] != "median"}, name="lb-part1",
                       config=lambda strategy, attack, seed: {"train-subsample": 0.25})
    second = write_grid(tmp_path / "part2", {k: v for k, v in VALUES.items() if k[0] == "median"}, name="lb-part2",
                        config=lambda strategy, attack, seed: {"train-subsample": 0.25 if seed <= 3 else 0.5})
    cells = load([first, second]).cells
    assert cells["train-subsample"].notna().all()
    by_condition = cells.groupby("condition")["cell"].count().to_dict()
    assert by_condition == {"dataset=pneumoniamnist, train-subsample=0.25": 30 + 9,
                            "dataset=pneumoniamnist, train-subsample=0.5": 6}, by_condition
    # two parts that each keep it constant, at different values: two conditions, not one pool
    third = write_grid(tmp_path / "part3", {k: v for k, v in VALUES.items() if k[0] == "median"}, name="lb-part3",
                       config=lambda strategy, attack, seed: {"train-subsample": 1.0})
    cells = load([first, third]).cells
    by_condition = cells.groupby("condition")["cell"].count().to_dict()
    assert by_condition == {"dataset=pneumoniamnist, train-subsample=0.25": 30,
                            "dataset=pneumoniamnist, train-subsample=1": 15}, by_condition
    # an option only one part sets is left out, as before (no column of NaNs)
    fourth = write_grid(tmp_path / "part4", {k: v for k, v in VALUES.items() if k[0] == "median"}, name="lb-part4")
    assert "train-subsample" not in load([first, fourth]).cells

def test_a_threat_model_without_an_attack_ranks_without_it(tmp_path, capsys):
    # without sign-flip every worst case is the label flip's: fedavg 0.800, hta 0.772, median 0.770 (means of the rows above)
    grid = write_grid(tmp_path / "g", VALUES)
    out = tmp_path / "board"
    assert main(["report", "--leaderboard", str(grid), "--out", str(out), "--resamples", "2000",
                 "--without-attacks", "sign-flip"]) == 0
    md = (out / "leaderboard.md").read_text()
    assert "attacks left out (a threat model without them): sign-flip" in md
    assert "| 1 | fedavg | 0.800 [" in md and "sign-flip" not in md.split("## Across conditions")[1]
    summary = pd.read_csv(out / "leaderboard_summary.csv").set_index("rule")
    assert summary.loc["hta", "worst_case"] == pytest.approx(0.772) and summary.loc["median", "worst_case"] == pytest.approx(0.770)
    assert main(["report", "--leaderboard", str(grid), "--out", str(out), "--without-attacks", "sing-flip"]) == 2
    err = capsys.readouterr().err
    assert "--without-attacks sing-flip: no such attack" in err and "label-flip, sign-flip" in err


def test_folders_without_results_are_refused_clearly(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LeaderboardError, match="no cells"):
        make_leaderboard([empty], tmp_path / "out")
    assert main(["report", "--leaderboard", str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err
    pending = write_grid(tmp_path / "pending", {("fedavg", "none"): VALUES[("fedavg", "none")]})
    for cell in (pending / "cells").iterdir():
        (cell / "summary.json").unlink()
    assert main(["report", "--leaderboard", str(pending)]) == 2
    assert "none of its 5 cells has finished" in capsys.readouterr().err
    (pending / "cells" / "strategy=fedavg__attack=none__seed=1" / "summary.json").write_text(json.dumps({"final": {
        "balanced_accuracy": 0.8}}))
    assert main(["report", "--leaderboard", str(pending), "--out", str(tmp_path / "partial")]) == 0  # one cell done
    assert "grid lb has not finished (1 of 5 cells)" in (tmp_path / "partial" / "leaderboard.md").read_text()
    assert main(["report", str(pending), str(empty)]) == 2  # several folders: only as one leaderboard
    assert "--leaderboard" in capsys.readouterr().err
    assert main(["report", "--leaderboard", str(pending), str(empty)]) == 2  # several: --out needed
    assert "--out" in capsys.readouterr().err
    assert main(["report", "--leaderboard", str(pending), "--resamples", "10"]) == 2
    assert "at least 100 bootstrap resamples" in capsys.readouterr().err
    assert main(["report", "--leaderboard", str(pending), "--last-k", "0"]) == 2
    assert "last-k = 0" in capsys.readouterr().err


def _cell(folder, name, config, value, axes):
    run = folder / "cells" / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"class-names": ["a", "b", "c"], **config}))
    central = {"balanced_accuracy": value, "accuracy": value}
    (run / "rounds.jsonl").write_text(json.dumps({"round": 1, "central": central, "clients": []}) + "\n")
    (run / "summary.json").write_text(json.dumps({"final": central, "wall_seconds": 1.0}))
    return {"cell": name, "axes": axes, "hospitals": 10}


def test_the_roles_of_a_cells_columns(tmp_path):
    # a `condition` table axis names the conditions; an HTA option with two values makes two rules;
    # the attacker fraction varies within condition "b" only, so only there the attack says "@0.2" / "@0.3"
    meta = []
    for cond, dataset, fractions in (("a", "pneumoniamnist", (0.3,)), ("b", "retinamnist", (0.2, 0.3))):
        for strategy, mads in (("fedavg", None), ("hta", 1.0), ("hta", 2.0)):
            for attack, fraction in [("none", 0.0)] + [("sign-flip", f) for f in fractions]:
                for seed in (1, 2):
                    config = {"strategy": strategy, "attack": attack, "seed": seed, "dataset": dataset,
                              "malicious-fraction": fraction, "partitioner": "dirichlet"}
                    if mads is not None:
                        config["hta.exclusion-mads"] = mads
                    axes = {"condition": cond, "strategy": strategy, "attack": attack, "seed": seed}
                    name = f"c={cond}__s={strategy}{mads}__a={attack}{fraction}__seed={seed}"
                    meta.append(_cell(tmp_path / "g", name, config, 0.5 + 0.1 * seed, axes))
    (tmp_path / "g" / "grid.json").write_text(json.dumps({"name": "roles", "cells": meta}))
    cells = load([tmp_path / "g"]).cells
    assert sorted(cells["condition"].unique()) == ["a", "b"]
    assert sorted(cells["rule"].unique()) == ["fedavg", "hta (hta.exclusion-mads=1)", "hta (hta.exclusion-mads=2)"]
    assert sorted(cells.loc[cells["condition"] == "a", "attack_label"].unique()) == ["none", "sign-flip"]
    assert sorted(cells.loc[cells["condition"] == "b", "attack_label"].unique()) == ["none", "sign-flip @0.2", "sign-flip @0.3"]
    assert cells["chance"].unique().tolist() == pytest.approx([1 / 3])  # three class names: balanced accuracy 1/3
    # without the axis, the condition is what differs between the cells (the dataset here)
    for cell in meta:
        cell["axes"].pop("condition")
    (tmp_path / "g" / "grid.json").write_text(json.dumps({"name": "roles", "cells": meta}))
    assert sorted(load([tmp_path / "g"]).cells["condition"].unique()) == ["dataset=pneumoniamnist", "dataset=retinamnist"]


def test_an_attacks_option_names_it_only_where_it_varies_within_a_condition_and_is_not_its_default(tmp_path):
    # label-flip's source is 1 in condition "a" and 4 in "b": one attack in each, plain "label-flip";
    # IPM's copy noise is the default 0 for two rules and 1 for a third in "a": "ipm" and "ipm (ipm.copy-noise=1)"
    meta = []
    for cond, source in (("a", 1), ("b", 4)):
        for seed in (1, 2):
            for strategy in ("fedavg", "median"):
                config = {"strategy": strategy, "attack": "label-flip", "seed": seed, "label-flip.source": source,
                          "label-flip.target": 0, "malicious-fraction": 0.3}
                axes = {"condition": cond, "strategy": strategy, "attack": "label-flip", "seed": seed}
                meta.append(_cell(tmp_path / "g", f"{cond}-{strategy}-lf-{seed}", config, 0.6, axes))
            if cond == "a":
                for strategy, noise in (("fedavg", 0.0), ("median", 0.0), ("foolsgold", 0.0), ("foolsgold", 1.0)):
                    config = {"strategy": strategy, "attack": "ipm", "seed": seed, "ipm.copy-noise": noise,
                              "ipm.eps": 0.5, "malicious-fraction": 0.3}
                    axes = {"condition": cond, "strategy": strategy, "attack": "ipm", "seed": seed}
                    meta.append(_cell(tmp_path / "g", f"{cond}-{strategy}-ipm{noise}-{seed}", config, 0.6, axes))
    (tmp_path / "g" / "grid.json").write_text(json.dumps({"name": "labels", "cells": meta}))
    cells = load([tmp_path / "g"]).cells
    assert set(cells.loc[cells["condition"] == "b", "attack_label"]) == {"label-flip"}
    a = cells[cells["condition"] == "a"]
    assert set(a["attack_label"]) == {"label-flip", "ipm", "ipm (ipm.copy-noise=1)"}
    assert set(a.loc[a["attack_label"] == "ipm", "rule"]) == {"fedavg", "median", "foolsgold"}


def test_a_rule_axis_names_the_rules_and_a_pre_aggregation_is_always_shown(tmp_path):
    meta = []
    for label, strategy, pre in (("plain-hta", "hta", "none"), (None, "median", "nnm"), (None, "fedavg", "none")):
        for seed in (1, 2):
            config = {"strategy": strategy, "attack": "none", "seed": seed, "dataset": "pneumoniamnist", "pre-aggregation": pre}
            axes = {"strategy": strategy, "seed": seed, **({"rule": label} if label else {})}
            meta.append(_cell(tmp_path / "g", f"{strategy}-{pre}-{seed}", config, 0.7, axes))
    (tmp_path / "g" / "grid.json").write_text(json.dumps({"name": "rules", "cells": meta}))
    assert sorted(load([tmp_path / "g"]).cells["rule"].unique()) == ["fedavg", "median (pre-aggregation=nnm)", "plain-hta"]


# ------------------------------------------------------------------ the grid files

LEADERBOARD_GRIDS = Path(__file__).resolve().parents[1] / "benchmarks" / "leaderboard"


def test_every_leaderboard_grid_parses_and_its_header_states_its_budget_and_wall_time():
    files = sorted(LEADERBOARD_GRIDS.rglob("*.toml"))  # v1's parts, and v2's in v2/
    assert len(files) >= 10, files
    for path in files:
        grid = parse_grid(path)
        header = path.read_text().split("[grid]", 1)[0]
        name = path.relative_to(LEADERBOARD_GRIDS).as_posix()
        assert re.search(r"[Bb]udget", header) and "Measured" in header and re.search(r"\d+(\.\d+)? min", header), name
        assert f"hospitrust bench benchmarks/leaderboard/{name}" in header, name  # the command that runs it
        assert grid.cells, path.name


def test_the_screen_parts_are_split_by_attack_and_each_holds_every_rule():
    parts = [parse_grid(LEADERBOARD_GRIDS / f"pneumonia-screen-{p}.toml") for p in "ab"]
    names = [{c.name for c in g.cells} for g in parts]
    assert not names[0] & names[1] and len(names[0]) == 140 and len(names[1]) == 124
    rules = [{c.axes["strategy"] for c in g.cells} for g in parts]
    assert rules[0] == rules[1] and len(rules[0]) == 28 and set(KEPT_RULES) <= rules[0]
    attacks = [{c.axes["attack"] for c in g.cells} for g in parts]
    assert not attacks[0] & attacks[1]


def test_the_v2_statistics_section_by_hand(tmp_path):
    """``--statistics v2`` adds the v2 protocol's section: per-seed worst cases, Friedman over (condition, seed)
    blocks, rank ranges. With 5 seeds the exact sign-flip test's smallest p is 2 / 32 = 0.0625: no pair can be
    separated at 0.05, so every rule's place is the whole range 1-3 (the v1 page calls fedavg third)."""
    grid = write_grid(tmp_path / "g", VALUES)
    out = tmp_path / "board"
    assert main(["report", "--leaderboard", str(grid), "--out", str(out), "--resamples", "200",
                 "--statistics", "v2"]) == 0
    md = (out / "leaderboard.md").read_text()
    assert "## v2 statistics: per-seed worst cases" in md and "### Across conditions: 5 (condition, seed) blocks" in md
    # per-seed worst cases: median 0.77 0.72 0.77 0.74 0.78, hta 0.76 0.70 0.78 0.72 0.79, fedavg 0.50 0.505 0.50 0.51
    # 0.50: rank sums 7, 8, 15 over 5 blocks: chi2 = 12 / (5 x 3 x 4) x (49 + 64 + 225) - 3 x 5 x 4 = 7.6, p = e^-3.8
    assert "Friedman chi-square = 7.60, p = 0.0224 over 5 blocks and 3 rules" in md
    # median's t interval: mean 0.756, s = sqrt(0.00252 / 4) = 0.02510, t(4) = 2.776: half width 0.0312
    assert "| 1-3 | median | 0.756 [0.725, 0.787] | 1.40 |" in md
    assert "| 1-3 | hta |" in md and "| 1-3 | fedavg |" in md
    assert "Pairs separated by the Holm-corrected sign-flip tests at 0.05: none." in md
    default = tmp_path / "v1"
    assert main(["report", "--leaderboard", str(grid), "--out", str(default), "--resamples", "200"]) == 0
    assert "v2 statistics" not in (default / "leaderboard.md").read_text()


def test_the_v2_ranked_parts_are_the_generators_output_and_every_rule_meets_the_same_rule_agnostic_attacks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("v2_parts", LEADERBOARD_GRIDS / "v2" / "parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    assert parts.main(["--check"]) == 0  # committed parts == generated
    agnostic = {label for label, _ in parts.RULE_AGNOSTIC}
    seen: dict[str, set[str]] = {}
    for path in sorted((LEADERBOARD_GRIDS / "v2").glob("ranked-pneumonia-s*.toml")):
        for cell in parse_grid(path).cells:
            seen.setdefault(f"{cell.axes['seed']}/{cell.axes['strategy']}", set()).add(cell.axes["attack"])
    assert len(seen) == 10 * 13  # every evaluation seed x every ranked rule (12, and anchored trust: amendment 10)
    for key, attacks in seen.items():
        assert agnostic <= attacks, key  # the whole rule-agnostic suite, for every rule and seed
    assert {int(k.split("/")[0]) for k in seen} == set(parts.EVALUATION_SEEDS)
    assert not {int(k.split("/")[0]) for k in seen} & {1, 2, 3}  # no tuning seed is an evaluation seed
    # the threat-model and sweep parts: within a condition, every kept rule meets the same attacks. The parts of one
    # condition differ only in their seed (the generator writes them; --check above), so one seed's part is parsed
    for condition, (_, hospitals, _, attacks) in parts.CONDITIONS.items():
        files = sorted((LEADERBOARD_GRIDS / "v2").glob(f"condition-{condition}-s*.toml"))
        assert {int(f.stem.rsplit("-s", 1)[1]) for f in files} == set(parts.condition_seeds(condition)) <= set(parts.EVALUATION_SEEDS)
        met: dict[str, set[str]] = {}
        for cell in parse_grid(files[0]).cells:
            assert cell.hospitals == hospitals, files[0].name
            met.setdefault(cell.axes["strategy"], set()).add(cell.axes["attack"])
        assert set(met) == set(parts.CONDITION_RULES), condition
        assert all(got == {label for label, _ in attacks} for got in met.values()), condition

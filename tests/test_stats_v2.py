"""The leaderboard v2 statistics (issue 44, hospitrust/bench/stats.py) on hand-computed tables: the seed
as the unit of replication, paired t intervals, exact sign-flip tests with Holm's correction, Friedman
over (condition, seed) blocks, tied rules as rank ranges; and the t interval's coverage at n = 10 by a
seeded simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from hospitrust.bench import stats


def test_t_interval_by_hand():
    iv = stats.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = sqrt(2.5), t(4, 0.975) = 2.776445105: half width 2.776445105 * 1.58113883 / sqrt(5) = 1.963243
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.low == pytest.approx(3 - 1.9632432, abs=1e-6) and iv.high == pytest.approx(3 + 1.9632432, abs=1e-6)
    flat = stats.t_interval([0.5, 0.5, 0.5])  # equal values: the interval is the value
    assert flat.low == flat.mean == flat.high == 0.5
    one = stats.t_interval([0.5, float("nan")])
    assert one.mean == 0.5 and one.n == 1 and not one.has_ci
    assert stats.t_interval([]).n == 0


def test_the_t_interval_covers_95_percent_at_ten_seeds():
    """2000 samples of 10 normal values (seeded): the share of intervals holding the true mean is 0.95
    within three binomial standard deviations (sqrt(0.95 * 0.05 / 2000) = 0.0049)."""
    rng = np.random.default_rng(44)
    draws = rng.normal(0.7, 0.05, size=(2000, 10))
    hits = 0
    for row in draws:
        iv = stats.t_interval(row)
        hits += iv.low <= 0.7 <= iv.high
    assert abs(hits / 2000 - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / 2000)
    # the percentile bootstrap the v1 tables used, at 5 seeds, misses far more often (the 84 %)
    small = rng.normal(0.7, 0.05, size=(200, 5))
    boot = sum(stats.bootstrap_ci(row, resamples=1000).contains(0.7) for row in small) / 200
    assert boot < 0.90


def test_sign_flip_pvalue_by_hand():
    # +-1 +-2 +-3: sums 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 in 2 of 8 patterns
    assert stats.sign_flip_pvalue([1.0, 2.0, 3.0]) == pytest.approx(0.25)
    # five equal differences: only all-plus and all-minus reach |mean| 1: 2 / 32
    assert stats.sign_flip_pvalue([1.0] * 5) == pytest.approx(0.0625)
    # (2, -1): the four patterns' sums 1, 3, -3, -1 are all at least as far from 0 as the observed 1
    assert stats.sign_flip_pvalue([2.0, -1.0]) == pytest.approx(1.0)
    assert stats.sign_flip_pvalue([0.0, 0.0]) == 1.0 and math.isnan(stats.sign_flip_pvalue([]))
    # ten seeds all one way: the smallest p there is, 2 / 1024
    assert stats.sign_flip_pvalue(np.linspace(0.01, 0.1, 10)) == pytest.approx(2 / 1024)
    # one-sided (issue 60's family): sums >= 6 in 1 of 8; (2, -1): sums 3 and 1 reach the observed 1, -1 and -3 do not
    assert stats.sign_flip_pvalue([1.0, 2.0, 3.0], alternative="greater") == pytest.approx(0.125)
    assert stats.sign_flip_pvalue([2.0, -1.0], alternative="greater") == pytest.approx(0.5)
    assert stats.sign_flip_pvalue([-1.0, -2.0, -3.0], alternative="greater") == pytest.approx(1.0)
    assert stats.sign_flip_pvalue(np.linspace(0.01, 0.1, 10), alternative="greater") == pytest.approx(1 / 1024)
    with pytest.raises(ValueError, match="alternative must be"):
        stats.sign_flip_pvalue([1.0], alternative="less")


def test_sign_flip_matches_scipys_permutation_test_and_draws_beyond_sixteen_seeds():
    from scipy import stats as sps

    d = np.random.default_rng(3).normal(0.02, 0.05, size=12)
    theirs = sps.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                  n_resamples=np.inf, vectorized=True).pvalue
    assert stats.sign_flip_pvalue(d) == pytest.approx(theirs, rel=1e-12)  # float64
    # 20 differences of one sign: 2 of 2^20 patterns are as far; the drawn test says (b + 1) / (R + 1) with b about 0
    p = stats.sign_flip_pvalue(np.linspace(0.01, 0.2, 20))
    assert p == pytest.approx(1 / (stats.SIGN_FLIP_RESAMPLES + 1), abs=3 / stats.SIGN_FLIP_RESAMPLES)


def _seeds_table():
    """Ten seeds x three rules: A beats C on every seed by 0.10 +- 0.01; B sits between, its differences
    to A and C change sign (so no test separates B from either)."""
    seeds = range(1, 11)
    c = [0.60, 0.62, 0.58, 0.61, 0.59, 0.63, 0.60, 0.57, 0.62, 0.61]
    a = [x + 0.10 + (0.01 if i % 2 else -0.01) for i, x in enumerate(c)]
    b = [x + (0.15 if i % 2 else -0.05) for i, x in enumerate(c)]
    return pd.DataFrame({"A": a, "B": b, "C": c}, index=pd.Index(seeds, name="seed"))


def test_paired_tests_by_hand_with_holm():
    table = _seeds_table()
    pairs = stats.paired_tests(table).set_index(["a", "b"])
    ac = pairs.loc[("A", "C")]
    # A - C: 0.09, 0.11 alternating: mean 0.10, s = 0.0105409, t(9) = 2.262157: half width 0.0075406
    assert ac["n"] == 10 and ac["mean"] == pytest.approx(0.10)
    assert ac["low"] == pytest.approx(0.10 - 0.0075406, abs=1e-6) and ac["high"] == pytest.approx(0.10 + 0.0075406, abs=1e-6)
    assert ac["pvalue"] == pytest.approx(2 / 1024)
    # B - C alternates -0.05, 0.15 (mean 0.05): exactly those patterns with five or more +0.15... p by enumeration
    d = np.array([-0.05, 0.15] * 5)
    signs = np.array([[1 if (k >> i) & 1 else -1 for i in range(10)] for k in range(1024)])
    by_hand = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))
    assert pairs.loc[("B", "C"), "pvalue"] == pytest.approx(by_hand)
    # Holm: the three p-values sorted, times 3, 2, 1, made monotone
    p = pairs["pvalue"].to_numpy()
    order = np.argsort(p)
    expected = np.maximum.accumulate(np.minimum(1, p[order] * np.array([3, 2, 1])))
    np.testing.assert_allclose(pairs["p_holm"].to_numpy()[order], expected)
    assert list(pairs["significant"]) == [False, True, False]  # (A, B), (A, C), (B, C)


def test_tied_rules_get_rank_ranges_not_ordinal_ranks():
    table = _seeds_table()
    ranges = stats.rank_ranges(table, stats.paired_tests(table))
    # A is better than C (significant); B is separated from neither: A 1-2, B 1-3, C 2-3
    assert ranges["rank"].to_dict() == {"A": "1-2", "B": "1-3", "C": "2-3"}
    assert list(ranges.index) == ["A", "B", "C"]  # by mean: A 0.703, B 0.653, C 0.603
    # mean ranks: where B is low (C - 0.05) the order is A, C, B; where it is high (C + 0.15) B, A, C
    assert ranges["mean_rank"].to_dict() == pytest.approx({"A": 1.5, "B": 2.0, "C": 2.5})
    # every pair separated: one place each; lower is better flips the order
    sep = pd.DataFrame({"a": ["x", "x", "y"], "b": ["y", "z", "z"], "mean": [-1.0, -2.0, -1.0], "significant": True})
    vals = pd.DataFrame({"x": [1.0, 1.0], "y": [2.0, 2.0], "z": [3.0, 3.0]})
    assert stats.rank_ranges(vals, sep, higher_is_better=False)["rank"].to_dict() == {"x": "1", "y": "2", "z": "3"}


def test_friedman_blocks_are_condition_seed_pairs_of_per_seed_worst_cases():
    rows = []
    for cond in ("pneumonia", "blood"):
        for seed in (1, 2, 3):
            for attack, drop in (("none", 0.0), ("ipm", 0.2), ("alie", 0.1)):
                for rule, base in (("median", 0.8), ("mean", 0.7), ("krum", 0.6)):
                    hurt = drop * (2.0 if rule == "mean" and attack == "ipm" else 1.0)
                    rows.append({"condition": cond, "seed": seed, "attack": attack, "rule": rule,
                                 "value": base - hurt + 0.01 * seed})
    blocks = stats.worst_case_blocks(pd.DataFrame(rows))
    assert blocks.shape == (6, 3)  # 2 conditions x 3 seeds, not 18 (attack, seed) blocks
    assert list(blocks.index.names) == ["condition", "seed"]
    # worst case per seed: the ipm row (median 0.8 - 0.2, mean 0.7 - 0.4, krum 0.6 - 0.2), + 0.01 seed
    assert blocks.loc[("blood", 2)].to_dict() == pytest.approx({"krum": 0.42, "mean": 0.32, "median": 0.62})
    f = stats.friedman(blocks)
    # median first, krum second, mean third in all 6 blocks: chi2 = 12 / (6 * 3 * 4) * 6^2 * (1 + 4 + 9) - 3 * 6 * 4
    assert f.blocks == 6 and f.statistic == pytest.approx(12.0) and f.pvalue == pytest.approx(math.exp(-6.0))


def test_the_rank_ranges_pairwise_test_can_separate_thirteen_rules_over_ten_seeds():
    # amendment 11: the exact sign-flip test's smallest p over 10 seeds is 2 / 1024; Holm over the 78 pairs of 13 rules
    # needs 0.05 / 78 for its first step, so it could never separate a pair
    assert 2 / 2 ** 10 > 0.05 / math.comb(13, 2)
    rng = np.random.default_rng(0)
    base = rng.normal(0.7, 0.05, size=10)
    table = pd.DataFrame({f"r{i:02d}": base + 0.05 * i + rng.normal(0, 0.005, size=10) for i in range(13)})
    sign = stats.paired_tests(table)
    t = stats.paired_tests(table, test="t").set_index(["a", "b"])
    assert not sign["significant"].any()  # every pair 10 for 10 in one direction, and still none separated
    assert t["significant"].all()
    # the t-test's p-value is scipy's paired t-test of the same seeds
    d = (table["r00"] - table["r01"]).to_numpy()
    assert t.loc[("r00", "r01"), "pvalue"] == pytest.approx(sps.ttest_rel(table["r00"], table["r01"]).pvalue, rel=1e-9)  # float64
    assert stats.paired_t_pvalue(d) == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, rel=1e-12)  # float64
    assert stats.paired_t_pvalue([0.1, 0.1]) == 0.0 and stats.paired_t_pvalue([0.0, 0.0]) == 1.0
    assert math.isnan(stats.paired_t_pvalue([0.3]))
    with pytest.raises(ValueError, match="test = 'wilcoxon': expected one of sign-flip, t"):
        stats.paired_tests(table, test="wilcoxon")

"""The leaderboard's statistics: pure functions on small tables, tested on hand-computed ones.

Two sets: the v1 leaderboard's (below, kept for its superseded tables) and the v2 protocol's (at the
end of the module: Student's t intervals, exact sign-flip tests with Holm's correction, Friedman over
(condition, seed) blocks of per-seed worst cases, rank ranges for tied rules; docs/leaderboard.md,
"v2 protocol").

v1: every interval is a **percentile bootstrap 95 % CI of the mean over seeds**: ``RESAMPLES``
resamples of the seeds with replacement, drawn by ``numpy.random.default_rng(RNG_SEED)``, so a
report is reproducible to the digit (scipy.stats.bootstrap, ``method="percentile"``). With 5
seeds a percentile interval is narrow (it undercovers a little): it is a statement about these
seeds' spread, not a guarantee.

Rules are compared **paired by seed**: a seed fixes the partition, the malicious hospitals and
the initial model, so ``rule A - rule B`` is taken seed by seed and the interval is that of the
mean difference. Two rules whose difference interval contains 0 are a **tie** (:func:`call`).

The **worst case** of a rule is taken per seed (the minimum over attacks within one seed, the
maximum for a lower-is-better metric) and then summarised over seeds: the minimum of the
per-attack means would be a worst case no single run had.

Across (condition, attack) cells the rules are **ranked** (1 = best, ties share the average
rank), checked with **Friedman's test** (scipy.stats.friedmanchisquare: are the rules'
ranks different at all?) and compared pairwise with **Wilcoxon signed-rank tests, Holm-corrected**
(scipy.stats.wilcoxon; :func:`holm`). Wilcoxon-Holm rather than Nemenyi: Nemenyi's verdict on two
rules depends on the mean ranks of every other rule in the comparison, so adding or dropping a
third rule can change whether A and B differ (Benavoli, Corani and Mangili, JMLR 2016); the
Wilcoxon test reads only A's and B's paired values, uses the size of the differences and not
only their order, and Holm keeps the family-wise error at alpha without Bonferroni's loss of
power. The critical-difference diagram joins the rules that no corrected test separates
(:func:`cliques`), as in Demšar (2006) with the Wilcoxon-Holm post-hoc of Ismail Fawaz et al. (2019).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

# scipy.stats is imported by the functions that use it: 1.7 s that importing this module (a test collection, a CLI)
# need not pay

# 3 ms an interval. With 5 seeds the resample means lie on a coarse grid, so an interval's ends still
# move by up to 0.0044 between rng seeds (20 rng seeds, values 0.812 0.774 0.845 0.701 0.796):
# hence the fixed rng seed, which makes a report reproducible to the digit.
RESAMPLES = 10_000
LEVEL = 0.95
RNG_SEED = 0
ALPHA = 0.05  # the Friedman and Wilcoxon-Holm tests' level


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds with its bootstrap CI (``low``/``high`` NaN with fewer than 2 seeds)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def has_ci(self) -> bool:
        return self.low == self.low and self.high == self.high

    def contains(self, x: float) -> bool:
        return self.has_ci and self.low <= x <= self.high

    def text(self, digits: int = 3) -> str:
        if self.mean != self.mean:
            return "-"
        if not self.has_ci:
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} [{_end(self.low, digits)}, {_end(self.high, digits)}]"


def _end(x: float, digits: int) -> str:
    """An interval's end; one that rounds to 0 without being 0 gets two more digits (-0.00030, not -0.000:
    whether an interval contains 0 is what the reader looks for).
    """
    text = f"{x:.{digits}f}"
    return f"{x:.{digits + 2}f}" if x != 0 and float(text) == 0 else text


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = RNG_SEED) -> Interval:
    """The mean of ``values`` (NaNs dropped) and its percentile bootstrap CI.

    One value: no interval (NaN ends). Equal values: the interval is the value itself (every
    resample has that mean; scipy would warn of a degenerate distribution).
    """
    from scipy import stats as sps
    arr = np.asarray([v for v in values if v == v], dtype=float)
    if not len(arr):
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(arr.mean())
    if len(arr) < 2:
        return Interval(mean, math.nan, math.nan, 1)
    if np.all(arr == arr[0]):
        return Interval(mean, mean, mean, len(arr))
    res = sps.bootstrap((arr,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
                        vectorized=True, rng=np.random.default_rng(seed))
    return Interval(mean, float(res.confidence_interval.low), float(res.confidence_interval.high), len(arr))


def paired_differences(a: pd.Series, b: pd.Series) -> pd.Series:
    """``a - b`` seed by seed (both indexed by seed), over the seeds both have."""
    left, right = a.to_dict(), b.to_dict()  # plain dicts: this runs thousands of times per leaderboard
    common = sorted(set(left) & set(right))
    return pd.Series([float(left[k]) - float(right[k]) for k in common], index=common, dtype=float)


def paired_difference(a: pd.Series, b: pd.Series, **kw) -> Interval:
    """The mean of ``a - b`` paired by seed, with its bootstrap CI (``kw``: :func:`bootstrap_ci`'s)."""
    return bootstrap_ci(paired_differences(a, b).to_numpy(), **kw)


def call(diff: Interval) -> str:
    """``tie`` when the paired difference's CI contains 0, ``above`` / ``below`` when it lies on
    one side (the difference is ``A - B`` in the better direction), ``no call`` without a CI.
    """
    if not diff.has_ci:
        return "no call"
    if diff.contains(0.0):
        return "tie"
    return "above" if diff.low > 0 else "below"


def worst_case_per_seed(table: pd.DataFrame, *, value: str = "value", higher_is_better: bool = True,
                        rule: str = "rule", attack: str = "attack", seed: str = "seed") -> pd.DataFrame:
    """Per rule and seed, the worst value over the attacks (min, or max when lower is better).

    A rule's attacks are those it was run with on any seed (an attack aimed at one rule, run
    against that rule only, counts in its worst case alone); a (rule, seed) that lacks one of
    them is left out, since its worst case would be over fewer attacks than the rule's other
    seeds'. Columns: rule, seed, worst, worst_attack, attacks (how many).
    """
    table = table.dropna(subset=[value])
    attacks_of = {r: set(sub[attack]) for r, sub in table.groupby(rule)}
    rows = []
    for (r, s), sub in table.groupby([rule, seed], sort=True):
        if set(sub[attack]) != attacks_of[r]:
            continue
        per_attack = sub.groupby(attack)[value].mean()
        worst_attack = per_attack.idxmin() if higher_is_better else per_attack.idxmax()
        rows.append({rule: r, seed: s, "worst": float(per_attack[worst_attack]), "worst_attack": worst_attack,
                     "attacks": len(per_attack)})
    return pd.DataFrame(rows, columns=[rule, seed, "worst", "worst_attack", "attacks"])


def rank_rows(values: pd.DataFrame, *, higher_is_better: bool = True) -> pd.DataFrame:
    """Each row's values ranked across the columns: 1 = best, equal values share the average rank."""
    from scipy import stats as sps
    signed = -values.to_numpy(dtype=float) if higher_is_better else values.to_numpy(dtype=float)
    ranks = np.vstack([sps.rankdata(row, method="average") for row in signed]) if len(values) else signed
    return pd.DataFrame(ranks, index=values.index, columns=values.columns)


@dataclass(frozen=True)
class Friedman:
    statistic: float
    pvalue: float
    blocks: int
    rules: int
    note: str = ""


def friedman(values: pd.DataFrame) -> Friedman:
    """Friedman's test over a blocks x rules table (scipy.stats.friedmanchisquare): do the rules'
    ranks differ beyond chance? It needs at least 3 rules and 2 blocks; otherwise NaN and a note.
    """
    from scipy import stats as sps
    blocks, rules = values.shape
    if rules < 3 or blocks < 2:
        return Friedman(math.nan, math.nan, blocks, rules,
                        f"Friedman's test needs at least 3 rules and 2 blocks (here {rules} rule(s), {blocks} block(s))")
    if np.all(values.to_numpy() == values.to_numpy()[:, :1]):  # every block a full tie: no evidence either way
        return Friedman(0.0, 1.0, blocks, rules, "every block ties all rules")
    res = sps.friedmanchisquare(*[values[c].to_numpy(dtype=float) for c in values.columns])
    return Friedman(float(res.statistic), float(res.pvalue), blocks, rules)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values times (m - i + 1), made
    monotone and capped at 1. An adjusted p below alpha rejects with family-wise error alpha.
    """
    p = np.asarray(pvalues, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for i, idx in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[idx]))
        adjusted[idx] = running
    return adjusted.tolist()


def wilcoxon_holm(values: pd.DataFrame, *, alpha: float = ALPHA) -> pd.DataFrame:
    """Every pair of rules (columns) over the blocks (rows): the two-sided Wilcoxon signed-rank
    p-value of their paired values, Holm-adjusted over all pairs. Two rules equal in every block
    get p = 1 (no difference to test). Columns: a, b, pvalue, p_holm, significant.
    """
    from scipy import stats as sps
    rows = []
    for a, b in itertools.combinations(values.columns, 2):
        diff = values[a].to_numpy(dtype=float) - values[b].to_numpy(dtype=float)
        if np.all(diff == 0):
            p = 1.0
        else:
            p = float(sps.wilcoxon(values[a].to_numpy(dtype=float), values[b].to_numpy(dtype=float)).pvalue)
        rows.append({"a": a, "b": b, "pvalue": p})
    out = pd.DataFrame(rows, columns=["a", "b", "pvalue"])
    out["p_holm"] = holm(out["pvalue"].tolist()) if len(out) else []
    out["significant"] = out["p_holm"] < alpha
    return out


def cliques(mean_ranks: pd.Series, pairs: pd.DataFrame) -> list[list[str]]:
    """Groups of rules, consecutive in mean rank, that no corrected test separates (the bars of
    a critical-difference diagram): maximal runs in which every pair is not significant.
    """
    order = list(mean_ranks.sort_values().index)
    separated = {frozenset((r.a, r.b)) for r in pairs.itertuples() if r.significant}
    runs: list[tuple[int, int]] = []
    for i in range(len(order)):
        j = i
        while j + 1 < len(order) and all(frozenset((order[k], order[j + 1])) not in separated for k in range(i, j + 1)):
            j += 1
        if j > i and not any(s <= i and j <= e for s, e in runs):
            runs.append((i, j))
    return [order[s:e + 1] for s, e in runs]


# ---- the v2 protocol's statistics (docs/leaderboard.md, "v2 protocol") ---------------------------------
#
# The seed is the unit of replication: a rule's value on a seed is its worst case over the attacks on
# that seed (:func:`worst_case_per_seed`), and every statement is about those per-seed values. A mean
# over n seeds gets Student's t interval (a percentile bootstrap over 5 seeds covers about 84 %, not
# 95 %; the t interval's coverage is exact for normal values and checked by simulation at n = 10 in
# tests/test_stats_v2.py); two rules are compared paired by seed with the t interval of the mean
# difference and the exact sign-flip permutation test, Holm-corrected over all pairs; Friedman's test
# takes one block per (condition, seed), each block the rules' per-seed worst cases; rules no
# corrected test separates share a rank range (:func:`rank_ranges`), not ordinal ranks.


def t_interval(values: Sequence[float] | np.ndarray, *, level: float = LEVEL) -> Interval:
    r"""The mean of ``values`` (NaNs dropped) and its Student's t interval,
    :math:`\bar x \pm t_{n-1,\,(1+\text{level})/2}\; s / \sqrt n` (scipy.stats.t).

    One value: no interval (NaN ends). Equal values: the interval is the value itself.

    Parameters
    ----------
    values : sequence of float
        One value per seed.
    level : float
        The confidence level (0.95).

    Returns
    -------
    Interval
        The mean, the interval's ends and n.
    """
    from scipy import stats as sps
    arr = np.asarray([v for v in values if v == v], dtype=float)
    if not len(arr):
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(arr.mean())
    if len(arr) < 2:
        return Interval(mean, math.nan, math.nan, 1)
    if np.all(arr == arr[0]):
        return Interval(mean, mean, mean, len(arr))
    half = float(sps.t.ppf((1.0 + level) / 2.0, len(arr) - 1)) * float(arr.std(ddof=1)) / math.sqrt(len(arr))
    return Interval(mean, mean - half, mean + half, len(arr))


#: Up to this many paired differences the sign-flip test enumerates every pattern (2^16 = 65,536); beyond,
#: it draws SIGN_FLIP_RESAMPLES random patterns with a fixed rng, p = (b + 1) / (R + 1).
SIGN_FLIP_EXACT_MAX = 16
SIGN_FLIP_RESAMPLES = 100_000


def sign_flip_pvalue(differences: Sequence[float] | np.ndarray, alternative: str = "two-sided") -> float:
    """The two-sided paired permutation test of a mean difference of 0: the share of the 2^n sign
    patterns of the paired differences whose mean is at least as far from 0 as the observed one
    (``alternative = "greater"``: one-sided, the share whose mean is at least the observed one; its
    smallest value is 1 / 2^n).

    Under the null hypothesis (the two rules are exchangeable within a seed) each difference's sign
    is a fair coin. Up to ``SIGN_FLIP_EXACT_MAX`` differences every pattern is enumerated and the
    p-value is exact; the smallest it can be is 2 / 2^n (n = 10: 0.002). Beyond, ``SIGN_FLIP_RESAMPLES``
    random patterns from ``numpy.random.default_rng(RNG_SEED)`` (reproducible to the digit), and
    p = (b + 1) / (R + 1) with b of them at least as far (so p is never 0). "At least as far" allows
    a relative 1e-9 for rounding (patterns equal to the observed sum in exact arithmetic count). All
    differences 0: p = 1. scipy.stats.permutation_test computes the same, about 100x slower here.

    Parameters
    ----------
    differences : sequence of float
        ``a - b`` per seed (NaNs dropped).

    Returns
    -------
    float
        The p-value; NaN without a difference.
    """
    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    d = np.asarray([v for v in differences if v == v], dtype=float)
    if not len(d):
        return math.nan
    if np.all(d == 0):
        return 1.0
    n = len(d)
    side = np.abs if alternative == "two-sided" else (lambda v: v)
    observed = float(side(np.asarray(d.sum())))
    tolerance = 1e-9 * float(np.abs(d).sum())
    if n <= SIGN_FLIP_EXACT_MAX:
        bits = (np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1
        sums = side((1 - 2 * bits) @ d)
        return float(np.mean(sums >= observed - tolerance))
    rng = np.random.default_rng(RNG_SEED)
    hits = 0
    for start in range(0, SIGN_FLIP_RESAMPLES, 10_000):
        signs = rng.integers(0, 2, size=(min(10_000, SIGN_FLIP_RESAMPLES - start), n)) * 2 - 1
        hits += int(np.sum(side(signs @ d) >= observed - tolerance))
    return (hits + 1) / (SIGN_FLIP_RESAMPLES + 1)


def paired_t_pvalue(differences: Sequence[float] | np.ndarray) -> float:
    """The two-sided one-sample t-test of a mean paired difference of 0 (the paired t-test, n - 1 degrees of
    freedom; scipy.stats.ttest_1samp). Differences without spread: 0 when they are not 0 (the t statistic is
    infinite), 1 when they are all 0; NaN with fewer than 2 differences.
    """
    from scipy import stats as sps
    d = np.asarray([v for v in differences if v == v], dtype=float)
    if len(d) < 2:
        return math.nan
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(sps.ttest_1samp(d, 0.0).pvalue)


#: the pairwise tests :func:`paired_tests` can use
PAIRED_TESTS = ("sign-flip", "t")


def paired_tests(values: pd.DataFrame, *, level: float = LEVEL, alpha: float = ALPHA,
                 test: str = "sign-flip") -> pd.DataFrame:
    """Every pair of rules (columns) over the seeds (rows, paired): the mean difference ``a - b`` with its
    t interval, the p-value of ``test`` (the exact sign-flip test, :func:`sign_flip_pvalue`, or the paired
    t-test, :func:`paired_t_pvalue`), Holm-adjusted over all pairs.

    The exact sign-flip test cannot go below 2 / 2^n: with n = 10 seeds that is 0.00195, and Holm over the
    78 pairs of 13 rules needs 0.05 / 78 = 0.00064 for its first step, so it separates no pair whatever the
    data. The paired t-test has no such floor (docs/leaderboard.md, amendment 11).

    Parameters
    ----------
    values : pandas.DataFrame
        Seeds x rules (a rule's per-seed worst case); a seed missing for either rule of a pair is
        left out of that pair.
    level : float
        The intervals' level.
    alpha : float
        The family-wise error of the Holm-corrected tests.
    test : str
        "sign-flip" or "t".

    Returns
    -------
    pandas.DataFrame
        Columns a, b, n, mean, low, high, pvalue, p_holm, significant.
    """
    if test not in PAIRED_TESTS:
        raise ValueError(f"test = {test!r}: expected one of {', '.join(PAIRED_TESTS)}")
    pvalue = sign_flip_pvalue if test == "sign-flip" else paired_t_pvalue
    rows = []
    for a, b in itertools.combinations(values.columns, 2):
        pair = values[[a, b]].dropna()
        d = (pair[a] - pair[b]).to_numpy(dtype=float)
        iv = t_interval(d, level=level)
        rows.append({"a": a, "b": b, "n": len(d), "mean": iv.mean, "low": iv.low, "high": iv.high, "pvalue": pvalue(d)})
    out = pd.DataFrame(rows, columns=["a", "b", "n", "mean", "low", "high", "pvalue"])
    out["p_holm"] = holm(out["pvalue"].fillna(1.0).tolist()) if len(out) else []
    out["significant"] = out["p_holm"] < alpha
    return out


def worst_case_blocks(table: pd.DataFrame, *, value: str = "value", higher_is_better: bool = True,
                      condition: str = "condition", rule: str = "rule", attack: str = "attack",
                      seed: str = "seed") -> pd.DataFrame:
    """Friedman's blocks: one row per (condition, seed), one column per rule, each value the rule's worst
    case over the attacks on that seed in that condition (:func:`worst_case_per_seed`).

    A block is one replicate: the attacks of a seed are not blocks of their own (they share the
    seed's partition and initial model). Blocks where a rule has no worst case are dropped (Friedman
    needs every rule in every block).

    Parameters
    ----------
    table : pandas.DataFrame
        One row per run: condition, rule, attack, seed and the value.
    value, condition, rule, attack, seed : str
        The column names.
    higher_is_better : bool
        The metric's direction.

    Returns
    -------
    pandas.DataFrame
        Indexed by (condition, seed), columns the rules.
    """
    parts = []
    for cond, sub in table.groupby(condition, sort=True):
        per_seed = worst_case_per_seed(sub, value=value, higher_is_better=higher_is_better, rule=rule, attack=attack,
                                       seed=seed)
        wide = per_seed.pivot(index=seed, columns=rule, values="worst")
        wide.index = pd.MultiIndex.from_product([[cond], wide.index], names=[condition, seed])
        parts.append(wide)
    if not parts:
        return pd.DataFrame()
    blocks = pd.concat(parts).sort_index()
    blocks.columns.name = None
    return blocks.dropna()


def rank_ranges(values: pd.DataFrame, pairs: pd.DataFrame, *, higher_is_better: bool = True) -> pd.DataFrame:
    """Each rule's place among the rules as a range the tests support, not an ordinal rank.

    A rule's best place is 1 + the number of rules significantly better than it, its worst place the
    number of rules not significantly worse (``pairs``: :func:`paired_tests` or any table with a, b,
    mean = a - b and significant). Rules that no test separates share a range (rank ``1-3``); a rule
    that every test separates from the rest gets one place (``1``). The mean rank over the blocks
    (:func:`rank_rows`, ties sharing the average) is given beside it.

    Parameters
    ----------
    values : pandas.DataFrame
        Blocks (seeds, or (condition, seed)) x rules.
    pairs : pandas.DataFrame
        The pairwise tests over the same rules.
    higher_is_better : bool
        The metric's direction.

    Returns
    -------
    pandas.DataFrame
        Indexed by rule, sorted by mean value then name: mean, mean_rank, best, worst, rank (text).
    """
    sign = 1.0 if higher_is_better else -1.0
    better: dict[str, int] = {r: 0 for r in values.columns}
    worse: dict[str, int] = {r: 0 for r in values.columns}
    for p in pairs.itertuples():
        if not p.significant:
            continue
        a_better = sign * float(p.mean) > 0
        winner, loser = (p.a, p.b) if a_better else (p.b, p.a)
        better[loser] += 1
        worse[winner] += 1
    k = len(values.columns)
    mean_ranks = rank_rows(values, higher_is_better=higher_is_better).mean()
    rows = []
    for r in values.columns:
        best, worst = 1 + better[r], k - worse[r]
        rows.append({"rule": r, "mean": float(values[r].mean()), "mean_rank": float(mean_ranks[r]), "best": best,
                     "worst": worst, "rank": str(best) if best == worst else f"{best}-{worst}"})
    out = pd.DataFrame(rows).set_index("rule")
    order = sorted(out.index, key=lambda r: (-sign * out.loc[r, "mean"], r))
    return out.loc[order]


def focus_comparison(values: pd.DataFrame, focus: str, *, level: float = LEVEL, alpha: float = ALPHA,
                     min_seeds: int = 2, min_effect: float = 1e-9) -> pd.DataFrame:
    """One rule (``focus``) against every other rule, paired by seed: does it beat each of them?

    Per other rule: the mean of ``focus - other`` over the seeds both have with its Student's t interval at
    ``level``; the two-sided paired t-test's p-value (:func:`paired_t_pvalue`, n - 1 degrees of freedom) and
    the exact sign-flip p-value (:func:`sign_flip_pvalue`), both Holm-adjusted over the m other rules; and the
    **Holm step interval**: with the t-test p-values in increasing order, the j-th (j = 1..m) gets the t
    interval at ``1 - alpha / (m - j + 1)``, the level at which Holm's j-th step tests it (Bonferroni's for the
    first). By the duality of the t-test and its interval, a rule is rejected by Holm exactly when its step
    interval and those of every rule before it exclude 0.

    ``beats``: at least ``min_seeds`` paired seeds, the Holm-adjusted t-test rejects at ``alpha``, and the mean
    difference is above ``min_effect`` (differences at rounding noise beat nothing); then the level-``level``
    interval and the step interval lie above 0 too. ``values`` must be oriented so that higher is better
    (negate a lower-is-better metric first).

    Parameters
    ----------
    values : pandas.DataFrame
        Seeds x rules, one value per seed (a rule's per-seed worst case).
    focus : str
        The rule compared with the others (a column of ``values``).
    level : float
        The unadjusted intervals' level.
    alpha : float
        The family-wise error over the other rules.
    min_seeds : int
        The fewest paired seeds a "beats" may stand on (the v2 protocol's claims: 10).
    min_effect : float
        The smallest mean difference a "beats" may stand on.

    Returns
    -------
    pandas.DataFrame
        One row per other rule (in column order): other, n, mean, low, high, step_level, step_low, step_high,
        p_t, p_t_holm, p_sign_flip, p_sign_flip_holm, beats.
    """
    if focus not in values.columns:
        raise ValueError(f"focus rule {focus!r} is not among the rules {', '.join(map(str, values.columns))}")
    others = [c for c in values.columns if c != focus]
    rows, diffs = [], []
    for other in others:
        pair = values[[focus, other]].dropna()
        d = (pair[focus] - pair[other]).to_numpy(dtype=float)
        iv = t_interval(d, level=level)
        p_t = paired_t_pvalue(d)
        diffs.append(d)
        rows.append({"other": other, "n": len(d), "mean": iv.mean, "low": iv.low, "high": iv.high, "p_t": p_t,
                     "p_sign_flip": sign_flip_pvalue(d)})
    columns = ["other", "n", "mean", "low", "high", "step_level", "step_low", "step_high", "p_t", "p_t_holm",
               "p_sign_flip", "p_sign_flip_holm", "beats"]
    out = pd.DataFrame(rows, columns=["other", "n", "mean", "low", "high", "p_t", "p_sign_flip"])
    if not len(out):
        return pd.DataFrame(columns=columns)
    m = len(out)
    order = np.argsort(out["p_t"].fillna(1.0).to_numpy(), kind="stable")  # Holm's order, as holm() takes it
    step_level, step_low, step_high = np.empty(m), np.empty(m), np.empty(m)
    for j, idx in enumerate(order):
        step_level[idx] = 1.0 - alpha / (m - j)
        iv = t_interval(diffs[idx], level=step_level[idx])
        step_low[idx], step_high[idx] = iv.low, iv.high
    out["step_level"], out["step_low"], out["step_high"] = step_level, step_low, step_high
    out["p_t_holm"] = holm(out["p_t"].fillna(1.0).tolist())
    out["p_sign_flip_holm"] = holm(out["p_sign_flip"].fillna(1.0).tolist())
    out["beats"] = (out["p_t_holm"] < alpha) & (out["mean"] > min_effect) & (out["n"] >= min_seeds)
    return out[columns]

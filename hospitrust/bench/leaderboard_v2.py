"""The v2 leaderboard's tables (docs/leaderboard.md, "v2 protocol", Statistics), as Markdown lines and PNGs.

Every statement is about per-seed values: a rule's value on a seed is its worst case over the attacks it
met on that seed (:func:`worst_per_seed`), the backdoor left out of the accuracy worst case and reported by
its success rate beside it. Means carry Student's t 95 % intervals; rules are compared paired by seed with
the exact sign-flip test, Holm-corrected over all pairs, and shown as rank ranges (tied rules share one);
one rule can be set against every other (:func:`focus_lines`: does it beat each, Holm-corrected over them).

The functions take the board's cells (:func:`hospitrust.bench.leaderboard.load`: one row per finished run
with ``rule``, ``attack_label``, ``seed`` and the metric columns) and return Markdown lines, so that a
page (benchmarks/leaderboard/v2/render.py) composes them per condition and threat model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from hospitrust.bench import stats
from hospitrust.bench.leaderboard import RankAnalysis, attack_order, cd_diagram

#: scored by their success rate beside the accuracy worst case, not inside it (the v2 protocol)
SUCCESS_RATE_ATTACKS = ("backdoor",)
ASR = "final_attack_success_rate"
#: within this of chance a model learned nothing (the rendered tables mark it)
CHANCE_MARGIN = 0.01


def _iv(values, digits: int = 3) -> str:
    return stats.t_interval(list(values)).text(digits)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows], ""]


def accuracy_attacks(cells: pd.DataFrame, order: Sequence[str] = ()) -> list[str]:
    """The attacked runs' labels that count in the accuracy worst case: those of ``order`` first, in its order,
    then the rest by name.
    """
    labels = set(cells["attack_label"]) - {"none", *SUCCESS_RATE_ATTACKS}
    return [a for a in order if a in labels] + [a for a in attack_order(sorted(labels)) if a not in order]


def worst_per_seed(cells: pd.DataFrame, column: str, attacks: Sequence[str] | None = None) -> pd.DataFrame:
    """Seeds x rules: each rule's worst ``column`` (higher is better) over the attacks it met on that seed.

    ``attacks``: the attack labels that count (a threat model's); by default every attacked run but the
    backdoor's. A (rule, seed) that lacks one of the rule's attacks has no value (NaN), as in
    :func:`stats.worst_case_per_seed`.
    """
    wanted = set(accuracy_attacks(cells) if attacks is None else attacks)
    sub = cells[cells["attack_label"].isin(wanted)].dropna(subset=[column])
    if sub.empty:
        return pd.DataFrame()
    per = stats.worst_case_per_seed(sub, value=column, attack="attack_label")
    wide = per.pivot(index="seed", columns="rule", values="worst")
    wide.columns.name = None
    return wide


def worst_attacks(cells: pd.DataFrame, column: str, attacks: Sequence[str] | None = None) -> pd.Series:
    """Per rule, the attack that was its worst on the most seeds (ties: every such attack, joined by "/")."""
    wanted = set(accuracy_attacks(cells) if attacks is None else attacks)
    sub = cells[cells["attack_label"].isin(wanted)].dropna(subset=[column])
    if sub.empty:
        return pd.Series(dtype=str)
    per = stats.worst_case_per_seed(sub, value=column, attack="attack_label")
    out = {}
    for rule, rows in per.groupby("rule"):
        counts = rows["worst_attack"].value_counts()
        out[rule] = "/".join(sorted(counts[counts == counts.max()].index))
    return pd.Series(out, dtype=str)


def clean_per_seed(cells: pd.DataFrame, column: str) -> pd.DataFrame:
    """Seeds x rules: the run without attack."""
    sub = cells[cells["attack_label"] == "none"].dropna(subset=[column])
    if sub.empty:
        return pd.DataFrame()
    wide = sub.pivot_table(index="seed", columns="rule", values=column, aggfunc="mean")
    wide.columns.name = None
    return wide


def order_by(values: pd.DataFrame) -> list[str]:
    """Rules by their mean over seeds, best first (name on ties)."""
    means = values.mean()
    return sorted(values.columns, key=lambda r: (-means[r] if means[r] == means[r] else math.inf, r))


def matrix_lines(cells: pd.DataFrame, column: str, rules: Sequence[str], *, chance: float | None = None,
                 order: Sequence[str] = ()) -> list[str]:
    """Rules x attacks (in ``order`` where it names them): the mean over seeds [95 % t CI] of every cell, then
    the per-seed worst case and its most frequent attack. "-": the rule did not meet that attack (an attack aimed
    at another rule).
    """
    attacks = ["none", *accuracy_attacks(cells, order)]
    worst = worst_per_seed(cells, column)
    modes = worst_attacks(cells, column)
    rows = []
    for rule in rules:
        mine = cells[cells["rule"] == rule]
        row = [rule]
        for attack in attacks:
            vals = mine.loc[mine["attack_label"] == attack, column].dropna()
            row.append(_iv(vals) if len(vals) else "-")
        w = worst[rule].dropna() if rule in worst else pd.Series(dtype=float)
        mark = " (chance)" if chance is not None and len(w) and abs(float(w.mean()) - chance) <= CHANCE_MARGIN else ""
        row += [(_iv(w) + mark) if len(w) else "-", str(len(w)), modes.get(rule, "-")]
        rows.append(row)
    return _table(["rule", *attacks, "worst case per seed [95 % t CI]", "seeds", "worst attack (most seeds)"], rows)


def ranking(worst: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The seeds every rule has (complete blocks), the pairwise tests over them, and the rank ranges."""
    complete = worst.dropna()
    pairs = stats.paired_tests(complete)
    return complete, pairs, stats.rank_ranges(complete, pairs)


def ranking_lines(worst: pd.DataFrame, clean: pd.DataFrame, baseline: str, what: str = "worst case per seed") -> list[str]:
    """Rank ranges of the rules by ``worst`` (seeds x rules) over the seeds every rule has, with each rule's
    clean value and its clean cost against ``baseline``; then the pairs the corrected tests separate.
    """
    complete, pairs, ranges = ranking(worst)
    if complete.shape[1] < 2 or len(complete) < 2:
        return [f"Fewer than two rules or seeds with a {what} for every rule: nothing to rank.", ""]
    rows = []
    for rule, r in ranges.to_dict("index").items():
        clean_iv = _iv(clean[rule].dropna()) if rule in clean else "-"
        cost = "-"
        if rule in clean and baseline in clean and rule != baseline:
            both = clean[[rule, baseline]].dropna()
            cost = stats.t_interval((both[rule] - both[baseline]).to_list()).text(3)
        rows.append([r["rank"], rule, _iv(complete[rule]), f"{r['mean_rank']:.2f}", clean_iv, cost])
    lines = [f"{len(complete)} seeds with every rule's {what} ({', '.join(str(s) for s in complete.index)}).", ""]
    lines += _table(["rank (range)", "rule", f"{what} [95 % t CI]", "mean rank", "no attack [95 % t CI]",
                     f"no attack minus {baseline} [95 % t CI]"], rows)
    separated = [f"{p.a if p.mean > 0 else p.b} over {p.b if p.mean > 0 else p.a} by {abs(p.mean):.3f} "
                 f"(p Holm {p.p_holm:.3g})" for p in pairs.itertuples() if p.significant]
    lines += [f"Pairs the Holm-corrected sign-flip tests separate at {stats.ALPHA} (of {len(pairs)}): "
              + ("; ".join(separated) if separated else "none") + ".", ""]
    return lines


def cd_png(worst: pd.DataFrame, title: str) -> bytes | None:
    """The critical-difference diagram of ``worst`` (seeds x rules) over its complete seeds: mean ranks, and
    bars joining the rules no Holm-corrected sign-flip test separates. None with fewer than 2 rules or seeds.
    """
    complete, pairs, _ = ranking(worst)
    if complete.shape[1] < 2 or len(complete) < 2:
        return None
    ranks = stats.rank_rows(complete)
    mean_ranks = ranks.mean().sort_values()
    analysis = RankAnalysis(complete, ranks, mean_ranks, stats.friedman(complete), pairs,
                            stats.cliques(mean_ranks, pairs), [])
    return cd_diagram(analysis, title, test="sign-flip")


def success_rate_lines(cells: pd.DataFrame, rules: Sequence[str]) -> list[str]:
    """The backdoor's success rate (lower is better) per rule: mean over seeds [95 % t CI]."""
    if ASR not in cells:
        return []
    sub = cells[cells["attack_label"].isin(SUCCESS_RATE_ATTACKS)].dropna(subset=[ASR])
    if sub.empty:
        return []
    rows = []
    for rule in rules:
        vals = sub.loc[sub["rule"] == rule, ASR]
        if len(vals):
            rows.append([rule, _iv(vals), str(len(vals))])
    return _table(["rule", "backdoor success rate [95 % t CI] (lower is better)", "seeds"], rows)


def focus_lines(worst: pd.DataFrame, clean: pd.DataFrame, focus: str, baseline: str, *,
                max_clean_cost: float = 0.02, min_seeds: int = 10) -> list[str]:
    """``focus`` against every other rule, paired by seed (:func:`stats.focus_comparison`; a "beats" needs
    ``min_seeds`` paired seeds), and its clean cost against ``baseline``; the sentences at the end say what the
    table shows.
    """
    if focus not in worst:
        return [f"No per-seed worst case for {focus} here.", ""]
    table = stats.focus_comparison(worst, focus, min_seeds=min_seeds)
    m = len(table)
    rows = [[r.other, str(r.n), f"{r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}]",
             f"[{r.low_all:+.3f}, {r.high_all:+.3f}]", f"{r.p_t_holm:.3g}", f"{r.p_sign_flip_holm:.3g}",
             "yes" if r.beats else "no"] for r in table.itertuples()]
    lines = _table(["other rule", "seeds", f"{focus} minus it [95 % t CI]", f"[t CI for all {m} at once]",
                    "p (paired t, Holm)", "p (sign-flip, Holm)", "beats it"], rows)
    beaten = [r.other for r in table.itertuples() if r.beats]
    not_beaten = [r.other for r in table.itertuples() if not r.beats]
    short = [r.other for r in table.itertuples() if r.n < min_seeds]
    if short:
        lines.append(f"Fewer than {min_seeds} paired seeds against {', '.join(short)}: no \"beats\" is called there yet.")
    lines.append(f"{focus} beats {len(beaten)} of {m} rules here"
                 + (f" ({', '.join(beaten)})" if beaten else "")
                 + (f"; not {', '.join(not_beaten)}" if not_beaten else "") + ".")
    if focus in clean and baseline in clean and focus != baseline:
        both = clean[[focus, baseline]].dropna()
        cost = stats.t_interval((both[focus] - both[baseline]).to_list())
        verdict = "within" if cost.mean >= -max_clean_cost else "beyond"
        lines.append(f"Without attack, {focus} minus {baseline}: {cost.text(3)} over {cost.n} seeds, "
                     f"{verdict} the {max_clean_cost} the rule may cost.")
    return [*lines, ""]


def by_threat_model_lines(columns: dict[str, pd.DataFrame], rules: Sequence[str]) -> list[str]:
    """Rules x threat models: each model's per-seed worst case (``columns``: name -> seeds x rules), mean [t CI]."""
    rows = []
    for rule in rules:
        row = [rule]
        for worst in columns.values():
            vals = worst[rule].dropna() if rule in worst else pd.Series(dtype=float)
            row.append(f"{_iv(vals)} (n={len(vals)})" if len(vals) else "-")
        rows.append(row)
    return _table(["rule", *columns], rows)


def sweep_png(points: dict[str, pd.DataFrame], rules: Sequence[str], title: str, xlabel: str) -> bytes:
    """Each rule's mean per-seed worst case at each point of a sweep, with its 95 % t interval as an error bar."""
    import io

    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    xs = list(range(len(points)))
    for i, rule in enumerate(rules):
        means, lows, highs = [], [], []
        for worst in points.values():
            iv = stats.t_interval(worst[rule].dropna().to_list()) if rule in worst else stats.t_interval([])
            means.append(iv.mean)
            lows.append(iv.mean - iv.low if iv.has_ci else 0.0)
            highs.append(iv.high - iv.mean if iv.has_ci else 0.0)
        offset = (i - (len(rules) - 1) / 2) * 0.03  # keep the error bars apart
        ax.errorbar([x + offset for x in xs], means, yerr=[lows, highs], marker="o", ms=3, capsize=2, lw=1, label=rule)
    ax.set_xticks(xs, list(points))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("per-seed worst case (mean, 95 % t CI)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


__all__ = ["ASR", "SUCCESS_RATE_ATTACKS", "accuracy_attacks", "by_threat_model_lines", "cd_png", "clean_per_seed",
           "focus_lines", "matrix_lines", "order_by", "ranking", "ranking_lines", "success_rate_lines", "sweep_png",
           "worst_attacks", "worst_per_seed"]

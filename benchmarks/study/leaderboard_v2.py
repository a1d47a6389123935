"""The v2 leaderboard's tables (docs/leaderboard.md, "v2 protocol", Statistics), as Markdown lines and PNGs.

Every statement is about per-seed values: a rule's value on a seed is its worst case over the attacks it
met on that seed (:func:`worst_per_seed`), the backdoor left out of the accuracy worst case and reported by
its success rate beside it. Means carry Student's t 95 % intervals; rules are compared paired by seed with
the paired t-test, Holm-corrected over all pairs, and shown as rank ranges (tied rules share one);
one rule can be set against every other (:func:`focus_lines`: does it beat each, Holm-corrected over them).

The functions take the board's cells (:func:`hospitrust.bench.leaderboard.load`: one row per finished run
with ``rule``, ``attack_label``, ``seed`` and the metric columns) and return Markdown lines, so that a
page (benchmarks/leaderboard/v2/render.py) composes them per condition and threat model.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import pandas as pd

from hospitrust.bench import stats
from hospitrust.bench.leaderboard import RankAnalysis, attack_order, cd_diagram, md_table

#: scored by their success rate beside the accuracy worst case, not inside it (the v2 protocol)
SUCCESS_RATE_ATTACKS = ("backdoor",)
ASR = "final_attack_success_rate"
#: the pairwise test of the rank ranges (amendment 11: the exact sign-flip test cannot separate 78 pairs over 10 seeds)
PAIRED_TEST = "t"
#: within this of chance a model learned nothing (the rendered tables mark it)
CHANCE_MARGIN = 0.01


def _iv(values, digits: int = 3) -> str:
    return stats.t_interval(list(values)).text(digits)


def accuracy_attacks(cells: pd.DataFrame, order: Sequence[str] = (), expected: Expected | None = None) -> list[str]:
    """The attacked runs' labels that count in the accuracy worst case (with ``expected``'s, run or not): those
    of ``order`` first, in its order, then the rest by name.
    """
    found = set(cells["attack_label"]) | {a for these in (expected or {}).values() for a in these}
    labels = found - {"none", *SUCCESS_RATE_ATTACKS}
    return [a for a in order if a in labels] + [a for a in attack_order(sorted(labels)) if a not in order]


Expected = Mapping[str, Collection[str]]


def _complete_only(sub: pd.DataFrame, expected: Expected | None, wanted: set[str]) -> pd.DataFrame:
    """``sub`` without the (rule, seed) groups that lack one of the rule's expected attacks among ``wanted``
    (a part not finished yet: its worst case would be over fewer attacks than the protocol's).
    """
    if expected is None or sub.empty:
        return sub
    keep = []
    for (rule, _seed), group in sub.groupby(["rule", "seed"], sort=False):
        needed = set(expected.get(rule, ())) & wanted
        if needed <= set(group["attack_label"]):
            keep.append(group)
    return pd.concat(keep) if keep else sub.iloc[0:0]


def worst_per_seed(cells: pd.DataFrame, column: str, attacks: Sequence[str] | None = None,
                   expected: Expected | None = None) -> pd.DataFrame:
    """Seeds x rules: each rule's worst ``column`` (higher is better) over the attacks it met on that seed.

    ``attacks``: the attack labels that count (a threat model's); by default every attacked run but the
    backdoor's. ``expected``: each rule's attacks by the protocol (the parts' files); a (rule, seed) that lacks
    one of them, or one of the rule's attacks seen on another seed, has no value (NaN), as in
    :func:`stats.worst_case_per_seed`.
    """
    return _wide(_per_seed(cells, column, attacks, expected))


def _wide(per: pd.DataFrame) -> pd.DataFrame:
    if per.empty:
        return pd.DataFrame()
    wide = per.pivot(index="seed", columns="rule", values="worst")
    wide.columns.name = None
    return wide


def _per_seed(cells: pd.DataFrame, column: str, attacks: Sequence[str] | None, expected: Expected | None) -> pd.DataFrame:
    # by default every accuracy attack, the protocol's too where none has run yet
    wanted = set(accuracy_attacks(cells, expected=expected) if attacks is None else attacks)
    sub = _complete_only(cells[cells["attack_label"].isin(wanted)].dropna(subset=[column]), expected, wanted)
    if sub.empty:
        return pd.DataFrame()
    return stats.worst_case_per_seed(sub, value=column, attack="attack_label")


def worst_attacks(cells: pd.DataFrame, column: str, attacks: Sequence[str] | None = None,
                  expected: Expected | None = None) -> pd.Series:
    """Per rule, the attack that was its worst on the most seeds (ties: every such attack, joined by "/")."""
    return _modes(_per_seed(cells, column, attacks, expected))


def _modes(per: pd.DataFrame) -> pd.Series:
    if per.empty:
        return pd.Series(dtype=str)
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
                 order: Sequence[str] = (), expected: Expected | None = None) -> list[str]:
    """Rules x attacks (in ``order`` where it names them): the mean over seeds [95 % t CI] of every cell, then
    the per-seed worst case and its most frequent attack.

    A cell's seed count is shown where it differs from the rule's most; "-": the rule does not meet that
    attack; "not run": it does by ``expected`` (the protocol), but no run of it has finished.
    """
    rules_expected = None if expected is None else {r: expected.get(r, ()) for r in rules}
    attacks = ["none", *accuracy_attacks(cells, order, rules_expected)]
    per = _per_seed(cells, column, None, expected)
    worst, modes = _wide(per), _modes(per)
    rows = []
    for rule in rules:
        mine = cells[cells["rule"] == rule]
        counts = {a: int(mine.loc[mine["attack_label"] == a, column].notna().sum()) for a in attacks}
        most = max(counts.values(), default=0)
        row = [rule]
        for attack in attacks:
            vals = mine.loc[mine["attack_label"] == attack, column].dropna()
            if len(vals):
                row.append(_iv(vals) + (f" (n={len(vals)})" if len(vals) != most else ""))
            elif expected is not None and (attack == "none" or attack in expected.get(rule, ())):
                row.append("not run")
            else:
                row.append("-")
        w = worst[rule].dropna() if rule in worst else pd.Series(dtype=float)
        mark = " (chance)" if chance is not None and len(w) and abs(float(w.mean()) - chance) <= CHANCE_MARGIN else ""
        row += [(_iv(w) + mark) if len(w) else "-", str(len(w)), modes.get(rule, "-")]
        rows.append(row)
    return md_table(["rule", *attacks, "worst case per seed [95 % t CI]", "seeds", "worst attack (most seeds)"], rows)


def ranking(worst: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The seeds every rule has (complete blocks), the pairwise tests over them, and the rank ranges."""
    complete = worst.dropna()
    pairs = stats.paired_tests(complete, test=PAIRED_TEST)
    return complete, pairs, stats.rank_ranges(complete, pairs)


def ranking_lines(worst: pd.DataFrame, clean: pd.DataFrame, baseline: str, what: str = "worst case per seed",
                  unit: str = "seeds") -> list[str]:
    """Rank ranges of the rules by ``worst`` (``unit`` x rules) over the rows every rule has, with each rule's
    clean value and its clean cost against ``baseline`` on those same rows; then the pairs the corrected tests
    separate.
    """
    complete, pairs, ranges = ranking(worst)
    if complete.shape[1] < 2 or len(complete) < 2:
        return [f"Fewer than two rules or {unit} with a {what} for every rule: nothing to rank.", ""]
    same = clean.reindex(complete.index) if len(clean) else clean
    rows = []
    for rule, r in ranges.to_dict("index").items():
        clean_iv = _iv(same[rule].dropna()) if rule in same else "-"
        cost = "-"
        if rule in same and baseline in same and rule != baseline:
            both = same[[rule, baseline]].dropna()
            cost = stats.t_interval((both[rule] - both[baseline]).to_list()).text(3)
        rows.append([r["rank"], rule, _iv(complete[rule]), f"{r['mean_rank']:.2f}", clean_iv, cost])
    labels = [" / ".join(map(str, i)) if isinstance(i, tuple) else str(i) for i in complete.index]
    lines = [f"{len(complete)} {unit} with every rule's {what} ({', '.join(labels)}).", ""]
    lines += md_table(["rank (range)", "rule", f"{what} [95 % t CI]", "mean rank", "no attack [95 % t CI]",
                     f"no attack minus {baseline} [95 % t CI]"], rows)
    separated = [f"{p.a if p.mean > 0 else p.b} over {p.b if p.mean > 0 else p.a} by {abs(p.mean):.3f} "
                 f"(p Holm {p.p_holm:.3g})" for p in pairs.itertuples() if p.significant]
    lines += [f"Pairs the Holm-corrected paired t-tests separate at {stats.ALPHA} (of {len(pairs)}): "
              + ("; ".join(separated) if separated else "none") + ".", ""]
    return lines


def controls_per_seed(cells: pd.DataFrame, column: str, controls: Collection[str] | None = None) -> pd.DataFrame:
    """Seeds x controls: each control's ``column`` (a control runs no attack: its one cell per seed).
    ``controls``: the rule labels that are controls (default: :data:`hospitrust.bench.controls.CONTROLS`).
    """
    from hospitrust.bench.controls import CONTROLS

    wanted = set(CONTROLS if controls is None else controls)
    clean = clean_per_seed(cells[cells["rule"].isin(wanted)], column) if "rule" in cells else pd.DataFrame()
    return clean[[c for c in clean.columns if c in wanted]] if len(clean) else clean


def best_control(controls: pd.DataFrame) -> str | None:
    """The control with the highest mean over the seeds every control has (name on ties); None without one.
    One control for the whole table, not the best per seed: a maximum over noisy values would favour the
    controls by construction. ``pooled`` is the ceiling, not a candidate: no hospital holds the pooled data.
    """
    from hospitrust.bench.controls import CEILING

    complete = controls.drop(columns=[CEILING], errors="ignore").dropna()
    if complete.empty:
        return None
    return order_by(complete)[0]


def versus_control(worst: pd.DataFrame, controls: pd.DataFrame) -> tuple[str | None, pd.DataFrame]:
    """Each rule's worst case minus the best control, paired by seed: (the best control, one row per rule
    with ``seeds``, ``mean``, ``low``, ``high`` (Student's t 95 %), ``p`` (the exact sign-flip test, two-sided)
    and ``above`` (seeds where the rule's worst case beats the control)). Rules best first.
    """
    best = best_control(controls)
    cols = ["rule", "seeds", "mean", "low", "high", "p", "above"]
    if best is None or worst.empty:
        return best, pd.DataFrame(columns=cols)
    rows = []
    for rule in order_by(worst):
        both = pd.concat([worst[rule], controls[best]], axis=1, keys=["rule", "control"]).dropna()
        d = (both["rule"] - both["control"]).to_list()
        iv = stats.t_interval(d)
        rows.append([rule, len(d), iv.mean, iv.low, iv.high, stats.sign_flip_pvalue(d), int(sum(x > 0 for x in d))])
    return best, pd.DataFrame(rows, columns=cols)


def versus_control_lines(worst: pd.DataFrame, controls: pd.DataFrame, what: str = "worst case") -> list[str]:
    """Does joining pay: the controls' values, then each rule's ``what`` minus the best control, paired by seed."""
    if controls.empty:
        return ["No control has run for this table: whether federating pays is not shown.", ""]
    lines = md_table(["control", "value [95 % t CI]", "seeds"],
                     [[c, _iv(controls[c].dropna()), str(int(controls[c].notna().sum()))] for c in order_by(controls)])
    best, table = versus_control(worst, controls)
    if best is None or table.empty:
        return lines + ["No seed has every control and a rule's value: nothing to pair.", ""]
    rows = [[r.rule, r.seeds, stats.Interval(r.mean, r.low, r.high, r.seeds).text(3), f"{r.p:.3g}", f"{r.above} of {r.seeds}"]
            for r in table.itertuples()]
    return lines + [f"Each rule's {what} minus the best control ({best}), paired by seed:", ""] + md_table(
        ["rule", "seeds", f"{what} minus {best} [95 % t CI]", "sign-flip p (two-sided)", "seeds above"], rows)


def cd_png(worst: pd.DataFrame, title: str) -> bytes | None:
    """The critical-difference diagram of ``worst`` (seeds x rules) over its complete seeds: mean ranks, and
    bars joining the rules no Holm-corrected paired t-test separates. None with fewer than 2 rules or seeds.
    """
    complete, pairs, _ = ranking(worst)
    if complete.shape[1] < 2 or len(complete) < 2:
        return None
    ranks = stats.rank_rows(complete)
    mean_ranks = ranks.mean().sort_values()
    analysis = RankAnalysis(complete, ranks, mean_ranks, stats.friedman(complete), pairs,
                            stats.cliques(mean_ranks, pairs), [])
    return cd_diagram(analysis, title, test="paired t")


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
    return md_table(["rule", "backdoor success rate [95 % t CI] (lower is better)", "seeds"], rows)


def focus_lines(worst: pd.DataFrame, clean: pd.DataFrame, focus: str, baseline: str, *,
                max_clean_cost: float = 0.02, min_seeds: int = 10, claim: bool = True) -> list[str]:
    """``focus`` against every other rule, paired by seed (:func:`stats.focus_comparison`), and its clean cost
    against ``baseline``.

    ``claim``: this table is where the claim is tested (a condition fixed in advance): it calls "beats" (Holm
    over the other rules, at least ``min_seeds`` paired seeds) and the clean cost; otherwise the table is
    descriptive (a threat model's attacks within a condition): the same numbers, no verdict.
    """
    if focus not in worst:
        return [f"No per-seed worst case for {focus} here.", ""]
    table = stats.focus_comparison(worst, focus, min_seeds=min_seeds)
    m = len(table)
    header = ["other rule", "seeds", f"{focus} minus it [95 % t CI]", "Holm step interval [level]",
              "p (paired t, Holm)", "p (sign-flip, Holm)"] + (["beats it"] if claim else [])
    rows = [[r.other, str(r.n), f"{r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}]",
             f"[{r.step_low:+.3f}, {r.step_high:+.3f}] [{r.step_level:.4f}]", f"{r.p_t_holm:.3g}",
             f"{r.p_sign_flip_holm:.3g}"] + (["yes" if r.beats else "no"] if claim else []) for r in table.itertuples()]
    lines = md_table(header, rows)
    if not claim:
        return [*lines, "Descriptive: the claim is not tested on this table (it is not one of the conditions fixed "
                        "for it), so it calls nothing.", ""]
    short = [r.other for r in table.itertuples() if r.n < min_seeds]
    if short:
        lines.append(f"Fewer than {min_seeds} paired seeds against {', '.join(short)}: no \"beats\" is called there yet.")
    beaten = [r.other for r in table.itertuples() if r.beats]
    not_beaten = [r.other for r in table.itertuples() if not r.beats]
    lines.append(f"{focus} beats {len(beaten)} of {m} rules here"
                 + (f" ({', '.join(beaten)})" if beaten else "")
                 + (f"; not {', '.join(not_beaten)}" if not_beaten else "") + ".")
    if focus in clean and baseline in clean and focus != baseline:
        both = clean[[focus, baseline]].dropna()
        cost = stats.t_interval((both[focus] - both[baseline]).to_list())
        if cost.n < min_seeds:
            lines.append(f"Without attack, {focus} minus {baseline}: {cost.text(3)} over {cost.n} seeds (fewer than "
                         f"{min_seeds}: no call on the clean cost yet).")
        else:
            mean_ok = cost.mean >= -max_clean_cost
            low_ok = cost.has_ci and cost.low >= -max_clean_cost
            lines.append(f"Without attack, {focus} minus {baseline}: {cost.text(3)} over {cost.n} seeds: the mean "
                         f"{'is' if mean_ok else 'is not'} within the {max_clean_cost} the rule may cost, and the "
                         f"interval's lower end {'is' if low_ok else 'is not'}.")
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
    return md_table(["rule", *columns], rows)


def sweep_png(points: dict[str, pd.DataFrame], rules: Sequence[str], title: str, xlabel: str) -> bytes:
    """Each rule's mean per-seed worst case at each point of a sweep, with its 95 % t interval as an error bar."""
    import io

    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    xs = list(range(len(points)))
    for i, rule in enumerate(rules):
        ivs = [stats.t_interval(w[rule].dropna().to_list()) if rule in w else stats.t_interval([]) for w in points.values()]
        offset = (i - (len(rules) - 1) / 2) * 0.03  # keep the error bars apart
        line = ax.plot([x + offset for x in xs], [iv.mean for iv in ivs], lw=1, label=rule)[0]
        for x, iv in zip(xs, ivs):
            if iv.has_ci:
                ax.errorbar([x + offset], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], marker="o", ms=3,
                            capsize=2, lw=1, color=line.get_color())
            elif iv.mean == iv.mean:  # one seed: no interval, so no bar and a hollow marker
                ax.plot([x + offset], [iv.mean], marker="o", ms=4, mfc="none", color=line.get_color())
    seeds = [min((int(w[r].notna().sum()) for r in rules if r in w), default=0) for w in points.values()]
    ax.set_xticks(xs, [f"{label}\n(n >= {n})" for label, n in zip(points, seeds)])
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

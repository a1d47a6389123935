"""``hospitrust report GRID_DIR``: what a grid found, as pictures and tables people can read.

Writes ``GRID_DIR/report/report.html`` (self-contained: figures embedded as base64 PNG) and
``GRID_DIR/report/report.md`` with ``report/figures/*.png``:

- the headline metric per round per strategy (mean over seeds, band = ± std), one panel per attack;
- heatmaps of the final metric over attack x strategy (mean ± std over seeds);
- the worst case over attacks per strategy (the ByzFL protocol: where a strategy was run with
  several hyperparameter settings, the setting with the best worst case is chosen and reported);
- trust / reputation trajectories per hospital (malicious hospitals in red), where rounds.jsonl has them;
- detection TPR / FPR (whole run, from summary.json) over attack x strategy;
- per-hospital accuracy spread of the final model (federated evaluation) per strategy;
- paired differences against the baseline strategy (FedAvg) on the same seed and scenario;
- the overhead share of the cells' wall time.

A *scenario* is one combination of the grid's other axes (dataset, heterogeneity, hospitals, ...);
each scenario gets its own figures (up to ``max_scenarios``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hospitrust.bench.store import cell_dirs, collect, overhead_table
from hospitrust.config.sections import is_hyperparameter

NOT_SCENARIO = {"cell", "strategy", "attack", "malicious-fraction", "seed", "assumed-malicious", "run-name", "status"}
METRIC_NAMES = {"balanced_accuracy": "balanced accuracy", "accuracy": "accuracy", "auc": "AUC", "macro_f1": "macro-F1",
                "worst_class_recall": "worst-class recall", "rare_class_macro_f1": "rare-class macro-F1"}


CHANCE_TOLERANCE = 0.01  # a cell's mean within this of chance level is marked: its model learned nothing
TIE_RULE = ("A difference smaller than the larger of the two standard deviations over seeds is called a tie "
            "(a quick reading; `hospitrust report --leaderboard` calls ties from paired, seed-by-seed confidence intervals).")


def chance_level(metric: str, num_classes: int | None) -> float | None:
    """What a model that learned nothing scores: balanced accuracy 1/K (one class predicted, or
    random guesses), AUC 0.5; None for a metric without a fixed chance level (accuracy depends on
    the class balance) or an unknown K.
    """
    if metric == "auc":
        return 0.5
    if metric == "balanced_accuracy" and num_classes:
        return 1.0 / num_classes
    return None


def at_chance(value: float, chance: float | None) -> bool:
    """Whether ``value`` is within CHANCE_TOLERANCE of the chance level (never for an unknown one or NaN)."""
    return chance is not None and value == value and abs(value - chance) <= CHANCE_TOLERANCE


def rank_with_ties(names: list[str], means: list[float], stds: list[float]) -> list[str]:
    """Per row of a table sorted best first, how it stands against the row above: ``tie with X``
    when the difference is smaller than the larger of the two standard deviations, else ``below X``
    (with both numbers); ``one seed: no spread`` when a standard deviation is unknown.
    """
    out = ["best"] if names else []
    for i in range(1, len(names)):
        diff, spread = means[i - 1] - means[i], max(stds[i - 1], stds[i])
        if spread != spread:  # NaN: a single seed
            out.append(f"below {names[i - 1]} by {diff:.3f} (one seed: no spread, no tie call)")
        elif diff < spread or abs(diff) <= 1e-12:  # equal means tie whatever the spread
            out.append(f"tie with {names[i - 1]} (difference {diff:.3f} < std {spread:.3f})")
        else:
            out.append(f"below {names[i - 1]} (difference {diff:.3f} >= std {spread:.3f})")
    return out


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[tuple[str, bytes, str]] = field(default_factory=list)  # (file name, png, caption)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _pm(mean: float, std: float, digits: int = 3) -> str:
    if mean != mean:
        return "-"
    return f"{mean:.{digits}f}" if std != std or std == 0 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:80]


class ReportData:
    """The grid's cells and rounds, with the roles of its columns worked out."""

    def __init__(self, grid_dir: Path, metric: str | None, baseline: str | None) -> None:
        self.grid_dir = grid_dir
        meta_path = grid_dir / "grid.json"
        self.meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        self.metric = metric or self.meta.get("metric", "balanced_accuracy")
        self.baseline = baseline or self.meta.get("baseline", "fedavg")
        self.rounds, self.cells, self.clients = collect(grid_dir)
        self.cell_path = {p.name: p for p in cell_dirs(grid_dir)}
        cells = self.cells
        self.done = cells[cells["status"] == "done"].copy() if len(cells) else cells
        columns = list(cells.columns)
        config_cols = columns[1:columns.index("status")] if "status" in columns else []
        axes = list(self.meta.get("axes", {})) or [c for c in config_cols if self.done[c].nunique(dropna=False) > 1]
        if "hospitals" in config_cols and self.done["hospitals"].nunique() > 1 and "hospitals" not in axes:
            axes.append("hospitals")
        self.hyper_cols = [c for c in axes if is_hyperparameter(c)]  # a rule's options: variants of the rule
        self.scenario_cols = [c for c in axes if c not in NOT_SCENARIO and c not in self.hyper_cols
                              and c in self.done.columns and self.done[c].nunique(dropna=False) > 1]
        for frame in (self.done, self.rounds):
            if not len(frame):
                continue
            frame["variant"] = self._variant(frame)
            frame["attack_label"] = self._attack_label(frame)
            frame["scenario"] = self._scenario(frame)
            if "seed" not in frame:
                frame["seed"] = 0

    def _variant(self, frame: pd.DataFrame) -> pd.Series:
        if not self.hyper_cols:
            return frame["strategy"].astype(str)
        return frame.apply(lambda r: f"{r['strategy']} (" + ", ".join(f"{c}={r[c]}" for c in self.hyper_cols) + ")", axis=1)

    def _attack_label(self, frame: pd.DataFrame) -> pd.Series:
        if "attack" not in frame:
            return pd.Series(["none"] * len(frame), index=frame.index)
        fractions = frame.loc[frame["attack"] != "none", "malicious-fraction"].nunique() if "malicious-fraction" in frame else 1
        if fractions > 1:
            return frame.apply(lambda r: "none" if r["attack"] == "none" else f"{r['attack']} @{r['malicious-fraction']:g}", axis=1)
        return frame["attack"].astype(str)

    def _scenario(self, frame: pd.DataFrame) -> pd.Series:
        if not self.scenario_cols:
            return pd.Series(["all cells"] * len(frame), index=frame.index)
        return frame.apply(lambda r: ", ".join(f"{c}={r[c]}" for c in self.scenario_cols), axis=1)

    def attack_order(self, frame: pd.DataFrame) -> list[str]:
        labels = list(dict.fromkeys(frame["attack_label"]))
        return (["none"] if "none" in labels else []) + sorted(a for a in labels if a != "none")

    def num_classes(self, frame: pd.DataFrame) -> int | None:
        """The scenario's number of classes (from its cells' config.json), when they agree."""
        found: set[int | None] = set()
        for cell in frame["cell"].unique():
            path = self.cell_path.get(str(cell))
            if path is None:
                found.add(None)
                continue
            try:
                found.add(len(json.loads((path / "config.json").read_text()).get("class-names") or []) or None)
            except (OSError, ValueError, TypeError, AttributeError):
                found.add(None)
        return found.pop() if len(found) == 1 else None

    def strategy_order(self, frame: pd.DataFrame) -> list[str]:
        names = sorted(set(frame["variant"]))
        return sorted(names, key=lambda v: (not v.startswith(self.baseline), v))


def _final_stats(data: ReportData, frame: pd.DataFrame, column: str) -> pd.DataFrame:
    g = frame.groupby(["variant", "attack_label"])[column]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.count()}).reset_index()


def _heatmap(ax, matrix: pd.DataFrame, text: pd.DataFrame, title: str, cmap="viridis", center_zero=False):
    import numpy as np

    values = matrix.to_numpy(dtype=float)
    lim = 1.0
    if center_zero:
        lim = np.nanmax(np.abs(values)) if np.isfinite(values).any() else 1.0
        im = ax.imshow(values, cmap="RdBu", vmin=-lim or -1, vmax=lim or 1, aspect="auto")
    else:
        im = ax.imshow(values, cmap=cmap, aspect="auto")
    ax.set_xticks(range(matrix.shape[1]), matrix.columns, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(matrix.shape[0]), matrix.index, fontsize=8)
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            t = text.iat[i, j]
            if t and t != "-":
                ax.text(j, i, t, ha="center", va="center", fontsize=6.5,
                        color=("white" if abs(values[i, j]) > 0.6 * lim else "black") if center_zero
                        else ("white" if values[i, j] < np.nanmean(values) else "black"))
    ax.set_title(title, fontsize=10)
    ax.figure.colorbar(im, ax=ax, fraction=0.03)


def section_curves(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    sec = Section(f"{METRIC_NAMES.get(data.metric, data.metric)} per round per strategy",
                  "Central test-split metric after each round; line = mean over seeds, band = ± std. "
                  "One panel per attack (with the attacker fraction where the grid varies it).")
    if not len(data.rounds):
        sec.text += " No finished cell."
        return sec
    for s_i, (scenario, frame) in enumerate(data.rounds.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            sec.text += f" (Only the first {max_scenarios} scenarios are drawn.)"
            break
        attacks = data.attack_order(frame)[:16]
        ncols = min(4, len(attacks))
        nrows = math.ceil(len(attacks) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False, sharey=True)
        for ax, attack in zip(axes.flat, attacks):
            sub = frame[frame["attack_label"] == attack]
            for variant in data.strategy_order(sub):
                g = sub[sub["variant"] == variant].groupby("round")[data.metric]
                mean, std = g.mean(), g.std(ddof=1).fillna(0.0)
                line, = ax.plot(mean.index, mean.values, marker="o", ms=2.5, lw=1.2, label=variant)
                ax.fill_between(mean.index, mean - std, mean + std, alpha=0.15, color=line.get_color())
            ax.set_title(attack, fontsize=9)
            ax.set_xlabel("round", fontsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(attacks):]:
            ax.axis("off")
        axes[0][0].set_ylabel(METRIC_NAMES.get(data.metric, data.metric), fontsize=8)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, bbox_to_anchor=(0.5, -0.02 - 0.03 * nrows))
        fig.suptitle(scenario, fontsize=10)
        fig.tight_layout()
        sec.figures.append((f"curves_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: {data.metric} per round"))
    return sec


def _matrix(stats: pd.DataFrame, rows: list[str], cols: list[str], digits=3):
    mean = stats.pivot(index="variant", columns="attack_label", values="mean").reindex(index=rows, columns=cols)
    std = stats.pivot(index="variant", columns="attack_label", values="std").reindex(index=rows, columns=cols)
    text = pd.DataFrame([[_pm(mean.iat[i, j], std.iat[i, j], digits) for j in range(len(cols))] for i in range(len(rows))],
                        index=rows, columns=cols)
    return mean, text


def section_heatmaps(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    col = f"final_{data.metric}"
    sec = Section(f"Final {METRIC_NAMES.get(data.metric, data.metric)}: attack x strategy",
                  "The final model's metric on the test split, mean ± std over seeds.")
    marked = everywhere = 0
    for s_i, (scenario, frame) in enumerate(data.done.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            break
        rows, cols = data.strategy_order(frame), data.attack_order(frame)
        mean, text = _matrix(_final_stats(data, frame, col), rows, cols)
        chance = chance_level(data.metric, data.num_classes(frame))
        for i in range(len(rows)):
            for j in range(len(cols)):
                if at_chance(float(mean.iat[i, j]), chance):
                    text.iat[i, j] += " (chance)"
                    marked += 1
                everywhere += int(mean.iat[i, j] == mean.iat[i, j])
        fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 3, 0.45 * len(rows) + 1.8))
        _heatmap(ax, mean, text, f"{scenario}: final {data.metric}")
        sec.figures.append((f"heatmap_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: final {data.metric}"))
        sec.tables.append((f"{scenario}: final {data.metric} (mean ± std over seeds)", text.rename_axis("strategy")))
    if marked:
        sec.text += (f" {'Every cell is' if marked == everywhere else f'{marked} of {everywhere} cells are'} at chance "
                     f"level (marked \"(chance)\": within {CHANCE_TOLERANCE} of balanced accuracy 1/K, or AUC 0.5): "
                     "the model learned nothing there, so the order of those cells means nothing.")
    return sec


def worst_case(data: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: the hyperparameter variant with the best worst case over attacks (attacked cells only)."""
    col = f"final_{data.metric}"
    attacked = frame[frame["attack_label"] != "none"] if (frame["attack_label"] != "none").any() else frame
    per = attacked.groupby(["strategy", "variant", "attack_label"])[col].agg(["mean", "std"]).reset_index()
    clean = frame[frame["attack_label"] == "none"].groupby("variant")[col].mean()
    rows = []
    for strategy, sub in per.groupby("strategy"):
        best = None
        for variant, v in sub.groupby("variant"):
            worst = v.loc[v["mean"].idxmin()]
            if best is None or worst["mean"] > best[1]["mean"]:
                best = (variant, worst)
        assert best is not None  # every strategy group has at least one variant
        variant, worst = best
        rows.append({"strategy": strategy, "chosen setting": variant, "worst attack": worst["attack_label"],
                     "worst case": worst["mean"], "worst case std": worst["std"],
                     "mean over attacks": sub[sub["variant"] == variant]["mean"].mean(),
                     "clean": clean.get(variant, math.nan)})
    return pd.DataFrame(rows).sort_values("worst case", ascending=False)


def section_worst_case(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    sec = Section("Worst case over attacks per strategy",
                  "The ByzFL protocol: for each strategy the hyperparameter setting with the best worst case over the "
                  "attacks is chosen (when the grid has several), and its worst-case final metric (mean over seeds) is "
                  "reported; the clean run (no attack) is marked for comparison. The ranking column sets each strategy "
                  f"against the one above it. {TIE_RULE}")
    for s_i, (scenario, frame) in enumerate(data.done.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            break
        table = worst_case(data, frame)
        if not len(table):
            continue
        fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(table) + 2), 3.2))
        x = range(len(table))
        ax.bar(x, table["worst case"], yerr=table["worst case std"].fillna(0), color="tab:red", alpha=0.75,
               label="worst case over attacks", capsize=3)
        ax.scatter(x, table["clean"], color="black", marker="_", s=300, label="no attack", zorder=3)
        ax.set_xticks(list(x), table["strategy"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"final {data.metric}", fontsize=8)
        ax.set_title(f"{scenario}: worst case over attacks", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        sec.figures.append((f"worst_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: worst case per strategy"))
        shown = table.copy()
        chance = chance_level(data.metric, data.num_classes(frame))
        shown["worst case"] = [_pm(m, s) + (" (chance)" if at_chance(m, chance) else "")
                               for m, s in zip(table["worst case"], table["worst case std"])]
        shown["ranking"] = rank_with_ties(list(table["strategy"]), list(table["worst case"]),
                                          list(table["worst case std"]))
        shown = shown.drop(columns=["worst case std"]).round(3)
        sec.tables.append((f"{scenario}: worst case over attacks", shown.set_index("strategy")))
    return sec


def section_trust(data: ReportData, max_cells: int = 8) -> Section:
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    sec = Section("Trust trajectories", "Per hospital and round, the trust (or reputation) a trust rule gave it; "
                  "malicious hospitals (simulation ground truth) in red, honest ones in grey.")
    cl = data.clients
    if not len(cl):
        sec.text += " No per-client records."
        return sec
    cl = cl.copy()
    cl["signal"] = cl["trust"]  # the rule's own trust signal, whichever it names (HTA's reputation, FLTrust's trust)
    with_signal = cl[cl["signal"].notna()]
    if not len(with_signal):
        sec.text += " No cell of this grid recorded per-client `trust` or `reputation` (no trust rule ran)."
        return sec
    cells = data.done.set_index("cell")
    picked = []
    for cell_name, sub in with_signal.groupby("cell"):
        if cell_name not in cells.index:
            continue
        row = cells.loc[cell_name]
        picked.append((row.get("seed", 0), row["attack_label"] == "none", row["scenario"], row["variant"], row["attack_label"], cell_name))
    picked.sort()
    # one seed only; attacked cells first
    seen_pairs, chosen = set(), []
    for seed, clean, scenario, variant, attack, cell_name in picked:
        if (scenario, variant, attack) in seen_pairs:
            continue
        seen_pairs.add((scenario, variant, attack))
        chosen.append((scenario, variant, attack, cell_name))
    chosen = chosen[:max_cells]
    ncols = min(4, len(chosen))
    nrows = math.ceil(len(chosen) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.7 * nrows), squeeze=False)
    for ax, (scenario, variant, attack, cell_name) in zip(axes.flat, chosen):
        sub = with_signal[with_signal["cell"] == cell_name]
        for hospital, h in sub.groupby("hospital"):
            mal = bool(h["malicious"].any())
            ax.plot(h["round"], h["signal"], color="tab:red" if mal else "0.55", lw=1.6 if mal else 0.9,
                    alpha=0.95 if mal else 0.7)
        ax.set_title(f"{variant} / {attack}", fontsize=8)
        ax.set_xlabel("round", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    axes[0][0].set_ylabel("trust / reputation", fontsize=8)
    fig.tight_layout()
    sec.figures.append(("trust.png", _png(fig), "trust per hospital and round (red: malicious)"))
    return sec


def section_detection(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    sec = Section("Detection: TPR and FPR", "Whole-run detection rates against the simulation's ground truth "
                  "(a hospital counts as flagged in a round when it was rejected, left out or flagged by the rule); "
                  "mean over seeds; attacked cells only.")
    if "detection_tpr" not in data.done:
        return sec
    for s_i, (scenario, frame) in enumerate(data.done.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            break
        frame = frame[frame["attack_label"] != "none"]
        if not len(frame) or frame["detection_tpr"].isna().all():
            continue
        rows, cols = data.strategy_order(frame), data.attack_order(frame)
        fig, axes = plt.subplots(1, 2, figsize=(2 * (0.9 * len(cols) + 2.5), 0.45 * len(rows) + 1.8))
        for ax, column, title in ((axes[0], "detection_tpr", "TPR"), (axes[1], "detection_fpr", "FPR")):
            mean, text = _matrix(_final_stats(data, frame, column), rows, cols, digits=2)
            _heatmap(ax, mean, text, f"{title}", cmap="magma" if title == "TPR" else "magma_r")
            sec.tables.append((f"{scenario}: detection {title}", text.rename_axis("strategy")))
        fig.suptitle(scenario, fontsize=10)
        fig.tight_layout()
        sec.figures.append((f"detection_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: detection TPR / FPR"))
    return sec


def section_spread(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    sec = Section("Per-hospital accuracy spread", "The final global model's accuracy on each hospital's own validation "
                  "split (federated evaluation): spread = best - worst hospital, over all cells (attacks x seeds) "
                  "of a strategy; lower is fairer.")
    if "hospital_acc_spread" not in data.done:
        return sec
    for s_i, (scenario, frame) in enumerate(data.done.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            break
        order = data.strategy_order(frame)
        groups = [frame.loc[frame["variant"] == v, "hospital_acc_spread"].dropna().to_numpy() for v in order]
        mins = [frame.loc[frame["variant"] == v, "hospital_acc_min"].dropna().to_numpy() for v in order]
        fig, axes = plt.subplots(1, 2, figsize=(max(6.0, 1.2 * len(order) + 3), 3.2))
        axes[0].boxplot(groups, tick_labels=order)
        axes[0].set_title("spread (max - min)", fontsize=9)
        axes[1].boxplot(mins, tick_labels=order)
        axes[1].set_title("worst hospital's accuracy", fontsize=9)
        for ax in axes:
            ax.tick_params(axis="x", rotation=30, labelsize=8)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(scenario, fontsize=10)
        fig.tight_layout()
        sec.figures.append((f"spread_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: per-hospital accuracy"))
    return sec


def paired_differences(data: ReportData, frame: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and attack: metric(strategy) - metric(baseline), same seed, scenario and attack."""
    col = f"final_{data.metric}"
    base = frame[frame["strategy"] == data.baseline]
    if not len(base):
        return pd.DataFrame()
    keys = ["scenario", "attack_label", "seed"]
    merged = frame[frame["strategy"] != data.baseline].merge(
        base[keys + [col]].rename(columns={col: "baseline_value"}), on=keys, how="inner")
    merged["diff"] = merged[col] - merged["baseline_value"]
    g = merged.groupby(["variant", "attack_label"])["diff"]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.count()}).reset_index()


def section_paired(data: ReportData, max_scenarios: int) -> Section:
    plt = _plt()
    sec = Section(f"Paired differences against {data.baseline}",
                  f"Final {data.metric} of each strategy minus {data.baseline}'s on the same seed, scenario and attack "
                  "(the same partitions, initial model and malicious hospitals); mean ± std over seeds (n pairs in the tables).")
    for s_i, (scenario, frame) in enumerate(data.done.groupby("scenario", sort=True)):
        if s_i >= max_scenarios:
            break
        diffs = paired_differences(data, frame)
        if not len(diffs):
            sec.text += f" No {data.baseline} cells in {scenario}."
            continue
        rows = [v for v in data.strategy_order(frame) if v in set(diffs["variant"])]
        cols = data.attack_order(frame)
        mean, text = _matrix(diffs, rows, cols)
        fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 3, 0.45 * len(rows) + 1.8))
        _heatmap(ax, mean, text, f"{scenario}: {data.metric} minus {data.baseline}", center_zero=True)
        sec.figures.append((f"paired_{s_i}_{_safe(scenario)}.png", _png(fig), f"{scenario}: paired differences"))
        n = diffs.pivot(index="variant", columns="attack_label", values="n").reindex(index=rows, columns=cols)
        text = text.where(n.isna(), text + " (n=" + n.fillna(0).astype(int).astype(str) + ")")
        sec.tables.append((f"{scenario}: {data.metric} minus {data.baseline}", text.rename_axis("strategy")))
    return sec


def section_findings(data: ReportData) -> Section | None:
    """The HTA authors' headline findings beside ours, when the grid can pair them."""
    from hospitrust.bench.findings import hta_findings

    table = hta_findings(data.done, data.metric)
    if not len(table):
        return None
    sec = Section("The HTA authors' findings beside ours",
                  f"Each of ours is the mean of paired differences of the final {data.metric}, in points, between "
                  "cells that differ only in the compared factor (same dataset, regime, seed, attacker fraction); "
                  "min .. max over the pairs. The authors' figures are in points of balanced accuracy.")
    sec.tables.append(("HTA authors' findings and ours", table.set_index(["finding", "dataset"])))
    return sec


def section_overhead(data: ReportData) -> Section:
    sec = Section("Where the time went", "Per cell: wall time of the cell (measured by the bench worker; for a folder "
                  "of runs without bench.jsonl, the run's own wall_seconds), time inside rounds (local training, "
                  "aggregation, federated and central evaluation: the sum of the rounds' periods, record to record), and the rest: start-up, "
                  "data loading and partitioning, model init, the query round, writing results.")
    table = overhead_table(data.cells)
    if len(table):
        sec.tables.append(("overhead", table.round(3).set_index("cells")))
    failed = data.cells[data.cells["status"] == "failed"] if len(data.cells) else data.cells
    if len(failed):
        sec.tables.append(("failed cells", failed[["cell", "error"]].set_index("cell")))
    return sec


def md_table(df: pd.DataFrame) -> str:
    df = df.reset_index()
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    sep = "|" + "---|" * len(df.columns)
    body = ["| " + " | ".join("-" if (isinstance(v, float) and v != v) else str(v).replace("|", "/") for v in row) + " |"
            for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def make_report(grid_dir: str | Path, *, metric: str | None = None, baseline: str | None = None,
                out_dir: str | Path | None = None, max_scenarios: int = 6) -> tuple[Path, Path]:
    """Write report.html and report.md (with figures/) for a grid folder; returns their paths."""
    grid_dir = Path(grid_dir).resolve()
    data = ReportData(grid_dir, metric, baseline)
    out = Path(out_dir).resolve() if out_dir else grid_dir / "report"
    (out / "figures").mkdir(parents=True, exist_ok=True)
    n_done = len(data.done)
    n_failed = int((data.cells["status"] == "failed").sum()) if len(data.cells) else 0
    n_total = len(data.cells)
    title = f"hospitrust benchmark: {data.meta.get('name', grid_dir.name)}"
    intro = (f"{n_done} of {n_total} cells finished, {n_failed} failed. Headline metric: {data.metric}; "
             f"baseline for paired differences: {data.baseline}. "
             f"Seeds: {sorted(data.done['seed'].unique().tolist()) if n_done and 'seed' in data.done else '-'}. "
             f"Scenario axes: {', '.join(data.scenario_cols) or 'none'}; "
             f"hyperparameter axes: {', '.join(data.hyper_cols) or 'none'}.")
    sections = []
    if n_done:
        sections = [section_curves(data, max_scenarios), section_heatmaps(data, max_scenarios),
                    section_worst_case(data, max_scenarios), section_trust(data), section_detection(data, max_scenarios),
                    section_spread(data, max_scenarios), section_paired(data, max_scenarios)]
        findings = section_findings(data)
        if findings is not None:
            sections.append(findings)
    sections.append(section_overhead(data))

    md = [f"# {title}", "", intro, ""]
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(intro)}</p>"]
    for sec in sections:
        md += [f"## {sec.title}", "", sec.text, ""]
        body += [f"<h2>{html.escape(sec.title)}</h2>", f"<p>{html.escape(sec.text)}</p>"]
        for name, png, caption in sec.figures:
            (out / "figures" / name).write_bytes(png)
            md += [f"![{caption}](figures/{name})", ""]
            b64 = base64.b64encode(png).decode()
            body.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{b64}">'
                        f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        for caption, table in sec.tables:
            md += [f"**{caption}**", "", md_table(table), ""]
            body += [f"<h3>{html.escape(caption)}</h3>", table.to_html(border=0, classes="t", na_rep="-")]
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             "img{max-width:100%}figure{margin:1em 0}figcaption{font-size:.85em;color:#555}"
             "table.t{border-collapse:collapse;font-size:.8em;margin:.5em 0 1.5em}"
             "table.t td,table.t th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page)
    md_path.write_text("\n".join(md) + "\n")
    return html_path, md_path

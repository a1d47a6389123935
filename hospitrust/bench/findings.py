"""The HTA authors' headline findings, recomputed from a grid's cells and set beside theirs.

Each finding is a mean of paired differences of the final metric, in points (x 100): the two
cells of a pair share everything but the compared factor (dataset, heterogeneity regime, seed,
attacker fraction, and the rule where the rule is not what is compared), so partitions,
initial model and malicious hospitals are the same. A finding the grid cannot pair (a missing
regime, rule or attack) is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Finding:
    name: str
    authors_points: float  # the HTA authors' figure, in points of balanced accuracy
    meaning: str


FINDINGS = (
    Finding("heterogeneity cost", 16.4, "clean runs, IID minus Dirichlet 0.1, mean over rules"),
    Finding("attacker cost", 7.2, "no attack minus attacked, mean over rules, attacks and attacker fractions"),
    Finding("HTA clean gain over FedAvg", 4.6, "no attack, HTA minus FedAvg, mean over regimes"),
    Finding("Multi-Krum clean gain over FedAvg", 5.9, "no attack, Multi-Krum minus FedAvg, mean over regimes"),
    Finding("HTA minus Multi-Krum, sign flip", -4.9, "sign flip, HTA minus Multi-Krum"),
    Finding("HTA minus Multi-Krum, scaling", -6.7, "scaling, HTA minus Multi-Krum"),
)


def regime(frame: pd.DataFrame) -> pd.Series:
    """'iid', 'dir<alpha>' or the partitioner's name, per cell."""

    def one(row) -> str:
        part = row.get("partitioner", "dirichlet")
        if part == "dirichlet":
            return f"dir{float(row.get('dirichlet.alpha', 0.5)):g}"
        return str(part)

    return frame.apply(one, axis=1)


def _pairs(a: pd.DataFrame, b: pd.DataFrame, keys: list[str], value: str) -> pd.Series:
    """value(a) - value(b), matched on keys."""
    merged = a[keys + [value]].merge(b[keys + [value]], on=keys, suffixes=("_a", "_b"))
    return merged[f"{value}_a"] - merged[f"{value}_b"]


def hta_findings(cells: pd.DataFrame, metric: str = "balanced_accuracy") -> pd.DataFrame:
    """One row per finding and dataset: authors' points, ours (mean of pairs, points), pairs."""
    value = f"final_{metric}"
    if not len(cells) or value not in cells:
        return pd.DataFrame()
    frame = cells.copy()
    frame["regime"] = regime(frame)
    for col, default in (("dataset", "-"), ("seed", 0), ("attack", "none"), ("malicious-fraction", 0.0)):
        if col not in frame:
            frame[col] = default
    clean = frame[frame["attack"] == "none"]
    attacked = frame[frame["attack"] != "none"]
    rows = []
    for dataset, _ in frame.groupby("dataset", sort=True):
        c = clean[clean["dataset"] == dataset]
        a = attacked[attacked["dataset"] == dataset]
        diffs = {
            "heterogeneity cost": _pairs(c[c["regime"] == "iid"], c[c["regime"] == "dir0.1"], ["strategy", "seed"], value),
            "attacker cost": _pairs(c, a, ["strategy", "regime", "seed"], value),
            "HTA clean gain over FedAvg": _pairs(c[c["strategy"] == "hta"], c[c["strategy"] == "fedavg"],
                                                 ["regime", "seed"], value),
            "Multi-Krum clean gain over FedAvg": _pairs(c[c["strategy"] == "multi-krum"], c[c["strategy"] == "fedavg"],
                                                        ["regime", "seed"], value),
        }
        for attack in ("sign-flip", "scaling"):
            sub = a[a["attack"] == attack]
            diffs[f"HTA minus Multi-Krum, {attack.replace('-', ' ')}"] = _pairs(
                sub[sub["strategy"] == "hta"], sub[sub["strategy"] == "multi-krum"],
                ["regime", "seed", "malicious-fraction"], value)
        for f in FINDINGS:
            d = diffs[f.name]
            if len(d):
                rows.append({"finding": f.name, "dataset": dataset, "HTA authors (points)": f.authors_points,
                             "ours (points)": round(100.0 * float(d.mean()), 1),
                             "min .. max (points)": f"{100 * d.min():.1f} .. {100 * d.max():.1f}",
                             "pairs": int(len(d)), "how": f.meaning})
    return pd.DataFrame(rows)

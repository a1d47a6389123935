"""The cost of local differential privacy per rule, from a finished ``benchmarks/privacy.toml`` grid.

    python benchmarks/privacy_table.py runs/bench/privacy

For every rule, scenario and privacy level (the cells' ``privacy.mode`` / ``privacy.target-epsilon``
in config.json): the final balanced accuracy and AUC (mean ± sample std over seeds), their paired
differences to the same rule, scenario and seed without DP (AUC shows whether a model that predicts
one class at the default threshold still ranks the images), and the detection false-positive rate as issue 23 defines
it, from rounds.jsonl: the share of honest hospital-rounds a rule left out (HTA: excluded; Multi-Krum
and the median have no per-hospital exclusion of their own beyond ``selected``) or, for EARN, weighted
below half the honest median weight of that round. Cells whose seed lacks its DP-off twin are
reported without the difference.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hospitrust.records import RoundRecord
from hospitrust.server_app.results import read_round_records


def privacy_level(config: Mapping[str, Any]) -> str:
    """``off`` or ``eps<target-epsilon>`` (local), ``central`` / ``both`` marked as such."""
    mode = config.get("privacy.mode", "off")
    if mode == "off":
        return "off"
    eps = float(config.get("privacy.target-epsilon", 8.0))
    return f"eps{eps:g}" if mode == "local" else f"{mode}-eps{eps:g}"


def false_positive_rate(rounds: Iterable[RoundRecord], strategy: str) -> tuple[int, int]:
    """(honest hospital-rounds counted as detected, honest hospital-rounds) of one run.

    EARN: a hospital whose weight is below half the round's median honest weight; every other rule:
    a hospital left out of the aggregate (``selected`` false or ``excluded``). Rejected replies are
    not a rule's decision and are not counted; neither are hospitals out of their privacy budget.
    """
    detected = total = 0
    for r in rounds:
        honest = [c for c in r.clients if not c.malicious and not c.rejected]
        if not honest:
            continue
        if strategy.startswith("earn"):
            median = statistics.median(c.weight for c in honest)
            detected += sum(1 for c in honest if c.weight < 0.5 * median)
        else:  # left out by the rule or a feature (schema 1's ``excluded`` entries were never selected either)
            detected += sum(1 for c in honest if c.excluded)
        total += len(honest)
    return detected, total


def finished_cells(folder: Path) -> Iterator[tuple[Path, dict[str, Any], dict[str, Any], list[RoundRecord]]]:
    """(run folder, config.json, summary.json, rounds.jsonl records) of every finished cell under ``folder/cells``."""
    for path in sorted((folder / "cells").glob("*/summary.json")):
        run = path.parent
        rounds = read_round_records(run)
        yield run, json.loads((run / "config.json").read_text()), json.loads(path.read_text()), rounds


def read_cells(folder: Path) -> list[dict[str, Any]]:
    """One row per finished cell under ``folder/cells``."""
    out = []
    for run, config, summary, rounds in finished_cells(folder):
        fp, honest = false_positive_rate(rounds, config["strategy"])
        out.append({"cell": run.name, "strategy": config["strategy"], "attack": config.get("attack", "none"),
                    "seed": int(config["seed"]), "privacy": privacy_level(config),
                    "balanced_accuracy": float(summary["final"]["balanced_accuracy"]),
                    "auc": _number(summary["final"].get("auc")),
                    "fp": fp, "honest": honest,
                    "epsilon": float((summary.get("privacy") or {}).get("max_local_epsilon", 0.0))})
    return out


def _number(value: Any) -> float:
    """A metric from summary.json, where NaN is stored as null."""
    return float("nan") if value is None else float(value)


def _mean_sd(values: Sequence[float]) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f} (n=1)"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} (n={len(values)})"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: rule x scenario x privacy level -> balanced accuracy and AUC, their paired cost, FPR."""
    off = {(r["strategy"], r["attack"], r["seed"]): r for r in rows if r["privacy"] == "off"}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["strategy"], r["attack"], r["privacy"])].append(r)
    order = {"off": 0}
    lines = ["| rule | attack | privacy | max epsilon | balanced accuracy | cost vs off (paired) | AUC | AUC cost vs off "
             "(paired) | FPR |", "|---|---|---|---|---|---|---|---|---|"]
    def level_order(level: str) -> tuple[int, str, float]:  # off, then each mode by decreasing epsilon
        if level in order:
            return (order[level], "", 0.0)
        mode, _, eps = level.rpartition("eps")
        try:
            return (1, mode, -float(eps))
        except ValueError:
            return (1, level, 0.0)

    for key in sorted(groups, key=lambda k: (k[0], k[1], level_order(k[2]))):
        cells = groups[key]
        strategy, attack, level = key
        twins = [(c, off[(strategy, attack, c["seed"])]) for c in cells
                 if level != "off" and (strategy, attack, c["seed"]) in off]
        cost = {m: [c[m] - twin[m] for c, twin in twins] for m in ("balanced_accuracy", "auc")}
        fp, honest = sum(c["fp"] for c in cells), sum(c["honest"] for c in cells)
        fpr = f"{fp / honest:.3f} ({fp}/{honest})" if honest else "-"
        eps = max(c["epsilon"] for c in cells)
        lines.append(f"| {strategy} | {attack} | {level} | {eps:.2f} | {_mean_sd([c['balanced_accuracy'] for c in cells])} | "
                     f"{_mean_sd(cost['balanced_accuracy']) if twins else '-'} | {_mean_sd([c['auc'] for c in cells])} | "
                     f"{_mean_sd(cost['auc']) if twins else '-'} | {fpr} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    rows = read_cells(Path(argv[0]))
    if not rows:
        print(f"no finished cells under {argv[0]}/cells", file=sys.stderr)
        return 1
    print(table(rows))
    return 0 if all(math.isfinite(r["balanced_accuracy"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

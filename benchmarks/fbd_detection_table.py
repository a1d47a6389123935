"""FED-FBD's color detection over a bench grid: per group of cells, the share of attacked color-rounds flagged
(TPR) and of clean color-rounds flagged (FPR), and the final balanced accuracy.

A color is *reached* by the malicious hospital when that hospital writes it (``summary.json``:
``fbd.colors_reached_by_malicious``); every round's ``fbd.flagged_colors`` in ``rounds.jsonl`` is compared
with that set. In a cell without attack every flag is a false positive. Cells are grouped by the ``--by``
axes and averaged over seeds (mean ± standard deviation).

    python benchmarks/fbd_detection_table.py runs/bench/fbd-detection --by dataset,skew,attack
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from hospitrust.server_app.results import read_round_records


def cell_detection(cell: Path) -> dict[str, float]:
    """TPR, FPR (over color-rounds) and the final balanced accuracy of one finished FBD cell."""
    summary = json.loads((cell / "summary.json").read_text())
    fbd = summary["fbd"]
    reached = set(int(c) for c in fbd.get("colors_reached_by_malicious") or [])
    colors = set(int(c) for c in fbd["plan"]["writers"])
    attacked = bool(summary.get("malicious_hospitals")) and bool(reached)
    rounds_path = next(cell.rglob("rounds.jsonl"))
    tp = fn = fp = tn = 0
    for record in read_round_records(rounds_path.parent):
        flagged = set(int(c) for c in (record.entries.get("fbd") or {}).get("flagged_colors", []))
        bad = reached if attacked else set()
        tp += len(flagged & bad)
        fn += len(bad - flagged)
        fp += len(flagged - bad)
        tn += len(colors - bad - flagged)
    return {"tpr": tp / (tp + fn) if tp + fn else float("nan"), "fpr": fp / (fp + tn) if fp + tn else float("nan"),
            "balanced_accuracy": float(summary["final"]["balanced_accuracy"])}


def _ms(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def table(grid: Path, by: list[str]) -> str:
    """The Markdown table: one row per group of the ``by`` axes."""
    groups: dict[tuple[str, ...], list[dict[str, float]]] = {}
    for summary in sorted(grid.glob("cells/*/summary.json")):
        axes = dict(part.split("=", 1) for part in summary.parent.name.split("__"))
        groups.setdefault(tuple(axes[b] for b in by), []).append(cell_detection(summary.parent))
    lines = [f"| {' | '.join(by)} | seeds | TPR (attacked color-rounds flagged) | FPR (clean color-rounds flagged) | "
             "balanced accuracy |", "|" + "---|" * (len(by) + 4)]
    for key, cells in groups.items():
        lines.append(f"| {' | '.join(key)} | {len(cells)} | {_ms([c['tpr'] for c in cells])} | "
                     f"{_ms([c['fpr'] for c in cells])} | {_ms([c['balanced_accuracy'] for c in cells])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid_folder", type=Path)
    parser.add_argument("--by", default="dataset,skew,attack", help="comma list of the axes that make the rows")
    args = parser.parse_args()
    print(table(args.grid_folder, [b.strip() for b in args.by.split(",") if b.strip()]), end="")


if __name__ == "__main__":
    main()

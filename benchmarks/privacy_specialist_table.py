"""Does EARN still trust the honest specialist's rare-class row under local DP? From a finished
``benchmarks/privacy-specialist.toml`` grid: per rule and privacy level, the final rare-class macro-F1
(mean ± sample std over seeds) with its paired difference to DP off, and for EARN the specialist's
(``--hospital``, default hospital-0) record on its rare class (``--label``, default 4) averaged over the
rounds: the share of rounds EARN counted it a holder of that class, its ``earn_trust`` on the row and
the row's weight it got (``rare_row_weight``).

    python benchmarks/privacy_specialist_table.py runs/bench/privacy-specialist
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from hospitrust.records import RoundRecord
from privacy_table import _mean_sd, _number, finished_cells, privacy_level  # benchmarks/, the script's own folder


def specialist_row(rounds: list[RoundRecord], hospital: str, label: int) -> dict[str, float]:
    """The specialist's mean over rounds: holder share, EARN trust and row weight on ``label`` (NaN if absent)."""
    held, trust, weight = [], [], []
    for record in rounds:
        entry = record.client(hospital)
        if entry is None or entry.signal("earn_trust") is None:
            continue
        held.append(1.0 if label in entry.signal("holds", []) else 0.0)
        trust.append(_number(entry.signal("earn_trust").get(str(label))))
        weight.append(_number((entry.signal("rare_row_weight") or {}).get(str(label))))

    def mean(xs: list[float]) -> float:
        xs = [x for x in xs if math.isfinite(x)]
        return statistics.mean(xs) if xs else float("nan")

    return {"held": mean(held), "trust": mean(trust), "row_weight": mean(weight)}


def read_cells(folder: Path, hospital: str, label: int) -> list[dict[str, Any]]:
    """One row per finished cell under ``folder/cells``."""
    out = []
    for _, config, summary, rounds in finished_cells(folder):
        out.append({"strategy": config["strategy"], "seed": int(config["seed"]), "privacy": privacy_level(config),
                    "rare_f1": _number(summary["final"].get("rare_class_macro_f1")),
                    **specialist_row(rounds, hospital, label)})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: rule x privacy level -> rare-class macro-F1, its paired cost, the specialist's row."""
    off = {(r["strategy"], r["seed"]): r["rare_f1"] for r in rows if r["privacy"] == "off"}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["strategy"], r["privacy"])].append(r)

    def level(key: str) -> tuple[int, float]:
        return (0, 0.0) if key == "off" else (1, -float(key.rpartition("eps")[2] or 0))

    lines = ["| rule | privacy | rare-class macro-F1 | cost vs off (paired) | specialist held the class (share of rounds) | "
             "its EARN trust on the row | its row weight |", "|---|---|---|---|---|---|---|"]
    for strategy, privacy in sorted(groups, key=lambda k: (k[0], level(k[1]))):
        cells = groups[(strategy, privacy)]
        cost = [c["rare_f1"] - off[(strategy, c["seed"])] for c in cells if privacy != "off" and (strategy, c["seed"]) in off]
        lines.append(f"| {strategy} | {privacy} | {_mean_sd([c['rare_f1'] for c in cells])} | {_mean_sd(cost) if cost else '-'} | "
                     f"{_mean_sd([c['held'] for c in cells])} | {_mean_sd([c['trust'] for c in cells])} | "
                     f"{_mean_sd([c['row_weight'] for c in cells])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", type=Path)
    ap.add_argument("--hospital", default="hospital-0", help="the specialist (default hospital-0)")
    ap.add_argument("--label", type=int, default=4, help="its rare class (default 4, RetinaMNIST's grade 4)")
    args = ap.parse_args(argv)
    rows = read_cells(args.grid, args.hospital, args.label)
    if not rows:
        print(f"no finished cells under {args.grid}/cells", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

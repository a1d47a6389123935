"""Issue 60's default check on the grid ``default-check.toml`` ran: each attacked cell within 0.02 of the same
seed's clean run in balanced accuracy (``attacked - clean >= -0.02``), for the sign flip and the aware attack.

    hospitrust bench benchmarks/defaults/default-check.toml --out runs/defaults-check
    python benchmarks/defaults/default_check.py runs/defaults-check

Prints one line per seed and attack and the verdict; exits 0 when every pair holds, 1 when one does not, 2 when the
grid has not finished.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

CLEAN = "none"
ATTACKS = ("sign-flip", "aware")
SLACK = 0.02


def read_cells(run: Path) -> dict[tuple[str, int], float]:
    """(attack label, seed) -> final balanced accuracy, for the finished cells."""
    out = {}
    with open(run / "cells.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("status") == "done":
                out[(row["attack"], int(row["seed"]))] = float(row["final_balanced_accuracy"])
    return out


def check(cells: dict[tuple[str, int], float]) -> list[dict]:
    """One row per (attack, seed): the clean and attacked figures, their difference and whether it holds."""
    seeds = sorted({s for _, s in cells})
    missing = [(a, s) for a in (CLEAN, *ATTACKS) for s in seeds if (a, s) not in cells]
    if missing or not seeds:
        raise SystemExit(f"default_check: {len(missing)} cells are not finished, e.g. {missing[:3]}: run the grid to "
                         "its end")
    rows = []
    for attack in ATTACKS:
        for seed in seeds:
            clean, attacked = cells[(CLEAN, seed)], cells[(attack, seed)]
            # rounded to the reported digits so a figure that prints -0.020 holds on any CPU's last bits
            diff = round(attacked - clean, 6)
            rows.append({"attack": attack, "seed": seed, "clean": clean, "attacked": attacked, "diff": diff,
                         "holds": diff >= -SLACK})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the grid's folder (hospitrust bench ... --out RUN)")
    args = parser.parse_args(argv)
    if not (args.run / "cells.csv").is_file():
        print(f"default_check: {args.run} has no cells.csv (run the grid first)", file=sys.stderr)
        return 2
    try:
        rows = check(read_cells(args.run))
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{'attack':<10} {'seed':>4} {'clean':>7} {'attacked':>8} {'diff':>7}  verdict")
    for r in rows:
        print(f"{r['attack']:<10} {r['seed']:>4} {r['clean']:>7.4f} {r['attacked']:>8.4f} {r['diff']:>+7.4f}  "
              f"{'holds' if r['holds'] else 'fails'}")
    ok = all(r["holds"] for r in rows)
    print(f"default check: {'holds' if ok else 'fails'} ({sum(r['holds'] for r in rows)} of {len(rows)} within "
          f"{SLACK} of the clean run)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

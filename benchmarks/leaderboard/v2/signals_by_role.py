"""One cell's per-round trust signals, attackers against honest hospitals: which signal an attack fools.

Reads a finished cell's ``rounds.jsonl`` (``hospitrust bench`` output, schema 2 records) and prints, for the
chosen rounds, the central balanced accuracy, the aggregate's norm, and the mean over the attackers and over the
honest hospitals of each named signal of the rule (``signals[<rule>][<name>]``), of the weight the rule gave and
of the update norm it saw; rejected replies are counted, not averaged.

    python benchmarks/leaderboard/v2/signals_by_role.py CELL_DIR --rule hta --signals s,m,v,tau,reputation
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f}" if values else "-"


def table(rounds: list, rule: str, signals: list[str], wanted: set[int] | None) -> list[str]:
    """The report's lines: one per chosen round."""
    head = ["round", "bal-acc", "agg-norm", *[f"{k} (att / hon)" for k in [*signals, "weight", "norm"]], "rejected"]
    lines = [" | ".join(head)]
    for r in rounds:
        if wanted and r.number not in wanted:
            continue
        kept = [h for h in r.clients if not h.rejected]
        by_role = {True: [h for h in kept if h.malicious], False: [h for h in kept if not h.malicious]}

        def signal(hs, name):
            return [float(v) for h in hs if isinstance(v := h.signals.get(rule, {}).get(name), (int, float))]

        cells = [f"{_mean(signal(by_role[True], k))} / {_mean(signal(by_role[False], k))}" for k in signals]
        norms = {role: [h.update_norm for h in hs if h.update_norm is not None] for role, hs in by_role.items()}
        cells += [f"{_mean([h.weight for h in by_role[True]])} / {_mean([h.weight for h in by_role[False]])}",
                  f"{_mean(norms[True])} / {_mean(norms[False])}"]
        bal = r.central.get("balanced_accuracy") if r.central else None
        lines.append(" | ".join([str(r.number), f"{bal:.3f}" if bal is not None else "-", f"{r.update_norm or 0.0:.4f}", *cells,
                                 str(len(r.clients) - len(kept))]))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table of one cell; 2 when the folder holds no rounds.jsonl."""
    from hospitrust.server_app.results import read_round_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", help="a finished cell's folder (holds rounds.jsonl)")
    ap.add_argument("--rule", required=True, help="the rule whose signals to read (its section name: hta, earn, ...)")
    ap.add_argument("--signals", default="", help="comma-separated signal names of that rule (e.g. s,m,v,tau,reputation)")
    ap.add_argument("--rounds", default="1,2,3,5,10,20,30,40", help="comma-separated rounds to print ('' for all)")
    args = ap.parse_args(argv)
    path = Path(args.cell) / "rounds.jsonl"
    if not path.is_file():
        print(f"signals_by_role: {path} does not exist; expected a finished cell's folder", file=sys.stderr)
        return 2
    rounds = read_round_records(path.parent)
    wanted = {int(x) for x in args.rounds.split(",") if x.strip()} or None
    signals = [s for s in args.signals.split(",") if s]
    print(args.cell)
    print("\n".join(table(rounds, args.rule, signals, wanted)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

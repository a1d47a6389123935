"""How much a metric of the global model moves from one round to the next, over the last rounds
of finished runs: the noise floor a comparison of two final models has to clear.

    python benchmarks/metric_swing.py runs/retina30-s42 runs/retina30-s1 --metric rare_class_macro_f1 --rounds 10

Each argument is a run directory (with ``rounds.jsonl``) or a folder searched for them. Prints,
per run and over all runs: the standard deviation of the metric over the last ``--rounds``
rounds, the mean absolute change between consecutive rounds there, and the share of those
changes larger than ``--margin`` (a gate's tolerance, 0.05 by default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from hospitrust.server_app import results


def find_runs(paths: list[str]) -> list[Path]:
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / "rounds.jsonl").is_file():
            runs.append(p)
        elif p.is_dir():  # runs are often linked into a folder: follow the links
            runs.extend(sorted(Path(d) for d, _, files in os.walk(p, followlinks=True) if "rounds.jsonl" in files))
        else:
            raise SystemExit(f"{p}: not a run directory (no rounds.jsonl) nor a folder holding runs")
    return runs


def metric_series(run: Path, metric: str) -> list[float]:
    """The rounds' central ``metric``, in order, over the rounds that report it."""
    return [float(r.central[metric]) for r in results.read_round_records(run)
            if isinstance(r.central.get(metric), (int, float))]


def swing(values: list[float], rounds: int, margin: float) -> dict[str, float]:
    """Standard deviation, mean |change| and share of |changes| > margin over the last ``rounds`` values."""
    tail = values[-rounds:]
    changes = [abs(b - a) for a, b in zip(tail, tail[1:])]
    return {"std": statistics.pstdev(tail), "mean_change": statistics.mean(changes),
            "over_margin": sum(c > margin for c in changes) / len(changes), "final": tail[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    parser.add_argument("--metric", default="rare_class_macro_f1", help="a key of rounds.jsonl's 'central' record")
    parser.add_argument("--rounds", type=int, default=10, help="the last N rounds of each run (at least 2)")
    parser.add_argument("--margin", type=float, default=0.05, help="count the changes larger than this")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    rows = []
    for run in find_runs(args.runs):
        values = metric_series(run, args.metric)
        if len(values) < args.rounds:
            print(f"{run}: {len(values)} rounds with '{args.metric}', fewer than --rounds {args.rounds}: skipped",
                  file=sys.stderr)
            continue
        rows.append((run, swing(values, args.rounds, args.margin)))
    if not rows:
        print(f"no run with at least {args.rounds} rounds of '{args.metric}'", file=sys.stderr)
        return 1
    print(f"| run | final {args.metric} | std, last {args.rounds} | mean round-to-round change | "
          f"share of changes > {args.margin:g} |")
    print("|---|---|---|---|---|")
    for run, s in rows:
        print(f"| {run} | {s['final']:.3f} | {s['std']:.3f} | {s['mean_change']:.3f} | {s['over_margin']:.2f} |")
    mean = {k: statistics.mean(s[k] for _, s in rows) for k in ("final", "std", "mean_change", "over_margin")}
    print(f"| all {len(rows)} runs (mean) | {mean['final']:.3f} | {mean['std']:.3f} | {mean['mean_change']:.3f} | "
          f"{mean['over_margin']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

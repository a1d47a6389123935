"""The trust-rule tables from attack-matrix folders (benchmarks/attack_matrix.py output):
balanced accuracy / worst-class recall per attack and rule, rare-class macro-F1 per attack and
rule, detection of the rules that exclude, honest rare-class hospitals wrongly flagged, and
EARN's evidence Spearman.

    python benchmarks/trust_tables.py runs/attack-matrix [--attacks none,label-flip,...]
    python benchmarks/trust_tables.py runs/am-seed42 runs/am-seed1 runs/am-seed2   # + mean +- std over seeds
    python benchmarks/trust_tables.py runs/r-s42 runs/r-s1 runs/r-s2 --last-rounds 5  # + the same over the last 5 rounds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from hospitrust.server_app import results

RULES = ["fedavg", "median", "multi-krum", "fltrust", "fedagain", "hta", "earn"]
ATTACKS = ["none", "label-flip", "backdoor", "sign-flip", "scaling", "alie", "ipm", "min-max", "free-rider",
           "delayed-sign-flip"]


def _load(folder: Path, attack: str, rule: str) -> dict | None:
    path = folder / f"{attack}__{rule}" / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def late_mean(folder: Path, attack: str, rule: str, last: int, metric: str = "balanced_accuracy") -> float | None:
    """The cell's central ``metric`` averaged over its last ``last`` rounds."""
    run = folder / f"{attack}__{rule}"
    return results.late_mean(results.read_round_records(run), metric, last) if (run / "rounds.jsonl").is_file() else None


def _f(x, digits=3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def accuracy_table(folder: Path, attacks: list[str], rules: list[str]) -> str:
    rows = ["| attack | " + " | ".join(rules) + " |", "|---|" + "---|" * len(rules)]
    for attack in attacks:
        cells = []
        for rule in rules:
            s = _load(folder, attack, rule)
            cells.append("not run" if s is None else
                         f"{_f(s['final']['balanced_accuracy'])} / {_f(s['final']['worst_class_recall'])}")
        rows.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def detection_table(folder: Path, attacks: list[str], rules: list[str]) -> str:
    rows = ["| attack | rule | TPR | FPR | honest rare-class holders | wrongly flagged (hospital-rounds) |",
            "|---|---|---|---|---|---|"]
    for attack in attacks:
        for rule in rules:
            s = _load(folder, attack, rule)
            if s is None:
                continue
            sec = s.get("security", {})
            rows.append(f"| {attack} | {rule} | {_f(sec.get('tpr'), 2)} | {_f(sec.get('fpr'), 2)} | "
                        f"{len(sec.get('honest_rare_class_holders', []))} | {sec.get('honest_rare_class_flagged', '-')} |")
    return "\n".join(rows)


def earn_spearman(folder: Path, attacks: list[str]) -> str:
    rows = ["| attack | EARN update-evidence Spearman vs true counts (mean over rounds) | per round |", "|---|---|---|"]
    for attack in attacks:
        run = folder / f"{attack}__earn"
        if not (run / "rounds.jsonl").is_file():
            continue
        per_round = []
        for r in results.read_round_records(run):
            vals = [c.signal("evidence_spearman") for c in r.clients if c.signal("evidence_spearman") is not None]
            if vals:
                per_round.append(vals[0])
        if per_round:
            rows.append(f"| {attack} | {statistics.mean(per_round):.2f} | {', '.join(f'{v:.2f}' for v in per_round)} |")
    return "\n".join(rows)


def seeds_table(folders: list[Path], attacks: list[str], rules: list[str], last: int = 0,
                metric: str = "balanced_accuracy") -> str:
    """A central metric (balanced accuracy by default), mean +- sample std over the folders (one
    seed each) that ran the cell: of the final model, or (``last`` > 0) of each run's mean over
    its last rounds. Runs without the metric (e.g. rare-class macro-F1 before it was recorded)
    are left out of the cell."""
    rows = ["| attack | " + " | ".join(rules) + " |", "|---|" + "---|" * len(rules)]
    for attack in attacks:
        cells = []
        for rule in rules:
            if last > 0:
                vals = [v for f in folders if (v := late_mean(f, attack, rule, last, metric)) is not None]
            else:
                vals = [s["final"][metric] for f in folders
                        if (s := _load(f, attack, rule)) is not None and s["final"].get(metric) is not None]
            vals = [v for v in vals if not math.isnan(v)]
            if not vals:
                cells.append("not run")
            elif len(vals) == 1:
                cells.append(f"{_f(vals[0])} (n=1)")
            else:
                cells.append(f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f} (n={len(vals)})")
        rows.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", help="attack-matrix folders; with several (one per seed), the first gets the per-cell tables")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--last-rounds", type=int, default=0, metavar="K",
                   help="also the seeds table of each run's balanced accuracy averaged over its last K rounds")
    args = p.parse_args(argv)
    if args.last_rounds < 0:
        p.error(f"--last-rounds must be >= 0, got {args.last_rounds}")
    folders, attacks, rules = [Path(f) for f in args.folders], args.attacks.split(","), args.rules.split(",")
    folder = folders[0]
    print("Balanced accuracy / worst-class recall\n")
    print(accuracy_table(folder, attacks, rules))
    print("\nDetection (rules that exclude or flag)\n")
    print(detection_table(folder, [a for a in attacks if a != "none"], [r for r in rules if r in ("hta", "earn", "multi-krum")]))
    print("\nEARN evidence\n")
    print(earn_spearman(folder, attacks))
    ran = [a for a in attacks if any(_load(f, a, r) for f in folders for r in rules)]
    if len(folders) > 1:
        print(f"\nBalanced accuracy over {len(folders)} folders (seeds): mean ± std\n")
        print(seeds_table(folders, ran, rules))
    if args.last_rounds:  # one folder too: the final model swings from round to round
        print(f"\nBalanced accuracy averaged over each run's last {args.last_rounds} rounds, over the seeds: mean ± std\n")
        print(seeds_table(folders, ran, rules, last=args.last_rounds))
    print(f"\nRare-class macro-F1 (macro-F1 over the federation's rare classes) of the final model, over "
          f"{len(folders)} folder(s): mean ± std\n")
    print(seeds_table(folders, ran, rules, metric="rare_class_macro_f1"))
    if args.last_rounds:
        print(f"\nThe same, averaged over each run's last {args.last_rounds} rounds\n")
        print(seeds_table(folders, ran, rules, last=args.last_rounds, metric="rare_class_macro_f1"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

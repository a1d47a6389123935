"""Attack x strategy matrix: every attack against the chosen rules, on the same data and seed.

Each cell is a whole federated run of the hospitrust ServerApp and ClientApp, in process
(hospitrust.ops.inprocess: no Ray, so the per-run overhead stays small on a few cores); cells
run in parallel worker processes, and a finished cell (its summary.json exists) is skipped,
so the script can be stopped and started again.

    python benchmarks/attack_matrix.py --out runs/attack-matrix --workers 2 \\
        -c 'num-server-rounds=5 local-epochs=1'

Prints a Markdown table (final balanced accuracy, AUC, attack success rate where it
applies, detection TPR/FPR) and writes it to OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ATTACKS = [
    "none", "label-flip", "backdoor", "corruption", "label-noise", "sign-flip", "scaling", "gaussian-noise",
    "free-rider", "alie", "ipm", "min-max", "min-sum", "fang-trimmed-mean", "fang-median", "mimic", "sybil",
]
STRATEGIES = ["fedavg", "median", "trimmed-mean", "krum", "multi-krum", "fltrust"]
# the targeted label flip (pneumonia -> normal: a missed diagnosis) has a success rate to report
ATTACK_DEFAULTS = {"label-flip.mode": "source-to-target", "label-flip.source": 1, "label-flip.target": 0}
# named variants: an attack with a schedule (honest for 2 rounds to earn trust, then attacking)
VARIANTS = {"delayed-sign-flip": {"attack": "sign-flip", "attack-schedule.start-round": 2},
            "delayed-label-flip": {"attack": "label-flip", "attack-schedule.start-round": 2}}
# the trust-rule comparison (issue: trust rules), beside fedavg, median, multi-krum, fltrust
TRUST_ATTACKS = ["none", "label-flip", "backdoor", "sign-flip", "scaling", "alie", "ipm", "min-max", "free-rider",
                 "delayed-sign-flip"]


def _cell_config(base: dict, attack: str, strategy: str, fraction: float, out: Path,
                 overrides: dict | None = None) -> dict:
    """pyproject defaults < the matrix's attack defaults < -c overrides < the cell's own keys; then,
    as a `hospitrust bench` grid does, only the keys of the components this cell selects (label-flip's
    options go to the label-flip cells; an -c key of a rule the cell does not run is left out).
    """
    from hospitrust.config import legacy
    from hospitrust.config.run import preset_key_problems, restrict_to_active

    own = {"strategy": strategy, "attack": attack, "output-dir": str(out), "run-name": f"{attack}__{strategy}",
           **VARIANTS.get(attack, {})}
    if attack == "none":
        own["malicious-fraction"], own["malicious-hospitals"] = 0.0, ""
    elif not str((overrides or {}).get("malicious-hospitals", "")).strip():  # named attackers (-c) win over the fraction
        own["malicious-fraction"] = fraction
    # rules sized for f: the true number of attackers (a generous assumption for the defence)
    own["assumed-malicious"] = max(1, round(fraction * 10))
    cfg, _notes = legacy.translate({**base, **ATTACK_DEFAULTS, **(overrides or {}), **own})
    explicit = legacy.translate_keys({*(overrides or {}), *own}, cfg)
    problems = preset_key_problems(cfg, explicit)
    if problems:
        raise ValueError(f"cell {own['run-name']}: " + "; ".join(problems))
    return restrict_to_active(cfg)


def _run_cell(args: tuple[dict, int]) -> tuple[str, float, str]:
    cfg, hospitals = args
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)  # per-round lines of many runs would interleave
    from hospitrust.ops.inprocess import run_inprocess

    started = time.time()
    try:
        run_inprocess(cfg, hospitals)
        return cfg["run-name"], time.time() - started, ""
    except Exception as exc:  # recorded, the other cells go on
        return cfg["run-name"], time.time() - started, f"{type(exc).__name__}: {exc}"


def _fmt(x, digits=3) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else f"{x:.{digits}f}"


def table(out: Path, attacks: list[str], strategies: list[str]) -> str:
    rows = ["| attack | strategy | balanced acc | AUC | worst recall | attack success | detection TPR | detection FPR |",
            "|---|---|---|---|---|---|---|---|"]
    for attack in attacks:
        for strategy in strategies:
            path = out / f"{attack}__{strategy}" / "summary.json"
            if not path.is_file():
                rows.append(f"| {attack} | {strategy} | failed or not run | | | | | |")
                continue
            s = json.loads(path.read_text())
            f, sec = s["final"], s.get("security", {})
            rows.append(f"| {attack} | {strategy} | {_fmt(f['balanced_accuracy'])} | {_fmt(f['auc'])} | "
                        f"{_fmt(f.get('worst_class_recall'))} | "
                        f"{_fmt(f.get('attack_success_rate'))} | {_fmt(sec.get('tpr'), 2)} | {_fmt(sec.get('fpr'), 2)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from hospitrust.config import parse_run_config
    from hospitrust.ops.simulate import app_config_defaults, parse_overrides

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/attack-matrix")
    parser.add_argument("--hospitals", type=int, default=10)
    parser.add_argument("--malicious-fraction", type=float, default=0.3)
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-c", "--run-config", action="append", default=[])
    args = parser.parse_args(argv)

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = app_config_defaults()
    overrides = parse_overrides(args.run_config, base)
    attacks, strategies = args.attacks.split(","), args.strategies.split(",")
    cells = []
    for attack in attacks:
        for strategy in strategies:
            try:  # a bad cell fails here, before any run
                cfg = _cell_config(base, attack, strategy, args.malicious_fraction, out, overrides)
                parse_run_config(cfg)
            except ValueError as exc:  # ConfigError is one
                parser.error(f"{exc}")
            if not (out / cfg["run-name"] / "summary.json").is_file():
                cells.append((cfg, args.hospitals))
    total = len(attacks) * len(strategies)
    print(f"attack matrix: {total} cells, {total - len(cells)} already done, {len(cells)} to run "
          f"on {args.workers} workers -> {out}", flush=True)
    started, done, failures = time.time(), 0, []
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for name, seconds, error in pool.imap_unordered(_run_cell, cells):
            done += 1
            elapsed = time.time() - started
            eta = elapsed / done * (len(cells) - done)
            print(f"[{done}/{len(cells)}] {name}: {'FAILED ' + error if error else 'done'} in {seconds:.0f} s "
                  f"(elapsed {elapsed:.0f} s, about {eta:.0f} s left)", flush=True)
            if error:
                failures.append((name, error))
                (out / f"{name}.error.txt").write_text(error)
    md = table(out, attacks, strategies)
    (out / "table.md").write_text(md + "\n")
    print(md)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Oracle exclusion: the federation without the hospitals an attack would make malicious.

What any rule that excluded the attackers perfectly, from the first round, could reach: the
same split, seed and rule, no attack, and the malicious hospitals' partitions simply absent
(in-process hospitals, as ``hospitrust bench`` runs them). Under a label flip, this is the
ceiling set by the data the honest hospitals hold: the flippers' rare-class images are lost
to every rule, whatever it detects.

Each final model (the oracle runs', and those of any ``--against`` run folders) is scored on
the test split with the full federation's rare classes (all hospitals' true training counts),
so the oracle's rare-class macro-F1 reads on the same classes as the full runs'.

    python benchmarks/oracle_exclusion.py --out runs/oracle --seeds 1,2,42 --strategies earn,fedavg \\
        --attack label-flip -c 'dataset=retinamnist num-server-rounds=30 local-epochs=2 \\
        train-subsample=1.0 train.class-weighted-loss=true label-flip.source=4 label-flip.target=0' \\
        --against runs/gates/natural-s*/*

A cell whose ``summary.json`` exists is not run again (an interrupted sweep resumes).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hospitrust import metrics
from hospitrust.server_app import results
from hospitrust.config import parse_run_config
from hospitrust.datasets.federation import load_arrays, simulated_hospital, test_set
from hospitrust.datasets.registry import dataset_info
from hospitrust.models import build_model
from hospitrust.bench.backends import run_inprocess_cell
from hospitrust.ops.simulate import app_config_defaults, parse_overrides
from hospitrust.attacks.threat_model import malicious_partitions
from hospitrust.models.training import predict_proba


def left_out(run_config: dict[str, Any], attack: str, hospitals: int) -> list[int]:
    """The partitions ``attack`` would make malicious under this run config (its seed, its
    ``malicious-fraction`` or ``malicious-hospitals``)."""
    threat = parse_run_config({**run_config, "attack": attack}).threat_model
    return sorted(malicious_partitions(threat, hospitals))


def run_oracle_cell(run_config: dict[str, Any], hospitals: int, leave_out: list[int], log) -> None:
    """One run of the ServerApp against the hospitals not in ``leave_out``, no attack; its log
    lines go to ``log``, the console keeps only warnings and errors (as in ``hospitrust bench``)."""
    kept = [i for i in range(hospitals) if i not in leave_out]
    if len(kept) < 2:
        raise SystemExit(f"leaving out {leave_out} keeps {len(kept)} of {hospitals} hospitals; a federation needs 2")
    quieted = [(h, h.level) for h in logging.getLogger("flwr").handlers]
    for h, _ in quieted:
        h.setLevel(logging.WARNING)
    try:
        run_inprocess_cell(run_config, len(kept), log,
                           node_configs=[{"partition-id": i, "num-partitions": hospitals} for i in kept])
    finally:
        for h, level in quieted:
            h.setLevel(level)


def federation_rare_classes(run_config: dict[str, Any], hospitals: int) -> list[int]:
    """The rare classes of the whole federation (all hospitals' true training counts), as the
    server computes them for a run with every hospital."""
    cfg = parse_run_config(run_config)
    info = dataset_info(cfg.dataset)
    load_arrays(cfg.federation)
    totals = np.sum([simulated_hospital(cfg.federation, pid, hospitals).train.class_counts(info.num_classes)
                     for pid in range(hospitals)], axis=0)
    return metrics.rare_classes(totals)


def score_model(run_dir: Path, run_config: dict[str, Any], rare: list[int]) -> dict[str, float]:
    """The run's final model (``model.pt``) on the test split: balanced accuracy and the
    rare-class macro-F1 over ``rare``."""
    cfg = parse_run_config(run_config)
    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
    model.load_state_dict(torch.load(run_dir / "model.pt", map_location="cpu"), strict=True)
    test = test_set(cfg.federation)
    pred = predict_proba(model, test.images, device=torch.device("cpu")).argmax(axis=1)
    labels = np.asarray(test.labels).reshape(-1)
    return {"balanced_accuracy": metrics.balanced_accuracy(labels, pred),
            "rare_f1": metrics.rare_class_macro_f1(labels, pred, rare)}


def run_config_of(run_dir: Path) -> dict[str, Any]:
    """A finished run's config (its ``config.json``), as run-config keys."""
    saved = results.read_config(run_dir)
    known = set(app_config_defaults())
    return {k: v for k, v in saved.items() if k in known}


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| seed | rule | federation | left out | rare classes | rare-class macro-F1 | balanced acc. |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["seed"], r["strategy"], r["federation"])):
        out.append(f"| {r['seed']} | {r['strategy']} | {r['federation']} | {r['left_out'] or '-'} | {r['rare']} | "
                   f"{r['rare_f1']:.3f} | {r['balanced_accuracy']:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for the oracle runs")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds")
    parser.add_argument("--strategies", default="earn,fedavg")
    parser.add_argument("--attack", default="label-flip", help="whose hospitals to leave out: this attack's")
    parser.add_argument("--malicious-fraction", type=float, default=0.3,
                        help="share of hospitals the attack makes malicious (as attack_matrix.py), unless "
                             "malicious-hospitals is set with -c")
    parser.add_argument("--hospitals", type=int, default=10)
    parser.add_argument("-c", "--run-config", action="append", default=[])
    parser.add_argument("--against", nargs="*", default=[], type=Path,
                        help="finished run folders (full federation) to score the same way, for comparison")
    args = parser.parse_args(argv)

    defaults = app_config_defaults()
    base = {**defaults, **parse_overrides(args.run_config, defaults)}
    base.pop("attack", None)
    if not str(base.get("malicious-hospitals", "")).strip():  # named attackers (-c) win over the fraction
        base["malicious-fraction"] = args.malicious_fraction
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        cfg_seed = {**base, "seed": seed}
        rare = federation_rare_classes(cfg_seed, args.hospitals)
        gone = left_out(cfg_seed, args.attack, args.hospitals)
        if not gone:
            parser.error(f"--attack {args.attack} with this run config makes no hospital malicious "
                         "(set malicious-fraction or malicious-hospitals)")
        for strategy in strategies:
            name = f"oracle-s{seed}__{strategy}"
            run_config = {**cfg_seed, "strategy": strategy, "output-dir": str(args.out), "run-name": name}
            run_dir = args.out / name
            if not (run_dir / "summary.json").exists():
                started = time.time()
                print(f"[oracle] seed {seed} {strategy}: leaving out partitions {gone} ...", flush=True)
                with open(args.out / f"{name}.log", "w") as log:
                    run_oracle_cell(run_config, args.hospitals, gone, log)
                print(f"[oracle]   done in {time.time() - started:.0f} s ({run_dir})", flush=True)
            rows.append({"seed": seed, "strategy": strategy, "federation": f"without {args.attack}'s hospitals",
                         "left_out": ",".join(map(str, gone)), "rare": rare,
                         **score_model(run_dir, run_config, rare)})
    for run_dir in args.against:
        if not (run_dir / "model.pt").exists():
            print(f"[oracle] skipping {run_dir}: no model.pt", file=sys.stderr)
            continue
        cfg = run_config_of(run_dir)
        rare = federation_rare_classes(cfg, args.hospitals)
        rows.append({"seed": cfg.get("seed"), "strategy": cfg.get("strategy"),
                     "federation": f"all, attack {cfg.get('attack', 'none')}", "left_out": "", "rare": rare,
                     **score_model(run_dir, cfg, rare)})
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP and EE under SecAgg+ against the same run without it (Flower, in-process).

Runs the hospitrust ServerApp and ClientApps twice with the same seed and run config,
once with plain FedAvg and once with ``secure-aggregation = true`` (Flower's SecAgg+:
the server only unmasks the sum), both with ``contribution-scoring = true``, and prints
per round the largest difference of the global model and of each hospital's LOO, IOI,
FP and EE. Round 1 starts from the same model in both runs, so its difference is the
quantization error of SecAgg+ alone; later rounds also carry the (small) divergence of
training from slightly different models.

Example::

    nice -n 15 python benchmarks/contribution_secagg.py --hospitals 5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from hospitrust.config import RunConfig
from hospitrust.ops.inprocess import run_inprocess
from hospitrust.server_app.results import read_round_records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hospitals", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-subsample", type=float, default=0.1)
    ap.add_argument("--utility", default="balanced-accuracy", choices=["balanced-accuracy", "neg-loss"])
    args = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="secagg-check-"))
    runs = {}
    for secure in (False, True):
        cfg = RunConfig().to_flat()
        cfg.update({"num-server-rounds": args.rounds, "train-subsample": args.train_subsample, "local-epochs": 1,
                    "output-dir": str(out), "run-name": f"secure-{secure}", "contribution-scoring.enabled": True,
                    "contribution-scoring.utility": args.utility, "secagg.enabled": secure})
        run_inprocess(cfg, args.hospitals)
        runs[secure] = (read_round_records(out / f"secure-{secure}"), torch.load(out / f"secure-{secure}" / "model.pt"))
    print(f"\n{args.hospitals} hospitals, utility {args.utility}: SecAgg+ minus plain FedAvg, largest |difference| over hospitals")
    print("| round | LOO | IOI | FP | EE | FP (plain) range | EE (plain) range |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for plain, secure in zip(runs[False][0], runs[True][0]):
        p, s = plain.entries["contribution"]["hospitals"], secure.entries["contribution"]["hospitals"]
        diff = {k: max(abs(p[h][k] - s[h][k]) for h in p) for k in ("loo", "ioi", "fp", "ee")}
        rng = {k: (min(v[k] for v in p.values()), max(v[k] for v in p.values())) for k in ("fp", "ee")}
        rows.append({"round": plain.number, **diff})
        print(f"| {plain.number} | {diff['loo']:.2e} | {diff['ioi']:.2e} | {diff['fp']:.2e} | {diff['ee']:.2e} | "
              f"{rng['fp'][0]:+.4f} .. {rng['fp'][1]:+.4f} | {rng['ee'][0]:+.4f} .. {rng['ee'][1]:+.4f} |")
    model_diff = max(float((runs[False][1][k] - runs[True][1][k]).abs().max()) for k in runs[False][1])
    print(f"\nfinal global model: largest |difference| {model_diff:.2e}")
    print(json.dumps({"rows": rows, "final_model_max_abs_diff": model_diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

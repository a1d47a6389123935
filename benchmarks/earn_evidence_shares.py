"""What EARN's update-derived evidence reads from the updates: class shares or hospital size?

Runs one in-process EARN federation, captures every hospital's classifier-bias update and
num-examples per round, and prints per round the Spearman (mean over classes, across
hospitals) of:

- ``max(0, db)`` against the true counts (``earn-evidence = update``);
- ``db / S`` (S: local SGD steps) against the true class *shares*: class information alone;
- num-examples alone against the true counts: what hospital size gives for free;
- the update-count estimate ``n * clip(softmax(b) + db / (eta S), 0, 1)`` against the counts
  (``earn-evidence = update-count``).

    python benchmarks/earn_evidence_shares.py [--dataset pneumoniamnist] [--rounds 5] [--subsample 0.5]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch


def _spearman(e: np.ndarray, t: np.ndarray) -> float:
    from scipy.stats import spearmanr

    vals = [spearmanr(e[:, c], t[:, c]).correlation for c in range(t.shape[1])
            if np.std(e[:, c]) > 0 and np.std(t[:, c]) > 0]
    return float(np.mean(vals)) if vals else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="pneumoniamnist")
    p.add_argument("--hospitals", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--subsample", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()

    from flwr.app import Context, RecordDict

    from hospitrust.aggregation.earn import update_count_evidence
    from hospitrust.client_app import app as client_app
    from hospitrust.config import RunConfig, parse_run_config
    from hospitrust.datasets import federation
    from hospitrust.datasets.registry import dataset_info
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app

    cfg = RunConfig().to_flat()
    cfg.update({"dataset": a.dataset, "strategy": "earn", "num-server-rounds": a.rounds, "local-epochs": 1,
                "train-subsample": a.subsample, "seed": a.seed, "output-dir": tempfile.mkdtemp(),
                "run-name": "evidence", "checkpoint": False})
    captured: list[dict] = []

    def capture(index, incoming, reply):
        if reply.has_content() and "arrays" in reply.content.array_records:
            g = incoming.content["arrays"].to_torch_state_dict()
            r = reply.content["arrays"].to_torch_state_dict()
            key = [k for k in g if k.endswith("bias")][-1]  # the classifier's bias
            captured.append({"round": int(incoming.content["config"]["server-round"]), "index": index,
                             "db": (r[key] - g[key]).double(), "global_bias": g[key].double(),
                             "n": int(reply.content["metrics"]["num-examples"])})
        return reply

    server_app(InProcessGrid(client_app, a.hospitals, cfg, reply_filter=capture),
               Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    run_cfg = parse_run_config(cfg)
    classes = dataset_info(a.dataset).num_classes
    true = np.array([federation.simulated_hospital(run_cfg.federation, i, a.hospitals).train.class_counts(classes)
                     for i in range(a.hospitals)], dtype=float)
    shares = true / true.sum(axis=1, keepdims=True)
    print(f"{a.dataset}, {a.hospitals} hospitals, Dirichlet {run_cfg.dirichlet_alpha}, seed {a.seed}")
    print("| round | max(0, db) vs counts | db / S vs shares | num-examples alone vs counts | update-count vs counts |")
    print("|---|---|---|---|---|")
    for rnd in range(1, a.rounds + 1):
        rows = sorted((c for c in captured if c["round"] == rnd), key=lambda c: c["index"])
        db = torch.stack([c["db"] for c in rows])
        n = torch.tensor([c["n"] for c in rows], dtype=torch.float64)
        steps = torch.ceil(n / run_cfg.batch_size) * run_cfg.local_epochs
        est = update_count_evidence(db, n, rows[0]["global_bias"], learning_rate=run_cfg.learning_rate,
                                    batch_size=run_cfg.batch_size, local_epochs=run_cfg.local_epochs)
        print(f"| {rnd} | {_spearman(db.clamp_min(0).numpy(), true):.2f} | "
              f"{_spearman((db / steps[:, None]).numpy(), shares):.2f} | "
              f"{_spearman(np.repeat(n.numpy()[:, None], classes, 1), true):.2f} | {_spearman(est.numpy(), true):.2f} |")


if __name__ == "__main__":
    main()

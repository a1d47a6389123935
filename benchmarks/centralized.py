"""Centralized baseline: the same model, trained on the union of the hospitals' training data
with the same budget (epochs = rounds x local epochs, same optimizer, learning rate and batch
size, and with ``class-weighted-loss`` the union's balanced class weights), evaluated on the same
test split. The difference to a federated run is the federated gap. Rare-class macro-F1 is over
the union's rare classes, as the server computes it for federated runs.

    python benchmarks/centralized.py --hospitals 10 -c 'dataset=pneumoniamnist'

Prints one line per epoch and a final line in the same format as ``hospitrust simulate``.

For a run of your own, ``hospitrust reference pooled RUN_DIR`` (docs/getting-started.md) is the supported
way: the leaderboard's ``pooled`` control (the honest hospitals' partitions, the task's augmentation) for
the run's config, written into the run directory, with the gap shown by ``hospitrust report RUN_DIR``.
This script stays for the measurements that cite it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hospitrust import metrics
from hospitrust.config import parse_run_config
from hospitrust.datasets.federation import load_arrays, simulated_hospital, test_set
from hospitrust.datasets.registry import dataset_info
from hospitrust.models import build_model
from hospitrust.ops.simulate import app_config_defaults, parse_overrides
from hospitrust.models.training import balanced_class_weights, pick_device, predict_proba, seed_everything, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hospitals", type=int, default=10)
    parser.add_argument("-c", "--run-config", action="append", default=[])
    parser.add_argument("--json", help="also write the result to this JSON file")
    args = parser.parse_args(argv)

    defaults = app_config_defaults()
    cfg = parse_run_config({**defaults, **parse_overrides(args.run_config, defaults)})
    info = dataset_info(cfg.dataset)
    load_arrays(cfg.federation)
    # the union of exactly the samples the hospitals train on (their local train splits)
    shares = [simulated_hospital(cfg.federation, pid, args.hospitals).train for pid in range(args.hospitals)]
    images = np.concatenate([s.images for s in shares])
    labels = np.concatenate([s.labels for s in shares])
    test = test_set(cfg.federation)
    rare = metrics.rare_classes(np.bincount(labels.astype(np.int64), minlength=info.num_classes))
    # the union holds every class, so the hospital- and federation-level weights are the same here
    class_weights = balanced_class_weights(labels, info.num_classes) if cfg.train.class_weighted_loss else None

    seed_everything(cfg.seed)
    device = pick_device()
    model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
    epochs = cfg.num_server_rounds * cfg.local_epochs
    print(f"centralized: {cfg.dataset}, {cfg.model}, {labels.size} training images (union of {args.hospitals} "
          f"hospitals), {epochs} epochs, {cfg.train.optimizer} lr {cfg.learning_rate}, batch {cfg.batch_size}, "
          f"class weights {'balanced' if class_weights is not None else 'off'}, rare classes {rare}", flush=True)
    started = time.time()
    generator = torch.Generator().manual_seed(cfg.seed)
    report = {}
    for epoch in range(1, epochs + 1):
        train(model, images, labels, epochs=1, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
              optimizer=cfg.train.optimizer, momentum=cfg.train.momentum, weight_decay=cfg.train.weight_decay, device=device,
              generator=generator, class_weights=class_weights)
        probs = predict_proba(model, test.images, device=device)
        report = metrics.classification_report(test.labels, probs, info.num_classes)
        report["rare_class_macro_f1"] = metrics.rare_class_macro_f1(test.labels, probs.argmax(axis=1), rare)
        print(f"epoch {epoch:>3}/{epochs}  bal-acc {report['balanced_accuracy']:.4f}  auc {report['auc']:.4f}  "
              f"acc {report['accuracy']:.4f}  rare-class macro-F1 {report['rare_class_macro_f1']:.4f}", flush=True)
    wall = time.time() - started
    print(f"final (centralized, {cfg.dataset}, {epochs} epochs, {wall:.0f} s): accuracy {report['accuracy']:.4f}  "
          f"balanced accuracy {report['balanced_accuracy']:.4f}  AUC {report['auc']:.4f}  "
          f"worst-class recall {report['worst_class_recall']:.4f}  rare-class macro-F1 {report['rare_class_macro_f1']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"final": report, "wall_seconds": wall, "epochs": epochs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

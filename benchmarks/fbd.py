"""FED-FBD against FedAvg, containment of a poisoned hospital, unlearning, membership inference.

Runs, all with the same data, seed, model and budget (rounds x local epochs; in FBD each
hospital trains one color per round, as in FedAvg it trains the one global model):

- ``fedavg``: the baseline;
- ``fbd``: block ownership, 6 hospitals x 6 colors, redundancy 3, the routed ensemble;
- ``fbd-label-flip`` and ``fbd-noise``: the same, with hospital-0 flipping labels
  (pneumonia -> normal) or sending Gaussian noise N(0, 1) instead of its update;
- ``fedavg-label-flip``, ``fedavg-noise``: FedAvg under the same attacks, for context.

Then ``hospitrust unlearn`` of hospital-0 from the honest and the label-flip FBD runs
(time, utility drop, membership-inference AUROC of hospital-0's training images against
the test images, before and after), and the time of the unlearning set operation on a
full-size ResNet-18 warehouse (6 colors, 11.2M parameters each).

    python benchmarks/fbd.py --out runs/fbd-bench --workers 2 \\
        -c 'num-server-rounds=10 local-epochs=1 train-subsample=0.5 model=small-cnn'

A finished run (its summary.json exists) is skipped, so the script can be stopped and
restarted. Writes OUT/results.json and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

HOSPITALS = 6
ATTACKS = {
    "label-flip": {"attack": "label-flip", "label-flip.mode": "source-to-target", "label-flip.source": 1, "label-flip.target": 0},
    "noise": {"attack": "gaussian-noise", "gaussian-noise.sigma": 1.0},
}


def _parse_overrides(items: list[str]) -> dict:
    from hospitrust.ops.simulate import parse_overrides

    return parse_overrides(items)


def _runs(base: dict, out: Path) -> list[dict]:
    runs = []
    for strategy in ("fedavg", "fbd"):
        runs.append({**base, "strategy": strategy, "run-name": strategy, "output-dir": str(out)})
        for name, attack in ATTACKS.items():
            runs.append({**base, **attack, "strategy": strategy, "malicious-hospitals": "0",
                         "run-name": f"{strategy}-{name}", "output-dir": str(out)})
    return runs


def _run(cfg: dict) -> tuple[str, float, str]:
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from hospitrust.ops.inprocess import run_inprocess

    started = time.time()
    try:
        run_inprocess(cfg, HOSPITALS)
        return cfg["run-name"], time.time() - started, ""
    except Exception as exc:  # recorded; the other runs go on
        return cfg["run-name"], time.time() - started, f"{type(exc).__name__}: {exc}"


def routed_without(run_dir: Path, colors: list[int]) -> dict:
    """The run's routed ensemble on the test split without the named colors (here: the ones
    the stamp trails show the attacker reached)."""
    from hospitrust import metrics
    from hospitrust.datasets.registry import dataset_info
    from hospitrust.datasets.federation import test_set
    from hospitrust.cli.fbd import _run_config
    from hospitrust.fbd.routing import color_probabilities, route
    from hospitrust.fbd.warehouse import Warehouse

    cfg, _ = _run_config(run_dir)
    test = test_set(cfg.federation)
    probs = color_probabilities(Warehouse.load(run_dir / "warehouse.pt"), test.images)
    rep = metrics.classification_report(test.labels, route(probs, "ensemble", colors), dataset_info(cfg.dataset).num_classes)
    return {"excluded": colors, "accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"]}


def resnet18_unlearning_seconds(repeats: int = 3) -> dict:
    """The unlearning set operation alone on a ResNet-18 warehouse (28x28 stem, 2 classes)."""
    from hospitrust.fbd.plan import make_plan
    from hospitrust.fbd.unlearn import unlearn_hospital
    from hospitrust.fbd.warehouse import BlockVersion, Warehouse

    hospitals = [f"hospital-{i}" for i in range(HOSPITALS)]
    plan = make_plan(hospitals, 6, 3, seed=42)
    wh = Warehouse.create("resnet18", 1, 2, 28, 6, seed=42)
    for m in range(6):
        writers = plan.writers(m)
        for b in wh.block_names:
            v = wh.meta[(m, b)]
            wh.meta[(m, b)] = BlockVersion(v.hash, writers, writers, 10, writers[-1])
    times = []
    for _ in range(repeats):
        _, record = unlearn_hospital(wh, "hospital-0", plan)
        times.append(record.seconds)
    return {"seconds": times, "median_seconds": sorted(times)[len(times) // 2],
            "parameters_per_color": sum(v.numel() for v in wh.states[0].values()),
            "replaced_blocks": len(record.replaced), "exact": record.exact}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/fbd-bench")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-c", "--run-config", action="append", default=[])
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    from hospitrust.config import RunConfig

    base = {**RunConfig().to_flat(), "partitioner": "iid", "fbd.colors": 6, "fbd.redundancy": 3,
            **_parse_overrides(args.run_config)}
    todo = [cfg for cfg in _runs(base, out) if not (out / cfg["run-name"] / "summary.json").is_file()]
    started = time.time()
    if todo:
        with mp.get_context("spawn").Pool(max(1, args.workers)) as pool:
            for name, seconds, error in pool.imap_unordered(_run, todo):
                print(f"{name}: {'FAILED ' + error if error else 'done'} in {seconds:.0f} s", flush=True)

    from hospitrust.cli.fbd import unlearn_run
    from hospitrust.server_app.results import read_summary

    summaries = {cfg["run-name"]: read_summary(out / cfg["run-name"]) for cfg in _runs(base, out)}
    results: dict = {"config": {k: base[k] for k in ("dataset", "model", "num-server-rounds", "local-epochs",
                                                   "train-subsample", "partitioner", "fbd.distill-weight", "seed")},
                     "runs": {}}
    for name, s in summaries.items():
        results["runs"][name] = {"accuracy": s["final"]["accuracy"], "balanced_accuracy": s["final"]["balanced_accuracy"],
                                 "auc": s["final"]["auc"], "wall_seconds": s["wall_seconds"]}
    honest = summaries["fbd"]["fbd"]
    for name in ATTACKS:
        attacked = summaries[f"fbd-{name}"]["fbd"]
        clean = attacked["clean_colors"]
        drift = {str(m): attacked["final_colors"][str(m)]["auc"] - honest["final_colors"][str(m)]["auc"] for m in clean}
        tainted = attacked["colors_reached_by_malicious"]
        results["runs"][f"fbd-{name}"].update(
            without_attacker_colors=routed_without(out / f"fbd-{name}", tainted),
            clean_colors=clean,
            clean_color_auc_drift=drift,
            max_abs_clean_drift=max(abs(v) for v in drift.values()),
            clean_colors_bit_identical=all(attacked["block_hashes"][k] == honest["block_hashes"][k]
                                           for k in honest["block_hashes"] if int(k.split("/")[0]) in clean),
            tainted_color_auc={str(m): attacked["final_colors"][str(m)]["auc"] for m in tainted},
        )
    results["unlearning"] = {}
    for name in ("fbd", "fbd-label-flip"):
        rec = unlearn_run(out / name, "hospital-0")
        ev = rec["evaluation"]
        results["unlearning"][name] = {
            "seconds": rec["seconds"], "exact": rec["exact"], "replaced_blocks": len(rec["replaced"]),
            "donor_colors": rec["donor_colors"], "accuracy_before": ev["before"]["accuracy"],
            "accuracy_after": ev["after"]["accuracy"], "auc_before": ev["before"]["auc"], "auc_after": ev["after"]["auc"],
            "accuracy_drop": ev["accuracy_drop"], "auc_drop": ev["auc_drop"],
            "mia_auroc_before": ev["before"].get("mia_auroc"), "mia_auroc_after": ev["after"].get("mia_auroc"),
            "mia_auroc_val_before": ev["before"].get("mia_auroc_val"),
            "mia_auroc_val_after": ev["after"].get("mia_auroc_val"),
        }
    results["resnet18_unlearning"] = resnet18_unlearning_seconds()
    results["wall_seconds"] = time.time() - started
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = format_table(results)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def format_table(r: dict) -> str:
    runs = r["runs"]
    lines = ["| run | accuracy | balanced acc. | AUC | max clean-color AUC drift |", "|---|---|---|---|---|"]
    for name, v in runs.items():
        drift = f"{v['max_abs_clean_drift']:.4f} (colors {v['clean_colors']}, bit-identical: {v['clean_colors_bit_identical']})" \
            if "max_abs_clean_drift" in v else ""
        lines.append(f"| {name} | {v['accuracy']:.4f} | {v['balanced_accuracy']:.4f} | {v['auc']:.4f} | {drift} |")
        if "without_attacker_colors" in v:
            w = v["without_attacker_colors"]
            lines.append(f"| {name}, ensemble without colors {w['excluded']} | {w['accuracy']:.4f} | "
                         f"{w['balanced_accuracy']:.4f} | {w['auc']:.4f} | |")
    lines += ["", "| unlearn hospital-0 from | time | exact | accuracy before -> after | AUC before -> after "
              "| MIA AUROC vs test images | MIA AUROC vs held-out val images |", "|---|---|---|---|---|---|---|"]

    def pair(u, key):
        return f"{u[key + '_before']:.4f} -> {u[key + '_after']:.4f}" if u.get(key + "_before") is not None else ""

    for name, u in r["unlearning"].items():
        lines.append(f"| {name} | {u['seconds'] * 1000:.1f} ms | {u['exact']} | {u['accuracy_before']:.4f} -> "
                     f"{u['accuracy_after']:.4f} | {u['auc_before']:.4f} -> {u['auc_after']:.4f} | "
                     f"{pair(u, 'mia_auroc')} | {pair(u, 'mia_auroc_val')} |")
    rn = r["resnet18_unlearning"]
    lines.append(f"\nResNet-18 warehouse (6 colors x {rn['parameters_per_color']:,} parameters): unlearning one hospital "
                 f"replaces {rn['replaced_blocks']} block versions in {rn['median_seconds'] * 1000:.0f} ms (median of "
                 f"{len(rn['seconds'])}).")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

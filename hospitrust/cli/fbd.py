"""``hospitrust unlearn RUN_DIR --hospital H``: remove a hospital from an FBD run's warehouse.

Writes ``RUN_DIR/unlearned-<H>/warehouse.pt`` (the new model) and ``unlearning.json`` (the
record: replaced blocks with old and new hashes, donors, exactness, time, and unless
``--no-evaluate`` the routed ensemble's accuracy and AUC before and after and the
membership-inference AUROC of H's training images before and after), and appends the new
block versions to the run's stamp log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any



def add_unlearn_parser(sub) -> None:
    """Add the ``unlearn`` subcommand to the CLI's subparsers.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``hospitrust`` parser's subparsers (``add_subparsers()``).
    """
    p = sub.add_parser(
        "unlearn",
        help="remove a hospital from a block-ownership (fbd) run",
        description="Replace every block a hospital reached by the average of the colors it never reached; "
                    "write the new warehouse and an unlearning record.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of a strategy=fbd run")
    p.add_argument("--hospital", required=True, help="hospital name as in the run (e.g. hospital-2)")
    p.add_argument("--recalibrate-bn", action="store_true",
                   help="re-estimate BatchNorm statistics of the replaced blocks on the reference cohort")
    p.add_argument("--no-evaluate", action="store_true",
                   help="skip the before/after evaluation (utility and membership inference)")
    p.add_argument("--out", help="output folder (default RUN_DIR/unlearned-<hospital>)")
    p.set_defaults(func=unlearn_command)


def _run_config(run_dir: Path):
    from hospitrust.config import RunConfig, parse_run_config

    saved = json.loads((run_dir / "config.json").read_text())
    known = set(RunConfig().to_flat())
    return parse_run_config({k: v for k, v in saved.items() if k in known}), saved


def evaluate_unlearning(cfg, saved: dict[str, Any], hospital: str, before, after) -> dict[str, Any]:
    """Routed ensemble on the test split before/after, and the membership-inference AUROC of
    the hospital's training images (members) against the test images (non-members).

    Parameters
    ----------
    cfg : RunConfig
        The run's validated config.
    saved : dict[str, Any]
        The run's ``config.json`` (its ``partitions`` and ``num-partitions``).
    hospital : str
        The hospital unlearned.
    before : Warehouse
        The warehouse before unlearning.
    after : Warehouse
        The warehouse after.

    Returns
    -------
    dict[str, Any]
        ``before`` and ``after`` metrics (accuracy, balanced accuracy, AUC, membership-inference
        AUROCs), ``accuracy_drop``, ``auc_drop`` and the routing mode.
    """
    from hospitrust import metrics
    from hospitrust.datasets.registry import dataset_info
    import numpy as np

    from hospitrust.datasets.federation import load_arrays, simulated_hospital, test_set
    from hospitrust.datasets.partitioners import reference_cohort
    from hospitrust.fbd.mia import mia_auroc
    from hospitrust.fbd.routing import color_probabilities, parse_color_list, route

    info = dataset_info(cfg.dataset)
    test = test_set(cfg.federation)
    exclude = parse_color_list(cfg.options("fbd").exclude_colors, cfg.options("fbd").colors)
    out: dict[str, Any] = {"routing_mode": cfg.options("fbd").routing}
    partitions = saved.get("partitions", {})
    # non-members from the members' own distribution too: the val split minus the reference
    # cohort (no hospital holds it, nothing trains on it); the test split alone mixes membership
    # with the train/test distribution shift of the dataset
    arrays = load_arrays(cfg.federation)
    held_out = np.ones(arrays.labels["val"].shape[0], dtype=bool)
    held_out[reference_cohort(arrays.labels["val"], cfg.reference_cohort_per_class, seed=cfg.seed)] = False
    val_images, val_labels = arrays.images["val"][held_out], arrays.labels["val"][held_out].reshape(-1)
    members = None
    if hospital in partitions and int(partitions[hospital]) >= 0:
        num_partitions = int(saved.get("num-partitions", len(partitions)))
        members = simulated_hospital(cfg.federation, int(partitions[hospital]), num_partitions).train
    for label, wh in (("before", before), ("after", after)):
        probs = color_probabilities(wh, test.images)
        routed = route(probs, cfg.options("fbd").routing, exclude)
        rep = metrics.classification_report(test.labels, routed, info.num_classes)
        out[label] = {"accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"]}
        if members is not None and len(members):
            member_probs = route(color_probabilities(wh, members.images), cfg.options("fbd").routing, exclude)
            out[label]["mia_auroc"] = mia_auroc(member_probs, members.labels, routed, test.labels)
            if len(val_labels):
                val_probs = route(color_probabilities(wh, val_images), cfg.options("fbd").routing, exclude)
                out[label]["mia_auroc_val"] = mia_auroc(member_probs, members.labels, val_probs, val_labels)
    out["accuracy_drop"] = out["before"]["accuracy"] - out["after"]["accuracy"]
    out["auc_drop"] = out["before"]["auc"] - out["after"]["auc"]
    if members is None:
        out["mia_note"] = f"{hospital} is not a simulated hospital of this run: its training images are not on the server"
    return out


def unlearn_run(run_dir: str | Path, hospital: str, *, recalibrate_bn: bool = False, evaluate: bool = True,
                out: str | Path | None = None) -> dict[str, Any]:
    """The whole command; returns the unlearning record (also written to disk).

    Parameters
    ----------
    run_dir : str or Path
        The directory of a strategy=fbd run.
    hospital : str
        The hospital to remove, by name.
    recalibrate_bn : bool
        Re-estimate the replaced blocks' BatchNorm statistics on the reference cohort.
    evaluate : bool
        Evaluate before and after (utility and membership inference).
    out : str or Path or None
        The output folder; None: ``RUN_DIR/unlearned-<hospital>``.

    Returns
    -------
    dict[str, Any]
        The unlearning record.
    """
    from hospitrust.datasets.federation import reference_set
    from hospitrust.fbd.plan import ShippingPlan
    from hospitrust.strategies.fbd import PLAN_FILE, WAREHOUSE_FILE
    from hospitrust.fbd.stamps import STAMP_LOG, StampLog
    from hospitrust.fbd.unlearn import unlearn_hospital
    from hospitrust.fbd.warehouse import Warehouse

    run_dir = Path(run_dir).expanduser().resolve()
    for name in (WAREHOUSE_FILE, PLAN_FILE, "config.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} not found: RUN_DIR must be the directory of a strategy=fbd run")
    cfg, saved = _run_config(run_dir)
    t0 = time.perf_counter()
    warehouse = Warehouse.load(run_dir / WAREHOUSE_FILE)
    plan = ShippingPlan.load(run_dir / PLAN_FILE)
    load_seconds = time.perf_counter() - t0
    if hospital not in plan.colors_of:
        raise ValueError(f"hospital {hospital!r} is not in this run's plan; hospitals: {', '.join(plan.hospitals)}")
    reference = reference_set(cfg.federation).images if recalibrate_bn else None
    new, record = unlearn_hospital(warehouse, hospital, plan, reference_images=reference)
    target = Path(out).expanduser().resolve() if out else run_dir / f"unlearned-{hospital}"
    target.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    new.save(target / WAREHOUSE_FILE)
    save_seconds = time.perf_counter() - t1
    StampLog(run_dir / STAMP_LOG).extend({**s, "output": str(target / WAREHOUSE_FILE)} for s in record.stamps)
    result = {**record.to_json(), "run_dir": str(run_dir), "output": str(target / WAREHOUSE_FILE),
              "load_seconds": load_seconds, "save_seconds": save_seconds}
    if evaluate:
        result["evaluation"] = evaluate_unlearning(cfg, saved, hospital, warehouse, new)
    from hospitrust.server_app.results import jsonable

    (target / "unlearning.json").write_text(json.dumps(jsonable(result), indent=2, allow_nan=False) + "\n")
    return result


def unlearn_command(args: argparse.Namespace) -> int:
    """``hospitrust unlearn``: run :func:`unlearn_run` and print the outcome.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed command line.

    Returns
    -------
    int
        The exit status (0, or 2 with the reason on stderr).
    """
    from hospitrust.fbd.plan import PlanError
    from hospitrust.fbd.unlearn import UnlearningError

    try:
        result = unlearn_run(args.run_dir, args.hospital, recalibrate_bn=args.recalibrate_bn,
                             evaluate=not args.no_evaluate, out=args.out)
    except (FileNotFoundError, ValueError, UnlearningError, PlanError) as exc:
        print(f"hospitrust unlearn: {exc}", file=sys.stderr)
        return 2
    print(f"unlearned {result['hospital']}: {len(result['replaced'])} block versions replaced by the average of colors "
          f"{result['donor_colors']}, {result['untouched_blocks']} untouched; exact: {result['exact']}")
    print(f"unlearning time {result['seconds'] * 1000:.1f} ms (load {result['load_seconds']:.2f} s, "
          f"save {result['save_seconds']:.2f} s)" + (f", BatchNorm recalibration {result['recalibration_seconds']:.2f} s"
                                                     if result["bn_recalibrated"] else ""))
    if args.recalibrate_bn and not result["bn_recalibrated"]:
        print("--recalibrate-bn: the replaced blocks have no BatchNorm layers; nothing to recalibrate")
    ev = result.get("evaluation")
    if ev:
        b, a = ev["before"], ev["after"]
        print(f"routed {ev['routing_mode']}: accuracy {b['accuracy']:.4f} -> {a['accuracy']:.4f}, "
              f"AUC {b['auc']:.4f} -> {a['auc']:.4f}")
        if "mia_auroc" in b:
            print(f"membership inference AUROC of {result['hospital']}'s training images: "
                  f"{b['mia_auroc']:.4f} -> {a['mia_auroc']:.4f} against test images"
                  + (f", {b['mia_auroc_val']:.4f} -> {a['mia_auroc_val']:.4f} against held-out val images"
                     if "mia_auroc_val" in b else ""))
    print(f"new warehouse: {result['output']}\nrecord: {Path(result['output']).parent / 'unlearning.json'}")
    return 0

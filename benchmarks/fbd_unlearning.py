"""FED-FBD's unlearning utility loss over a bench grid of FBD runs: every hospital of every finished cell
unlearned in turn (``hospitrust unlearn``'s own code path, :func:`hospitrust.cli.fbd.unlearn_run`), and per
group of cells the change in the routed ensemble's AUC, accuracy and balanced accuracy, the time of the
set operation, and the membership-inference AUROC of the unlearned hospital's training images before and
after. A hospital that reached every color has no donors and is refused; the table counts those.

Each unlearning is written beside its run (``unlearned-<hospital>/unlearning.json``) and read back on a
second call, so the script resumes where it stopped.

    hospitrust bench benchmarks/fbd-unlearning.toml --out runs/bench/fbd-unlearning
    python benchmarks/fbd_unlearning.py runs/bench/fbd-unlearning --by dataset,skew
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def run_dirs(grid: Path) -> list[tuple[dict[str, str], Path]]:
    """(axis labels, run folder) of every finished FBD cell of the grid folder."""
    out = []
    for summary in sorted(grid.glob("cells/*/summary.json")):
        cell = summary.parent
        axes = dict(part.split("=", 1) for part in cell.name.split("__") if "=" in part)
        warehouses = sorted(p for p in cell.rglob("warehouse.pt")
                            if not any(x.name.startswith("unlearned-") for x in p.relative_to(cell).parents))
        if warehouses:
            out.append((axes, warehouses[0].parent))
    return out


def unlearn_cell(run_dir: Path, hospitals: list[str] | None = None) -> list[dict]:
    """One record per hospital of the run: the unlearning's evaluation, or why it was refused."""
    from hospitrust.cli.fbd import unlearn_run
    from hospitrust.fbd.plan import PlanError, ShippingPlan
    from hospitrust.strategies.fbd import PLAN_FILE
    from hospitrust.fbd.unlearn import UnlearningError

    plan = ShippingPlan.load(run_dir / PLAN_FILE)
    records = []
    for hospital in hospitals or list(plan.hospitals):
        saved = run_dir / f"unlearned-{hospital}" / "unlearning.json"
        result = json.loads(saved.read_text()) if saved.is_file() else None
        if result is None or "evaluation" not in result:  # none yet, or one written with --no-evaluate
            try:
                result = unlearn_run(run_dir, hospital)
            except (UnlearningError, PlanError, ValueError) as exc:  # e.g. a hospital that reached every color
                records.append({"hospital": hospital, "refused": str(exc)})
                continue
        ev = result["evaluation"]
        b, a = {k: _number(v) for k, v in ev["before"].items()}, {k: _number(v) for k, v in ev["after"].items()}
        records.append({"hospital": hospital, "seconds": float(result["seconds"]), "exact": bool(result["exact"]),
                        "auc_drop": b["auc"] - a["auc"], "accuracy_drop": b["accuracy"] - a["accuracy"],
                        "balanced_accuracy_drop": b["balanced_accuracy"] - a["balanced_accuracy"],
                        "auc_before": b["auc"], "mia_before": b.get("mia_auroc_val", float("nan")),
                        "mia_after": a.get("mia_auroc_val", float("nan"))})
    return records


def _number(value) -> float:
    """A metric from unlearning.json, where NaN is stored as null."""
    return float("nan") if value is None else float(value)


def _ms(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    xs = [x * scale for x in xs if x == x]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else f"{xs[0]:.{digits}f}"


def table(grid: Path, by: list[str], hospitals: list[str] | None = None) -> str:
    """The Markdown table, one row per group of the ``by`` axes (every unlearning of its cells)."""
    groups: dict[tuple[str, ...], list[dict]] = {}
    for axes, run_dir in run_dirs(grid):
        missing = [b for b in by if b not in axes]
        if missing:
            raise SystemExit(f"--by {','.join(missing)}: not an axis of cell {run_dir.name} (axes: {', '.join(axes)})")
        key = tuple(axes[b] for b in by)
        groups.setdefault(key, []).extend(unlearn_cell(run_dir, hospitals))
    if not groups:
        raise SystemExit(f"{grid}: no finished FBD cell (cells/*/summary.json beside a warehouse.pt)")
    lines = [f"| {' | '.join(by)} | unlearned | refused | AUC before | AUC loss (points) | accuracy loss "
             "(points) | balanced-accuracy loss (points) | set operation (ms) | MIA AUROC before -> after |",
             "|" + "---|" * (len(by) + 8)]
    for key in sorted(groups):
        recs = groups[key]
        done = [r for r in recs if "refused" not in r]
        lines.append(
            f"| {' | '.join(key)} | {len(done)} | {len(recs) - len(done)} | {_ms([r['auc_before'] for r in done], digits=3)} | "
            f"{_ms([r['auc_drop'] for r in done], 100)} | {_ms([r['accuracy_drop'] for r in done], 100)} | "
            f"{_ms([r['balanced_accuracy_drop'] for r in done], 100)} | {_ms([r['seconds'] for r in done], 1000, 1)} | "
            f"{_ms([r['mia_before'] for r in done], digits=3)} -> {_ms([r['mia_after'] for r in done], digits=3)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", type=Path, help="a bench output folder of strategy=fbd cells")
    ap.add_argument("--by", default="dataset,skew", help="comma-separated axes to group by")
    ap.add_argument("--hospitals", default="", help="comma-separated hospitals to unlearn (default: every one)")
    args = ap.parse_args(argv)
    hospitals = [h for h in args.hospitals.split(",") if h] or None
    sys.stdout.write(table(args.grid, [b for b in args.by.split(",") if b], hospitals))
    return 0


if __name__ == "__main__":
    sys.exit(main())

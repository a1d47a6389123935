"""The leaderboard v3's controls (docs/leaderboard.md, "v3 protocol"): their tuning grid, the rule that chooses
their learning rate and epochs from it, and the evaluation grids that rule writes.

    python benchmarks/leaderboard/v3/controls.py tune                  # (re)write the tuning grid beside this script
    hospitrust bench benchmarks/leaderboard/v3/controls-tune-pneumonia.toml --out runs/leaderboard-v3/controls-tune-pneumonia
    python benchmarks/leaderboard/v3/controls.py choose --tuned runs/leaderboard-v3/controls-tune-pneumonia
    python benchmarks/leaderboard/v3/controls.py choose --check     # from the committed curves (docs/results/leaderboard/v3)
    hospitrust bench benchmarks/leaderboard/v3/controls-pneumonia-main.toml --out runs/leaderboard-v3/controls-pneumonia-main

``choose`` prints, per converged control, the mean over the tuning seeds of the validation balanced accuracy
at each candidate (learning rate, epochs), takes the best by the protocol's rule (ties: fewer epochs, then the
smaller rate), and writes the evaluation grid with the chosen values (``--check``: exit 1 if the committed
evaluation grid differs from what the tuning cells give).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "v2"))
import parts as v2  # noqa: E402  (the main condition's base values: one source)

TUNING_SEEDS = (1, 2, 3)
EVALUATION_SEEDS = v2.EVALUATION_SEEDS  # 11-20: the Pneumonia main condition (descriptive in v3: seen in v2)
RATES = (0.001, 0.003, 0.01, 0.03)
# the converged controls: (most epochs tried, the step between the epochs a choice may stop at)
EPOCHS = {"cohort-only-converged": (400, 10), "local-only-mean": (150, 5), "pooled": (120, 5)}
# local-only-best trains exactly as local-only-mean (the same hospitals, rate and epochs); only the report differs
SAME_AS = {"local-only-best": "local-only-mean"}
# the rounds-matched control: FLTrust's root update at FLTrust's rate of the condition (v2's budget; Dirichlet 0.1
# keeps the main condition's rates, v2's amendment 8; RetinaMNIST's from its own budget)
FLTRUST_RATE = v2.RULE_PARAMETERS["fltrust"][0]


def _v3_parts():
    """benchmarks/leaderboard/v3/parts.py (RetinaMNIST's base values and budget: one source), loaded by path: its
    module name, ``parts``, is v2's here."""
    spec = importlib.util.spec_from_file_location("leaderboard_v3_parts", HERE / "parts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Condition(NamedTuple):
    """A condition's controls: its files' names, its title, its Dirichlet alpha and its evaluation seeds."""

    tune_file: str
    curves_file: str
    evaluation_file: str
    title: str
    alpha: float
    seeds: tuple[int, ...]
    role: str  # the evaluation grid's first comment's tail
    # the condition's [base] lines given extra keys (TOML values); None: PneumoniaMNIST's main base at ``alpha``
    base: Callable[[dict[str, str] | None], list[str]] | None = None
    fltrust_rate: Callable[[], float] = lambda: FLTRUST_RATE

    def base_lines(self, extra: dict[str, str] | None = None) -> list[str]:
        return self.base(extra) if self.base is not None else base_lines(extra, self.alpha)


CONDITIONS = {
    "main": Condition("controls-tune-pneumonia.toml", "controls_tuning_pneumonia.csv", "controls-pneumonia-main.toml",
                      "PneumoniaMNIST main condition", 0.5, EVALUATION_SEEDS,
                      "Descriptive in v3:\n# these seeds were seen in v2."),
    # decisive in v3, fresh seeds (the protocol's conditions table)
    "alpha0.1": Condition("controls-tune-alpha0.1.toml", "controls_tuning_alpha0.1.csv", "controls-alpha0.1.toml",
                          "PneumoniaMNIST Dirichlet 0.1", 0.1, tuple(range(41, 51)),
                          "Decisive in v3:\n# fresh seeds."),
    # decisive in v3, never run on Retina; its cohort (3 per class), rates and rounds: v3 parts.py and its budget
    "retina": Condition("controls-tune-retina.toml", "controls_tuning_retina.csv", "controls-retina.toml",
                        "RetinaMNIST main condition", 0.5, EVALUATION_SEEDS, "Decisive in v3:\n# never run on Retina.",
                        base=lambda extra: _v3_parts().retina_base(extra),
                        fltrust_rate=lambda: _v3_parts().retina_rates()["fltrust"]),
}


def base_lines(extra: dict[str, str] | None = None, alpha: float = 0.5) -> list[str]:
    """The main condition's [base] (benchmarks/leaderboard/v2/parts.py) at Dirichlet ``alpha``, with ``extra`` keys
    (TOML values) added."""
    values = {
        "dataset": '"pneumoniamnist"', "partitioner": '"dirichlet"', '"dirichlet.alpha"': str(alpha), "model": f'"{v2.MODEL}"',
        '"task.augmentation"': f'"{v2.AUGMENTATION}"', "num-server-rounds": str(v2.ROUNDS), "local-epochs": "1",
        "train-subsample": "0.25", '"train.class-weighted-loss"': "true", "checkpoint": "false",
        # the control cells keep the condition's malicious share: it names the honest hospitals (they run no attack)
        "malicious-fraction": "0.3", "assumed-malicious": "3", **(extra or {}),
    }
    return ["[base]", *[f"{k} = {v}" for k, v in values.items()]]


def tune_grid(condition: Condition = CONDITIONS["main"]) -> str:
    """The condition's tuning grid: every converged control at every rate, to its most epochs, on the tuning seeds."""
    entries = []
    for kind, (most, _) in EPOCHS.items():
        for rate in RATES:
            entries.append(f'    {{ label = "{kind}-lr{rate}", control = "{kind}", control-epochs = {most}, '
                           f"control-learning-rate = {rate} }},")
    cells = len(entries) * len(TUNING_SEEDS)
    return "\n".join([
        f"# Leaderboard v3: the controls' tuning grid, {condition.title} (generated by",
        "# benchmarks/leaderboard/v3/controls.py tune: edit it there). docs/leaderboard.md, \"v3 protocol\".",
        f"# Budget stated before it ran: {cells} cells on the tuning seeds {', '.join(map(str, TUNING_SEEDS))}, evaluated on "
        "the val split outside the cohort after every epoch; within 20 min on 2 cores.",
        "# Measured wall time: recorded in docs/leaderboard.md, \"v3 results\" (min).",
        f"#   hospitrust bench benchmarks/leaderboard/v3/{condition.tune_file} --out runs/leaderboard-v3/{condition.tune_file[:-5]}",
        "[grid]", f'name = "leaderboard-v3-{condition.tune_file[:-5]}"',
        f'description = "{condition.title}: the converged controls x learning rates, tuning seeds, val split"',
        'backend = "inprocess"', "workers = 2", "hospitals = 10", 'metric = "balanced_accuracy"', 'baseline = "fedavg"', "",
        *condition.base_lines({'"server-data.test-split"': '"val"'}), "",
        "[axes]", f"seed = [{', '.join(map(str, TUNING_SEEDS))}]", "strategy = [", *entries, "]",
    ]) + "\n"


RESULTS = HERE.parents[2] / "docs" / "results" / "leaderboard" / "v3"
TUNING_CSV = RESULTS / CONDITIONS["main"].curves_file


def write_curves(tuned: Path, path: Path = TUNING_CSV) -> None:
    """The tuning cells' curves as one committed CSV (control, learning_rate, seed, epoch, val_balanced_accuracy)."""
    from hospitrust.server_app.results import read_round_records

    rows = ["control,learning_rate,seed,epoch,val_balanced_accuracy"]
    for cell in sorted(p for p in (tuned / "cells").iterdir() if (p / "summary.json").is_file()):
        control = json.loads((cell / "summary.json").read_text())["control"]
        seed = json.loads((cell / "config.json").read_text())["seed"]
        for rec in read_round_records(cell):
            rows.append(f"{control['control']},{control['control-learning-rate']},{seed},{rec.number},"
                        f"{rec.central['balanced_accuracy']:.6f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def read_curves(tuned: Path) -> dict[tuple[str, float], dict[int, list[float]]]:
    """(control, rate) -> epoch -> the tuning seeds' validation balanced accuracies at that epoch, from the tuning
    grid's folder or from its committed CSV (:func:`write_curves`)."""
    curves: dict[tuple[str, float], dict[int, list[float]]] = {}
    if tuned.is_file():
        import csv

        with open(tuned) as fh:
            for row in csv.DictReader(fh):
                key = (row["control"], float(row["learning_rate"]))
                curves.setdefault(key, {}).setdefault(int(row["epoch"]), []).append(float(row["val_balanced_accuracy"]))
        return curves
    from hospitrust.server_app.results import read_round_records

    cells = sorted(p for p in (tuned / "cells").iterdir() if (p / "summary.json").is_file())
    for cell in cells:
        control = json.loads((cell / "summary.json").read_text())["control"]
        key = (control["control"], float(control["control-learning-rate"]))
        for rec in read_round_records(cell):
            curves.setdefault(key, {}).setdefault(rec.number, []).append(float(rec.central["balanced_accuracy"]))
    return curves


def choose(curves: dict[tuple[str, float], dict[int, list[float]]]) -> dict[str, tuple[float, int, float]]:
    """Per converged control: (rate, epochs, the mean over the tuning seeds there), by the protocol's rule."""
    out = {}
    for kind, (most, step) in EPOCHS.items():
        candidates = []
        for rate in RATES:
            by_epoch = curves.get((kind, rate), {})
            for epoch in range(step, most + 1, step):
                values = by_epoch.get(epoch, [])
                if len(values) != len(TUNING_SEEDS):
                    raise SystemExit(f"controls.py: {kind} at rate {rate}, epoch {epoch}: {len(values)} of "
                                     f"{len(TUNING_SEEDS)} tuning seeds finished; run the tuning grid to the end first")
                candidates.append((sum(values) / len(values), -epoch, -rate))
        mean, neg_epoch, neg_rate = max(candidates)
        out[kind] = (-neg_rate, -neg_epoch, mean)
    return out


def evaluation_grid(chosen: dict[str, tuple[float, int, float]], condition: Condition = CONDITIONS["main"]) -> str:
    """The condition's controls on its evaluation seeds, at the chosen rates and epochs."""
    entries = [f'    {{ label = "cohort-only-rounds", control = "cohort-only-rounds", '
               f"learning-rate = {condition.fltrust_rate()} }},"]
    for kind in ("cohort-only-converged", "local-only-mean", "local-only-best", "pooled"):
        rate, epochs, mean = chosen[SAME_AS.get(kind, kind)]
        entries.append(f'    {{ label = "{kind}", control = "{kind}", control-epochs = {epochs}, '
                       f"control-learning-rate = {rate} }},  # tuning mean {mean:.4f}")
    seeds = ", ".join(map(str, condition.seeds))
    span = f"{condition.seeds[0]}-{condition.seeds[-1]}"
    name = condition.evaluation_file[:-5]
    the = "the " if condition.title.endswith("condition") else ""
    return "\n".join([
        f"# Leaderboard v3: the controls of {the}{condition.title}, evaluation seeds {span} (generated by",
        f"# benchmarks/leaderboard/v3/controls.py choose from the tuning grid's cells: edit it there). {condition.role}"
        " docs/leaderboard.md, \"v3 protocol\".",
        f"# Budget stated before it ran: {5 * len(condition.seeds)} cells; within 30 min on 2 cores.",
        "# Measured wall time: recorded in docs/leaderboard.md, \"v3 results\" (min).",
        f"#   hospitrust bench benchmarks/leaderboard/v3/{condition.evaluation_file} --out runs/leaderboard-v3/{name}",
        "[grid]", f'name = "leaderboard-v3-{name}"',
        f'description = "{condition.title}: the controls, evaluation seeds {span}"',
        'backend = "inprocess"', "workers = 2", "hospitals = 10", 'metric = "balanced_accuracy"', 'baseline = "fedavg"', "",
        *condition.base_lines(), "",
        "[axes]", f"seed = [{seeds}]", "strategy = [", *entries, "]",
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tune = sub.add_parser("tune", help="write the tuning grid")
    tune.add_argument("--check", action="store_true", help="exit 1 if the committed tuning grid differs")
    pick = sub.add_parser("choose", help="choose from the tuning cells and write the evaluation grid")
    pick.add_argument("--tuned", type=Path,
                      help="the tuning grid's output folder (its curves are then written to the committed CSV), or that CSV "
                           "(default: the condition's committed CSV)")
    pick.add_argument("--check", action="store_true", help="exit 1 if the committed evaluation grid differs")
    for command in (tune, pick):
        command.add_argument("--condition", choices=sorted(CONDITIONS), default="main",
                             help="the condition (default: PneumoniaMNIST's main condition)")
    args = parser.parse_args(argv)
    condition = CONDITIONS[args.condition]
    if args.command == "tune":
        path, text = HERE / condition.tune_file, tune_grid(condition)
    else:
        curves_csv = RESULTS / condition.curves_file
        tuned = args.tuned or curves_csv
        if tuned.is_dir() and not args.check:
            write_curves(tuned, curves_csv)
        chosen = choose(read_curves(tuned))
        print("| control | learning rate | epochs | mean validation balanced accuracy (seeds 1-3) |\n|---|---|---|---|")
        for kind, (rate, epochs, mean) in chosen.items():
            print(f"| {kind} | {rate} | {epochs} | {mean:.4f} |")
        path, text = HERE / condition.evaluation_file, evaluation_grid(chosen, condition)
    if args.check:
        same = path.is_file() and path.read_text() == text
        print(f"{path.name}: {'as generated' if same else 'differs from what the script writes'}")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

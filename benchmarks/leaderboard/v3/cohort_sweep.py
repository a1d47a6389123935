"""The leaderboard v3's cohort-size sweep (docs/leaderboard.md, "v3 protocol"): where does federating start to pay,
and where does the server's reference cohort carry the model?

    hospitrust bench benchmarks/leaderboard/v3/cohort-sweep.toml --out runs/leaderboard-v3/cohort-sweep
    python benchmarks/leaderboard/v3/cohort_sweep.py --grid runs/leaderboard-v3/cohort-sweep

Reads the sweep's finished cells (``--grid``; without it the committed ``cohort_sweep.csv``, so the page re-renders
from the repository alone) and writes ``cohort-sweep.md`` and ``cohort-sweep.png`` beside the v3 pages. For each
rule that uses a cohort and each cohort size: its clean run and its run under its most harmful attack of the main
table, and the two cohort controls, as means over the seeds with each seed's value; then each rule's attacked run
minus the best going-alone figure at the same size, paired by seed: the cohort alone (the better of the two cohort
controls, by mean) and the best honest hospital alone (``local-only-best`` of the main condition's controls, which
do not use the cohort's images). Descriptive: three seeds, no test decides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

def _load_parts():
    """benchmarks/leaderboard/v3/parts.py (the sweep's sizes, rules and attacks: one source), under a name of its
    own: it imports v2's parts.py as ``parts``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("leaderboard_v3_parts", HERE / "parts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


parts = _load_parts()

from hospitrust.bench import stats  # noqa: E402
from hospitrust.bench.leaderboard import last_k_mean, md_table  # noqa: E402

SIZE = "reference-cohort-per-class"
COHORT_CONTROLS = ("cohort-only-rounds", "cohort-only-converged")
ALONE = "local-only-best"  # the best honest hospital alone (the main condition's controls, the same seeds)
KEEP = ["rule", SIZE, "attack_label", "seed", "final_balanced_accuracy", "last_k", "final_auc"]


def read_grid(folder: Path) -> pd.DataFrame:
    """The sweep's finished cells, one row per (rule or control, size, attack, seed)."""
    from hospitrust.bench.store import collect

    rounds, cells, _ = collect(folder)
    done = cells[cells["status"] == "done"].copy()
    if done.empty:
        raise SystemExit(f"cohort_sweep.py: {folder}: no finished cell")
    done["rule"] = done["strategy"].astype(str)
    done["attack_label"] = done["attack"].astype(str)
    done[SIZE] = done[SIZE].astype(int)
    done["last_k"] = done["cell"].map(last_k_mean(rounds, "balanced_accuracy", 3))
    return done[KEEP].sort_values(["rule", SIZE, "attack_label", "seed"]).reset_index(drop=True)


def _seeds_text(sub: pd.DataFrame, column: str) -> str:
    values = sub.sort_values("seed")[column].to_list()
    return f"{sum(values) / len(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def accuracy_lines(cells: pd.DataFrame, column: str = "final_balanced_accuracy") -> list[str]:
    """Rows: each rule clean and attacked, each cohort control; columns: the cohort sizes. Mean over the seeds
    with each seed's value (in seed order); "needs a cohort" where a rule or control cannot run without one."""
    sizes = list(parts.COHORT_SIZES)
    rows = []
    for rule in parts.COHORT_RULES:
        for attack in ("none", parts.MOST_HARMFUL[rule]):
            row = [rule, "no attack" if attack == "none" else attack]
            for size in sizes:
                sub = cells[(cells["rule"] == rule) & (cells[SIZE] == size) & (cells["attack_label"] == attack)]
                row.append(_seeds_text(sub, column) if not sub.empty else
                           "needs a cohort" if size == 0 and rule not in parts.COHORT_FREE else "not run")
            rows.append(row)
    for control in COHORT_CONTROLS:
        row = [control, "no hospital"]
        for size in sizes:
            sub = cells[(cells["rule"] == control) & (cells[SIZE] == size)]
            row.append(_seeds_text(sub, column) if not sub.empty else "needs a cohort" if size == 0 else "not run")
        rows.append(row)
    return md_table(["rule", "run", *[f"{n} per class" for n in sizes]], rows)


def paired_lines(cells: pd.DataFrame, alone: pd.Series, column: str = "final_balanced_accuracy") -> list[str]:
    """Each rule's attacked run minus going alone at the same size, paired by seed: the better cohort control
    (by mean at that size) and the best honest hospital alone (``alone``: seed -> its value)."""
    rows = []
    for rule in parts.COHORT_RULES:
        attack = parts.MOST_HARMFUL[rule]
        row = [rule]
        for size in parts.COHORT_SIZES:
            ruled = cells[(cells["rule"] == rule) & (cells[SIZE] == size) & (cells["attack_label"] == attack)]
            if ruled.empty:
                row += ["-", "-"]
                continue
            by_seed = ruled.set_index("seed")[column]
            controls = {c: cells[(cells["rule"] == c) & (cells[SIZE] == size)].set_index("seed")[column]
                        for c in COHORT_CONTROLS}
            controls = {c: v for c, v in controls.items() if not v.empty}
            if controls:
                best = max(controls, key=lambda c: controls[c].mean())
                row.append(_difference(by_seed, controls[best]) + f" ({best.removeprefix('cohort-only-')})")
            else:
                row.append("no cohort")
            row.append(_difference(by_seed, alone))
        rows.append(row)
    header = ["rule (its most harmful attack)"]
    for size in parts.COHORT_SIZES:
        header += [f"{size}/class: minus the cohort alone", f"{size}/class: minus {ALONE}"]
    return md_table(header, rows)


def _difference(rule: pd.Series, control: pd.Series) -> str:
    both = pd.concat([rule, control], axis=1, keys=["r", "c"]).dropna()
    d = (both["r"] - both["c"]).to_list()
    if not d:
        return "no common seed"
    return f"{stats.t_interval(d).text(3)}, {sum(x > 0 for x in d)}/{len(d)} above"


def plot(cells: pd.DataFrame, alone: pd.Series, path: Path, column: str = "final_balanced_accuracy") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, rule in enumerate(parts.COHORT_RULES):
        color = f"C{i}"
        for attack, style in (("none", "--"), (parts.MOST_HARMFUL[rule], "-")):
            sub = cells[(cells["rule"] == rule) & (cells["attack_label"] == attack)]
            means = sub.groupby(SIZE)[column].mean()
            if not means.empty:
                ax.plot(means.index, means.values, style, marker="o", color=color,
                        label=f"{rule} ({'clean' if attack == 'none' else attack})")
    for control, marker in zip(COHORT_CONTROLS, ("s", "D")):
        means = cells[cells["rule"] == control].groupby(SIZE)[column].mean()
        if not means.empty:
            ax.plot(means.index, means.values, ":", marker=marker, color="black", label=control)
    if not alone.empty:
        ax.axhline(alone.mean(), color="grey", linewidth=1, label=f"{ALONE} (no cohort used)")
    ax.set_xlabel("reference cohort: images per class")
    ax.set_ylabel("final-round balanced accuracy (mean over seeds)")
    ax.set_xticks(list(parts.COHORT_SIZES))
    ax.set_title("PneumoniaMNIST main condition: the cohort's size")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(cells: pd.DataFrame, alone: pd.Series) -> str:
    seeds = sorted(cells["seed"].unique())
    md = ["# Leaderboard v3: the reference cohort's size (PneumoniaMNIST main condition)", "",
          "Rendered by `python benchmarks/leaderboard/v3/cohort_sweep.py` from `benchmarks/leaderboard/v3/cohort-sweep.toml`'s "
          "cells (docs/leaderboard.md, \"v3 protocol\"). Descriptive: seeds "
          f"{', '.join(map(str, seeds))} (seen in v2), no test decides. 10 hospitals, Dirichlet 0.5, 3 colluding in the "
          "attacked runs, 40 rounds; each rule under its most harmful attack of the main table. At 0 per class HTA and "
          "EARN run cohort-free (`hta.validation-exponent = 0`, EARN also `earn.audit = false`).", "",
          "![balanced accuracy against the cohort's size](cohort-sweep.png)", "",
          "## Final-round balanced accuracy: mean (each seed)", ""] + accuracy_lines(cells)
    md += ["## Under attack minus going alone, paired by seed", "",
           f"Mean [95 % t CI], seeds above. The cohort alone: the better cohort control at that size by mean; "
           f"`{ALONE}`: the main condition's controls (`controls_pneumonia_main.csv`), the same seeds.", ""]
    md += paired_lines(cells, alone)
    md += ["## Final-round AUC: mean (each seed)", ""] + accuracy_lines(cells, "final_auc")
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=Path, help="the sweep's grid folder (default: the committed cells)")
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/leaderboard/v3")
    args = parser.parse_args(argv)
    committed = args.out / "cohort_sweep.csv"
    if args.grid is not None:
        cells = read_grid(args.grid)
        args.out.mkdir(parents=True, exist_ok=True)
        cells.to_csv(committed, index=False)
    elif committed.is_file():
        cells = pd.read_csv(committed)
    else:
        raise SystemExit(f"cohort_sweep.py: no cells: give --grid (the sweep's grid folder) or commit {committed}")
    controls = pd.read_csv(args.out / "controls_pneumonia_main.csv")
    alone = controls[controls["rule"] == ALONE].set_index("seed")["final_balanced_accuracy"]
    alone = alone[alone.index.isin(cells["seed"].unique())]
    page = args.out / "cohort-sweep.md"
    page.write_text(render(cells, alone))
    plot(cells, alone, args.out / "cohort-sweep.png")
    print(f"wrote {page} and {args.out / 'cohort-sweep.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

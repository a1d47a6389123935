"""The leaderboard v3's page for a condition: the rules beside the controls (docs/leaderboard.md, "v3 protocol").

    python benchmarks/leaderboard/v3/render.py --controls runs/leaderboard-v3/controls-pneumonia-main \\
        --out docs/results/leaderboard/v3
    python benchmarks/leaderboard/v3/render.py --condition alpha0.1 --out docs/results/leaderboard/v3

The PneumoniaMNIST main condition's rules are v2's committed cells (``--rules``: v2's
``leaderboard_cells.csv``, condition ``main``, seeds 11-20); its controls are read from the controls grid's
folder, or, without one, from the controls' committed cells (``--out``/controls_pneumonia_main.csv), so the
page re-renders from the repository alone. Dirichlet 0.1's rules are its ten evaluation parts (``--grids``:
runs/leaderboard-v3/alpha0.1-sNN, unpacked from their archives in docs/results/leaderboard/v3/grids where a
folder lacks its cells), written to ``--out``/alpha0.1_cells.csv, which the page re-renders from when no part is
there; its controls are ``--out``/controls_alpha0.1.csv. The page holds: the controls; each rule's worst case over
the nine attacks every rule meets, and its clean run, minus the best control, paired by seed (Student's t
intervals, the exact sign-flip test, Holm over the declared family); the same on the last-3-round mean and on
AUC; each rule's own aware attack beside; and the (rule, seed) pairs that did not train.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "v2"))
import parts as v2parts  # noqa: E402  (the suite: one source)

sys.path.insert(0, str(HERE.parents[1] / "study"))  # the studies' own code (not in the wheel)
import leaderboard_v2 as v2  # noqa: E402
from hospitrust.bench import stats  # noqa: E402
from hospitrust.bench.controls import CEILING, CONTROLS  # noqa: E402
from hospitrust.bench.leaderboard import last_k_mean, md_table  # noqa: E402

# the nine attacks every rule meets (v3 protocol: the decisive worst case), and each rule's own beside it
COMMON = [label for label, _ in v2parts.RULE_AGNOSTIC if label not in ("none", "backdoor")]
OWN = {rule: [label for label, _, who in v2parts.RULE_SPECIFIC if rule in who] for rule in v2parts.RULE_PARAMETERS}
DID_NOT_TRAIN = 0.03  # a clean run within this of chance
# the v3 set: the rules whose comparisons form the declared family (2 each: worst case and clean run, Holm over 14);
# the other rules' comparisons are shown beside, uncorrected and outside the family
FAMILY = ("fedavg", "fltrust", "earn", "anchored-trust", "hta", "geometric-median", "median")
OUTCOMES = {"final_balanced_accuracy": "final-round balanced accuracy (decides)",
            "last_k": "mean balanced accuracy of the last 3 rounds (epochs)", "final_auc": "final-round AUC"}
KEEP = ["rule", "seed", "attack_label", "final_balanced_accuracy", "last_k", "final_auc", "chance"]


def recall_column(cls: int) -> str:
    return f"final_recall_{cls}"


def with_rare_recall(done: pd.DataFrame, folder: Path, rare: tuple[int, ...]) -> pd.DataFrame:
    """Each finished cell's final recall of the ``rare`` classes (its summary.json), as columns."""
    for cls in rare:
        done[recall_column(cls)] = [
            json.loads((folder / "cells" / cell / "summary.json").read_text())["final"]["per_class_recall"][cls]
            for cell in done["cell"]]
    return done


def read_controls(folder: Path, condition: Condition | None = None) -> pd.DataFrame:
    """The controls grid's finished cells: one row per (control, seed), with the last-3 mean."""
    from hospitrust.bench.store import collect

    rounds, cells, _ = collect(folder)
    done = cells[cells["status"] == "done"].copy()
    done["rule"] = done["strategy"].astype(str)
    done["attack_label"] = "none"
    done["last_k"] = done["cell"].map(last_k_mean(rounds, "balanced_accuracy", 3))
    condition = condition or CONDITIONS["pneumonia-main"]
    done["chance"] = 1 / condition.classes
    unknown = sorted(set(done["rule"]) - set(CONTROLS))
    if unknown:
        raise SystemExit(f"render.py: {folder}: cells that are not controls: {unknown}")
    done = with_rare_recall(done, folder, condition.rare_classes)
    keep = KEEP + [recall_column(c) for c in condition.rare_classes]
    return done[keep].sort_values(["rule", "seed"]).reset_index(drop=True)


def _family(worst: pd.DataFrame, clean: pd.DataFrame, controls: pd.DataFrame) -> tuple[str | None, pd.DataFrame]:
    """Both comparisons of every rule against the best control, with Holm over all of them (the family)."""
    best, w = v2.versus_control(worst, controls)
    _, c = v2.versus_control(clean, controls)
    both = pd.concat([w.assign(what="worst case"), c.assign(what="no attack")], ignore_index=True)
    both["p_holm"] = float("nan")
    declared = both["rule"].isin(FAMILY)
    if declared.any():
        both.loc[declared, "p_holm"] = stats.holm(both.loc[declared, "p"].fillna(1.0).to_list())
    return best, both


def joining_pays_lines(cells: pd.DataFrame, column: str) -> list[str]:
    rules = cells[~cells["rule"].isin(CONTROLS)]
    worst = v2.worst_per_seed(rules, column, attacks=COMMON)
    clean = v2.clean_per_seed(rules, column)
    controls = v2.controls_per_seed(cells, column)
    best, family = _family(worst, clean, controls)
    if best is None or family.empty:
        return ["No seed has a control and a rule: nothing to compare.", ""]
    declared = int(family["rule"].isin(FAMILY).sum())
    lines = [f"Best control (highest mean; `{CEILING}` is the ceiling, not a candidate): **{best}**. "
             f"The declared family: {declared} comparisons (the worst case and the clean run of each rule of the v3 set, "
             f"{', '.join(FAMILY)}, against it), Holm-corrected sign-flip p; the other rules' p beside, uncorrected "
             "(\"outside\").", ""]
    rows = []
    for rule in v2.order_by(worst.dropna(axis=1, how="all")):
        r = family[(family["rule"] == rule) & (family["what"] == "worst case")].iloc[0]
        cl = family[(family["rule"] == rule) & (family["what"] == "no attack")]
        def holm_text(p_holm: float) -> str:
            return "outside" if p_holm != p_holm else f"{p_holm:.3g}"

        cl_text = "-" if cl.empty else (f"{stats.Interval(cl.iloc[0]['mean'], cl.iloc[0]['low'], cl.iloc[0]['high'], int(cl.iloc[0]['seeds'])).text(3)}"
                                         f" (p {cl.iloc[0]['p']:.3g} / Holm {holm_text(cl.iloc[0]['p_holm'])})")
        if r["p_holm"] != r["p_holm"]:
            verdict = "descriptive"
        else:
            verdict = ("pays" if r["mean"] > 0 and r["p_holm"] < stats.ALPHA else
                       "costs" if r["mean"] < 0 and r["p_holm"] < stats.ALPHA else "not separated")
        rows.append([rule, int(r["seeds"]), v2._iv(worst[rule].dropna()),
                     stats.Interval(r["mean"], r["low"], r["high"], int(r["seeds"])).text(3),
                     f"{r['p']:.3g} / {holm_text(r['p_holm'])}", f"{int(r['above'])} of {int(r['seeds'])}", verdict, cl_text])
    return lines + md_table(["rule", "seeds", "worst case over the nine", f"worst case minus {best} [95 % t CI]",
                             "sign-flip p / Holm", "seeds above", "joining", f"no attack minus {best}"], rows)


def each_control_lines(cells: pd.DataFrame, column: str) -> list[str]:
    """Descriptive: each rule's worst case minus every control, paired by seed (mean [95 % t CI], seeds above)."""
    rules = cells[~cells["rule"].isin(CONTROLS)]
    worst = v2.worst_per_seed(rules, column, attacks=COMMON)
    controls = v2.controls_per_seed(cells, column)
    names = [c for c in CONTROLS if c in controls]
    rows = []
    for rule in v2.order_by(worst.dropna(axis=1, how="all")):
        row = [rule]
        for control in names:
            both = pd.concat([worst[rule], controls[control]], axis=1, keys=["r", "c"]).dropna()
            d = (both["r"] - both["c"]).to_list()
            row.append(f"{stats.t_interval(d).text(3)}, {sum(x > 0 for x in d)}/{len(d)}")
        rows.append(row)
    return md_table(["rule", *[f"minus {c}" for c in names]], rows)


def controls_lines(cells: pd.DataFrame) -> list[str]:
    rows = []
    for control in CONTROLS:
        sub = cells[cells["rule"] == control]
        if sub.empty:
            continue
        rows.append([control, len(sub)] + [v2._iv(sub[c].dropna()) for c in OUTCOMES])
    return md_table(["control", "seeds", *OUTCOMES.values()], rows)


def own_attack_lines(cells: pd.DataFrame, column: str) -> list[str]:
    rows = []
    for rule, labels in OWN.items():
        if not labels:
            continue
        worst = v2.worst_per_seed(cells[cells["rule"] == rule], column, attacks=labels)
        if rule in worst:
            rows.append([rule, ", ".join(labels), v2._iv(worst[rule].dropna())])
    return md_table(["rule", "its own attacks", "worst case over them [95 % t CI]"], rows)


def backdoor_lines(cells: pd.DataFrame) -> list[str]:
    """The backdoor's success rate per rule, mean [95 % t CI] over seeds; a rate lies in [0, 1], so its interval's
    ends are cut there (with 10 seeds and rates near 0 or 1 the t interval reaches past them)."""
    if v2.ASR not in cells:
        return []
    sub = cells[cells["attack_label"].isin(v2.SUCCESS_RATE_ATTACKS)].dropna(subset=[v2.ASR])
    rows = []
    for rule, values in sub.groupby("rule", sort=False)[v2.ASR]:
        iv = stats.t_interval(values.to_list())
        cut = stats.Interval(iv.mean, max(0.0, iv.low), min(1.0, iv.high), iv.n) if iv.has_ci else iv
        rows.append((iv.mean, [rule, cut.text(3), str(iv.n)]))
    if not rows:
        return []
    return md_table(["rule", "backdoor success rate [95 % t CI, cut to [0, 1]] (lower is better)", "seeds"],
                    [row for _, row in sorted(rows, key=lambda r: r[0])])


def rare_recall_lines(cells: pd.DataFrame, rare: tuple[int, ...]) -> list[str]:
    """Each rule's and control's final recall of the rare classes, mean [95 % t CI] over seeds: clean, and in each
    seed's worst-case cell (the attack of the nine with the lowest final balanced accuracy there)."""
    columns = [recall_column(c) for c in rare if recall_column(c) in cells]
    if not columns:
        return []
    clean = cells[cells["attack_label"] == "none"]
    attacked = cells[cells["attack_label"].isin(COMMON)].dropna(subset=["final_balanced_accuracy"])
    worst = attacked.loc[attacked.groupby(["rule", "seed"])["final_balanced_accuracy"].idxmin()]
    rows = []
    for name in [*[c for c in CONTROLS if c in set(clean["rule"])], *v2.order_by(
            v2.worst_per_seed(cells[~cells["rule"].isin(CONTROLS)], "final_balanced_accuracy", attacks=COMMON))]:
        row = [name]
        for column in columns:
            row.append(v2._iv(clean.loc[clean["rule"] == name, column].dropna()))
            w = worst.loc[worst["rule"] == name, column].dropna()
            row.append(v2._iv(w) if len(w) else "-")
        rows.append(row)
    head = [h for c in rare for h in (f"class {c}, no attack", f"class {c}, worst case")]
    return md_table(["rule or control", *head], rows)


def did_not_train_lines(cells: pd.DataFrame) -> list[str]:
    clean = cells[cells["attack_label"] == "none"]  # the controls too: a control that did not train is no control
    flat = clean[clean["final_balanced_accuracy"] <= clean["chance"] + DID_NOT_TRAIN]
    if flat.empty:
        return [f"Every rule trained on every seed (no clean run within {DID_NOT_TRAIN} of chance).", ""]
    pairs = ", ".join(f"{r.rule} (seed {int(r.seed)}: {r.final_balanced_accuracy:.3f})" for r in flat.itertuples())
    return [f"Did not train ({len(flat)} of {len(clean)} clean runs and controls within {DID_NOT_TRAIN} of chance; a "
            f"rule's attacked cells on such a seed are not robustness failures): {pairs}.", ""]


class Condition(NamedTuple):
    """A condition's page: its file, title and what it is (descriptive or decisive, where its rules' cells come
    from); its committed controls and rule cells; its evaluation parts (prefix and seeds); its classes."""

    page: str
    title: str
    what: str
    controls_csv: str
    cells_csv: str | None  # None: the rules' cells are v2's (--rules)
    part_prefix: str = ""
    seeds: tuple[int, ...] = ()
    classes: int = 2
    rare_classes: tuple[int, ...] = ()  # their recall beside the tables (RetinaMNIST: the two rarest grades)


CONDITIONS = {
    "pneumonia-main": Condition(
        "pneumonia-main.md", "PneumoniaMNIST main condition",
        "Descriptive: these seeds were seen in v2; the decisive conditions are RetinaMNIST's and Dirichlet 0.1's. "
        "The rules' cells are v2's (10 hospitals, Dirichlet 0.5, 3 colluding, 40 rounds)",
        "controls_pneumonia_main.csv", None),
    "alpha0.1": Condition(
        "alpha0.1.md", "PneumoniaMNIST, Dirichlet 0.1",
        "Decisive: fresh seeds 41-50, the protocol and its decision test committed before the first cell ran. "
        "The rules' cells are the ten evaluation parts `benchmarks/leaderboard/v3/alpha0.1-sNN.toml` (10 "
        "hospitals, Dirichlet 0.1, 3 colluding, 40 rounds, the main condition's rates and bounds; the cells in "
        "`alpha0.1_cells.csv`)",
        "controls_alpha0.1.csv", "alpha0.1_cells.csv", "alpha0.1-s", tuple(range(41, 51))),
    "retina": Condition(
        "retina.md", "RetinaMNIST main condition",
        "Decisive: seeds 11-20, never run on RetinaMNIST before, the protocol and its decision test committed before "
        "the first cell ran. The rules' cells are the ten evaluation parts `benchmarks/leaderboard/v3/retina-sNN.toml` "
        "(10 hospitals, Dirichlet 0.5, 3 colluding, 40 rounds, a 3-per-class cohort, Retina's own rates and bounds; "
        "the cells in `retina_cells.csv`). At 40 rounds no rule had reached its clean plateau: doubling to 80 rounds "
        "moved FedAvg by +0.041, the median by +0.016, FLTrust and the geometric median by +0.011, HTA by -0.005, "
        "EARN by -0.002 and anchored-trust by -0.024 on the tuning seeds (`plateau-retina/budget.md`)",
        "controls_retina.csv", "retina_cells.csv", "retina-s", tuple(range(11, 21)), classes=5, rare_classes=(1, 4)),
}


def cd_lines(cells: pd.DataFrame, title: str, png: Path | None) -> list[str]:
    """The critical-difference diagram of each rule's worst case over the nine and each control, seed by seed
    (descriptive: its bars are v2's Holm-corrected paired t-tests, the decision is the sign-flip table's), written to
    ``png``; a line pointing at it."""
    if png is None:
        return []
    column = "final_balanced_accuracy"
    worst = v2.worst_per_seed(cells[~cells["rule"].isin(CONTROLS)], column, attacks=COMMON)
    both = pd.concat([worst, v2.controls_per_seed(cells, column)], axis=1)
    data = v2.cd_png(both, f"{title}: worst case over the nine attacks, and the controls")
    if data is None:
        return []
    png.write_bytes(data)
    return [f"![critical-difference diagram]({png.name})", "",
            "Mean ranks over the seeds of each rule's worst case and each control (1 = best; bars join what Holm-corrected "
            "paired t-tests do not separate: descriptive, the decision is the sign-flip table above).", ""]


def render(rules: pd.DataFrame, controls: pd.DataFrame, condition: str = "pneumonia-main", cd_png: Path | None = None) -> str:
    spec = CONDITIONS[condition]
    title, what = spec.title, spec.what
    rare = [recall_column(c) for c in spec.rare_classes]
    cells = pd.concat([rules[KEEP + [c for c in (v2.ASR, *rare) if c in rules]], controls[KEEP + [c for c in rare if c in controls]]],
                      ignore_index=True)
    seeds = sorted(cells["seed"].unique())
    md = [f"# Leaderboard v3: does joining pay? {title}", "",
          f"Rendered by `python benchmarks/leaderboard/v3/render.py` (docs/leaderboard.md, \"v3 protocol\"). {what}; "
          "the controls are trained by `hospitrust/bench/controls.py` with the same data, model, training loop and "
          "evaluation.", "",
          f"Seeds: {', '.join(map(str, seeds))}. The worst case is over the nine attacks every rule meets: "
          f"{', '.join(COMMON)}.", "",
          "## The controls", ""] + controls_lines(cells)
    for column, what in OUTCOMES.items():
        md += [f"## Joining against going alone: {what}", ""] + joining_pays_lines(cells, column)
    md += cd_lines(cells, title, cd_png)
    md += ["## Against each control (descriptive, final-round balanced accuracy)", "",
           "Each rule's worst case over the nine minus each control, paired by seed: mean [95 % t CI], seeds above.", ""]
    md += each_control_lines(cells, "final_balanced_accuracy")
    md += ["## Each rule's own attack, beside (final-round balanced accuracy)", ""]
    md += own_attack_lines(cells, "final_balanced_accuracy")
    if backdoor := backdoor_lines(cells):
        md += ["## The backdoor, beside (its success rate on the server's test images, lower is better)", ""] + backdoor
    if recall := rare_recall_lines(cells, spec.rare_classes):
        md += ["## The rare classes' recall, beside (final round; the worst case: each seed's worst attack of the nine)",
               ""] + recall
    md += ["## Did not train", ""] + did_not_train_lines(cells)
    return "\n".join(md) + "\n"


def part_rules(condition: Condition, grids: Path, archives: Path, committed: Path) -> pd.DataFrame:
    """A decisive condition's rule cells: from its parts' folders (unpacking archives where a folder lacks its
    cells) into ``committed``, or from ``committed`` alone when no part is at hand."""
    from hospitrust.bench.archive import unpack
    from hospitrust.bench.leaderboard import load

    found = []
    for seed in condition.seeds:
        name = f"{condition.part_prefix}{seed}"
        folder, archive = grids / name, archives / f"{name}.tar.xz"
        if not any((folder / "cells").glob("*/summary.json")) and archive.is_file():
            print(f"[render] unpacking {archive.name}", file=sys.stderr)
            unpack(archive, folder)
        if any((folder / "cells").glob("*/summary.json")):
            found.append(folder)
    if not found:
        if committed.is_file():
            return pd.read_csv(committed)
        raise SystemExit(f"render.py: no {condition.title} part in {grids} nor {archives}, and no {committed}")
    loaded = load(found).cells
    frames = [with_rare_recall(loaded[loaded["grid_dir"] == str(f.resolve())].copy(), f, condition.rare_classes)
              for f in found]
    cells = pd.concat(frames, ignore_index=True)
    keep = KEEP + [c for c in (v2.ASR,) if c in cells] + [recall_column(c) for c in condition.rare_classes]
    cells = cells[keep].sort_values(["rule", "seed", "attack_label"]).reset_index(drop=True)
    cells.to_csv(committed, index=False)
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--condition", choices=sorted(CONDITIONS), default="pneumonia-main")
    parser.add_argument("--controls", type=Path, help="the controls grid's folder (default: the committed cells)")
    parser.add_argument("--rules", type=Path, default=REPO / "docs/results/leaderboard/v2/board/leaderboard_cells.csv",
                        help="pneumonia-main: v2's committed cells")
    parser.add_argument("--grids", type=Path, default=REPO / "runs/leaderboard-v3",
                        help="alpha0.1, retina: the folder of its parts' grid folders")
    parser.add_argument("--archives", type=Path, default=REPO / "docs/results/leaderboard/v3/grids",
                        help="alpha0.1, retina: the folder of its parts' archives")
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/leaderboard/v3")
    args = parser.parse_args(argv)
    condition = CONDITIONS[args.condition]
    committed = args.out / condition.controls_csv
    if args.controls is not None:
        controls = read_controls(args.controls, condition)
        args.out.mkdir(parents=True, exist_ok=True)
        controls.to_csv(committed, index=False)
    elif committed.is_file():
        controls = pd.read_csv(committed)
    else:
        raise SystemExit(f"render.py: no controls: give --controls (the controls grid's folder) or commit {committed}")
    if condition.cells_csv is None:
        rules = pd.read_csv(args.rules)
        rules = rules[rules["condition"] == "main"]
    else:
        rules = part_rules(condition, args.grids, args.archives, args.out / condition.cells_csv)
    page = args.out / condition.page
    page.write_text(render(rules, controls, args.condition, cd_png=page.with_name(f"{page.stem}-cd.png")))
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

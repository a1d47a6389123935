"""The leaderboard v2's page of results, from its parts' grid folders (or their committed archives).

    python benchmarks/leaderboard/v2/render.py                       # runs/leaderboard-v2 -> docs/results/leaderboard/v2/board
    python benchmarks/leaderboard/v2/render.py --grids DIR --out DIR --focus anchored-trust

A part is read from ``--grids/<part>`` when that folder has finished cells, else from its archive in
``--archives`` (unpacked into ``--grids`` first, saying so). A ranked part's cells are the main condition's;
a condition part's are its condition's (benchmarks/leaderboard/v2/parts.py names them). The page
(``leaderboard.md``, with ``leaderboard_cells.csv`` and the PNGs beside it) holds, per the v2 protocol
(docs/leaderboard.md): the main condition's rules x attacks table, its ranking by per-seed worst case with
rank ranges, its critical-difference diagram and the backdoor's success rates; the threat models apart;
the sweeps (f, alpha, 20 hospitals) with their figures; Friedman over (condition, seed) blocks; and the
focus rule against every other, paired by seed, Holm-corrected. Unfinished parts are listed, and every
table says over how many seeds it stands.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "study"))  # the studies' own code (not in the wheel)
import parts  # noqa: E402  (the part names, rules and attacks: one source)

import leaderboard_v2 as v2  # noqa: E402
from hospitrust.bench import stats  # noqa: E402
from hospitrust.bench.leaderboard import LeaderboardError, load  # noqa: E402

REPO = HERE.parents[2]
MAIN = "main"
COLUMN = "final_balanced_accuracy"
PART = re.compile(r"^(?:leaderboard-v2-)?(?:(?P<ranked>ranked-pneumonia-s\d+-[a-z])|condition-(?P<condition>.+)-s\d+)$")
# the attacks of the main condition, grouped by what the attacker knows and aims at
DATA_POISONING = ("label-flip",)
UPDATE_ATTACKS = ("sign-flip", "scaling", "alie", "ipm", "min-max", "min-sum")
SUITE_ORDER = [label for label, _ in parts.RULE_AGNOSTIC] + [label for label, _, _ in parts.RULE_SPECIFIC]


def expected_attacks(condition: str) -> dict[str, set[str]]:
    """Each rule's attacks in a condition by the parts' files (parts.py): what its worst case must cover."""
    if condition == MAIN:
        return {rule: {label for label, _ in parts.RULE_AGNOSTIC}
                | {label for label, _, who in parts.RULE_SPECIFIC if rule in who} for rule in parts.RULE_PARAMETERS}
    attacks = parts.CONDITIONS[condition][3]
    return {rule: {label for label, _ in attacks} for rule in parts.CONDITION_RULES}


def condition_of(grid_name: str) -> str:
    """A part's condition from its grid name: ``main`` for the ranked parts, else the condition part's name."""
    m = PART.match(grid_name)
    if not m:
        raise LeaderboardError(f"grid {grid_name!r} is not a leaderboard v2 part (ranked-pneumonia-sNN-X or "
                               "condition-NAME-sNN, as benchmarks/leaderboard/v2/parts.py names them)")
    return MAIN if m["ranked"] else m["condition"]


def part_names() -> list[str]:
    """Every ranked and condition part, in parts.py's order."""
    return [name[:-5] for name in parts.every_part() if PART.match(name[:-5])]


def gather(grids: Path, archives: Path, say) -> tuple[list[Path], list[str]]:
    """The parts' grid folders with finished cells (unpacking archives where a folder lacks them), and the parts
    neither has.
    """
    from hospitrust.bench.archive import unpack

    found, missing = [], []
    for name in part_names():
        folder = grids / name
        finished = folder.is_dir() and any((folder / "cells").glob("*/summary.json"))
        archive = archives / f"{name}.tar.xz"
        if not finished and archive.is_file():
            say(f"[render] {name}: unpacking {archive.name}")
            unpack(archive, folder)
            finished = True
        (found if finished else missing).append(folder if finished else name)
    return found, missing


def _threat_models(cells: pd.DataFrame) -> dict[str, pd.DataFrame]:
    main = cells[cells["condition"] == MAIN]
    tuned = [a for a in v2.accuracy_attacks(main) if a not in DATA_POISONING + UPDATE_ATTACKS]
    out = {}
    faulty = cells[cells["condition"] == "faulty"]
    if len(faulty):
        out["faulty hospitals (label noise, corruption)"] = v2.worst_per_seed(faulty, COLUMN,
                                                                              expected=expected_attacks("faulty"))
    f1 = cells[cells["condition"] == "f1"]
    if len(f1):
        out["one malicious hospital (f = 1)"] = v2.worst_per_seed(f1, COLUMN, expected=expected_attacks("f1"))
    if len(main):
        exp = expected_attacks(MAIN)
        out["colluding minority f = 3: label flip"] = v2.worst_per_seed(main, COLUMN, DATA_POISONING, exp)
        out["colluding minority f = 3: update attacks blind to the rule"] = v2.worst_per_seed(main, COLUMN,
                                                                                             UPDATE_ATTACKS, exp)
        out["colluding minority f = 3: attacks tuned to the rule"] = v2.worst_per_seed(main, COLUMN, tuned, exp)
        out["colluding minority f = 3: every attack"] = v2.worst_per_seed(main, COLUMN, expected=exp)
    return out


def _main_at_condition_protocol(cells: pd.DataFrame) -> pd.DataFrame:
    """The main condition's runs that a condition part would have run: its seeds, rules and attacks (a sweep's
    f = 3 of 10 and alpha = 0.5 points, and the 10-hospital point beside 20).
    """
    labels = {label for label, _ in parts.CONDITION_ATTACKS}
    main = cells[cells["condition"] == MAIN]
    return main[main["seed"].isin(parts.CONDITION_SEEDS) & main["rule"].isin(parts.CONDITION_RULES)
                & main["attack_label"].isin(labels)]


SWEEPS = {  # name: (x label, [(point, condition or None for the main condition's runs)])
    "f": ("malicious hospitals of 10 (the rules sized for them)", [("f = 1", "f1"), ("f = 2", "f2"), ("f = 3", None)]),
    "alpha": ("Dirichlet alpha over labels", [("0.1", "alpha0.1"), ("0.5", None), ("1.0", "alpha1.0")]),
    "hospitals": ("hospitals (30 % malicious)", [("10", None), ("20", "h20")]),
}


def _fewer_seeds(points) -> str:
    """The sweep points that run fewer seeds than the others (amendment 13), in words."""
    fewer = [f"{label}: seeds {', '.join(map(str, parts.condition_seeds(c)))}, amendment 13" for label, c in points
             if c is not None and parts.condition_seeds(c) != tuple(parts.CONDITION_SEEDS)]
    return f" ({'; '.join(fewer)})" if fewer else ""


def condition_tables(cells: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Each sweep's cells (its condition parts' and the main condition's runs at their protocol) and the faulty
    hospitals' (only those that have run), by folder name."""
    at_protocol = _main_at_condition_protocol(cells)
    out = {}
    for name, (_, points) in SWEEPS.items():
        conds = [c for _, c in points if c is not None]
        parts_cells = cells[cells["condition"].isin(conds)]
        if len(parts_cells):
            out[f"sweep-{name}"] = pd.concat([at_protocol, parts_cells])
    faulty = cells[cells["condition"] == "faulty"]
    if len(faulty):
        out["faulty-hospitals"] = faulty
    return out


def page(cells: pd.DataFrame, out: Path, *, focus: str, baseline: str, grids, missing: list[str]) -> list[str]:
    """The page's Markdown lines from the board's cells (its PNGs written into ``out``)."""
    md = ["# Leaderboard v2: results", "",
          "Rendered by `python benchmarks/leaderboard/v2/render.py` from the parts' grids (docs/leaderboard.md, "
          "\"v2 protocol\"). Headline: the final model's balanced accuracy on the test split. A rule's value on a seed "
          "is its worst case over the attacks it met there (the backdoor scored by its success rate, beside it); means "
          "over seeds carry Student's t 95 % intervals; rules are compared paired by seed (paired t-tests, Holm over "
          "all pairs) and shown as rank ranges.", ""]
    md += ["## Parts", ""]
    rows = [[g.name.removeprefix("leaderboard-v2-"), condition_of(g.name), f"{g.done} / {g.total}",
             "-" if g.wall_seconds != g.wall_seconds else f"{g.wall_seconds / 60:.1f}"] for g in grids]
    md += v2.md_table(["part", "condition", "cells finished", "wall time (min, its starts summed)"], rows)
    if missing:
        md += [f"Not run yet ({len(missing)} parts): {', '.join(missing)}. Every table below stands on the seeds it "
               "names.", ""]
    # the main condition
    main = cells[cells["condition"] == MAIN]
    if len(main):
        worst, clean = v2.worst_per_seed(main, COLUMN, expected=expected_attacks(MAIN)), v2.clean_per_seed(main, COLUMN)
        order = v2.order_by(worst.dropna()) if len(worst.dropna()) else sorted(worst.columns)
        chance = main["chance"].dropna().unique()
        md += ["## Main condition: PneumoniaMNIST, 10 hospitals, Dirichlet 0.5, 3 colluding", "",
               f"Seeds: {', '.join(str(s) for s in sorted(main['seed'].unique()))}.", "",
               "### Rules x attacks", "",
               "Mean over seeds [95 % t CI] (n: a cell's seeds where fewer than the rule's most); \"-\": an attack "
               "aimed at another rule; \"not run\": the rule meets it, but no run has finished. A seed's worst case "
               "needs every attack the rule meets (a seed of an unfinished part has none), and leaves out the "
               "backdoor (its success rate is below).", ""]
        md += v2.matrix_lines(main, COLUMN, order, chance=float(chance[0]) if len(chance) == 1 else None,
                              order=SUITE_ORDER, expected=expected_attacks(MAIN))
        md += ["### Ranking by the per-seed worst case", ""]
        md += v2.ranking_lines(worst, clean, baseline)
        png = v2.cd_png(worst, "main condition: per-seed worst cases")
        if png:
            (out / "cd_main.png").write_bytes(png)
            md += ["![critical-difference diagram, main condition](cd_main.png)", ""]
        md += ["### Backdoor success rate", ""] + v2.success_rate_lines(main, order)
    # threat models
    models = _threat_models(cells)
    if models:
        rules = [r for r in parts.RULE_PARAMETERS if any(r in w for w in models.values())]
        md += ["## Threat models apart", "",
               "Per-seed worst case within each threat model, mean over its seeds [95 % t CI] (n = seeds). Faulty and "
               f"one malicious hospital: the condition parts ({len(parts.CONDITION_SEEDS)} seeds, the kept rules, "
               "amendment 12's attacks); the colluding minority: the main condition, its attacks grouped by what the "
               "attacker aims at.", ""]
        md += v2.by_threat_model_lines(models, rules)
    # sweeps
    at_protocol = _main_at_condition_protocol(cells)
    for name, (xlabel, points) in SWEEPS.items():
        worsts = {}
        for label, cond in points:
            sub = at_protocol if cond is None else cells[cells["condition"] == cond]
            if len(sub):
                # the main condition's point is held to a condition part's attacks (f1's: none of the clean run)
                worsts[label] = v2.worst_per_seed(sub, COLUMN, expected=expected_attacks(cond or "f1"))
        if len(worsts) < 2:
            continue
        rules = [r for r in parts.CONDITION_RULES if any(r in w for w in worsts.values())]
        md += [f"## Sweep: {xlabel}", "",
               f"The condition parts' attacks ({', '.join(label for label, _ in parts.CONDITION_ATTACKS)}; amendment 12) "
               f"at seeds {', '.join(map(str, parts.CONDITION_SEEDS))}{_fewer_seeds(points)}; the main condition's point is its runs of the "
               "same seeds, rules and attacks: a sweep's worst case is over these attacks only, milder than the main "
               "condition's over the full suite.", ""]
        md += v2.by_threat_model_lines(worsts, rules)
        (out / f"sweep_{name}.png").write_bytes(v2.sweep_png(worsts, rules, f"sweep: {xlabel}", xlabel))
        md += [f"![sweep: {xlabel}](sweep_{name}.png)", ""]
    # across conditions
    conditions = [c for c in parts.CONDITIONS if c != "faulty" and (cells["condition"] == c).any()]
    if conditions:
        pooled = pd.concat([at_protocol.assign(condition=MAIN),
                            *[cells[cells["condition"] == c] for c in conditions]])
        pooled = pooled[pooled["rule"].isin(parts.CONDITION_RULES)]
        blocks = stats.worst_case_blocks(pooled[pooled["attack_label"].isin(v2.accuracy_attacks(pooled))],
                                         value=COLUMN, attack="attack_label")
        if len(blocks) >= 2:
            fried = stats.friedman(blocks)
            used = list(dict.fromkeys(blocks.index.get_level_values(0)))
            md += ["## Across conditions: (condition, seed) blocks", "",
                   f"{len(blocks)} blocks ({', '.join(used)}; the main condition's runs matched to the condition parts' "
                   "seeds, rules and attacks), each the rules' per-seed worst cases. Friedman: "
                   + (f"chi2 = {fried.statistic:.2f}, p = {fried.pvalue:.3g}." if fried.pvalue == fried.pvalue else fried.note), ""]
            md += v2.ranking_lines(blocks, pd.DataFrame(), baseline, what="block's worst case",
                                   unit="(condition, seed) blocks")
            png = v2.cd_png(blocks.reset_index(drop=True), "all conditions: (condition, seed) blocks")
            if png:
                (out / "cd_all_conditions.png").write_bytes(png)
                md += ["![critical-difference diagram, all conditions](cd_all_conditions.png)", ""]
    # the focus rule
    if focus and (cells["rule"] == focus).any():
        md += [f"## {focus} against every other rule, paired by seed", "",
               f"Per seed, {focus}'s worst case minus the other rule's: the mean with its 95 % t interval; the Holm step "
               "interval (the j-th smallest p-value's interval at 1 - 0.05 / (m - j + 1): a rule is beaten exactly when "
               "its step interval and those of every rule before it exclude 0); the paired t-test's and the sign-flip "
               "test's p-values, Holm-corrected over the other rules. **The claim is tested in the main condition "
               "only, fixed before its grids ran** (the only condition with 10 seeds; the sweeps and threat-model "
               f"conditions run {len(parts.CONDITION_SEEDS)}): \"beats it\" there needs the corrected t-test to reject at "
               f"{stats.ALPHA} over at least 10 paired seeds with a positive mean. The tables after it, a threat "
               "model's attacks within the main condition or a condition part's (fewer seeds), are descriptive and call nothing.", ""]
        if len(main):
            md += ["### Main condition, every attack (the claim)", ""]
            md += v2.focus_lines(worst, clean, focus, baseline)
        for model, w in models.items():
            if focus in w and "every attack" not in model:
                md += [f"### {model} (descriptive)", ""] + v2.focus_lines(w, pd.DataFrame(), focus, baseline, claim=False)
    return md


def main(argv: list[str] | None = None) -> int:
    """Gather the parts, render the page into ``--out``; 1 with a one-line reason when nothing can be rendered."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grids", default=str(REPO / "runs" / "leaderboard-v2"), help="folder of the parts' grid folders")
    ap.add_argument("--archives", default=str(REPO / "docs" / "results" / "leaderboard" / "v2" / "grids"),
                    help="folder of the parts' archives (hospitrust bench-archive pack)")
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / "leaderboard" / "v2" / "board"))
    ap.add_argument("--focus", default="anchored-trust", help="the rule set against every other (empty: none)")
    ap.add_argument("--baseline", default="fedavg")
    ap.add_argument("--ranked-table", default=None,
                    help="also write the main condition's cells (the ranked table) to this CSV "
                         "(docs/results/leaderboard/leaderboard_cells.csv once every ranked part has run)")
    ap.add_argument("--sweeps-out", default=None,
                    help="also write each sweep's and the faulty hospitals' cells (the main condition's matched runs "
                         "included) to DIR/sweep-NAME/ and DIR/faulty-hospitals/ (docs/results/leaderboard)")
    args = ap.parse_args(argv)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    grids, out = Path(args.grids), Path(args.out)
    grids.mkdir(parents=True, exist_ok=True)
    found, missing = gather(grids, Path(args.archives), say)
    if not found:
        print(f"render: no part has finished cells in {grids} nor an archive in {args.archives}: run a part first "
              "(the commands are in each part's header)", file=sys.stderr)
        return 1
    try:
        board = load(found, progress=say, condition_of=condition_of)
    except LeaderboardError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    md = page(board.cells, out, focus=args.focus, baseline=args.baseline, grids=board.grids, missing=missing)
    keep = [c for c in ("condition", "rule", "attack_label", "seed", "strategy", "attack", "learning-rate",
                        "max-update-norm", "malicious-fraction", "hospitals", "dirichlet.alpha", "num-server-rounds",
                        COLUMN, "final_accuracy", "final_auc", "final_macro_f1", "final_rare_class_macro_f1",
                        "final_attack_success_rate", "last_k", "chance", "detection_fpr", "grid") if c in board.cells]
    table = board.cells[keep].sort_values(["condition", "rule", "attack_label", "seed"])
    table.to_csv(out / "leaderboard_cells.csv", index=False)
    if args.ranked_table:
        table[table["condition"] == MAIN].to_csv(args.ranked_table, index=False)
    if args.sweeps_out:
        for name, sub in condition_tables(table).items():
            folder = Path(args.sweeps_out) / name
            folder.mkdir(parents=True, exist_ok=True)
            sub.to_csv(folder / "leaderboard_cells.csv", index=False)
    (out / "leaderboard.md").write_text("\n".join(md) + "\n")
    print(f"leaderboard v2: {out / 'leaderboard.md'} ({len(board.cells)} runs from {len(found)} parts; "
          f"{len(missing)} parts not run yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The leaderboard v2's ranked grid (the main condition), written as parts that each fit in an hour.

One part is one evaluation seed and one half of the ranked rules, so a part is a whole block of the
statistics' unit (a seed) for its rules, and an interrupted session loses at most one part. Every part
holds the same attack suite (docs/leaderboard.md, "The attack suite: complete and symmetric"); the
rules' learning rates and the rounds come from the budget at the tiny CNN with augmentation (docs/results/leaderboard/v2/budget-aug/).

    python benchmarks/leaderboard/v2/parts.py            # (re)write the part files beside this script
    python benchmarks/leaderboard/v2/parts.py --check    # exit 1 if a committed part differs

tests/test_leaderboard.py checks that the committed parts are this script's output and that every rule
meets the same rule-agnostic attacks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

EVALUATION_SEEDS = tuple(range(11, 21))  # none of them screened rules or chose a budget (tuning seeds: 1-3)
# the ranked rules, in two halves of about equal cost: (learning rate, max-update-norm), both from the budget
# (amendments 4 and 5: the rate chosen on the val split; the bound twice the largest honest update norm of the
# rule's clean tuning runs at that rate, rounded up)
RULES: dict[str, dict[str, tuple[float, float]]] = {
    "a": {"fedavg": (0.01, 1.8), "median": (0.03, 5.0), "trimmed-mean": (0.03, 5.1), "krum": (0.01, 1.3),
          "multi-krum": (0.03, 5.7), "geometric-median": (0.03, 6.2)},
    "b": {"centered-clipping": (0.03, 5.3), "fltrust": (0.03, 6.0), "foolsgold": (0.1, 19.0), "hta": (0.03, 5.2),
          "earn": (0.03, 6.0), "fedagain": (0.03, 5.2)},
    # amendment 10: issue 45's rule, designed on the tuning seeds 1-3 and frozen before its first evaluation cell
    # (rate and bound from tune-aug-anchored-trust.toml, as amendments 4 and 5 choose them)
    "c": {"anchored-trust": (0.03, 5.8)},
}
MODEL = "tiny-cnn"  # amendment 7
AUGMENTATION = "affine-rotation=10,affine-translate=0.1,affine-crop=0.8"  # amendment 8
ROUNDS = 40  # amendment 9: 40 rounds for every rule and condition (80 would take about 25 h of the 16 h)

RULE_AGNOSTIC = [
    ("none", {"attack": "none"}),
    ("label-flip", {"attack": "label-flip"}),
    ("sign-flip", {"attack": "sign-flip"}),
    ("scaling", {"attack": "scaling"}),
    ("alie", {"attack": "alie"}),
    ("ipm", {"attack": "ipm"}),
    ("min-max", {"attack": "min-max"}),
    ("min-sum", {"attack": "min-sum"}),
    ("tailored-alie", {"attack": "tailored-alie"}),
    ("tailored-ipm", {"attack": "tailored-ipm"}),
    ("backdoor", {"attack": "backdoor"}),
]
# attacks defined for some rules only: (label, options, the rules that meet it)
RULE_SPECIFIC = [
    ("agr-tailored", {"attack": "agr-tailored"}, ("median", "trimmed-mean", "krum", "multi-krum")),
    ("hta-aware", {"attack": "hta-aware"}, ("hta",)),
    ("earn-aware", {"attack": "earn-aware"}, ("earn",)),
    ("fltrust-aware", {"attack": "fltrust-aware"}, ("fltrust", "anchored-trust")),
    ("anchored-trust-aware", {"attack": "anchored-trust-aware"}, ("anchored-trust",)),
    ("alie-decorrelated", {"attack": "alie", "alie.copy-noise": 1.0}, ("foolsgold", "anchored-trust")),
    ("tailored-ipm-decorrelated", {"attack": "tailored-ipm", "tailored-ipm.copy-noise": 1.0},
     ("foolsgold", "anchored-trust")),
]


# The threat-model tables and the sweeps (docs/leaderboard.md, "Conditions and threat models"): the
# rule-agnostic suite's cut, on the rules the cost table's cut keeps (amendment 8). Amendment 12 (the 16 h budget):
# 3 of the evaluation seeds and two update attacks, sign flip (blind) and ALIE (omniscient, colluding), the same for
# every rule; "none" runs only where the clean run differs from the main condition's (alpha, 20 hospitals).
# Their "f = 3 of 10", "alpha = 0.5" and the faulty hospitals' "none" points are the main condition's cells of
# the same seeds; the rules keep the main condition's learning rate and bound (amendment 8).
CONDITION_SEEDS = EVALUATION_SEEDS[:3]
# amendment 13 (before any 20-hospital part ran): the condition parts cost about 1.25x their estimate, so the
# 20-hospital condition runs seeds 11-12 only, to stay within the 16 h
CONDITION_SEEDS_OF = {"h20": EVALUATION_SEEDS[:2]}


def condition_seeds(condition: str) -> tuple[int, ...]:
    """The seeds a condition's parts run."""
    return tuple(CONDITION_SEEDS_OF.get(condition, CONDITION_SEEDS))

# amendment 12: FoolsGold left out (its clean runs average 0.59, 0.25 below FedAvg: a sweep of a rule that does not
# train without attack says nothing of its robustness)
CONDITION_RULES = ("fedavg", "median", "multi-krum", "fltrust", "hta", "earn", "fedagain", "anchored-trust")
CONDITION_ATTACKS = [
    ("sign-flip", {"attack": "sign-flip"}),
    ("alie", {"attack": "alie"}),
]
CLEAN = [("none", {"attack": "none"})]
# the rules and attacks the 20-hospital cost probe ran with (before amendment 12 cut them): its file stays as run
PROBED_CONDITION_RULES = ("fedavg", "median", "multi-krum", "fltrust", "foolsgold", "hta", "earn", "fedagain")
PROBED_CONDITION_ATTACKS = CLEAN + [(a, {"attack": a}) for a in ("label-flip", "sign-flip", "alie", "ipm", "tailored-ipm")]
FAULTY_ATTACKS = [
    ("label-noise", {"attack": "label-noise"}),
    ("corruption", {"attack": "corruption"}),
]
# name: (what it varies, hospitals, [base] values over the main condition's, its attacks)
CONDITIONS: dict[str, tuple[str, int, dict[str, object], list[tuple[str, dict[str, object]]]]] = {
    "faulty": ("faulty hospitals: 3 of 10 honest but careless (label noise) or with corrupted images", 10,
               {}, FAULTY_ATTACKS),
    "f1": ("one malicious hospital (f = 1 of 10, the rules sized for 1)", 10,
           {"malicious-fraction": 0.1, "assumed-malicious": 1}, CONDITION_ATTACKS),
    "f2": ("two colluding hospitals (f = 2 of 10, the rules sized for 2)", 10,
           {"malicious-fraction": 0.2, "assumed-malicious": 2}, CONDITION_ATTACKS),
    "alpha0.1": ("heterogeneity: Dirichlet alpha = 0.1", 10, {'"dirichlet.alpha"': 0.1}, CLEAN + CONDITION_ATTACKS),
    "alpha1.0": ("heterogeneity: Dirichlet alpha = 1.0", 10, {'"dirichlet.alpha"': 1.0}, CLEAN + CONDITION_ATTACKS),
    "h20": ("20 hospitals, 6 of 20 malicious (the rules sized for 6)", 20,
            {"malicious-fraction": 0.3, "assumed-malicious": 6}, CLEAN + CONDITION_ATTACKS),
}
RULE_PARAMETERS = {**RULES["a"], **RULES["b"], **RULES["c"]}


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def _inline(options: dict[str, object]) -> str:
    return "{ " + ", ".join(f'{k if k.replace("-", "").isalnum() else chr(34) + k + chr(34)} = {_value(v)}'
                            for k, v in options.items()) + " }"


def pneumonia_base(overrides: dict[str, object] | None = None, **more: object) -> dict[str, object]:
    """The main condition's ``[base]`` values, keys as written in a grid file (PneumoniaMNIST, 10 hospitals,
    Dirichlet 0.5, 3 colluders; amendment 8's model, augmentation and rounds); a part overrides what its condition
    changes (v3's Dirichlet 0.1 parts too). One source, so every part's base is the same run but for its overrides."""
    return {
        "dataset": '"pneumoniamnist"', "partitioner": '"dirichlet"', '"dirichlet.alpha"': 0.5, "model": f'"{MODEL}"',
        '"task.augmentation"': f'"{AUGMENTATION}"',
        "num-server-rounds": ROUNDS, "local-epochs": 1, "train-subsample": 0.25,
        '"train.class-weighted-loss"': "true", "checkpoint": "false", "malicious-fraction": 0.3,
        "assumed-malicious": 3, '"label-flip.mode"': '"source-to-target"', '"label-flip.source"': 1,
        '"label-flip.target"': 0, **(overrides or {}), **more,
    }


def base_lines(values: dict[str, object]) -> list[str]:
    return [f"{k} = {v}" for k, v in values.items()]


def part_name(seed: int, half: str) -> str:
    return f"ranked-pneumonia-s{seed}-{half}.toml"


def render(seed: int, half: str) -> str:
    """One part's grid file."""
    rules = RULES[half]
    if any(v is None for pair in rules.values() for v in pair):
        raise SystemExit("parts.py: the budget is not complete (a learning rate or max-update-norm is None); "
                         "fill RULES from docs/results/leaderboard/v2/budget-aug/ first")
    attacks = RULE_AGNOSTIC + [(label, opts) for label, opts, who in RULE_SPECIFIC if set(who) & set(rules)]
    cells = len(rules) * len(RULE_AGNOSTIC) + sum(len(set(who) & set(rules)) for _, _, who in RULE_SPECIFIC)
    path = f"benchmarks/leaderboard/v2/{part_name(seed, half)}"
    lines = [
        f"# Leaderboard v2, ranked grid of the main condition: evaluation seed {seed}, rules {half} (generated by",
        "# benchmarks/leaderboard/v2/parts.py: edit it there). docs/leaderboard.md, \"v2 protocol\".",
        f"# Budget stated before it ran: {cells} cells of {ROUNDS} rounds, within 60 minutes on 2 cores (the cost table).",
        "# Measured wall time: recorded in the cost table's \"measured\" column per part (min).",
        f"#   hospitrust bench {path} --out runs/leaderboard-v2/{part_name(seed, half)[:-5]}",
        "[grid]",
        f'name = "leaderboard-v2-{part_name(seed, half)[:-5]}"',
        f'description = "PneumoniaMNIST, 10 hospitals, Dirichlet 0.5, 3 malicious: rules {half} x the full suite, '
        f'seed {seed}, {ROUNDS} rounds"',
        'backend = "inprocess"', "workers = 2", "hospitals = 10", 'aggregation-backend = "eager"',
        'metric = "balanced_accuracy"', 'baseline = "fedavg"', "",
        "[base]",
        *base_lines(pneumonia_base()), "",
        "[axes]",
        f"seed = [{seed}]",
        "strategy = [",
        *[f'    {{ label = "{r}", strategy = "{r}", learning-rate = {lr}, max-update-norm = {bound} }},'
          for r, (lr, bound) in rules.items()],
        "]",
        "attack = [",
        *[f"    {_inline({'label': label, **opts})}," for label, opts in attacks],
        "]", "",
        "[[when]]", 'if = { attack = "none" }', "set = { malicious-fraction = 0.0 }",
    ]
    for label, _, who in RULE_SPECIFIC:
        others = [r for r in rules if r not in who]
        if others and len(others) < len(rules):
            lines += ["", "[[when]]", f'if = {{ attack = "{label}", strategy = [{", ".join(map(_value, others))}] }}',
                      "skip = true"]
    return "\n".join(lines) + "\n"


def condition_part_name(condition: str, seed: int) -> str:
    return f"condition-{condition}-s{seed}.toml"


def render_condition(condition: str, seed: int) -> str:
    """One seed of a threat-model table or sweep point: the kept rules x that condition's attacks."""
    what, hospitals, overrides, attacks = CONDITIONS[condition]
    cells = len(CONDITION_RULES) * len(attacks)
    name = condition_part_name(condition, seed)[:-5]
    base = pneumonia_base(**overrides)
    lines = [
        f"# Leaderboard v2, {what}: evaluation seed {seed} (generated by benchmarks/leaderboard/v2/parts.py: edit it",
        "# there). docs/leaderboard.md, \"Conditions and threat models\", amendments 8 and 12.",
        f"# Budget stated before it ran: {cells} cells of {ROUNDS} rounds, {hospitals} hospitals, within 60 minutes on 2 cores "
        "(the cost table).",
        "# Measured wall time: recorded in the cost table's \"measured\" column per part (min).",
        f"#   hospitrust bench benchmarks/leaderboard/v2/{name}.toml --out runs/leaderboard-v2/{name}",
        "[grid]",
        f'name = "leaderboard-v2-{name}"',
        f'description = "PneumoniaMNIST, {what}: {len(CONDITION_RULES)} rules x {len(attacks)} attacks, seed {seed}, '
        f'{ROUNDS} rounds"',
        'backend = "inprocess"', "workers = 2", f"hospitals = {hospitals}", 'aggregation-backend = "eager"',
        'metric = "balanced_accuracy"', 'baseline = "fedavg"', "",
        "[base]",
        *base_lines(base),
        "",
        "[axes]",
        f"seed = [{seed}]",
        "strategy = [",
        *[f'    {{ label = "{r}", strategy = "{r}", learning-rate = {RULE_PARAMETERS[r][0]}, '
          f'max-update-norm = {RULE_PARAMETERS[r][1]} }},' for r in CONDITION_RULES],
        "]",
        "attack = [",
        *[f"    {_inline({'label': label, **opts})}," for label, opts in attacks],
        "]",
    ]
    if any(label == "none" for label, _ in attacks):
        lines += ["", "[[when]]", 'if = { attack = "none" }', "set = { malicious-fraction = 0.0 }"]
    return "\n".join(lines) + "\n"


def render_cost_probe(condition: str | None = None) -> str:
    """The cost table's probe: every cell kind of the main condition's ranked grid (or, with ``condition``, of one
    condition's parts) for 3 rounds on tuning seed 1, at the parts' rates and bounds."""
    # the probe ran before amendment 10: rules a and b (the c rule's cost is its probe grid's, measured)
    probed = {**RULES["a"], **RULES["b"]}
    if condition is None:
        rules, hospitals, overrides = probed, 10, {}
        specific = [(label, opts, who) for label, opts, who in RULE_SPECIFIC if set(who) & set(rules)]
        attacks = RULE_AGNOSTIC + [(label, opts) for label, opts, _ in specific]
        what, name = "every cell kind of the main condition's ranked grid", "cost-probe"
        skips = [(label, [r for r in rules if r not in who]) for label, _, who in specific]
    else:
        what, hospitals, overrides, _ = CONDITIONS[condition]
        attacks = PROBED_CONDITION_ATTACKS
        rules = {r: RULE_PARAMETERS[r] for r in PROBED_CONDITION_RULES if r in probed}
        name, skips = f"cost-probe-{condition}", []
    cells = len(rules) * len(attacks) - sum(len(others) for _, others in skips)
    base = pneumonia_base({"num-server-rounds": 3, **overrides})
    lines = [
        f"# Leaderboard v2, the cost table's probe (docs/leaderboard.md, \"Cost table\"): {what}, 3 rounds on",
        "# tuning seed 1, at the parts' learning rates and bounds, so every part's seconds per round are measured and",
        "# every combination shown to run before its parts start (generated by benchmarks/leaderboard/v2/parts.py).",
        f"# Budget stated before it ran: {cells} cells of 3 rounds, {hospitals} hospitals, at most 30 minutes on 2 cores.",
        "# Measured wall time: recorded in the cost table (docs/leaderboard.md).",
        f"#   hospitrust bench benchmarks/leaderboard/v2/{name}.toml --out runs/leaderboard-v2/{name}",
        "[grid]",
        f'name = "leaderboard-v2-{name}"',
        f'description = "PneumoniaMNIST, {hospitals} hospitals: {what}, 3 rounds, seed 1"',
        'backend = "inprocess"', "workers = 2", f"hospitals = {hospitals}", 'aggregation-backend = "eager"',
        'metric = "balanced_accuracy"', 'baseline = "fedavg"', "",
        "[base]",
        *base_lines(base),
        "",
        "[axes]",
        "seed = [1]",
        "strategy = [",
        *[f'    {{ label = "{r}", strategy = "{r}", learning-rate = {lr}, max-update-norm = {bound} }},'
          for r, (lr, bound) in rules.items()],
        "]",
        "attack = [",
        *[f"    {_inline({'label': label, **opts})}," for label, opts in attacks],
        "]",
    ]
    if any(label == "none" for label, _ in attacks):
        lines += ["", "[[when]]", 'if = { attack = "none" }', "set = { malicious-fraction = 0.0 }"]
    for label, others in skips:
        lines += ["", "[[when]]", f'if = {{ attack = "{label}", strategy = [{", ".join(map(_value, others))}] }}',
                  "skip = true"]
    return "\n".join(lines) + "\n"


def every_part() -> dict[str, str]:
    """Every generated part: file name -> text."""
    out = {part_name(seed, half): render(seed, half) for seed in EVALUATION_SEEDS for half in RULES}
    out.update({condition_part_name(c, seed): render_condition(c, seed) for c in CONDITIONS
                for seed in condition_seeds(c)})
    out["cost-probe.toml"] = render_cost_probe()
    out["cost-probe-h20.toml"] = render_cost_probe("h20")  # the only condition whose cells differ in size
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed parts instead of writing")
    args = ap.parse_args(argv)
    stale = []
    for name, text in every_part().items():
        path = HERE / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"parts.py: {len(stale)} part(s) differ from the generator: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

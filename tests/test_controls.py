"""The controls (hospitrust.bench.controls): what the server or the hospitals get without federating, as rows
of a grid beside the rules, and each rule's worst case set against the best of them."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import tomllib

import numpy as np
import pandas as pd
import pytest
import torch

from hospitrust.attacks.selection import malicious_set
import leaderboard_v2 as v2  # benchmarks/study (conftest.STUDY on sys.path)
from hospitrust.bench.controls import CONTROLS, Control, ControlError, honest_partitions
from hospitrust.server_app.converge import EpochTrainer
from hospitrust.bench.grid import GridError, grid_fingerprint, parse_grid
from hospitrust.config import parse_run_config
from hospitrust.models import build_model
from hospitrust.models.training import balanced_class_weights, seed_everything, train
from hospitrust.ops.simulate import app_config_defaults

from conftest import REPO


def test_a_controls_keys_are_checked_with_what_is_allowed():
    assert Control.from_keys({}) is None
    assert Control.from_keys({"control": "cohort-only-rounds"}) == Control("cohort-only-rounds")
    assert Control.from_keys({"control": "pooled", "control-epochs": 5, "control-learning-rate": 0.01}) == Control(
        "pooled", 5, 0.01)
    bad = [({"control": "alone"}, "control = 'alone'; allowed: " + ", ".join(CONTROLS)),
           ({"control": "pooled"}, "control-epochs must be an integer in [1, 100000]"),
           ({"control": "local-only-best", "control-epochs": 2.5}, "got 2.5"),
           ({"control": "cohort-only-rounds", "control-epochs": 3}, "control-epochs does not apply"),
           ({"control": "pooled", "control-epochs": 3, "control-learning-rate": -1}, "control-learning-rate must be"),
           ({"control-epochs": 3}, "control-epochs without control = one of"),
           ({"control": "pooled", "control-epoch": 3}, "unknown control key(s) ['control-epoch']")]
    for keys, message in bad:
        with pytest.raises(ControlError, match=None) as err:
            Control.from_keys(keys)
        assert message in str(err.value), (keys, str(err.value))


def test_the_honest_hospitals_are_those_the_attacked_cells_leave_honest():
    defaults = app_config_defaults()
    for fraction, named, seed in ((0.3, "", 11), (0.3, "", 12), (0.0, "", 11), (0.0, "0,3", 5)):
        cfg = parse_run_config({**defaults, "malicious-fraction": fraction, "malicious-hospitals": named, "seed": seed})
        bad = malicious_set(10, malicious_fraction=fraction, malicious_hospitals=named, seed=seed)
        assert honest_partitions(cfg, 10) == [i for i in range(10) if i not in bad]
    cfg = parse_run_config({**defaults, "malicious-hospitals": "0,3"})
    assert honest_partitions(cfg, 5) == [1, 2, 4]
    assert len(honest_partitions(parse_run_config({**defaults, "malicious-fraction": 0.3, "seed": 11}), 10)) == 7


def test_training_one_epoch_at_a_time_is_training_for_every_epoch_at_once():
    # the converged controls evaluate after each epoch; the model must be the one train(epochs=E) gives
    cfg = parse_run_config({**app_config_defaults(), "batch-size": 8, "train.class-weighted-loss": True})
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(21, 28, 28, 1), dtype=np.uint8)  # 3 batches, the last one short
    labels = rng.integers(0, 2, size=21).astype(np.int64)

    def fresh():
        seed_everything(5)
        return build_model("tiny-cnn", 1, 2, 28)

    a = fresh()
    seed_everything(9)
    trainer = EpochTrainer(a, images, labels, cfg=cfg, learning_rate=0.05, num_classes=2, augment=None,
                           device=torch.device("cpu"))
    for _ in range(3):
        trainer.epoch()
    b = fresh()
    seed_everything(9)
    train(b, images, labels, epochs=3, batch_size=8, learning_rate=0.05, optimizer=cfg.train.optimizer,
          momentum=cfg.train.momentum, weight_decay=cfg.train.weight_decay, device=torch.device("cpu"),
          class_weights=balanced_class_weights(labels, 2))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), fresh().state_dict().values()))  # it trained


def _frame(values: dict[str, list[float]], attack: str) -> list[dict]:
    return [{"rule": rule, "seed": 11 + i, "attack_label": attack, "final_balanced_accuracy": v}
            for rule, vs in values.items() for i, v in enumerate(vs)]


def test_each_rules_worst_case_is_paired_with_the_control_best_on_average():
    cells = pd.DataFrame(_frame({"fltrust": [0.80, 0.70, 0.90]}, "alie") + _frame({"fltrust": [0.85, 0.80, 0.95]}, "ipm")
                         + _frame({"fltrust": [0.9, 0.9, 0.9], "cohort-only-rounds": [0.75, 0.75, 0.75],
                                   "local-only-mean": [0.5, 0.6, 0.7], "pooled": [0.95, 0.95, 0.95]}, "none"))
    worst = v2.worst_per_seed(cells, "final_balanced_accuracy", attacks=["alie", "ipm"])
    controls = v2.controls_per_seed(cells, "final_balanced_accuracy")
    assert list(controls.columns) == ["cohort-only-rounds", "local-only-mean", "pooled"]  # the rule's clean run is not one
    best, table = v2.versus_control(worst, controls)
    # mean 0.75 against 0.60: one control for the table, not a per-seed max; pooled (0.95) is the ceiling, not a candidate
    assert best == "cohort-only-rounds"
    (row,) = table.itertuples()
    # differences 0.05, -0.05, 0.15: mean 0.05, sd 0.1, t(0.975, 2) = 4.3027 -> half width 0.24842
    assert row.seeds == 3 and row.above == 2
    assert math.isclose(row.mean, 0.05, abs_tol=1e-12)
    assert math.isclose(row.low, 0.05 - 0.248414, abs_tol=1e-5) and math.isclose(row.high, 0.05 + 0.248414, abs_tol=1e-5)
    # |sum| of the 8 sign patterns: 0.15, 0.15, 0.25, 0.05, 0.05, 0.25, 0.15, 0.15: 6 of 8 at least 0.15
    assert math.isclose(row.p, 0.75)
    lines = "\n".join(v2.versus_control_lines(worst, controls))
    assert "minus the best control (cohort-only-rounds)" in lines and "| fltrust | 3 | 0.050 [-0.198, 0.298] | 0.75 | 2 of 3 |" in lines
    assert "whether federating pays is not shown" in v2.versus_control_lines(worst, pd.DataFrame())[0]


def test_a_grid_takes_controls_beside_its_rules_and_a_rules_cell_hashes_as_before():
    grid = REPO / "benchmarks" / "leaderboard" / "v2" / "ranked-pneumonia-s11-a.toml"
    parsed = parse_grid(grid, validate=False)
    old = hashlib.sha1(json.dumps([[c.name, c.hospitals, c.run_config] for c in parsed.cells], sort_keys=True,
                                  default=str).encode()).hexdigest()[:12]
    assert grid_fingerprint(parsed) == old and all(c.control == {} for c in parsed.cells)

    base = {"grid": {"name": "g", "hospitals": 4}, "base": {"num-server-rounds": 2, "malicious-fraction": 0.25},
            "axes": {"seed": [1], "strategy": [{"label": "fedavg", "strategy": "fedavg"},
                                               {"label": "pooled", "control": "pooled", "control-epochs": 3},
                                               {"label": "cohort", "control": "cohort-only-rounds"}]}}
    cells = {c.axes["strategy"]: c for c in parse_grid(base, validate=False).cells}
    assert cells["fedavg"].control == {} and cells["cohort"].control == {"control": "cohort-only-rounds"}
    assert cells["pooled"].control == {"control": "pooled", "control-epochs": 3}
    assert cells["pooled"].run_config["malicious-fraction"] == 0.25  # the condition's honest hospitals
    wrong = json.loads(json.dumps(base))
    wrong["axes"]["strategy"][1] = {"label": "pooled", "control": "pooled"}
    with pytest.raises(GridError, match=r"cell seed=1__strategy=pooled: control = 'pooled' trains to convergence"):
        parse_grid(wrong, validate=False)


@pytest.mark.data
def test_every_control_runs_in_a_grid_and_is_read_back_as_a_row(tmp_path, data_dir):
    from hospitrust.bench.runner import run_grid
    from hospitrust.datasets.federation import simulated_hospital

    grid = parse_grid({
        "grid": {"name": "controls", "hospitals": 4, "workers": 1},
        "base": {"dataset": "pneumoniamnist", "model": "tiny-cnn", "num-server-rounds": 3, "train-subsample": 0.05,
                 "malicious-fraction": 0.25, "reference-cohort-per-class": 10, "train.class-weighted-loss": True,
                 "seed": 1},
        "axes": {"strategy": [
            {"label": "cohort-only-rounds", "control": "cohort-only-rounds"},
            {"label": "cohort-only-converged", "control": "cohort-only-converged", "control-epochs": 2,
             "control-learning-rate": 0.003},
            {"label": "local-only-mean", "control": "local-only-mean", "control-epochs": 2},
            {"label": "local-only-best", "control": "local-only-best", "control-epochs": 2},
            {"label": "pooled", "control": "pooled", "control-epochs": 2}]}})
    outcome = run_grid(grid, tmp_path / "out", progress=lambda line: None)
    assert outcome.ok, outcome
    # the part records the code it ran: this checkout's commit
    (start,) = [e for e in map(json.loads, (tmp_path / "out" / "bench.jsonl").read_text().splitlines()) if e["event"] == "start"]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert start["code"]["commit"] == head and isinstance(start["code"]["dirty"], bool), start
    table = pd.read_csv(tmp_path / "out" / "cells.csv").set_index("strategy")
    assert set(table.index) == set(CONTROLS) and (table["status"] == "done").all()
    assert table.loc["cohort-only-rounds", "rounds"] == 3 and table.loc["pooled", "rounds"] == 2
    assert table["final_balanced_accuracy"].between(0, 1).all() and table["final_auc"].between(0, 1).all()

    cfg = parse_run_config(grid.cells[0].run_config)
    honest = honest_partitions(cfg, 4)
    assert len(honest) == 3
    summary = {k: json.loads((tmp_path / "out" / "cells" / f"strategy={k}" / "summary.json").read_text())["control"]
               for k in CONTROLS}
    sizes = {p: len(simulated_hospital(cfg.federation, p, 4).train) for p in honest}
    assert summary["pooled"]["pooled_images"] == sum(sizes.values())
    assert summary["cohort-only-rounds"]["cohort_images"] == 20 == summary["cohort-only-converged"]["cohort_images"]
    best = summary["local-only-best"]
    scores = best["validation_balanced_accuracy"]
    assert set(scores) == {f"hospital-{p}" for p in honest} == set(best["honest_hospitals"])
    assert best["best_hospital"] == max(sorted(scores), key=lambda h: scores[h])


def test_a_cohort_of_zero_images_per_class_is_a_run_without_a_cohort(data_dir):
    """The cohort-size sweep's 0: valid; a rule that needs a cohort names its cohort-free setting or says it has none."""
    from hospitrust.bench.controls import run_control
    from hospitrust.config.run import ConfigError
    from hospitrust.datasets.federation import load_arrays, reference_set, validation_set

    defaults = app_config_defaults()
    cfg = parse_run_config({**defaults, "dataset": "pneumoniamnist", "reference-cohort-per-class": 0})
    assert len(reference_set(cfg.federation)) == 0
    assert len(validation_set(cfg.federation)) == len(load_arrays(cfg.federation).labels["val"])  # nothing held back
    for rule, said in (("fltrust", "fltrust has no cohort-free setting"),
                       ("hta", "or hta.validation-exponent = 0 (trust from direction and magnitude only) to run it without one")):
        with pytest.raises(ConfigError) as err:
            parse_run_config({**defaults, "strategy": rule, "reference-cohort-per-class": 0})
        assert "or reference-cohort-per-class >= 1" in str(err.value) and said in str(err.value), str(err.value)
    parse_run_config({**defaults, "strategy": "hta", "reference-cohort-per-class": 0, "hta.validation-exponent": 0})
    with pytest.raises(ValueError, match="trains on the server's reference cohort: this run has none"):
        run_control({**defaults, "dataset": "pneumoniamnist", "reference-cohort-per-class": 0, "num-server-rounds": 1},
                    2, Control("cohort-only-rounds"), say=lambda line: None)


def _v3_controls():
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_controls", REPO / "benchmarks" / "leaderboard" / "v3" / "controls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_controls_are_tuned_by_the_protocols_rule_and_the_committed_grids_are_the_scripts_output():
    v3 = _v3_controls()
    assert v3.main(["tune", "--check"]) == 0
    assert v3.main(["choose", "--check"]) == 0  # the evaluation grid is what the committed tuning curves choose
    assert v3.main(["tune", "--check", "--condition", "alpha0.1"]) == 0
    assert v3.main(["choose", "--check", "--condition", "alpha0.1"]) == 0  # from its committed tuning curves
    assert v3.main(["tune", "--check", "--condition", "retina"]) == 0
    assert v3.main(["choose", "--check", "--condition", "retina"]) == 0
    retina = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "controls-tune-retina.toml")
    cfg = parse_run_config(retina.cells[0].run_config)
    assert len(retina.cells) == 36 and (cfg.dataset, cfg.reference_cohort_per_class, cfg.train_subsample) == (
        "retinamnist", 3, 1.0) and cfg.server_data.test_split == "val"
    alpha = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "controls-tune-alpha0.1.toml")
    assert len(alpha.cells) == 36 and {c.run_config["dirichlet.alpha"] for c in alpha.cells} == {0.1}
    curves = {}
    for kind, (most, step) in v3.EPOCHS.items():
        for rate in v3.RATES:
            curves[(kind, rate)] = {e: [0.6, 0.6, 0.6] for e in range(1, most + 1)}
    # cohort: a spike at an epoch no choice may stop at (15) is not chosen; 0.9 at 30 and 40 ties: fewer epochs
    curves[("cohort-only-converged", 0.003)][15] = [1.0, 1.0, 1.0]
    curves[("cohort-only-converged", 0.003)][30] = [0.9, 0.8, 1.0]
    curves[("cohort-only-converged", 0.003)][40] = [0.9, 0.9, 0.9]
    # local: the same mean at two rates and one epoch: the smaller rate
    curves[("local-only-mean", 0.01)][20] = [0.8, 0.8, 0.8]
    curves[("local-only-mean", 0.03)][20] = [0.7, 0.8, 0.9]
    chosen = v3.choose(curves)
    assert chosen["cohort-only-converged"][:2] == (0.003, 30) and math.isclose(chosen["cohort-only-converged"][2], 0.9)
    assert chosen["local-only-mean"][:2] == (0.01, 20)
    assert chosen["pooled"][:2] == (0.001, 5)  # everything equal: the fewest epochs, the smallest rate
    grid = parse_grid(tomllib.loads(v3.evaluation_grid(chosen)))
    by = {c.axes["strategy"]: c.control for c in grid.cells if c.axes["seed"] == 11}
    assert by["local-only-best"] == {"control": "local-only-best", "control-epochs": 20, "control-learning-rate": 0.01}
    assert by["cohort-only-rounds"] == {"control": "cohort-only-rounds"} and len(grid.cells) == 50
    del curves[("pooled", 0.03)][120]
    with pytest.raises(SystemExit, match="pooled at rate 0.03, epoch 120: 0 of 3 tuning seeds finished"):
        v3.choose(curves)


def test_the_v3_page_sets_each_rules_worst_case_and_clean_run_against_the_best_control(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_render", REPO / "benchmarks" / "leaderboard" / "v3" / "render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    rows = []
    for i, seed in enumerate((11, 12, 13)):
        for rule, clean, floor in (("fltrust", 0.85, 0.80 + 0.01 * i), ("fedavg", 0.86, 0.50)):
            rows.append({"condition": "main", "rule": rule, "seed": seed, "attack_label": "none", "chance": 0.5,
                         "final_balanced_accuracy": clean, "last_k": clean, "final_auc": 0.9})
            for j, attack in enumerate(render.COMMON):  # the worst of the nine is `floor`, at the last attack
                rows.append({"condition": "main", "rule": rule, "seed": seed, "attack_label": attack, "chance": 0.5,
                             "final_balanced_accuracy": floor + 0.01 * (len(render.COMMON) - 1 - j), "last_k": floor,
                             "final_auc": 0.8})
        rows.append({"condition": "main", "rule": "fltrust", "seed": seed, "attack_label": "fltrust-aware", "chance": 0.5,
                     "final_balanced_accuracy": 0.1, "last_k": 0.1, "final_auc": 0.5})  # beside, not in the worst case
    rules = tmp_path / "rules.csv"
    pd.DataFrame(rows).to_csv(rules, index=False)
    controls = [{"rule": c, "seed": s, "attack_label": "none", "final_balanced_accuracy": v, "last_k": v,
                 "final_auc": 0.85, "chance": 0.5}
                for s in (11, 12, 13) for c, v in (("cohort-only-rounds", 0.78), ("local-only-mean", 0.6), ("pooled", 0.9))]
    out = tmp_path / "v3"
    out.mkdir()
    pd.DataFrame(controls).to_csv(out / "controls_pneumonia_main.csv", index=False)
    assert render.main(["--rules", str(rules), "--out", str(out)]) == 0
    page = (out / "pneumonia-main.md").read_text()
    assert "Best control (highest mean; `pooled` is the ceiling, not a candidate): **cohort-only-rounds**" in page
    # fltrust's worst cases 0.80, 0.81, 0.82 minus 0.78: +0.02, +0.03, +0.04 (mean 0.03, sd 0.01, half 4.3027 x 0.01/sqrt 3)
    assert "| fltrust | 3 | 0.810 [0.785, 0.835] | 0.030 [0.005, 0.055] | 0.25 / 1 | 3 of 3 | not separated " in page
    # fedavg's worst case 0.50 on every seed: -0.28 each, the interval is the value itself; 3 seeds cannot separate
    assert "| fedavg | 3 | 0.500 [0.500, 0.500] | -0.280 [-0.280, -0.280] | 0.25 / " in page and "not separated" in page
    assert "| fltrust | fltrust-aware, anchored-trust-aware" not in page and "| fltrust | fltrust-aware | 0.100" in page
    assert "Every rule trained on every seed" in page
    # the CD diagram: the rules' worst cases beside the controls, three seeds
    assert "![critical-difference diagram](pneumonia-main-cd.png)" in page
    assert (out / "pneumonia-main-cd.png").read_bytes().startswith(b"\x89PNG")


def test_the_v3_alpha01_page_renders_from_its_committed_cells_when_no_part_is_at_hand(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_render", REPO / "benchmarks" / "leaderboard" / "v3" / "render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    out, empty = tmp_path / "v3", tmp_path / "empty"
    out.mkdir()
    empty.mkdir()
    args = ["--condition", "alpha0.1", "--grids", str(empty), "--archives", str(empty), "--out", str(out)]
    pd.DataFrame([{"rule": "pooled", "seed": 41, "attack_label": "none", "final_balanced_accuracy": 0.9, "last_k": 0.9,
                   "final_auc": 0.95, "chance": 0.5}]).to_csv(out / "controls_alpha0.1.csv", index=False)
    with pytest.raises(SystemExit, match="no PneumoniaMNIST, Dirichlet 0.1 part in .*empty nor .*empty, and no .*alpha0.1_cells.csv"):
        render.main(args)
    rows = [{"rule": "median", "seed": 41, "attack_label": attack, "final_balanced_accuracy": 0.5, "last_k": 0.5,
             "final_auc": 0.5, "chance": 0.5} for attack in ["none", *render.COMMON]]
    pd.DataFrame(rows).to_csv(out / "alpha0.1_cells.csv", index=False)
    assert render.main(args) == 0
    page = (out / "alpha0.1.md").read_text()
    assert page.startswith("# Leaderboard v3: does joining pay? PneumoniaMNIST, Dirichlet 0.1") and "Decisive: fresh" in page
    # a clean run at chance is "did not train", named with its seed
    assert "median (seed 41: 0.500)" in page


def test_the_v3_backdoor_table_cuts_its_t_intervals_to_the_rates_range():
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_render", REPO / "benchmarks" / "leaderboard" / "v3" / "render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    cells = pd.DataFrame([{"rule": rule, "seed": seed, "attack_label": "backdoor", "final_attack_success_rate": rate}
                          for rule, rates in (("median", (0.9, 1.0, 1.0)), ("fltrust", (0.1, 0.2, 0.3)))
                          for seed, rate in zip((41, 42, 43), rates)])
    lines = "\n".join(render.backdoor_lines(cells))
    # median: mean 0.9667, sd 0.0577, t(2, 0.975) 4.3027: 0.9667 +- 0.1434 = [0.823, 1.110], cut at 1
    # fltrust: 0.2 +- 4.3027 x 0.1 / sqrt 3 = [-0.048, 0.448], cut at 0; the lower rate first
    assert lines.index("| fltrust | 0.200 [0.000, 0.448] | 3 |") < lines.index("| median | 0.967 [0.823, 1.000] | 3 |")
    assert render.backdoor_lines(cells.drop(columns="final_attack_success_rate")) == []


def test_the_v3_retina_page_sets_the_rare_classes_recall_beside_clean_and_in_each_seeds_worst_attack():
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_render", REPO / "benchmarks" / "leaderboard" / "v3" / "render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    assert render.CONDITIONS["retina"].rare_classes == (1, 4) and render.CONDITIONS["retina"].classes == 5
    rows = []
    for seed, (worst_attack, r4) in zip((11, 12), (("alie", 0.2), ("sign-flip", 0.4))):
        rows.append({"rule": "fltrust", "seed": seed, "attack_label": "none", "final_balanced_accuracy": 0.5,
                     "final_recall_1": 0.3, "final_recall_4": 0.6})
        for attack in render.COMMON:  # each seed's worst attack has the lowest balanced accuracy and its own recall
            worst = attack == worst_attack
            rows.append({"rule": "fltrust", "seed": seed, "attack_label": attack,
                         "final_balanced_accuracy": 0.25 if worst else 0.45,
                         "final_recall_1": 0.0 if worst else 0.9, "final_recall_4": r4 if worst else 0.9})
        rows.append({"rule": "cohort-only-rounds", "seed": seed, "attack_label": "none", "final_balanced_accuracy": 0.4,
                     "final_recall_1": 0.1, "final_recall_4": 0.5 + 0.1 * (seed - 11)})
    lines = "\n".join(render.rare_recall_lines(pd.DataFrame(rows), (1, 4)))
    # fltrust: clean 0.3 and 0.6 on both seeds; in the worst cells class 1 0.0, class 4 0.2 and 0.4 (mean 0.3,
    # half-width 12.706 x 0.1414 / sqrt 2 = 1.271); the control has no worst case
    assert "| fltrust | 0.300 [0.300, 0.300] | 0.000 [0.000, 0.000] | 0.600 [0.600, 0.600] | 0.300 [-0.971, 1.571] |" in lines
    assert "| cohort-only-rounds | 0.100 [0.100, 0.100] | - | 0.550 [-0.085, 1.185] | - |" in lines
    assert render.rare_recall_lines(pd.DataFrame(rows).drop(columns=["final_recall_1", "final_recall_4"]), (1, 4)) == []


def test_the_v3_decisive_parts_are_the_generators_output_and_their_cost_fits_the_budget():
    import importlib.util

    spec = importlib.util.spec_from_file_location("v3_parts", REPO / "benchmarks" / "leaderboard" / "v3" / "parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    assert parts.main(["--check"]) == 0
    grid = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "tune-retina.toml")
    assert len(grid.cells) == 63 and {c.axes["seed"] for c in grid.cells} == {1, 2, 3}
    cfg = parse_run_config(grid.cells[0].run_config)
    assert cfg.dataset == "retinamnist" and cfg.reference_cohort_per_class == 3 and cfg.server_data.test_split == "val"
    # Retina's rounds: the v3 set at its budget's rates (budget-retina/budget.csv), clean, 160 rounds, seeds 1-3
    plateau = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "plateau-retina.toml")
    assert len(plateau.cells) == 21 and {c.axes["seed"] for c in plateau.cells} == {1, 2, 3}
    rates = {c.axes["strategy"]: parse_run_config(c.run_config) for c in plateau.cells if c.axes["seed"] == 1}
    assert {r: cfg.learning_rate for r, cfg in rates.items()} == {
        "fedavg": 0.003, "fltrust": 0.003, "earn": 0.03, "anchored-trust": 0.01, "hta": 0.03, "geometric-median": 0.01,
        "median": 0.03}
    assert all(cfg.num_server_rounds == 160 and cfg.malicious_fraction == 0.0 for cfg in rates.values())
    # the cohort sweep: 4 rules x 3 sizes x (clean, sign-flip) + HTA and EARN cohort-free at 0 (clean, sign-flip)
    # + 2 cohort controls x 3 sizes, per seed
    sweep = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "cohort-sweep.toml")
    assert len(sweep.cells) == 3 * (24 + 4 + 6) == 102
    at_zero = {c.axes["strategy"]: parse_run_config(c.run_config) for c in sweep.cells
               if c.axes["reference-cohort-per-class"] == 0}
    assert set(at_zero) == {"hta", "earn"}
    assert at_zero["hta"].strategy_options.validation_exponent == 0 and not at_zero["earn"].strategy_options.audit
    # Dirichlet 0.1, one part per fresh seed 41-50: the 7 rules x (clean, 9 common attacks, backdoor) and the 8 cells
    # of their own attacks (median's agr-tailored, HTA's, EARN's, FLTrust's and anchored-trust's aware ones, and
    # anchored-trust's two decorrelated copies), at the main condition's rates and bounds
    for seed in range(41, 51):
        part = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / f"alpha0.1-s{seed}.toml")
        assert len(part.cells) == 7 * 11 + 8 == 85 and {c.axes["seed"] for c in part.cells} == {seed}
    by_cell = {(c.axes["strategy"], c.axes["attack"]): parse_run_config(c.run_config) for c in part.cells}
    assert part.cells[0].run_config["dirichlet.alpha"] == 0.1 and ("fedavg", "agr-tailored") not in by_cell
    assert by_cell[("fltrust", "none")].malicious_fraction == 0 and by_cell[("fltrust", "alie")].malicious_fraction == 0.3
    assert (by_cell[("hta", "sign-flip")].learning_rate, by_cell[("hta", "sign-flip")].max_update_norm) == (0.03, 5.2)
    # RetinaMNIST, one part per seed 11-20 (the generator's, checked above): the same 85 cells at Retina's budget
    # (its rates and 40-round bounds)
    part = parse_grid(REPO / "benchmarks" / "leaderboard" / "v3" / "retina-s20.toml")
    assert len(part.cells) == 85 and {c.axes["seed"] for c in part.cells} == {20}
    assert sorted(p.name for p in (REPO / "benchmarks" / "leaderboard" / "v3").glob("retina-s*.toml")) == [
        f"retina-s{seed}.toml" for seed in range(11, 21)]
    by_cell = {(c.axes["strategy"], c.axes["attack"]): parse_run_config(c.run_config) for c in part.cells}
    fltrust = by_cell[("fltrust", "sign-flip")]
    assert (fltrust.dataset, fltrust.reference_cohort_per_class, fltrust.num_server_rounds) == ("retinamnist", 3, 40)
    assert (fltrust.learning_rate, fltrust.max_update_norm) == (0.003, 0.78) and fltrust.server_data.test_split == "test"
    assert (by_cell[("median", "agr-tailored")].learning_rate, by_cell[("median", "agr-tailored")].max_update_norm) == (
        0.03, 7.3)
    total = parts.cost_table().splitlines()[-1]
    assert total.startswith("| all | ") and float(total.split("|")[3]) <= 12.0  # the 12 h of grid time

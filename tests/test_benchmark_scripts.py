"""The table scripts under benchmarks/ on hand-made run folders: what they average and pair."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from conftest import REPO
from hospitrust.records import RoundRecord


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name.replace('/', '_')}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in a script look their module up there (a name no import uses)
    spec.loader.exec_module(module)
    return module


def _summary(folder: Path, cell: str, balanced_accuracy: float) -> None:
    (folder / cell).mkdir(parents=True)
    (folder / cell / "summary.json").write_text(json.dumps(
        {"final": {"balanced_accuracy": balanced_accuracy, "worst_class_recall": 0.0}}))


def test_trust_tables_mean_and_sample_std_over_seed_folders(tmp_path):
    tables = _script("trust_tables")
    folders = [tmp_path / s for s in ("s42", "s1", "s2")]
    for folder, value in zip(folders, (0.5, 0.6, 0.7)):
        _summary(folder, "none__fedavg", value)
    _summary(folders[0], "none__hta", 0.8)  # one seed only
    text = tables.seeds_table(folders, ["none", "label-flip"], ["fedavg", "hta"])
    # mean 0.6, sample std sqrt(((0.1)^2 + 0 + (0.1)^2) / 2) = 0.1
    assert "| none | 0.600 ± 0.100 (n=3) | 0.800 (n=1) |" in text
    assert "| label-flip | not run | not run |" in text


def test_trust_tables_late_mean_averages_the_last_rounds(tmp_path):
    tables = _script("trust_tables")
    for folder, curve in ((tmp_path / "s1", [0.2, 0.4, 0.3, 0.5]), (tmp_path / "s2", [0.2, 0.6, 0.5, 0.3])):
        _summary(folder, "none__fedavg", curve[-1])
        (folder / "none__fedavg" / "rounds.jsonl").write_text("".join(
            json.dumps({"round": i + 1, "central": {"balanced_accuracy": v}}) + "\n" for i, v in enumerate(curve)))
    assert tables.late_mean(tmp_path / "s1", "none", "fedavg", 2) == pytest.approx(0.4)
    assert tables.late_mean(tmp_path / "s1", "none", "fedavg", 10) == pytest.approx(0.35)  # fewer rounds: all of them
    assert tables.late_mean(tmp_path / "s1", "none", "hta", 2) is None
    # last 3 rounds: 0.4 and 0.4667; the final rounds alone: 0.5 and 0.3
    assert "| none | 0.433 ± 0.047 (n=2) |" in tables.seeds_table([tmp_path / "s1", tmp_path / "s2"], ["none"], ["fedavg"], last=3)
    assert "| none | 0.400 ± 0.141 (n=2) |" in tables.seeds_table([tmp_path / "s1", tmp_path / "s2"], ["none"], ["fedavg"])


def test_trust_tables_prints_the_late_mean_for_a_single_folder(tmp_path, capsys):
    tables = _script("trust_tables")
    folder = tmp_path / "s1"
    _summary(folder, "none__fedavg", 0.5)
    (folder / "none__fedavg" / "rounds.jsonl").write_text("".join(
        json.dumps({"round": i + 1, "central": {"balanced_accuracy": v}}) + "\n" for i, v in enumerate([0.2, 0.4, 0.5])))
    assert tables.main([str(folder), "--attacks", "none", "--rules", "fedavg", "--last-rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "last 2 rounds" in out and "| none | 0.450 (n=1) |" in out
    assert "folders (seeds)" not in out  # no seeds table of final models for one folder


def _run(folder: Path, name: str, strategy: str, attack: str, seed: int, rare_f1: float) -> None:
    run = folder / "cells" / name
    run.mkdir(parents=True)
    cfg = {"strategy": strategy, "attack": attack, "seed": seed, "earn.agreement": "blend", "earn.evidence": "update",
           "earn.row-cap": 0.5, "earn.audit": True, "earn.audit-by": "row-shift-free", "earn.base": "hta",
           "earn.ablation.excuse-direction": True}
    (run / "config.json").write_text(json.dumps({"run_config": cfg}))
    (run / "rounds.jsonl").write_text(json.dumps(
        {"round": 1, "clients": [], "central": {"rare_class_macro_f1": rare_f1, "balanced_accuracy": 0.3}}) + "\n")


def test_earn_faker_gates_compare_runs_of_the_same_seed(tmp_path):
    script = _script("earn_faker")
    _run(tmp_path, "fedavg-none-1", "fedavg", "none", 1, 0.10)
    _run(tmp_path, "fedavg-none-2", "fedavg", "none", 2, 0.30)
    _run(tmp_path, "earn-none-1", "earn", "none", 1, 0.20)  # above seed 1's FedAvg, below seed 2's
    _run(tmp_path, "earn-none-2", "earn", "none", 2, 0.20)
    _run(tmp_path, "earn-flip-1", "earn", "label-flip", 1, 0.22)  # within 0.05 of seed 1's clean run
    _run(tmp_path, "earn-flip-2", "earn", "label-flip", 2, 0.30)  # 0.10 from seed 2's
    rows = [script.run_figures(r, "4", "hospital-5", "hospital-0") for r in sorted((tmp_path / "cells").iterdir())]
    lines = {(line.split(" | ")[0].lstrip("| "), line.split(" | ")[1], line.split(" | ")[2]): line
             for line in script.table(rows).splitlines()[2:]}
    assert "pass (> FedAvg)" in lines[("earn (mode=blend)", "none", "1")]
    assert "fail (> FedAvg)" in lines[("earn (mode=blend)", "none", "2")]
    assert "pass (within 0.05 of no attack)" in lines[("earn (mode=blend)", "label-flip", "1")]
    assert "fail (within 0.05 of no attack)" in lines[("earn (mode=blend)", "label-flip", "2")]


def test_earn_faker_reads_the_specialists_body_weight_and_the_late_rare_f1(tmp_path):
    script = _script("earn_faker")
    run = tmp_path / "earn-none-1"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_config": {"strategy": "earn", "attack": "none", "seed": 1}}))
    rounds = []
    for rnd, (w, f1, recall4) in enumerate(((0.0, 0.1, 0.0), (0.2, 0.3, 0.5), (0.1, 0.2, 0.25)), start=1):
        clients = [{"hospital": "hospital-0", "num_examples": 10, "weight": w},  # data share 10 / 100
                   {"hospital": "hospital-1", "num_examples": 90, "weight": 1.0 - w}]
        rounds.append({"round": rnd, "clients": clients, "central": {
            "rare_class_macro_f1": f1, "balanced_accuracy": 0.3, "per_class_recall": [0.9, 0.1, 0.2, 0.3, recall4]}})
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    row = script.run_figures(run, "4", "hospital-5", "hospital-0")
    assert row["specialist_body_over_share"] == pytest.approx((0.0 + 2.0 + 1.0) / 3)
    assert row["rare_f1_last5"] == pytest.approx(0.2) and row["rare_f1"] == pytest.approx(0.2)
    assert row["rare_recall_last5"] == pytest.approx((0.0 + 0.5 + 0.25) / 3)  # grade 4's recall, three rounds
    assert math.isnan(script.rare_recall_late([RoundRecord.from_json(r) for r in rounds], 7, 5))  # no such class reported
    assert script._label(row).endswith(", fedavg base)")  # a run from before earn-base: the FedAvg base


def _rounds(run: Path, values: list[float]) -> None:
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("".join(
        json.dumps({"round": i + 1, "central": {"rare_class_macro_f1": v}}) + "\n" for i, v in enumerate(values)))


def test_metric_swing_by_hand(tmp_path, capsys):
    swing = _script("metric_swing")
    # last 4 of [9, 0.1, 0.2, 0.1, 0.3]: changes 0.1, 0.1, 0.2 (mean 0.1333; only 0.2 is > 0.15);
    # std of 0.1, 0.2, 0.1, 0.3 = sqrt(0.0375 - 0.175^2) = 0.0829
    s = swing.swing([9.0, 0.1, 0.2, 0.1, 0.3], rounds=4, margin=0.15)
    assert s["mean_change"] == pytest.approx(0.4 / 3)
    assert s["over_margin"] == pytest.approx(1 / 3)
    assert s["std"] == pytest.approx(0.0829156, abs=1e-6)
    assert s["final"] == 0.3
    _rounds(tmp_path / "runs" / "a", [0.0, 0.1, 0.2, 0.1, 0.3])
    _rounds(tmp_path / "runs" / "short", [0.5])
    assert swing.main([str(tmp_path / "runs"), "--rounds", "4", "--margin", "0.15"]) == 0
    out = capsys.readouterr()
    assert "| 0.300 | 0.083 | 0.133 | 0.33 |" in out.out
    assert "fewer than --rounds 4: skipped" in out.err
    with pytest.raises(SystemExit):
        swing.main([str(tmp_path / "nowhere")])


def test_centralized_baseline_uses_the_class_weights_and_reports_rare_class_f1(tmp_path, capsys, data_dir):
    centralized = _script("centralized")
    out = tmp_path / "central.json"
    assert centralized.main(["--hospitals", "3", "--json", str(out), "-c",
                             "num-server-rounds=1 local-epochs=1 train-subsample=0.05 train.class-weighted-loss=true"]) == 0
    printed = capsys.readouterr().out
    assert "class weights balanced, rare classes [0]" in printed  # PneumoniaMNIST: normal is the rare class
    final = json.loads(out.read_text())["final"]
    assert 0.0 <= final["rare_class_macro_f1"] <= 1.0 and final["rare_class_macro_f1"] == final["rare_class_macro_f1"]


def test_trust_tables_rare_class_f1_for_every_rule_skips_runs_without_it(tmp_path):
    tables = _script("trust_tables")
    folders = [tmp_path / s for s in ("s42", "s1", "s2")]
    for folder, value in zip(folders, (0.1, 0.2, None)):
        (folder / "none__hta").mkdir(parents=True)
        final = {"balanced_accuracy": 0.5, "worst_class_recall": 0.0}
        if value is not None:
            final["rare_class_macro_f1"] = value
        (folder / "none__hta" / "summary.json").write_text(json.dumps({"final": final}))
    text = tables.seeds_table(folders, ["none"], ["hta"], metric="rare_class_macro_f1")
    # 0.1 and 0.2: mean 0.15, sample std 0.0707; the third run has no rare-class F1
    assert "| none | 0.150 ± 0.071 (n=2) |" in text
    assert "| none | 0.500 ± 0.000 (n=3) |" in tables.seeds_table(folders, ["none"], ["hta"])


def test_oracle_exclusion_runs_without_the_attackers_and_scores_like_the_server(tmp_path, capsys, data_dir):
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.attacks.threat_model import malicious_partitions
    from hospitrust.config import parse_run_config
    from conftest import small_run_config

    oracle = _script("oracle_exclusion")
    small = "num-server-rounds=1 local-epochs=1 train-subsample=0.05 seed=7"
    # a full federation's run (all four hospitals), to score beside the oracle
    full = small_run_config(tmp_path, **{"num-server-rounds": 1, "seed": 7, "run-name": "full"})
    run_inprocess(full, 4)
    full_dir = tmp_path / "runs" / "full"
    out = tmp_path / "oracle"
    argv = ["--out", str(out), "--seeds", "7", "--strategies", "fedavg", "--hospitals", "4",
            "--malicious-fraction", "0.25", "-c", small, "--against", str(full_dir)]
    assert oracle.main(argv) == 0
    printed = capsys.readouterr().out
    expected = sorted(malicious_partitions(parse_run_config(
        {"attack": "label-flip", "malicious-fraction": 0.25, "seed": 7}).threat_model, 4))
    assert len(expected) == 1
    # the oracle federation has every hospital but the attacker's partition
    counts = (out / "oracle-s7__fedavg" / "class_counts.csv").read_text()
    kept = {line.split(",")[0] for line in counts.splitlines()[1:]}
    assert kept == {f"hospital-{i}" for i in range(4) if i not in expected}
    assert f"| 7 | fedavg | without label-flip's hospitals | {expected[0]} |" in printed
    # a full run scored by the script reads what the server recorded: same model, same rare classes
    server = json.loads((full_dir / "summary.json").read_text())["final"]
    row = next(line for line in printed.splitlines() if "| all, attack none |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == str(json.loads((full_dir / "summary.json").read_text())["rare_classes"])
    assert float(cells[5]) == pytest.approx(server["rare_class_macro_f1"], abs=5e-4)
    assert float(cells[6]) == pytest.approx(server["balanced_accuracy"], abs=5e-4)
    # a finished cell is not run again
    assert oracle.main(argv) == 0
    assert "[oracle] seed 7 fedavg: leaving out" not in capsys.readouterr().out


def test_grid_table_means_over_seeds_and_pairs_by_seed(tmp_path):
    gt = _script("grid_table")
    cells = tmp_path / "grid" / "cells"
    # fedavg 0.8 / 0.6 and rule-x 0.7 / 0.7 over two seeds in scenario a; only fedavg in scenario b
    for strategy, seed, value in (("fedavg", 1, 0.8), ("fedavg", 2, 0.6), ("rule-x", 1, 0.7), ("rule-x", 2, 0.7)):
        _summary(cells, f"strategy={strategy}__scenario=a__seed={seed}", value)
    _summary(cells, "strategy=fedavg__scenario=b__seed=1", 0.5)
    values = gt.cell_values(tmp_path / "grid", "balanced_accuracy", ["scenario"])
    assert values[("rule-x", ("a",), "2")] == 0.7 and len(values) == 5
    text = gt.tables(values, "fedavg")
    # mean 0.7, sample std sqrt(0.02) = 0.141; paired differences -0.1 and +0.1: mean 0, std 0.141
    assert "| fedavg | 0.700 ± 0.141 | 0.500 |" in text
    assert "| rule-x | 0.700 ± 0.000 | - |" in text
    assert "| rule-x | +0.000 ± 0.141 | - |" in text
    assert set(gt.cell_values(tmp_path / "grid", "balanced_accuracy", ["seed"], {"scenario": "b"})) == {
        ("fedavg", ("1",), "1")}


def test_fbd_detection_table_counts_color_rounds(tmp_path):
    fd = _script("fbd_detection_table")
    cell = tmp_path / "grid" / "cells" / "attack=label-flip__seed=1"
    cell.mkdir(parents=True)
    writers = {str(c): [] for c in range(4)}
    (cell / "summary.json").write_text(json.dumps({
        "final": {"balanced_accuracy": 0.7}, "malicious_hospitals": ["hospital-0"],
        "fbd": {"colors_reached_by_malicious": [0, 1], "plan": {"writers": writers}}}))
    # round 1 flags color 0 (reached) and 3 (clean); round 2 flags nothing
    (cell / "rounds.jsonl").write_text(json.dumps({"fbd": {"flagged_colors": [0, 3]}}) + "\n"
                                       + json.dumps({"fbd": {"flagged_colors": []}}) + "\n")
    d = fd.cell_detection(cell)
    assert d["tpr"] == 1 / 4 and d["fpr"] == 1 / 4 and d["balanced_accuracy"] == 0.7  # 1 of 4 reached, 1 of 4 clean
    assert "| label-flip | 1 | 0.25 | 0.25 | 0.70 |" in fd.table(tmp_path / "grid", ["attack"])


def test_contribution_benchmark_scores_are_efficient_against_exact_and_monte_carlo_shapley(tmp_path, capsys, data_dir):
    contribution = _script("contribution")
    out = tmp_path / "contribution.json"
    # 4 hospitals: exact Shapley; 11: above EXACT_UP_TO, Monte-Carlo Shapley
    assert contribution.main(["--hospitals", "4", "11", "--rounds", "2", "--seeds", "0", "--permutations", "30",
                              "--train-subsample", "0.1", "--weightings", "fedavg", "shapley", "ee-published",
                              "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## pneumoniamnist, 4 hospitals" in printed and "Shapley: exact" in printed
    assert "Shapley: monte-carlo (30 orders a round)" in printed
    rows = json.loads(out.read_text())["results"]
    assert [r["hospitals"] for r in rows] == [4, 11]
    for row in rows:
        # every hospital is in every FedAvg round, so the efficient scores (and Shapley, exact or sampled:
        # each order's marginals telescope to v(N) - v({})) all sum to the rounds' total gain
        total = sum(row["shapley"])
        for score in ("fp", "fp-published", "ee-published"):
            assert sum(row[score]) == pytest.approx(total, abs=1e-9), score  # float64
        assert set(row["test_bal_acc"]) == {"fedavg", "shapley", "ee-published"}
        # Everybody-Else never reads the selfish hospital's own reports for its own score
        assert row["selfish_gain"]["ee"] == pytest.approx(0.0, abs=1e-12)  # float64


def test_attack_matrix_cells_carry_only_their_components_options(tmp_path):
    """Every cell of the full matrix parses (the README's command stopped before its first cell when
    label-flip's options went to every cell), and a cell keeps only its own components' keys.
    """
    from hospitrust.config import parse_run_config
    from hospitrust.ops.simulate import app_config_defaults, parse_overrides

    matrix = _script("attack_matrix")
    base = app_config_defaults()
    overrides = parse_overrides(["num-server-rounds=1 earn.row-cap=0.3 hta.exclusion-fraction=0.4"], base)
    strategies = [*matrix.STRATEGIES, "fedagain", "hta", "earn"]
    for attack in [*matrix.ATTACKS, *matrix.VARIANTS]:
        for strategy in strategies:
            cfg = matrix._cell_config(base, attack, strategy, 0.3, tmp_path, overrides)
            parse_run_config(cfg)
            sections = {k.split(".")[0] for k in cfg if "." in k}
            assert ("label-flip" in sections) == (matrix.VARIANTS.get(attack, {}).get("attack", attack) == "label-flip"), (attack, strategy)
            assert ("earn" in sections) == (strategy == "earn"), (attack, strategy)
    flip = matrix._cell_config(base, "label-flip", "earn", 0.3, tmp_path, overrides)
    assert (flip["label-flip.mode"], flip["label-flip.source"], flip["label-flip.target"]) == ("source-to-target", 1, 0)
    assert flip["earn.row-cap"] == 0.3 and flip["num-server-rounds"] == 1 and flip["malicious-fraction"] == 0.3
    none = matrix._cell_config(base, "none", "hta", 0.3, tmp_path, overrides)
    assert none["malicious-fraction"] == 0.0 and none["hta.exclusion-fraction"] == 0.4


def test_signals_by_role_means_attackers_and_honest_apart_by_hand(tmp_path, capsys):
    """Two attackers and two honest hospitals, one rejected honest reply: each column's means by hand."""
    script = _script("leaderboard/v2/signals_by_role")

    def hospital(name, malicious, s, weight, norm, rejected=False):
        return {"hospital": name, "malicious": malicious, "weight": weight, "update_norm": norm, "rejected": rejected,
                "signals": {} if rejected else {"hta": {"s": s}}}

    line = {"schema": 2, "round": 3, "central": {"balanced_accuracy": 0.75}, "update_norm": 0.125, "clients": [
        hospital("a", True, 0.2, 0.25, 1.0), hospital("b", True, 0.4, 0.75, 3.0),
        hospital("c", False, 0.9, 0.0, 0.5), hospital("d", False, 0.0, 0.0, 9.0, rejected=True)]}
    (tmp_path / "rounds.jsonl").write_text(json.dumps(line) + "\n")
    assert script.main([str(tmp_path), "--rule", "hta", "--signals", "s", "--rounds", "3"]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    # s: attackers (0.2 + 0.4) / 2, honest 0.9 (d rejected); weight 0.5 / 0; norm 2 / 0.5; one rejected
    assert row == "3 | 0.750 | 0.1250 | 0.300 / 0.900 | 0.500 / 0.000 | 2.000 / 0.500 | 1"
    assert script.main([str(tmp_path / "missing"), "--rule", "hta"]) == 2


def test_the_load_benchmarks_clientapp_slots_let_at_most_k_run_at_once_and_every_one_finish(tmp_path):
    """--clientapp-slots: the stand-in flwr-clientapp runs Flower's own, whose ClientApp loading first waits for one
    of K lock files. Here the "Flower" it runs is a stand-in that, like Flower's run_clientapp, starts its task's
    heartbeat, then loads the ClientApp (the slot), then trains: every one starts its heartbeat at once (a queued
    ClientApp keeps its task alive: N = 35 lost its replies when the slot came first), at most K train at once, and
    none is lost."""
    import inspect
    import subprocess
    import time

    from flwr.supernode.runtime import run_clientapp

    # Flower's order, which the slot relies on: the heartbeat starts before the ClientApp is loaded
    source = inspect.getsource(run_clientapp.run_clientapp)
    assert source.index("heartbeat_sender.start()") < source.index("get_load_client_app_fn(")
    load = _script("load")
    real = tmp_path / "real-clientapp"
    real.write_text(f"#!{sys.executable}\nimport sys, time\nfrom flwr.supernode.runtime import run_clientapp\n"
                    "out = open(sys.argv[1], 'a', buffering=1)\nout.write('%f heartbeat\\n' % time.time())\n"
                    # all five alive before any loads: a machine's load does not decide who queues
                    "import glob\nwhile len(glob.glob(sys.argv[1].rsplit('-', 1)[0] + '-*.txt')) < 5: time.sleep(0.05)\n"
                    "run_clientapp.get_load_client_app_fn(default_app_ref='', app_path=None, multi_app=True)\n"
                    "out.write('%f start\\n' % time.time())\n"
                    "time.sleep(0.6)\nout.write('%f end\\n' % time.time())\n")
    real.chmod(0o755)
    (tmp_path / "locks").mkdir()
    shim = tmp_path / "flwr-clientapp"
    shim.write_text(load.SLOT_SHIM.format(python=sys.executable, folder=str(tmp_path / "locks"), slots=2, real=str(real)))
    shim.chmod(0o755)
    procs = [subprocess.Popen([str(shim), str(tmp_path / f"ran-{i}.txt")]) for i in range(5)]
    started = time.monotonic()
    assert [p.wait(timeout=120) for p in procs] == [0] * 5
    events = sorted((float(t), kind) for i in range(5) for t, kind in
                    (line.split() for line in (tmp_path / f"ran-{i}.txt").read_text().splitlines()))
    running, most = 0, 0
    for _, kind in events:
        running += {"start": 1, "end": -1}.get(kind, 0)
        most = max(most, running)
    assert len(events) == 15 and most == 2  # every one ran, two at a time
    heartbeats, starts = [t for t, kind in events if kind == "heartbeat"], sorted(t for t, kind in events if kind == "start")
    assert starts[4] - max(heartbeats) >= 2 * 0.6 - 0.1  # the last queued two turns, its heartbeat already running
    assert time.monotonic() - started >= 3 * 0.6 - 0.1  # 5 of them two at a time: at least three turns
    waits = [float(x) for x in (tmp_path / "locks" / "waits.log").read_text().split()]
    assert len(waits) == 5 and sorted(waits)[-1] >= 2 * 0.6 - 0.1  # the last waited two turns
    # the memory estimate: with slots the hospitals' ClientApps count K times, not N times
    measured = {"hospitals": 10, "clientapp_slots": 0,
                "peak_gb_by_role": {"flower-superlink": 0.2, "serverapp": 0.6, "clientapp": 4.5, "flower-supernode": 1.1}}
    assert math.isclose(load.estimate_gb(20, "flower", measured), 0.8 + 20 * 0.56)
    assert math.isclose(load.estimate_gb(50, "flower", dict(measured, clientapp_slots=4), slots=4),
                        0.8 + 50 * 0.11 + 4 * load.CLIENTAPP_GB)
    assert math.isclose(load.estimate_gb(50, "flower", measured, slots=4),  # a run without slots: the defaults
                        load.DEFAULT_GB["server"] + 50 * (load.DEFAULT_GB["hospital"]["flower"] - 0.30) + 4 * load.CLIENTAPP_GB)


def test_the_refactor_check_picks_each_ranked_rules_worst_attack_and_compares_exactly(tmp_path, capsys):
    """Issue 64's check grid: one cell per ranked rule (seed 11, its lowest final balanced accuracy among the
    attacks), with its v2 part's settings; compare passes only on equal values, digit for digit."""
    import csv

    from hospitrust.bench.grid import parse_grid

    check = _script("leaderboard/v3/refactor_check")
    worst = check.worst_attacks()
    rows = [r for r in csv.DictReader(open(check.CELLS)) if r["condition"] == "main" and r["seed"] == "11"]
    assert len(worst) == 13
    for rule, (attack, value) in worst.items():
        mine = [float(r[check.COLUMN]) for r in rows if r["rule"] == rule and r["attack_label"] != "none"]
        assert float(value) == min(mine) and attack != "none"
    grid = parse_grid(check.make(tmp_path / "check.toml"))
    assert sorted(c.name for c in grid.cells) == sorted(f"seed=11__strategy={r}__attack={a}" for r, (a, _) in worst.items())
    run = tmp_path / "run"
    run.mkdir()
    recorded = check.archived()

    def write(nudge=None):
        with open(run / "cells.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["strategy", "attack", "status", check.COLUMN, "final_auc"])
            for rule, (attack, _) in worst.items():
                row = recorded[(rule, attack)]
                auc = float(row["final_auc"]) + (1e-12 if rule == nudge else 0.0)
                w.writerow([rule, attack, "done", row[check.COLUMN], repr(auc)])

    write()
    assert check.compare(run) == 0
    write(nudge=sorted(worst)[0])  # the same balanced accuracy (0.5: a collapsed model), another AUC
    assert check.compare(run) == 1
    assert "12 of 13 cells reproduce" in capsys.readouterr().out


def test_the_defaults_decision_rule_on_hand_made_cells(tmp_path, capsys):
    """Issue 62's rule: eligible = every class recalled, balanced accuracy >= today's, AUC >= today's - 0.01, time
    <= 1.05x today's; score = the worse dataset's mean gap to pooled; within 0.005 of the best the fewer changes win."""
    import csv

    from hospitrust.bench.grid import parse_grid

    choose = _script("defaults/choose")
    # candidate -> (balanced accuracy on both datasets, AUC, worst-class recall, run seconds); pooled 0.80
    plan = {"today": (0.70, 0.90, 0.0, 100.0), "balanced": (0.78, 0.90, 0.2, 100.0),
            "balanced-aug": (0.782, 0.91, 0.2, 104.0), "balanced-lr0.03": (0.795, 0.90, 0.2, 100.0),
            "balanced-lr0.003": (0.79, 0.90, 0.2, 120.0), "pooled": (0.80, 0.92, 0.3, 90.0)}
    with open(tmp_path / "cells.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["candidate", "dataset", "seed", "status", "final_balanced_accuracy", "final_auc",
                    "final_worst_class_recall", "run_seconds"])
        for label, (ba, auc, worst, seconds) in plan.items():
            for dataset in ("pneumoniamnist", "retinamnist"):
                for seed in (1, 2, 3):
                    never = label == "balanced-lr0.03" and dataset == "retinamnist" and seed == 2
                    w.writerow([label, dataset, seed, "done", ba, auc, 0.0 if never else worst, seconds])
    chosen, rows = choose.decide(choose.read_cells(tmp_path), choose.candidates())
    verdicts = {r["label"]: (round(r["score"], 6), r["eligible"]) for r in rows}
    assert verdicts == {"today": (-0.1, False), "balanced": (-0.02, True), "balanced-aug": (-0.018, True),
                        "balanced-lr0.03": (-0.005, False), "balanced-lr0.003": (-0.01, False)}
    assert chosen == "balanced"  # within 0.005 of balanced-aug's -0.018, with one change instead of two
    assert choose.main([str(tmp_path), "--write-evaluation", str(tmp_path / "evaluation.toml")]) == 0
    assert "chosen: balanced" in capsys.readouterr().out
    grid = parse_grid(tmp_path / "evaluation.toml")
    assert len(grid.cells) == 18 and {c.run_config["seed"] for c in grid.cells} == {101, 102, 103}
    assert {c.run_config.get("server-data.test-split", "test") for c in grid.cells} == {"test"}  # the test split


def test_the_default_bound_decision_rule_on_hand_made_cells(tmp_path, capsys):
    """Issue 60's rule for round-norm-bound.over-median: eligible = clean cost against off at most 0.005; score = the mean
    over seeds of the worst attack; within 0.005 of the best the larger ratio wins; off is never chosen over one."""
    import csv

    choose = _script("defaults/choose_bound")
    # (bound, attack) -> balanced accuracy on seeds 1, 2, 3
    plan = {("off", "none"): (0.82, 0.84, 0.80), ("x2", "none"): (0.81, 0.83, 0.79), ("x4", "none"): (0.82, 0.84, 0.795),
            ("off", "sign-flip"): (0.80, 0.80, 0.80), ("x2", "sign-flip"): (0.80, 0.80, 0.80),
            ("x4", "sign-flip"): (0.79, 0.80, 0.80), ("off", "scaling"): (0.50, 0.60, 0.55),
            ("x2", "scaling"): (0.81, 0.81, 0.81), ("x4", "scaling"): (0.80, 0.80, 0.80),
            ("off", "ipm"): (0.50, 0.50, 0.50), ("x2", "ipm"): (0.80, 0.80, 0.80), ("x4", "ipm"): (0.78, 0.79, 0.80)}
    # the specialist condition runs clean only: off 0.40, x2 0.40, x4 0.40 on every seed
    plan.update({("off", "none", "retina"): (0.40,) * 3, ("x2", "none", "retina"): (0.40,) * 3,
                 ("x4", "none", "retina"): (0.40,) * 3})
    with open(tmp_path / "cells.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["condition", "bound", "attack", "seed", "status", "final_balanced_accuracy"])
        for key, values in plan.items():
            bound, attack, condition = (*key, "pneumonia")[:3]
            for seed, ba in zip((1, 2, 3), values):
                w.writerow([condition, bound, attack, seed, "done", ba])
    chosen, rows = choose.decide(choose.read_cells(tmp_path), choose.bounds())
    verdicts = {r["bound"]: (round(r["clean_cost"], 6), round(r["worst"], 6), r["eligible"]) for r in rows}
    # x2 scores best (0.80) but costs 0.01 clean: not eligible; x4 costs 0.00167 (seed 3: -0.005); its worst per seed 0.78, 0.79, 0.80
    assert verdicts == {"off": (0.0, 0.5, False), "x2": (-0.01, 0.8, False), "x4": (-0.001667, 0.79, True)}
    assert chosen == "x4"
    assert choose.main([str(tmp_path)]) == 0 and "chosen: x4 (round-norm-bound.over-median = 4)" in capsys.readouterr().out
    # a bound that rejects the specialist (its clean run 0.01 lower on Retina) is not eligible: none left, off stays
    cells = choose.read_cells(tmp_path)
    for seed in (1, 2, 3):
        cells[("retina", "x4", "none", seed)] = 0.39
    assert choose.decide(cells, choose.bounds())[0] == "off"
    # one unfinished cell: no verdict
    cells = choose.read_cells(tmp_path)
    del cells[("pneumonia", "x4", "ipm", 2)]
    with pytest.raises(SystemExit, match="1 cells are not finished"):
        choose.decide(cells, choose.bounds())


def test_the_default_check_on_hand_made_cells(tmp_path, capsys):
    """Issue 60's default check: every attacked cell within 0.02 of its seed's clean run; -0.02 exactly holds,
    -0.0201 fails; an unfinished grid is said to be so."""
    import csv

    check = _script("defaults/default_check")
    plan = {("none", 101): 0.90, ("none", 102): 0.85, ("none", 103): 0.80,
            ("sign-flip", 101): 0.91, ("sign-flip", 102): 0.83, ("sign-flip", 103): 0.79,
            ("aware", 101): 0.89, ("aware", 102): 0.849, ("aware", 103): 0.7799}

    def write(cells):
        with open(tmp_path / "cells.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["attack", "seed", "status", "final_balanced_accuracy"])
            for (attack, seed), ba in cells.items():
                w.writerow([attack, seed, "done", ba])

    write(plan)
    rows = {(r["attack"], r["seed"]): (r["diff"], r["holds"]) for r in check.check(check.read_cells(tmp_path))}
    assert rows == {("sign-flip", 101): (0.01, True), ("sign-flip", 102): (-0.02, True),
                    ("sign-flip", 103): (-0.01, True), ("aware", 101): (-0.01, True),
                    ("aware", 102): (-0.001, True), ("aware", 103): (-0.0201, False)}
    assert check.main([str(tmp_path)]) == 1 and "default check: fails (5 of 6 within 0.02" in capsys.readouterr().out
    write({**plan, ("aware", 103): 0.79})
    assert check.main([str(tmp_path)]) == 0 and "default check: holds (6 of 6" in capsys.readouterr().out
    write({k: v for k, v in plan.items() if k != ("aware", 102)})
    assert check.main([str(tmp_path)]) == 2 and "1 cells are not finished" in capsys.readouterr().err
    # the grid declares what the script reads: its attack labels, seeds 101-103 and the test split
    from hospitrust.bench.grid import parse_grid

    grid = parse_grid(REPO / "benchmarks" / "defaults" / "default-check.toml")
    assert {c.axes["attack"] for c in grid.cells} == {"none", *check.ATTACKS}
    assert {c.run_config["seed"] for c in grid.cells} == {101, 102, 103} and len(grid.cells) == 9
    assert {c.run_config.get("server-data.test-split", "test") for c in grid.cells} == {"test"}

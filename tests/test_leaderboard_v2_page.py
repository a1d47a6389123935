"""The leaderboard v2's page (benchmarks/study/leaderboard_v2.py, benchmarks/leaderboard/v2/render.py) on
hand-made tables: one rule against the rest paired by seed (Holm), the per-seed worst case without the
backdoor, the parts' conditions from their names, and a whole page rendered from synthetic cells.
"""

from __future__ import annotations

import importlib.util
import json
import tarfile
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

import leaderboard_v2 as v2  # benchmarks/study (conftest.STUDY on sys.path)
from hospitrust.bench import stats
from hospitrust.bench.leaderboard import LeaderboardError

RENDER = Path(__file__).resolve().parent.parent / "benchmarks" / "leaderboard" / "v2" / "render.py"


def _render_module():
    spec = importlib.util.spec_from_file_location("leaderboard_v2_render", RENDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_focus_comparison_by_hand_with_holm_and_the_fewest_seeds():
    a = np.array([0.80, 0.70, 0.90, 0.60])
    values = pd.DataFrame({"A": a, "B": a - [0.30, 0.31, 0.29, 0.30], "C": a + [0.1, -0.1, 0.0, 0.0]}, index=[1, 2, 3, 4])
    out = stats.focus_comparison(values, "A").set_index("other")
    # A - B = 0.30, 0.31, 0.29, 0.30: mean 0.30, sd sqrt(0.0002 / 3), t = 0.30 / (sd / 2)
    sd = math.sqrt(0.0002 / 3)
    half = sps.t.ppf(0.975, 3) * sd / 2
    assert out.loc["B", "mean"] == pytest.approx(0.30)
    assert (out.loc["B", "low"], out.loc["B", "high"]) == pytest.approx((0.30 - half, 0.30 + half))
    # Holm's steps: B has the smaller p, so its interval is at 1 - 0.05 / 2 (two-sided: the 0.9875 quantile),
    # C's at 1 - 0.05 / 1 = 0.95
    step = sps.t.ppf(1 - 0.05 / 2 / 2, 3) * sd / 2
    assert out.loc["B", "step_level"] == pytest.approx(0.975) and out.loc["C", "step_level"] == pytest.approx(0.95)
    assert (out.loc["B", "step_low"], out.loc["B", "step_high"]) == pytest.approx((0.30 - step, 0.30 + step))
    c_sd = math.sqrt(0.02 / 3)  # A - C = -0.1, 0.1, 0, 0
    c_half = sps.t.ppf(0.975, 3) * c_sd / 2
    assert (out.loc["C", "step_low"], out.loc["C", "step_high"]) == pytest.approx((-c_half, c_half))
    p_b = 2 * sps.t.sf(0.30 / (sd / 2), 3)
    assert out.loc["B", "p_t"] == pytest.approx(p_b)
    # A - C = -0.1, 0.1, 0, 0: mean 0, t = 0, p = 1; Holm: 2 * p_b first, then max(2 * p_b, 1) = 1
    assert out.loc["C", "p_t"] == pytest.approx(1.0)
    assert out.loc["B", "p_t_holm"] == pytest.approx(2 * p_b) and out.loc["C", "p_t_holm"] == pytest.approx(1.0)
    # the sign-flip test: all four of A - B positive, 2 of the 16 patterns as far: 0.125, Holm 0.25
    assert out.loc["B", "p_sign_flip"] == pytest.approx(0.125) and out.loc["B", "p_sign_flip_holm"] == pytest.approx(0.25)
    assert bool(out.loc["B", "beats"]) and not bool(out.loc["C", "beats"])
    # the same table with a floor of 5 paired seeds calls nothing; nor do differences at rounding noise
    assert not stats.focus_comparison(values, "A", min_seeds=5)["beats"].any()
    tiny = pd.DataFrame({"A": a + 2.0 ** -52, "B": a}, index=[1, 2, 3, 4])
    assert not stats.focus_comparison(tiny, "A")["beats"].any()
    with pytest.raises(ValueError, match="focus rule 'Z' is not among the rules A, B, C"):
        stats.focus_comparison(values, "Z")


def _cells(conditions=(("main", range(11, 21)),)) -> pd.DataFrame:
    """Three rules; anchored-trust meets its own attack too. Worst cases: anchored-trust 0.80 + seed noise
    (its own attack), median 0.60 (ipm), fedavg 0.50 (ipm); the backdoor hurts accuracy most but is scored apart.
    """
    rows = []
    for cond, seeds in conditions:
        for seed in seeds:
            noise = 0.001 * (seed % 7)
            for rule, clean, ipm in (("fedavg", 0.86, 0.50), ("median", 0.84, 0.60), ("anchored-trust", 0.86, 0.85)):
                attacks = {"none": clean, "label-flip": clean - 0.02, "ipm": ipm, "backdoor": 0.30}
                if rule == "anchored-trust":
                    attacks["anchored-trust-aware"] = 0.80
                for attack, value in attacks.items():
                    rows.append({"condition": cond, "rule": rule, "attack_label": attack, "seed": seed,
                                 "final_balanced_accuracy": value + noise, "chance": 0.5,
                                 "final_attack_success_rate": 0.9 if attack == "backdoor" else math.nan})
    return pd.DataFrame(rows)


def test_the_worst_case_per_seed_leaves_out_the_backdoor_and_incomplete_seeds():
    cells = _cells()
    worst = v2.worst_per_seed(cells, "final_balanced_accuracy")
    assert worst.loc[11].to_dict() == pytest.approx({"anchored-trust": 0.804, "fedavg": 0.504, "median": 0.604})
    assert v2.worst_attacks(cells, "final_balanced_accuracy").to_dict() == {
        "anchored-trust": "anchored-trust-aware", "fedavg": "ipm", "median": "ipm"}
    # a seed that lacks one of the rule's attacks has no worst case for that rule
    short = cells.drop(cells[(cells["rule"] == "median") & (cells["seed"] == 12) & (cells["attack_label"] == "ipm")].index)
    assert math.isnan(v2.worst_per_seed(short, "final_balanced_accuracy").loc[12, "median"])
    # a threat model's attacks only
    assert v2.worst_per_seed(cells, "final_balanced_accuracy", ["label-flip"]).loc[11, "fedavg"] == pytest.approx(0.844)
    assert v2.accuracy_attacks(cells, ["ipm", "label-flip"]) == ["ipm", "label-flip", "anchored-trust-aware"]


def test_the_parts_conditions_come_from_their_names():
    render = _render_module()
    assert render.condition_of("leaderboard-v2-ranked-pneumonia-s11-a") == "main"
    assert render.condition_of("leaderboard-v2-condition-alpha0.1-s12") == "alpha0.1"
    assert render.condition_of("condition-h20-s15") == "h20"
    with pytest.raises(LeaderboardError, match="not a leaderboard v2 part"):
        render.condition_of("leaderboard-v2-probe-floor")
    names = render.part_names()
    assert "ranked-pneumonia-s20-c" in names and "condition-faulty-s11" in names and "cost-probe" not in names


def test_a_page_from_synthetic_cells_ranks_compares_and_draws(tmp_path, monkeypatch):
    render = _render_module()
    # the protocol's attacks for these three rules are the synthetic ones (parts.py holds the real suite)
    monkeypatch.setattr(render, "expected_attacks", lambda cond: {
        r: {"label-flip", "ipm", "backdoor"} | ({"anchored-trust-aware"} if r == "anchored-trust" else set())
        for r in ("fedavg", "median", "anchored-trust")})
    # and the condition parts' attacks, which a sweep's main-condition point is held to
    monkeypatch.setattr(render.parts, "CONDITION_ATTACKS", [("label-flip", {}), ("ipm", {})])
    cells = _cells((("main", range(11, 21)), ("f1", render.parts.CONDITION_SEEDS)))
    md = "\n".join(render.page(cells, tmp_path, focus="anchored-trust", baseline="fedavg", grids=[],
                               missing=["condition-f2-s11"]))
    assert "Not run yet (1 parts): condition-f2-s11" in md
    # the ranking: three rules separated over 10 seeds (equal differences: paired t p = 0, Holm over 3 pairs)
    assert "| 1 | anchored-trust | 0.804 [" in md and "| 2 | median |" in md and "| 3 | fedavg |" in md
    assert "anchored-trust over median by 0.200" in md
    # the focus: beats both on the main condition's 10 seeds; on f1's 3 seeds no call
    assert "anchored-trust beats 2 of 2 rules here (fedavg, median)." in md
    assert ("Without attack, anchored-trust minus fedavg: 0.000 [0.000, 0.000] over 10 seeds: the mean is within the "
            "0.02 the rule may cost, and the interval's lower end is.") in md
    # the threat models' tables within the main condition and the condition parts' are descriptive: no verdict
    assert "### one malicious hospital (f = 1) (descriptive)" in md
    assert md.count("beats 2 of 2 rules") == 1 and "Descriptive: the claim is not tested on this table" in md
    # the backdoor is beside, not inside: its success rate table, and no backdoor in the worst attacks
    assert "| anchored-trust | 0.900 [0.900, 0.900] | 10 |" in md
    assert "one malicious hospital (f = 1)" in md
    for png in ("cd_main.png", "sweep_f.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the sweeps' own cells: the f sweep's condition part and the main condition's runs held to its protocol
    tables = render.condition_tables(cells)
    assert list(tables) == ["sweep-f"]
    f = tables["sweep-f"]
    assert set(f["condition"]) == {"main", "f1"} and set(f["seed"]) == set(render.parts.CONDITION_SEEDS)
    assert set(f.loc[f["condition"] == "main", "attack_label"]) == {"label-flip", "ipm"}


def test_an_unfinished_seed_has_no_worst_case_and_an_unrun_cell_says_so():
    cells = _cells()
    expected = {r: {"label-flip", "ipm", "backdoor"} for r in ("fedavg", "median")}
    expected["anchored-trust"] = {"label-flip", "ipm", "backdoor", "anchored-trust-aware", "tailored-ipm"}
    # anchored-trust's tailored-ipm never ran, and seed 12 of fedavg lacks its ipm run: neither has a worst case
    short = cells.drop(cells[(cells["rule"] == "fedavg") & (cells["seed"] == 12) & (cells["attack_label"] == "ipm")].index)
    worst = v2.worst_per_seed(short, "final_balanced_accuracy", expected=expected)
    assert "anchored-trust" not in worst and math.isnan(worst.loc[12, "fedavg"]) and worst["median"].notna().all()
    md = "\n".join(v2.matrix_lines(short, "final_balanced_accuracy", ["fedavg", "anchored-trust"], expected=expected,
                                   order=["label-flip", "ipm", "tailored-ipm"]))
    assert "| fedavg | 0.864 [0.862, 0.865] | 0.844 [0.842, 0.845] | 0.503 [0.502, 0.505] (n=9) | - | - | 0.503" in md
    assert "| anchored-trust |" in md and "| not run |" in md
    # the expected attacks of the real parts: the main condition's suite and each rule's own
    render = _render_module()
    main = render.expected_attacks("main")
    assert {"tailored-ipm", "backdoor", "anchored-trust-aware", "fltrust-aware"} <= main["anchored-trust"]
    assert "hta-aware" not in main["fedavg"] and render.expected_attacks("faulty")["hta"] == {"label-noise", "corruption"}


def _grid_time_module():
    spec = importlib.util.spec_from_file_location("leaderboard_v2_grid_time", RENDER.parent / "grid_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_time_sums_each_starts_span_and_reads_an_archive_without_unpacking(tmp_path, capsys):
    grid_time = _grid_time_module()
    # two starts: 100 -> 160 (the last event before the resume), then 1000 -> 1030; the gap between them is not counted
    events = [{"time": 100.0, "event": "start"}, {"time": 130.0, "event": "cell"}, {"time": 160.0, "event": "interrupted"},
              {"time": 1000.0, "event": "start"}, {"time": 1030.0, "event": "end"}]
    lines = [json.dumps(e) for e in events]
    assert grid_time.wall_seconds(lines) == 90.0
    assert grid_time.wall_seconds([]) == 0.0
    # one part in a folder, one only in an archive (bench.jsonl at the archive's root, as bench-archive packs it)
    grids, archives = tmp_path / "grids", tmp_path / "archives"
    (grids / "condition-f1-s11").mkdir(parents=True)
    (grids / "condition-f1-s11" / "bench.jsonl").write_text("\n".join(lines) + "\n")
    archives.mkdir()
    (tmp_path / "bench.jsonl").write_text("\n".join(lines[3:]) + "\n")
    with tarfile.open(archives / "ranked-pneumonia-s11-a.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "bench.jsonl", arcname="bench.jsonl")
    assert grid_time.main([str(grids), "--archives", str(archives)]) == 0
    out = capsys.readouterr().out
    assert "condition parts: 1, 0.03 h" in out and "ranked parts: 1, 0.01 h" in out  # 90 s and 30 s
    unarchived = sum(grid_time.UNARCHIVED_MINUTES.values())
    assert f"every grid: {2 + len(grid_time.UNARCHIVED_MINUTES)}, {(120 / 60 + unarchived) / 60:.2f} h" in out
    assert grid_time.main([str(tmp_path / "none"), "--archives", str(tmp_path / "none")]) == 2

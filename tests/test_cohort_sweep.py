"""The cohort-size sweep's page (benchmarks/leaderboard/v3/cohort_sweep.py) on a hand-made table of cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "leaderboard" / "v3"))
import cohort_sweep as sweep  # noqa: E402

SIZE = sweep.SIZE


def _cells() -> pd.DataFrame:
    rows = []
    def add(rule, size, attack, values):
        for seed, v in zip((11, 12, 13), values):
            rows.append({"rule": rule, SIZE: size, "attack_label": attack, "seed": seed,
                         "final_balanced_accuracy": v, "last_k": v, "final_auc": v + 0.1})
    add("fltrust", 5, "none", (0.8, 0.7, 0.9))
    add("fltrust", 5, "sign-flip", (0.6, 0.7, 0.8))
    add("hta", 0, "sign-flip", (0.5, 0.5, 0.6))
    add("cohort-only-rounds", 5, "none", (0.7, 0.7, 0.7))
    add("cohort-only-converged", 5, "none", (0.75, 0.65, 0.8))
    return pd.DataFrame(rows)


def test_the_table_gives_each_seed_and_the_mean_and_says_what_could_not_run():
    text = "\n".join(sweep.accuracy_lines(_cells()))
    # fltrust clean at 5 per class: (0.8 + 0.7 + 0.9) / 3, each seed in seed order
    assert "| fltrust | no attack | needs a cohort | 0.800 (0.800, 0.700, 0.900) | not run | not run |" in text
    assert "| fltrust | sign-flip | needs a cohort | 0.700 (0.600, 0.700, 0.800) |" in text
    # HTA runs cohort-free at 0: its row shows the value, EARN's cohort-free run is absent here: "not run"
    assert "| hta | sign-flip | 0.533 (0.500, 0.500, 0.600) |" in text
    assert "| earn | no attack | not run |" in text
    assert "| cohort-only-rounds | no hospital | needs a cohort | 0.700 (0.700, 0.700, 0.700) |" in text


def test_attacked_minus_going_alone_is_paired_by_seed_against_the_better_cohort_control():
    alone = pd.Series({11: 0.8, 12: 0.8, 13: 0.8})
    text = "\n".join(sweep.paired_lines(_cells(), alone))
    row = next(line for line in text.splitlines() if line.startswith("| fltrust |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    # 5 per class: the converged control's mean 0.733 beats the rounds-matched 0.700; differences -0.15, 0.05, 0.0:
    # mean -0.0333, s = 0.10408, t(2, 0.975) = 4.3027: half-width 0.2586
    at5 = cols[3]
    assert at5.startswith("-0.033 [-0.292, 0.225]") and "1/3 above" in at5 and "(converged)" in at5, at5
    # minus the best hospital alone (0.8 each seed): -0.2, -0.1, 0.0 -> mean -0.100, s 0.1, half 0.2484
    assert cols[4].startswith("-0.100 [-0.348, 0.148]") and "0/3 above" in cols[4], cols[4]
    assert cols[1] == "-" and cols[2] == "-"  # FLTrust did not run at 0


def test_the_page_and_its_plot_are_written(tmp_path):
    alone = pd.Series({11: 0.8, 12: 0.8, 13: 0.8})
    page = sweep.render(_cells(), alone)
    assert page.startswith("# Leaderboard v3: the reference cohort's size") and "cohort-sweep.png" in page
    sweep.plot(_cells(), alone, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_cells_the_command_names_what_to_give(tmp_path):
    with pytest.raises(SystemExit, match="give --grid"):
        sweep.main(["--out", str(tmp_path)])

"""The grid report does not rank noise: cells at chance level are marked, and the ranking calls a
difference smaller than the larger of the two standard deviations a tie (hand-computed cases)."""

from __future__ import annotations

import json
import math

from hospitrust.bench.report import at_chance, chance_level, make_report, rank_with_ties


def test_chance_levels():
    assert chance_level("balanced_accuracy", 2) == 0.5 and chance_level("balanced_accuracy", 5) == 0.2
    assert chance_level("auc", None) == 0.5
    assert chance_level("accuracy", 2) is None and chance_level("balanced_accuracy", None) is None
    assert at_chance(0.505, 0.5) and not at_chance(0.52, 0.5) and not at_chance(math.nan, 0.5) and not at_chance(0.5, None)


def test_rank_with_ties_by_hand():
    # A 0.85 ± 0.0707, B 0.82 ± 0.0566 (0.03 < 0.0707: tie), C 0.50 ± 0 (0.32 >= 0.0566: below), D 0.50 (equal: tie)
    assert rank_with_ties(["A", "B", "C", "D"], [0.85, 0.82, 0.50, 0.50], [0.0707, 0.0566, 0.0, 0.0]) == [
        "best", "tie with A (difference 0.030 < std 0.071)", "below B (difference 0.320 >= std 0.057)",
        "tie with C (difference 0.000 < std 0.000)"]
    assert rank_with_ties(["A", "B"], [0.9, 0.8], [math.nan, 0.01])[1].startswith("below A by 0.100 (one seed")
    assert rank_with_ties([], [], []) == []


def _run(folder, strategy, seed, value):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "strategy": strategy, "attack": "none", "seed": seed, "dataset": "pneumoniamnist", "malicious-fraction": 0.0,
        "num-server-rounds": 1, "class-names": ["normal", "pneumonia"]}))
    central = {"balanced_accuracy": value, "accuracy": value, "auc": 0.7, "macro_f1": value, "worst_class_recall": 0.1}
    (folder / "rounds.jsonl").write_text(json.dumps({"round": 1, "central": central, "clients": [], "round_seconds": 1.0,
                                                    "timing": {"train_pushed_at": 0.0, "finished_at": 1.0}}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"final": central, "wall_seconds": 2.0, "best_round": 1}))


def test_the_report_marks_chance_and_ties(tmp_path):
    for strategy, values in (("aaa", (0.80, 0.90)), ("bbb", (0.78, 0.86)), ("ccc", (0.50, 0.50))):
        for seed, value in zip((1, 2), values):
            _run(tmp_path / "runs" / f"{strategy}-{seed}", strategy, seed, value)
    _, md_path = make_report(tmp_path / "runs", baseline="aaa")
    md = md_path.read_text()
    assert "1 of 3 cells are at chance level" in md
    assert "| ccc | 0.500 (chance) |" in md
    assert "`hospitrust report --leaderboard` calls ties from paired, seed-by-seed confidence intervals" in md
    assert "tie with aaa (difference 0.030 < std 0.071)" in md
    assert "below bbb (difference 0.320 >= std 0.057)" in md

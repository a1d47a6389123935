"""The pooled reference of a run (``hospitrust reference pooled RUN_DIR``, ``hospitrust simulate --pooled-reference``):
the leaderboard's ``pooled`` control for the run's own config, written into the run folder, and the gap line that
``hospitrust report RUN_DIR`` and the end of ``hospitrust simulate`` print (or how to make the reference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, small_run_config
from docs_commands import commands
from hospitrust.bench.reference import REFERENCE_FILE, gap_line
from hospitrust.cli import main as cli
from hospitrust.records import RoundRecord

# a tiny run: 1 round of 1 local epoch on 3 % of PneumoniaMNIST's training split over 3 hospitals (about 130 images)
TINY = {"train-subsample": 0.03, "num-server-rounds": 1, "local-epochs": 1}


def _central(bal: float, auc: float) -> dict:
    return {"accuracy": bal, "balanced_accuracy": bal, "macro_f1": bal, "auc": auc, "worst_class_recall": bal,
            "per_class_recall": [bal, bal], "loss": 0.5, "num_examples": 624}


def _run_dir(tmp_path: Path, name: str = "run", *, hospitals: int = 3, partitions: list[int] | None = None,
             final: tuple[float, float] | None = (0.7, 0.85), **overrides) -> Path:
    """A run directory as a simulated run leaves it (config.json, rounds.jsonl, summary.json), made by hand."""
    run = tmp_path / name
    run.mkdir()
    ids = list(range(hospitals)) if partitions is None else partitions
    config = {**small_run_config(tmp_path, **{**TINY, **overrides}), "num-partitions": hospitals,
              "partitions": {f"hospital-{i}": p for i, p in enumerate(ids)},
              "hospitals": {str(100 + i): f"hospital-{i}" for i in range(len(ids))}, "class-names": ["normal", "pneumonia"]}
    (run / "config.json").write_text(json.dumps(config))
    if final is not None:
        central = _central(*final)
        (run / "rounds.jsonl").write_text(json.dumps(RoundRecord(number=1, central=central).to_json()) + "\n")
        (run / "summary.json").write_text(json.dumps({"final": central, "best_round": 1, "best": central, "rounds": 1,
                                                      "dataset": config["dataset"], "strategy": "fedavg"}))
    return run


def test_the_pooled_reference_is_the_pooled_control_for_the_runs_config(tmp_path, data_dir, capsys):
    from hospitrust.bench.controls import Control, run_control
    from hospitrust.config import RunConfig

    # hospital-1 attacked: the reference pools the two honest hospitals, as the leaderboard's control does
    run = _run_dir(tmp_path, **{"attack": "sign-flip", "malicious-hospitals": "1"})
    assert cli.main(["reference", "pooled", str(run)]) == 0
    out = capsys.readouterr().out
    ref = json.loads((run / REFERENCE_FILE).read_text())
    assert ref["epochs"] == 1 and ref["budget"] == "matched: num-server-rounds 1 x local-epochs 1"
    assert ref["pooled_hospitals"] == ["hospital-0", "hospital-2"] and ref["hospitals"] == 3
    assert set(ref["per_class_recall"]) == {"normal", "pneumonia"} and ref["final"]["num_examples"] == 624  # the test split
    assert 0.0 <= ref["final"]["balanced_accuracy"] <= 1.0 and 0.0 <= ref["final"]["auc"] <= 1.0
    assert "pooled reference: epoch   1/1  bal-acc" in out and f"written: {run / REFERENCE_FILE}" in out
    gap = ref["gap"]["balanced_accuracy"]
    assert ref["this_run"]["balanced_accuracy"] == 0.7 and gap == pytest.approx(0.7 - ref["final"]["balanced_accuracy"])
    assert f"this run: 0.7000 (AUC 0.8500); gap: {gap:+.4f}" in out.splitlines()[-1]

    # the same numbers as the leaderboard's pooled control for the same config and budget: one trainer
    saved = json.loads((run / "config.json").read_text())
    config = {k: v for k, v in saved.items() if k in set(RunConfig().to_flat())}
    control = run_control({**config, "run-name": "control"}, 3, Control("pooled", 1), say=lambda line: None)
    assert json.loads((control / "summary.json").read_text())["final"] == ref["final"]

    # made once: a second call shows it, --force trains it again
    assert cli.main(["reference", "pooled", str(run)]) == 0
    assert "exists (--force trains it again)" in capsys.readouterr().out
    assert cli.main(["reference", "pooled", str(run), "--force", "--epochs", "2"]) == 0
    again = json.loads((run / REFERENCE_FILE).read_text())
    assert again["epochs"] == 2 and again["budget"] == "given (--epochs)" and len(again["history"]) == 2


def test_report_shows_the_gap_to_the_reference_or_how_to_make_it(tmp_path, capsys):
    run = _run_dir(tmp_path, final=(0.7, 0.85))
    assert cli.main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("pooled reference: none yet; ") and f"`hospitrust reference pooled {run}` trains it" in last

    reference = {"reference": "pooled", "epochs": 20, "pooled_images": 4238, "final": _central(0.8, 0.9),
                 "pooled_hospitals": [f"hospital-{i}" for i in range(3)]}
    (run / REFERENCE_FILE).write_text(json.dumps(reference))
    assert cli.main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("pooled reference: balanced accuracy 0.8000 (AUC 0.9000); this run: 0.7000 (AUC 0.8500); "
                    "gap: -0.1000 (AUC -0.0500) (this run minus the reference; 20 epochs on 4238 images of 3 hospitals)")

    # a reference made for another config of the run (e.g. extended by resume-from) says so
    from hospitrust.bench.reference import config_fingerprint, run_setting

    (run / REFERENCE_FILE).write_text(json.dumps({**reference, "config_fingerprint": config_fingerprint(
        {**run_setting(run)[0], "num-server-rounds": 5})}))
    assert gap_line(run).endswith(f"the run's config changed since the reference was made: `hospitrust reference "
                                  f"pooled {run} --force` trains it again")
    # a run without a summary yet
    (run / "summary.json").unlink()
    assert "this run: no summary.json yet" in gap_line(run)


def test_a_run_of_real_hospitals_is_refused_with_why(tmp_path, capsys):
    own_task = _run_dir(tmp_path, "own-task", **{"task.file": str(tmp_path / "task.toml")})
    assert cli.main(["reference", "pooled", str(own_task)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hospitrust reference pooled: this run's task is the consortium's own (task.file / task.classes)")
    assert "needs the hospitals' training data in one place, which only a simulation" in err
    assert not (own_task / REFERENCE_FILE).exists()
    assert gap_line(own_task).startswith("pooled reference: none can be made for this run (this run's task is")

    deployed = _run_dir(tmp_path, "deployed", partitions=[-1, -1])
    assert cli.main(["reference", "pooled", str(deployed)]) == 2
    assert "hospital-0, hospital-1 trained on data of their own (no simulated partition)" in capsys.readouterr().err

    control = _run_dir(tmp_path, "control", control="local-only-mean")
    assert cli.main(["reference", "pooled", str(control)]) == 2
    assert "the leaderboard's 'local-only-mean' control, not a federated run" in capsys.readouterr().err

    for argv, message in (([str(tmp_path / "nowhere")], "is not a folder: give a run directory"),
                          ([str(tmp_path)], "has no config.json: give a run directory"),
                          ([str(deployed), "--epochs", "0"], "--epochs must be an integer in [1, 100000], got 0")):
        assert cli.main(["reference", "pooled", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_simulate_ends_with_the_gap_line_and_makes_the_reference_when_asked(tmp_path, data_dir, monkeypatch, capsys):
    import hospitrust.ops.simulate as sim
    from hospitrust.cli import simulate as simulate_command

    run = _run_dir(tmp_path)
    monkeypatch.setattr(sim, "simulate", lambda **kwargs: (sim.COMPLETED, run))
    monkeypatch.setattr(simulate_command, "_environment_problem", lambda: None)
    assert cli.main(["simulate"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("pooled reference: none yet; ")
    assert cli.main(["simulate", "--pooled-reference"]) == 0
    out = capsys.readouterr().out
    assert "hospitrust simulate --pooled-reference: " in out and (run / REFERENCE_FILE).is_file()
    assert "; this run: 0.7000 (AUC 0.8500); gap: " in out.splitlines()[-1]


def test_the_getting_started_page_runs_the_reference_commands():
    shown = [c for c in commands(REPO / "docs" / "getting-started.md")
             if c.text.startswith(("hospitrust reference pooled", "hospitrust report runs/"))
             or "--pooled-reference" in c.text]
    assert len(shown) == 3 and not [c.where for c in shown if c.exempt]

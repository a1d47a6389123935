"""The run directory's schema: written, read back, NaN as null, never overwritten."""

from __future__ import annotations

import json
import pytest
import torch

from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app.results import RunDirectory, read_round_lines, read_round_records, read_summary


def _round(i):
    return RoundRecord(i, central={"accuracy": 0.5, "auc": float("nan"), "per_class_recall": [1.0, float("nan")]},
                       clients=[HospitalRecord("h0", node_id=1, num_examples=3, weight=1.0, train_loss=0.1)],
                       aggregation_seconds=0.01, round_seconds=1.0)


def test_round_trip(tmp_path):
    rd = RunDirectory.create(tmp_path, "run")
    rd.write_config({"seed": 1, "path": tmp_path})
    rd.append_round(_round(1))
    rd.append_round(_round(2))
    rd.write_summary({"final": {"accuracy": 0.5}, "best_round": 2, "rounds": 2, "wall_seconds": 3.0,
                      "dataset": "pneumoniamnist", "strategy": "fedavg"})
    rd.save_model({"w": torch.ones(2), "n": torch.tensor(3)})
    rounds = read_round_records(rd.path)
    assert [r.number for r in rounds] == [1, 2]
    assert rounds[0].central["auc"] is None and rounds[0].central["per_class_recall"] == [1.0, None]
    assert read_summary(rd.path)["best_round"] == 2
    assert json.loads((rd.path / "config.json").read_text())["path"] == str(tmp_path)
    assert torch.equal(torch.load(rd.path / "model.pt")["n"], torch.tensor(3))
    # every line is strict JSON (no NaN tokens): the raw schema view
    read_round_lines(rd.path, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_a_round_is_appended_only_as_a_typed_record(tmp_path):
    rd = RunDirectory.create(tmp_path, "run")
    with pytest.raises(TypeError, match="a round is appended as a RoundRecord, not dict"):
        rd.append_round(_round(1).to_json())
    with pytest.raises(ValueError, match="best_round"):
        rd.write_summary({"final": {}})


def test_an_earlier_run_is_never_overwritten(tmp_path):
    first = RunDirectory.create(tmp_path, "run")
    first.append_round(_round(1))
    second = RunDirectory.create(tmp_path, "run")
    assert second.path != first.path and second.path.name == "run-2"


def test_the_config_reference_documents_every_run_config_key():
    from pathlib import Path

    from hospitrust.config.run import known_keys

    reference = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    missing = [k for k in known_keys() if f"`{k}`" not in reference]
    assert not missing, f"docs/config.md lacks run config keys {missing} (run `hospitrust config generate`)"


def test_round_periods_by_hand():
    """Rounds that overlap (the next round's train messages out with this round's evaluation):
    round_seconds 5, 9, 9 add up to 23 s, the run took 5 + 7 + 4 = 16 s, record to record."""
    from hospitrust.server_app.results import round_periods

    rounds = [RoundRecord(1, round_seconds=5.0, timing={"finished_at": 100.0}),
              RoundRecord(2, round_seconds=9.0, timing={"finished_at": 107.0}),
              RoundRecord(3, round_seconds=9.0, timing={"finished_at": 111.0})]
    assert round_periods(rounds) == [5.0, 7.0, 4.0]
    # a run written before the stamps: its round_seconds
    assert round_periods([RoundRecord(1, round_seconds=2.5), RoundRecord(2, round_seconds=3.0)]) == [2.5, 3.0]


def test_the_serverapps_log_is_kept_in_the_run_directory_without_colour_codes(tmp_path):
    from logging import INFO

    from flwr.common.logger import log

    run = RunDirectory.create(tmp_path, "logged")
    log(INFO, "before the directory is held: not in the file")
    with run.exclusive():
        log(INFO, "hospitrust: round 1 done")
    log(INFO, "after: not in the file")
    with run.exclusive():  # a resumed run appends
        log(INFO, "hospitrust: resuming")
    text = (run.path / "server.log").read_text()
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].startswith("INFO ") and lines[0].endswith(": hospitrust: round 1 done"), text
    assert lines[1].endswith(": hospitrust: resuming") and "\x1b[" not in text

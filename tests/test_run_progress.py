"""`hospitrust deploy run` counts a run's progress from the server's checkpoint, not from `flwr log`: after a
SuperLink crash the failed run's log can hold none of the rounds it finished, and counting from it made two
crashes in a row look like two attempts without progress (the supervisor gave up on a run that advanced).

The Flower side (submit, status, log) is played by the test; the checkpoints are real ones, written with the
ServerApp's own save_checkpoint into the run directory (tests/test_run_supervisor.py runs the real thing).
"""

from __future__ import annotations

import json
import os
import time

import torch

from hospitrust.ops.deploy.runner import RunSupervisor
from hospitrust.server_app.checkpoint import save_checkpoint


class Played(RunSupervisor):
    """Each attempt: the rounds its ServerApp checkpoints before it ends, how it ends, and what `flwr log` says."""

    def __init__(self, tmp_path, plays: list[tuple[list[int], str, str]], **kw) -> None:
        self.said: list[str] = []
        super().__init__(tmp_path / "app", "tls", f'run-name="crash" output-dir="{tmp_path / "runs"}" num-server-rounds=5',
                         record=tmp_path / "attempts.jsonl", work=tmp_path, poll=0, say=self.said.append, **kw)
        self.plays, self.submitted = plays, []

    def _submit(self, resume: bool) -> int:
        self.submitted.append(resume)
        return len(self.submitted)

    def _watch(self, run_id: int) -> tuple[str, str]:
        rounds, status, _ = self.plays[run_id - 1]
        for r in rounds:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_checkpoint(self.run_dir, round=r, model_state={"w": torch.full((2,), float(r))}, strategy_name="fedavg",
                            strategy_state={}, config={}, history=[])
        return status, ""

    def _log(self, run_id: int) -> str:
        return self.plays[run_id - 1][2]


def _record(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]


def test_two_crashes_in_a_row_that_advanced_the_run_are_progress(tmp_path):
    # the case: each crash came after a checkpointed round, and the failed run's log shows no round line
    sup = Played(tmp_path, [([1], "finished:failed", ""), ([2], "finished:failed", ""),
                            ([3, 4, 5], "finished:completed", "round   5/5  bal-acc 0.9")], attempts=5)
    assert sup.run() == 0, sup.said
    record = _record(tmp_path)
    assert [a["rounds_reached"] for a in record] == [1, 2, 5]
    assert {a["rounds_from"] for a in record} == {"checkpoint"}
    assert sup.submitted == [False, True, True]


def test_attempts_that_checkpoint_nothing_new_are_given_up_after_two(tmp_path):
    sup = Played(tmp_path, [([1], "finished:failed", ""), ([], "finished:failed", ""), ([], "finished:failed", ""),
                            ([2], "finished:completed", "")], attempts=5)
    assert sup.run() == 1
    assert [a["rounds_reached"] for a in _record(tmp_path)] == [1, 1, 1]
    assert "two attempts in a row made no progress" in sup.said[-1]


def test_a_checkpoint_older_than_the_supervisor_is_not_progress_and_a_crash_before_round_1_starts_again(tmp_path):
    old = tmp_path / "runs" / "crash"
    old.mkdir(parents=True)
    save_checkpoint(old, round=4, model_state={"w": torch.zeros(2)}, strategy_name="fedavg", strategy_state={},
                    config={}, history=[])
    os.utime(old / "checkpoint.pt", (time.time() - 3600, time.time() - 3600))  # an earlier run of the same name
    sup = Played(tmp_path, [([], "finished:failed", ""), ([1, 2, 3, 4, 5], "finished:completed", "")], attempts=3)
    assert sup.run() == 0
    assert [a["rounds_reached"] for a in _record(tmp_path)] == [0, 5]
    assert sup.submitted == [False, False]  # nothing checkpointed by this run: no resume from the old file


def test_without_the_run_directory_here_the_log_counts_with_the_resumed_line(tmp_path):
    # the supervisor on another machine than the SuperLink: output-dir is not here, the log is all there is
    sup = Played(tmp_path, [([], "finished:failed", "round   1/5  bal-acc 0.5"),
                            ([], "finished:failed", "hospitrust: resuming /x/runs/crash after round 1\nround   2/5  x"),
                            ([], "finished:completed", "")], attempts=5)
    sup.run_dir = tmp_path / "elsewhere" / "runs" / "crash"
    assert sup.run() == 0
    record = _record(tmp_path)
    assert [(a["rounds_reached"], a["rounds_from"]) for a in record] == [(1, "log"), (2, "log"), (2, "log")]


def test_an_unreadable_checkpoint_is_said_and_the_log_counts(tmp_path):
    sup = Played(tmp_path, [([], "finished:completed", "round   3/5  x")], attempts=1)
    sup.run_dir.mkdir(parents=True)
    (sup.run_dir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert sup.run() == 0
    assert [(a["rounds_reached"], a["rounds_from"]) for a in _record(tmp_path)] == [(3, "log")]
    assert any("cannot read" in line and "counting rounds from the log" in line for line in sup.said), sup.said

"""A run survives its SuperLink: `hospitrust deploy run` submits a 3-round run, flower-superlink is killed with
SIGKILL after round 1 and nothing restarts it but its `hospitrust deploy superlink` wrapper (on its database),
and the supervisor resumes the run by itself; it ends with the model of the same run unbroken (the session's
federation, tests/federation.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import psutil
import pytest
import torch

from federation import HTA_ROUNDS, HTA_RUN, RUN_TIMEOUT, run_config, task_keys
from hospitrust.ops import deploy

pytestmark = [pytest.mark.slow, pytest.mark.data]


def _model_hash(path) -> str:
    state, h = torch.load(path), hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def _superlinks(wrapper: psutil.Process) -> list[psutil.Process]:
    """The wrapper's live flower-superlink children."""
    out = []
    for p in wrapper.children():
        try:
            if any("flower-superlink" in a for a in p.cmdline()[:2]) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:  # exited
            pass
    return out


def test_a_run_resumes_by_itself_after_the_superlink_is_killed(federation):
    fed = federation
    extra = f"{HTA_RUN} {task_keys(fed)}"  # test_deploy's first run: its model is the unbroken one
    reference = fed.work / "runs" / "nan" / "model.pt"
    if not reference.is_file():  # that test was deselected: run it unbroken here
        assert fed.wait(fed.submit(run_config(fed, "nan", extra, rounds=HTA_ROUNDS)))[0] == deploy.COMPLETED
    run_dir = fed.work / "runs" / "crash"
    record = fed.work / "crash.attempts.jsonl"
    fed.wait_idle()
    fed.start("run-supervisor", [sys.executable, "-m", "hospitrust.cli.main", "deploy", "run", str(fed.app), "--connection",
                                 "tls", "--run-config", run_config(fed, "crash", extra, rounds=HTA_ROUNDS), "--record", str(record), "--poll", "2",
                                 "--attempts", "3"], fed.cli_home)
    supervisor = fed.procs["run-supervisor"]
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (run_dir / "checkpoint.pt").is_file():  # round 1 done
        assert supervisor.alive() and time.monotonic() < deadline, fed.tail("run-supervisor")
        time.sleep(0.5)

    # the crash: flower-superlink itself, with SIGKILL; nothing but its `deploy superlink` wrapper restarts it
    wrapper = psutil.Process(fed.procs["superlink"].pid)
    (superlink,) = _superlinks(wrapper)
    os.kill(superlink.pid, signal.SIGKILL)
    deadline_up = time.monotonic() + 120
    while [p.pid for p in _superlinks(wrapper)] in ([], [superlink.pid]):
        assert wrapper.is_running() and time.monotonic() < deadline_up, fed.tail("superlink")
        time.sleep(0.5)
    deploy.wait_healthy(fed.address, ca=fed.certs / "ca.crt", timeout=120, proc=fed.procs["superlink"])
    assert fed.procs["superlink"].alive() and "flower-superlink exited with code -9" in fed.tail("superlink", 100000)

    # Flower 1.42's SuperNode can hang on the message that was in flight when its SuperLink died (its ClientApp's
    # reply is refused, "Run is finished", and the next message is never answered): restart such a SuperNode, as
    # the federation does before every run; the SuperLink delivers the resumed run's query to it again
    while not record.is_file():
        assert supervisor.alive() and time.monotonic() < deadline, fed.tail("run-supervisor")
        time.sleep(0.5)
    fed.wait_idle(timeout=60)
    rc = supervisor.popen.wait(timeout=RUN_TIMEOUT)
    attempts = [json.loads(line) for line in record.read_text().splitlines()]
    assert rc == 0, fed.tail("run-supervisor") + "\n" + json.dumps(attempts, indent=1) + "\n" + fed.diagnostics(run_dir)
    assert [a["status"] for a in attempts] == ["finished:failed", deploy.COMPLETED], attempts
    assert attempts[0]["resume_from"] == "" and attempts[1]["resume_from"] == str(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == HTA_ROUNDS and summary["resumed_at"], summary
    assert _model_hash(run_dir / "model.pt") == _model_hash(reference), fed.diagnostics(run_dir)

"""A run survives its SuperLink: `hospitrust deploy run` submits a 2-round run; after round 1 flower-superlink is
killed with SIGKILL and nothing restarts it but its `hospitrust deploy superlink` wrapper (on its database); once it
is back, the wrapper itself is killed with SIGKILL (taking flower-superlink and nginx with it) and started again with
the same command, as its unit's `Restart=on-failure` does; then the warm ServerApp launcher (with the run's ServerApp) is
killed with SIGKILL and the wrapper starts a new one. The supervisor resumes the run by itself, the SuperNodes
reconnect and heal by themselves (the test restarts none), and the run ends with the model of the same run unbroken
(the session's federation, tests/federation.py)."""

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

from federation import HTA_ROUNDS, HTA_RUN, RUN_TIMEOUT, run_config, superlinks as _superlinks, task_keys
from hospitrust.ops import deploy

pytestmark = [pytest.mark.slow, pytest.mark.data]


def _model_hash(path) -> str:
    state, h = torch.load(path), hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].contiguous().numpy().tobytes())
    return h.hexdigest()




def _launchers(wrapper: psutil.Process) -> list[psutil.Process]:
    """The live ServerApp launcher under the `deploy superlink` wrapper (hospitrust's warm one, the wrapper's child)."""
    out = []
    for p in wrapper.children():
        try:
            if "hospitrust.supervision.serverapp_launcher" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_a_run_resumes_by_itself_after_the_superlink_and_then_its_wrapper_are_killed(federation):
    fed = federation
    extra = f"{HTA_RUN} {task_keys(fed)}"  # test_deploy's first run: its model is the unbroken one
    reference = fed.work / "runs" / "nan" / "model.pt"
    if not reference.is_file():  # that test was deselected: run it unbroken here
        assert fed.wait(fed.submit(run_config(fed, "nan", extra, rounds=HTA_ROUNDS)))[0] == deploy.COMPLETED
    run_dir = fed.work / "runs" / "crash"
    record = fed.work / "crash.attempts.jsonl"
    fed.wait_idle()
    restarted = list(fed.restarted)
    fed.start("run-supervisor", [sys.executable, "-m", "hospitrust.cli.main", "deploy", "run", str(fed.app), "--connection",
                                 "tls", "--run-config", run_config(fed, "crash", extra, rounds=HTA_ROUNDS), "--record", str(record), "--poll", "2",
                                 "--attempts", "4"], fed.cli_home)
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

    # then the wrapper itself, with SIGKILL, before the run's failure is known: the kernel's parent-death signal
    # takes the restarted flower-superlink and nginx with it, and the wrapper's unit starts it again after 5 s
    children = wrapper.children(recursive=True)
    os.kill(wrapper.pid, signal.SIGKILL)
    fed.procs["superlink"].stop(timeout=30)  # reaped (its children are no longer its own: they go by themselves)
    _, left = psutil.wait_procs(children, timeout=30)
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "left running by the killed wrapper"
    time.sleep(5)  # the unit's RestartSec
    fed.start("superlink", *fed.commands["superlink"])
    deploy.wait_healthy(fed.address, ca=fed.certs / "ca.crt", timeout=120, proc=fed.procs["superlink"])

    # and its ServerApp launcher (issue 63: a SQLite lock's HTTP 500 killed Flower's under load, and every later run
    # stayed pending), with SIGKILL while it runs the resumed run's ServerApp (which goes with it): the wrapper starts
    # a new one within 20 s, and the supervisor resubmits the run
    wrapper = psutil.Process(fed.procs["superlink"].pid)
    deadline_up = time.monotonic() + 60
    while not _launchers(wrapper):
        assert time.monotonic() < deadline_up, fed.tail("superlink")
        time.sleep(0.5)
    (launcher,) = _launchers(wrapper)
    os.kill(launcher.pid, signal.SIGKILL)
    killed = time.monotonic()
    while [p.pid for p in _launchers(wrapper)] in ([], [launcher.pid]):
        assert time.monotonic() - killed < 20, "no ServerApp launcher 20 s after its death\n" + fed.tail("superlink")
        time.sleep(0.5)
    back_after = time.monotonic() - killed
    assert "serverapp-launcher exited with code -9" in fed.tail("superlink", 100000), fed.tail("superlink")
    print(f"ServerApp launcher back {back_after:.1f} s after its SIGKILL")

    # the SuperNodes reconnect by themselves; one hung on the message in flight at a crash is healed by its own
    # watchdog (issue 47): the fixture restarts no SuperNode
    rc = supervisor.popen.wait(timeout=RUN_TIMEOUT)
    attempts = [json.loads(line) for line in record.read_text().splitlines()]
    assert rc == 0, fed.tail("run-supervisor") + "\n" + json.dumps(attempts, indent=1) + "\n" + fed.diagnostics(run_dir)
    # the crashed attempt, then its resumption (failed attempts in between where the wrapper or the launcher was killed
    # after the supervisor had learnt of the first failure and resubmitted: the resubmitted run can die with them)
    statuses = [a["status"] for a in attempts]
    assert statuses[0] == "finished:failed" and statuses[-1] == deploy.COMPLETED and len(statuses) <= 4, attempts
    assert attempts[0]["resume_from"] == "" and {a["resume_from"] for a in attempts[1:]} == {str(run_dir)}
    assert attempts[0]["rounds_reached"] == 1 and attempts[-1]["rounds_reached"] == HTA_ROUNDS, attempts
    assert fed.restarted == restarted, fed.restarted
    for log in fed.work.glob("superlink*.log"):
        assert "address already in use" not in log.read_text().lower(), log.read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == HTA_ROUNDS and summary["resumed_at"], summary
    assert _model_hash(run_dir / "model.pt") == _model_hash(reference), fed.diagnostics(run_dir)

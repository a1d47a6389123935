"""An interrupted test run (SIGTERM, or Ctrl-C) leaves no Flower process behind: in one process, and on
pytest-xdist workers, as the whole suite runs on them (tests/conftest.py; two here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_an_interrupted_pytest_stops_every_flower_process(tmp_path, how, workers):
    probe = tmp_path / "pids.json"
    env = dict(os.environ, HOSPITRUST_PROBE_FILE=str(probe))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # on xdist the probe runs in a worker: a SIGTERM reaches the controller only, which passes it on
    # Ctrl-C's default action, as a terminal's foreground job has it: a suite started in the background of a shell
    # without job control (`nohup ... &`) has SIGINT ignored, and an ignored signal stays ignored across exec
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "tests/interrupt_probe.py"]
    with_ctrl_c = ["import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"]
    child = subprocess.Popen([sys.executable, "-c", *with_ctrl_c, *argv],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # its own process group, as a terminal would give it
    try:
        deadline = time.monotonic() + 180
        while not probe.is_file():
            assert child.poll() is None, child.stdout.read()
            assert time.monotonic() < deadline, "the probe never started its SuperLink"
            time.sleep(0.5)
        pids = json.loads(probe.read_text())
        time.sleep(2)  # the SuperLink starts its SuperExec (in another session)
        tree = [pids["superlink"], pids["sleeper"]] + [p.pid for p in psutil.Process(pids["superlink"]).children(recursive=True)]
        assert len(tree) >= 3, "the SuperLink started no SuperExec"
        if how == "sigterm":
            child.send_signal(signal.SIGTERM)
        else:
            os.killpg(child.pid, signal.SIGINT)  # what the terminal sends the foreground group
        child.wait(timeout=120)
        alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"left running after {how}: {[psutil.Process(p).cmdline() for p in alive]}"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)

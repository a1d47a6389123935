"""The test federation's SuperNodes declare a 10 s heartbeat, poll every second when idle and drop a ClientApp's task
token 15 s after its last beat, and the ClientApps it forks beat often enough for that
(tests/supernode_heartbeat/sitecustomize.py): the changes act in a process named flower-supernode and in the ClientApp
launcher, on Flower's own modules, and nowhere else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from federation import SUPERNODE_HEARTBEAT, flwr_env

PROBE = """
import time
import flwr.supercore.heartbeat as beats
import flwr.supernode.fleet_http_connection as connection
import flwr.supernode.start_client_internal as loop
import flwr.supercore.corestate.in_memory_corestate as memory_state
import flwr.supercore.corestate.sql_corestate as sql_state
lapses = {m.HEARTBEAT_PATIENCE * m.HEARTBEAT_DEFAULT_INTERVAL for m in (memory_state, sql_state)}
windows = {m.HEARTBEAT_DEFAULT_INTERVAL for m in (memory_state, sql_state)}
start = time.monotonic()
loop.time.sleep(3)  # the loop's idle sleep between empty pulls
print(connection.HEARTBEAT_DEFAULT_INTERVAL, beats.HEARTBEAT_DEFAULT_INTERVAL, round(time.monotonic() - start),
      *lapses, *windows)
"""


def _run(tmp_path: Path, name: str, extra: dict[str, str] | None = None, supervised: bool = False) -> list[str]:
    script = tmp_path / name
    script.write_text(f"#!{sys.executable}\n{PROBE}")
    script.chmod(0o755)
    # supervised: as `deploy supernode`'s supervisor starts it, Flower's script under supernode_main
    cmd = [sys.executable, "-m", "hospitrust.supervision.supernode_main", str(script)] if supervised else [str(script)]
    out = subprocess.run(cmd, env=flwr_env(tmp_path / "home", extra), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_federations_supernodes_beat_every_ten_seconds_poll_every_second_and_lapse_tokens_after_fifteen(tmp_path):
    assert flwr_env(tmp_path)["PYTHONPATH"].split(os.pathsep)[0] == str(SUPERNODE_HEARTBEAT)
    # a process named flower-supernode, as `hospitrust deploy supernode` starts it: the interval it declares and
    # beats by
    # and a task token lapses 15 s after its ClientApp's last beat (Flower's claim window, 30 s, kept); its idle poll
    # sleeps 1 s instead of 3 s
    assert _run(tmp_path, "flower-supernode") == ["10.0", "10.0", "1", "15.0", "30"]
    assert _run(tmp_path, "flower-supernode", supervised=True) == ["10.0", "10.0", "1", "15.0", "30"]
    assert _run(tmp_path, "flower-supernode", {"HOSPITRUST_TEST_SUPERNODE_HEARTBEAT": "30", "HOSPITRUST_TEST_TASK_TOKEN_LAPSE": "60",
                                               "HOSPITRUST_TEST_SUPERNODE_POLL": "3"}) == ["30.0", "30.0", "3", "60.0", "30"]
    # any other process of the federation (the SuperLink, ServerApps, the tests' commands): Flower's values
    assert _run(tmp_path, "flower-superlink") == ["30", "30", "3", "60", "30"]


LAUNCHER_PROBE = """
import runpy, sys
sys.orig_argv = [sys.executable, "-m", "hospitrust.supervision.launcher", "--runtime-api-address", "127.0.0.1:1"]
runpy.run_path(sys.argv[1])
import flwr.supercore.heartbeat as beats
print(beats.HEARTBEAT_DEFAULT_INTERVAL)
"""


def test_the_clientapp_launchers_clientapps_beat_within_the_test_federations_token_lapse(tmp_path):
    """The warm launcher (and every ClientApp it forks) beats at a 10 s interval, every 3.5-4.5 s: more than three
    beats per 15 s lapse; Flower's 30 s interval (17.5-22.5 s between beats) would let the token lapse in training."""
    env = flwr_env(tmp_path / "home")
    sitecustomize = str(SUPERNODE_HEARTBEAT / "sitecustomize.py")
    out = subprocess.run([sys.executable, "-c", LAUNCHER_PROBE, sitecustomize], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["10"], out.stdout + out.stderr
    # the same interpreter, not started as the launcher: Flower's 30 s
    out = subprocess.run([sys.executable, "-c", "import flwr.supercore.heartbeat as b; print(b.HEARTBEAT_DEFAULT_INTERVAL)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["30"], out.stdout + out.stderr

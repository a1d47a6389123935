"""The test federation's SuperNodes declare a 10 s heartbeat (tests/supernode_heartbeat/sitecustomize.py): the change
acts in a process named flower-supernode, on Flower's own modules, and nowhere else."""

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
print(connection.HEARTBEAT_DEFAULT_INTERVAL, beats.HEARTBEAT_DEFAULT_INTERVAL, loop.time is time)
"""


def _run(tmp_path: Path, name: str, extra: dict[str, str] | None = None) -> list[str]:
    script = tmp_path / name
    script.write_text(f"#!{sys.executable}\n{PROBE}")
    script.chmod(0o755)
    out = subprocess.run([str(script)], env=flwr_env(tmp_path / "home", extra), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_federations_supernodes_declare_a_ten_second_heartbeat_and_nothing_else_changes(tmp_path):
    assert flwr_env(tmp_path)["PYTHONPATH"].split(os.pathsep)[0] == str(SUPERNODE_HEARTBEAT)
    # a process named flower-supernode, as `hospitrust deploy supernode` starts it: the interval it declares and
    # beats by; its idle poll (the loop's time module) is Flower's
    assert _run(tmp_path, "flower-supernode") == ["10.0", "10.0", "True"]
    assert _run(tmp_path, "flower-supernode", {"HOSPITRUST_TEST_SUPERNODE_HEARTBEAT": "30"}) == ["30.0", "30.0", "True"]
    # any other process of the federation (the SuperLink, ServerApps, ClientApps, the tests' commands): Flower's 30 s
    assert _run(tmp_path, "flower-superlink") == ["30", "30", "True"]

"""Not collected by default (no test_ prefix): tests/test_interrupt.py runs this file in a child pytest
and interrupts it. It starts a real SuperLink (tracked by hospitrust.ops.flwr, in its own session, as
the deployment tests do) and an untracked child process, writes their pids, and waits to be stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hospitrust.ops import flwr


def test_wait_to_be_interrupted(tmp_path):
    out = Path(os.environ["HOSPITRUST_PROBE_FILE"])
    port = flwr.free_port()
    home = tmp_path / "flwr"
    superlink = flwr.start("flower-superlink", flwr.simulation_superlink_command(port), env=flwr.flower_env(home),
                           cwd=tmp_path, log_file=tmp_path / "superlink.log")
    flwr.wait_healthy(f"127.0.0.1:{port}", proc=superlink, timeout=120)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    out.write_text(json.dumps({"superlink": superlink.pid, "sleeper": sleeper.pid}))
    time.sleep(300)

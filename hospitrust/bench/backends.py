"""How one cell runs: in process (the real ServerApp and ClientApp, no Ray) or as a real Flower simulation.

``inprocess``: ``hospitrust.ops.inprocess.run_inprocess`` in a worker process that is reused across
cells, so imports, the loaded dataset and the partitions (cached per process) are paid once per
worker, not once per cell.

``simulation``: a real Flower simulation (SuperLink, SuperExec, ``flwr-simulation``, Ray actors).
With ``shared-superlink`` (default) the grid starts one SuperLink and submits every cell to it
as its own run (``flwr run``); otherwise every cell calls ``hospitrust.ops.simulate.simulate`` and
owns a SuperLink. With a Ray address (``--ray-address`` / ``RAY_ADDRESS``) each run's
``flwr-simulation`` joins that Ray cluster (``ray.init()`` reads ``RAY_ADDRESS``) instead of
starting a Ray instance of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hospitrust.ops import flwr
from hospitrust.ops.inprocess import run_inprocess
from hospitrust.ops.flwr import COMPLETED, FlowerProcess, FlowerProcessError
from hospitrust.ops.simulate import (
    CONNECTION, SimulationError, app_config_defaults, find_app_dir, simulate, size_resources, to_toml_overrides,
)


def run_inprocess_cell(run_config: dict[str, Any], hospitals: int, log: TextIO,
                       node_configs: list[dict[str, Any]] | None = None) -> None:
    """One cell in this (worker) process; the run's log lines (flwr logger, prints) go to ``log``.
    ``node_configs``: one per hospital (default: partition i of ``hospitals``).
    """
    flwr_logger = logging.getLogger("flwr")
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))
    flwr_logger.addHandler(handler)
    previous = flwr_logger.level
    flwr_logger.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            run_inprocess(run_config, hospitals, node_configs=node_configs)
    finally:
        flwr_logger.removeHandler(handler)
        flwr_logger.setLevel(previous)


def _overrides(run_config: dict[str, Any], app_dir: Path) -> dict[str, Any]:
    """The keys that differ from pyproject's defaults (plus where results go): a short --run-config."""
    defaults = app_config_defaults(app_dir)
    values = {k: v for k, v in run_config.items() if defaults.get(k) != v}
    values["output-dir"] = str(Path(run_config["output-dir"]).resolve())
    values["run-name"] = run_config["run-name"]
    data_dir = run_config.get("data-dir") or os.environ.get("HOSPITRUST_DATA_DIR", "")
    if data_dir:
        values["data-dir"] = str(Path(data_dir).expanduser().resolve())
    return values


@dataclass
class SharedSuperLink:
    """One SuperLink (simulation mode) for the whole grid: every cell is one run submitted to it."""

    address: str
    flwr_home: str
    pid: int

    @classmethod
    def start(cls, ray_address: str = "", extra_env: dict[str, str] | None = None) -> tuple["SharedSuperLink", FlowerProcess]:
        work = Path(tempfile.mkdtemp(prefix="hospitrust-bench-superlink-"))
        env = flwr.flower_env(work, extra_env)
        if ray_address:
            env["RAY_ADDRESS"] = ray_address
        port = flwr.free_port()
        flwr.write_local_connection(work, CONNECTION, port)
        proc = flwr.start("flower-superlink", flwr.simulation_superlink_command(port), env=env, cwd=work,
                          log_file=work / "superlink.log")
        try:
            flwr.wait_healthy(f"127.0.0.1:{port}", proc=proc)
        except FlowerProcessError as exc:
            proc.stop()
            raise SimulationError(str(exc)) from None
        return cls(f"127.0.0.1:{port}", str(work), proc.pid), proc

    @staticmethod
    def stop(proc: FlowerProcess, flwr_home: str) -> None:
        proc.stop()
        shutil.rmtree(flwr_home, ignore_errors=True)


def run_simulation_cell(run_config: dict[str, Any], hospitals: int, log: TextIO, *, timeout: float,
                        superlink: dict[str, str] | None = None, ray_address: str = "") -> None:
    """One real Flower simulation run; raises unless it ended finished:completed with a summary.json."""
    app = find_app_dir()
    values = _overrides(run_config, app)
    if superlink is None:  # simulate's own SuperLink joins the Ray cluster at ray_address
        status, _ = simulate(hospitals=hospitals, overrides=[to_toml_overrides(values)], app_dir=app,
                             timeout=timeout, out=log, ray_address=ray_address)
        if status != COMPLETED:
            raise SimulationError(f"simulation ended {status}")
        return
    work = Path(superlink["flwr_home"])
    env = flwr.flower_env(work)
    res = size_resources(hospitals)
    federation = (f"num-supernodes={hospitals} client-resources-num-cpus={res.cpus_per_hospital:g} "
                  f"client-resources-num-gpus={res.gpus_per_hospital:g}")
    try:
        run_id = flwr.submit_run(app, CONNECTION, run_config=to_toml_overrides(values), env=env, cwd=work,
                                 federation_config=federation)
    except FlowerProcessError as exc:
        raise SimulationError(str(exc)) from None
    print(f"bench: run {run_id} submitted to SuperLink {superlink['address']}", file=log, flush=True)
    deadline = time.monotonic() + timeout
    status, details = "pending", ""
    while time.monotonic() < deadline:
        status, details = flwr.run_status(run_id, CONNECTION, env=env, cwd=work)  # in process: milliseconds
        if status.startswith("finished"):
            break
        time.sleep(1.0)
    if not status.startswith("finished"):
        flwr.stop_run(run_id, CONNECTION, env=env, cwd=work)
        status, details = "timeout", f"timed out after {timeout:.0f} s; the run was stopped"
    shown = flwr.flwr_cli(["log", str(run_id), CONNECTION, "--show"], env=env, cwd=work)
    log.write(shown.stdout + shown.stderr)
    print(f"bench: run {run_id} ended {status}", file=log, flush=True)
    if status != COMPLETED:
        raise SimulationError(f"simulation run {run_id} ended {status}: {details[-1500:]}")


class LocalRayHead:
    """A Ray head on 127.0.0.1 started by us (``ray start --head --block`` in its own process group),
    for tests and single-machine use; ``stop()`` ends exactly that process group (never ``ray stop``,
    which would end every Ray instance of the user).
    """

    def __init__(self, num_cpus: int | None = None, timeout: float = 180.0) -> None:
        self.port = flwr.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="hospitrust-ray-")
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--port", str(self.port), "--include-dashboard", "false", "--disable-usage-stats",
               "--temp-dir", self.temp_dir]
        if num_cpus:
            cmd += ["--num-cpus", str(num_cpus)]
        self.log_path = Path(self.temp_dir) / "ray-start.log"
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        self.proc = flwr.start("ray head", cmd, env=env, cwd=Path(self.temp_dir), log_file=self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise SimulationError(f"ray start exited with {self.proc.popen.returncode}:\n{self.log_path.read_text()[-2000:]}")
            text = self.log_path.read_text()
            if "Ray runtime started" in text:
                # Ray may bind the GCS to the host's address rather than 127.0.0.1: use the one it reports
                found = re.search(r"--address='([^']+)'", text)
                if found:
                    self.address = found.group(1)
                return
            time.sleep(0.5)
        self.stop()
        raise SimulationError(f"the Ray head did not start within {timeout:.0f} s:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.stop(timeout=60)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayHead":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

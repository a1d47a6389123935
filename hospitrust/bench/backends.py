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

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hospitrust.ops.simulate import (
    COMPLETED, SimulationError, _env, _flwr, _stop, _wait_healthy, app_config_defaults, find_app_dir, free_port, run_status,
    size_resources,
    to_toml_overrides,
)


def run_inprocess_cell(run_config: dict[str, Any], hospitals: int, log: TextIO,
                       node_configs: list[dict[str, Any]] | None = None) -> None:
    """One cell in this (worker) process; the run's log lines (flwr logger, prints) go to ``log``.
    ``node_configs``: one per hospital (default: partition i of ``hospitals``)."""
    import contextlib
    import logging

    from hospitrust.ops.inprocess import run_inprocess

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
    def start(cls, ray_address: str = "", extra_env: dict[str, str] | None = None) -> tuple["SharedSuperLink", subprocess.Popen]:
        work = Path(tempfile.mkdtemp(prefix="hospitrust-bench-superlink-"))
        env = _env(work)
        env.update(extra_env or {})
        if ray_address:
            env["RAY_ADDRESS"] = ray_address
        port = free_port()
        (work / "config.toml").write_text(
            f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
        log_file = work / "superlink.log"
        with open(log_file, "w") as fh:
            proc = subprocess.Popen(
                ["flower-superlink", "--insecure", "--simulation", "--host", "127.0.0.1", "--port", str(port),
                 "--disable-runtime-dependency-installation"],
                cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_healthy(port, proc, log_file)
        except SimulationError:
            _stop(proc)
            raise
        return cls(f"127.0.0.1:{port}", str(work), proc.pid), proc

    @staticmethod
    def stop(proc: subprocess.Popen, flwr_home: str) -> None:
        _stop(proc)
        shutil.rmtree(flwr_home, ignore_errors=True)


def run_simulation_cell(run_config: dict[str, Any], hospitals: int, log: TextIO, *, timeout: float,
                        superlink: dict[str, str] | None = None, ray_address: str = "") -> None:
    """One real Flower simulation run; raises unless it ended finished:completed with a summary.json."""
    app = find_app_dir()
    values = _overrides(run_config, app)
    if ray_address:
        os.environ["RAY_ADDRESS"] = ray_address  # inherited by the SuperLink -> flwr-simulation -> ray.init()
    if superlink is None:
        from hospitrust.ops.simulate import simulate

        status, _ = simulate(hospitals=hospitals, overrides=[to_toml_overrides(values)], app_dir=app,
                             timeout=timeout, out=log)
        if status != COMPLETED:
            raise SimulationError(f"simulation ended {status}")
        return
    work = Path(superlink["flwr_home"])
    env = _env(work)
    res = size_resources(hospitals)
    federation = (f"num-supernodes={hospitals} client-resources-num-cpus={res.cpus_per_hospital:g} "
                  f"client-resources-num-gpus={res.gpus_per_hospital:g}")
    submit = _flwr(["run", str(app), "sim", "--federation-config", federation,
                    "--run-config", to_toml_overrides(values), "--format", "json"], env, work)
    try:
        run_id = int(json.loads(submit.stdout)["run-id"])
    except (json.JSONDecodeError, KeyError, ValueError):
        raise SimulationError(f"flwr run did not start the run:\n{submit.stdout[-2000:]}\n{submit.stderr[-2000:]}")
    print(f"bench: run {run_id} submitted to SuperLink {superlink['address']}", file=log, flush=True)
    summary = Path(values["output-dir"]) / values["run-name"] / "summary.json"
    deadline = time.monotonic() + timeout
    status, details, last_check = "pending", "", 0.0
    while time.monotonic() < deadline:
        # a finished run leaves summary.json; `flwr ls` (a CLI start, ~1 s of CPU) only now and then
        if summary.is_file() or time.monotonic() - last_check > 20:
            status, details = run_status(run_id, env, work)
            last_check = time.monotonic()
            if status.startswith("finished"):
                break
        time.sleep(1.0)
    if not status.startswith("finished"):
        _flwr(["stop", str(run_id), "sim"], env, work)
        status, details = "timeout", f"timed out after {timeout:.0f} s; the run was stopped"
    shown = _flwr(["log", str(run_id), "sim", "--show"], env, work)
    log.write(shown.stdout + shown.stderr)
    print(f"bench: run {run_id} ended {status}", file=log, flush=True)
    if status != COMPLETED:
        raise SimulationError(f"simulation run {run_id} ended {status}: {details[-1500:]}")


class LocalRayHead:
    """A Ray head on 127.0.0.1 started by us (``ray start --head --block`` in its own process group),
    for tests and single-machine use; ``stop()`` ends exactly that process group (never ``ray stop``,
    which would end every Ray instance of the user)."""

    def __init__(self, num_cpus: int | None = None, timeout: float = 180.0) -> None:
        self.port = free_port()
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
        with open(self.log_path, "w") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SimulationError(f"ray start exited with {self.proc.returncode}:\n{self.log_path.read_text()[-2000:]}")
            text = self.log_path.read_text()
            if "Ray runtime started" in text:
                import re

                # Ray may bind the GCS to the host's address rather than 127.0.0.1: use the one it reports
                found = re.search(r"--address='([^']+)'", text)
                if found:
                    self.address = found.group(1)
                return
            time.sleep(0.5)
        self.stop()
        raise SimulationError(f"the Ray head did not start within {timeout:.0f} s:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayHead":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""`hospitrust deploy superlink` keeps flower-superlink and nginx running by itself (real processes on 127.0.0.1,
no federation): either one killed with SIGKILL is restarted (a killed nginx master's workers, which keep its
listening sockets, are stopped first, so the restart does not meet "address already in use"); a wrapper killed
with SIGKILL leaves neither running, and a new wrapper then starts on the same ports; SIGTERM stops everything
and exits 0 (systemd's clean stop). Restarting the wrapper itself is the service manager's job
(deploy/systemd/hospitrust-superlink.service)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hospitrust.errors import DeployError
from hospitrust.ops import deploy, flwr
from hospitrust.ops.deploy import gateway

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def _wrapper(tmp: Path, ports: dict[str, int]) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"wrapper-{time.monotonic_ns()}.log"
    env = {**os.environ, "FLWR_HOME": str(tmp / "flwr"), "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(REPO),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    cmd = [sys.executable, "-m", "hospitrust.cli.main", "deploy", "superlink", "--certs", str(tmp / "certs"),
           "--database", str(tmp / "state" / "superlink.db"), "--host", "127.0.0.1", "--port", str(ports["fleet"]),
           "--operator-port", str(ports["operator"]), "--superlink-port", str(ports["superlink"]),
           "--access-log-max-mb", "0.0005", "--access-log-keep", "2"]  # rotated after a few requests
    with log.open("w") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp), log


def _children(wrapper: subprocess.Popen) -> dict[str, psutil.Process]:
    """The wrapper's flower-superlink and nginx master."""
    out = {}
    for p in psutil.Process(wrapper.pid).children():
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:  # exited, not reaped yet
            continue
        if "flower-superlink" in cmd:
            out["superlink"] = p
        elif "nginx" in cmd and "-g" in p.cmdline():
            out["nginx"] = p
    return out


def _healthy(tmp: Path, ports: dict[str, int], wrapper: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Through the gateway: nginx and the SuperLink behind it both answer."""
    deadline = time.monotonic() + timeout
    while True:
        assert wrapper.poll() is None, log.read_text()
        try:
            deploy.wait_healthy(f"127.0.0.1:{ports['fleet']}", ca=tmp / "certs" / "ca.crt", timeout=3)
            return
        except flwr.FlowerProcessError:
            assert time.monotonic() < deadline, log.read_text()


def _gone(procs: list[psutil.Process], timeout: float = 30) -> list[str]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())}")
        except psutil.Error:
            pass
    return left


def test_the_wrapper_restarts_its_children_leaves_no_orphans_and_stops_cleanly(tmp_path):
    deploy.create_ca(tmp_path / "certs")
    deploy.create_server_cert(tmp_path / "certs" / "ca.crt", tmp_path / "certs" / "ca.key", tmp_path / "certs", ["127.0.0.1"])
    ports = {"fleet": flwr.free_port(), "operator": flwr.free_port(), "superlink": flwr.free_port()}
    wrapper, log = _wrapper(tmp_path, ports)
    everything: list[psutil.Process] = []
    try:
        _healthy(tmp_path, ports, wrapper, log)
        for name in ("superlink", "nginx"):
            before = _children(wrapper)[name]
            workers = before.children(recursive=True)
            everything += [before, *workers]
            os.kill(before.pid, signal.SIGKILL)
            deadline = time.monotonic() + 90
            while (now := _children(wrapper).get(name)) is None or now.pid == before.pid:
                assert wrapper.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            _healthy(tmp_path, ports, wrapper, log)
            assert not _gone(workers, timeout=1), log.read_text()  # nginx's orphaned workers were stopped
        text = log.read_text()
        assert "flower-superlink exited with code -9" in text and "nginx exited with code -9" in text, text
        assert "address already in use" not in text.lower(), text

        # the wrapper killed: its parent-death signal stops flower-superlink and nginx, workers included
        children = psutil.Process(wrapper.pid).children(recursive=True)
        assert {"superlink", "nginx"} <= set(_children(wrapper)), children
        everything += children
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=10)
        assert not _gone(children), "left running after kill -9 of the wrapper"

        # what systemd does next: start it again, on the same ports and database
        wrapper, log = _wrapper(tmp_path, ports)
        _healthy(tmp_path, ports, wrapper, log)
        children = psutil.Process(wrapper.pid).children(recursive=True)
        everything += children
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=60) == 0, log.read_text()
        assert not _gone(children, timeout=5), log.read_text()
        gw = tmp_path / "state" / "gateway"  # the wrapper rotated nginx's access log (the health checks filled it)
        assert (gw / "access.log.1").is_file() and not (gw / "access.log.3").exists(), sorted(p.name for p in gw.iterdir())
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        for p in everything:
            try:
                p.kill()
            except psutil.Error:
                pass


def _listener(marker: str, port: int) -> subprocess.Popen:
    code = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_a_stale_copy_holding_the_port_is_stopped_and_a_foreign_one_is_named():
    port = flwr.free_port()
    stale = _listener("/var/lib/hospitrust/superlink.db", port)
    try:
        child = gateway.Child("flower-superlink", ["true"], ports=(("127.0.0.1", port),), mine="/var/lib/hospitrust/superlink.db")
        gateway.free_ports(child, timeout=20)
        stale.wait(timeout=5)  # stopped (psutil reaped it: its exit code is not kept)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free
    finally:
        stale.kill()
    foreign = _listener("somebody-else", port)
    try:
        with pytest.raises(DeployError, match=rf"cannot start flower-superlink: port {port} on 127.0.0.1 is already in use "
                                              rf"by pid {foreign.pid}"):
            gateway.free_ports(child, timeout=1)
        assert foreign.poll() is None  # not ours: left alone
    finally:
        foreign.kill()


def test_flower_superlink_without_its_serverapp_launcher_is_unwell():
    """The check the wrapper runs every 2 s (issue 63): a process whose child is a live flower-superexec is well; once
    that child is dead (a zombie, or reaped), it is not, and the reason says why runs would stay pending."""
    parent = subprocess.Popen(["bash", "-c", "(exec -a flower-superexec sleep 60) & wait"])
    try:
        deadline = time.monotonic() + 10
        while not [p for p in psutil.Process(parent.pid).children(recursive=True) if "flower-superexec" in p.cmdline()[:1]]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert gateway.superexec_gone(parent) is None
        (child,) = psutil.Process(parent.pid).children(recursive=True)
        child.kill()
        child.wait(timeout=10)
        assert gateway.superexec_gone(parent) == "its ServerApp launcher (flower-superexec) is gone: no run would start"
    finally:
        parent.kill()
        parent.wait()
    assert gateway.superexec_gone(parent) is None  # flower-superlink itself gone: its exit is what restarts it

"""`hospitrust deploy supernode`'s supervisor with stand-in processes (no Flower, no torch): its children die
with it, a killed SuperNode is restarted with backoff, a held port is reported with its owner, and no log
file gets colour codes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil

from hospitrust.ops import flwr
from hospitrust.supervision import supervisor as sv

REPO = Path(__file__).resolve().parent.parent


def _stand_in(marker: str, name: str) -> list[str]:
    """A process that says it got a node id (as flower-supernode does) and sleeps; ``marker`` finds it."""
    return [sys.executable, "-c", f"import time; print('SuperNode ID: 1 ({name})', flush=True); time.sleep(600)", marker]


def _with_marker(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info["cmdline"] or []):
            out.append(p)
    return out


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _supervise(tmp_path: Path, marker: str, supernode: list[str] | None = None) -> subprocess.Popen:
    """A supervisor in its own process, with stand-ins for flower-supernode and the launcher."""
    script = tmp_path / "supervise.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from hospitrust.supervision import supervisor as sv
        sv.RESTART_BACKOFF = (0.5, 1.0)
        s = sv.Supervisor({supernode or _stand_in(marker, "supernode")!r}, "127.0.0.1:1", message_timeout=600.0, env=dict(__import__("os").environ),
                          out=sv.console_and_file({str(tmp_path / "supervisor.log")!r}),
                          launcher_cmd={_stand_in(marker, "launcher")!r})
        sys.exit(s.run(poll=0.2))
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def test_the_supernode_and_launcher_die_with_a_supervisor_killed_with_sigkill(tmp_path):
    marker = f"h33-{uuid.uuid4().hex}"
    proc = _supervise(tmp_path, marker)
    try:
        _wait(lambda: len(_with_marker(marker)) == 2, 30, "the supervisor starts both")
        proc.kill()  # SIGKILL: no handler of the supervisor's runs
        proc.wait(10)
        _wait(lambda: not _with_marker(marker), 15, "no supervised process left behind")
    finally:
        proc.kill()
        for p in _with_marker(marker):
            p.kill()


def _supernodes(marker: str) -> list[tuple[int, list[str]]]:
    out = []
    for p in _with_marker(marker):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "(supernode)" in " ".join(cmd):
            out.append((p.pid, cmd))
    return out


def test_a_supernode_killed_by_a_signal_is_restarted_with_the_same_command_and_backoff(tmp_path):
    marker = f"h33-{uuid.uuid4().hex}"
    proc = _supervise(tmp_path, marker)
    log = tmp_path / "supervisor.log"
    try:
        first, command = _wait(lambda: _supernodes(marker), 30, "the stand-in SuperNode starts")[0]
        os.kill(first, signal.SIGKILL)
        again = _wait(lambda: [s for s in _supernodes(marker) if s[0] != first], 30, "a new SuperNode")
        assert len(again) == 1 and again[0][1] == command  # the same command: the same key
        text = log.read_text()
        assert "flower-supernode was killed by signal 9: restarting it with the same key in 0.5 s (restart 1 in a row)" in text
        # killed again at once: the backoff doubles (capped at 1 s here)
        os.kill(again[0][0], signal.SIGKILL)
        _wait(lambda: "in 1 s (restart 2 in a row)" in log.read_text(), 30, "the second restart's backoff")
        third = _wait(lambda: [s for s in _supernodes(marker) if s[0] not in (first, again[0][0])], 30,
                      "the third SuperNode")[0]
        os.kill(third[0], signal.SIGTERM)  # the stand-in has no handler: it dies of the signal, so it is restarted
        _wait(lambda: "restart 3 in a row" in log.read_text(), 30, "SIGTERM from outside counts as killed")
        assert "\x1b[" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
    # the supervisor's own SIGTERM stops both children
    _wait(lambda: not _with_marker(marker), 15, "nothing left after the supervisor stopped")


def test_a_supernode_that_exits_by_itself_is_not_restarted(tmp_path):
    """Flower gave up (a refused key, a bad certificate, its retries spent): the supervisor exits with it."""
    marker = f"h33-{uuid.uuid4().hex}"
    proc = _supervise(tmp_path, marker, [sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(4)", marker])
    try:
        assert proc.wait(60) == 4
    finally:
        proc.kill()
    assert "flower-supernode exited with 4" in (tmp_path / "supervisor.log").read_text()
    _wait(lambda: not _with_marker(marker), 15, "the launcher stopped with it")


def test_a_port_still_held_is_reported_with_its_owner():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        held = sv.port_in_use("127.0.0.1", port)
    assert held is not None and f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in held, held
    assert "python" in held  # the owner's command line
    assert sv.port_in_use("127.0.0.1", port) is None  # released


def test_no_colour_codes_in_log_files(tmp_path):
    line = "\x1b[92mINFO \x1b[0m:      Starting Flower SuperNode"
    assert sv.plain(line) == "INFO :      Starting Flower SuperNode"
    out = sv.console_and_file(tmp_path / "supernode.log")
    out(line)
    assert (tmp_path / "supernode.log").read_text() == "INFO :      Starting Flower SuperNode\n"
    # what flwr.start writes (the federation's and simulate's logs of Flower processes)
    proc = flwr.start("colours", [sys.executable, "-c", f"print({line!r})"], env=dict(os.environ), cwd=tmp_path,
                      log_file=tmp_path / "flower.log")
    proc.popen.wait(30)
    _wait(lambda: (tmp_path / "flower.log").read_text(), 10, "the log written")
    assert (tmp_path / "flower.log").read_text() == "INFO :      Starting Flower SuperNode\n"
    proc.stop()


def test_a_session_that_cannot_be_deactivated_says_why(tmp_path):
    from hospitrust.ops import deploy

    deploy.create_ca(tmp_path)
    deploy.create_supernode_keys(tmp_path, "x")
    cmd = ["flower-supernode", "--superlink", f"127.0.0.1:{flwr.free_port()}", "--root-certificates",
           str(tmp_path / "ca.crt"), "--auth-supernode-private-key", str(tmp_path / "x.key")]
    said = sv.deactivate_session(cmd, 5)
    assert said.startswith("its session (node 5) not deactivated (ConnectError") and "heartbeats lapse" in said, said
    assert "not deactivated: no --superlink" in sv.deactivate_session(["flower-supernode"], 5)


def test_each_keys_node_id_is_remembered_for_the_next_supervisor(tmp_path):
    env = {"FLWR_HOME": str(tmp_path / "flwr")}
    assert sv.remembered_node_id(env, str(tmp_path / "a.key")) is None
    sv.remember_node_id(env, str(tmp_path / "a.key"), 12345678901234567890)
    sv.remember_node_id(env, str(tmp_path / "b.key"), 7)
    assert sv.remembered_node_id(env, str(tmp_path / "a.key")) == 12345678901234567890
    assert sv.remembered_node_id(env, str(tmp_path / "b.key")) == 7
    assert (tmp_path / "flwr" / "hospitrust" / "node-ids.json").is_file()
    # a supervisor picks it up from its SuperNode's log line and at start
    s = sv.Supervisor(["flower-supernode", "--auth-supernode-private-key", str(tmp_path / "c.key")], "127.0.0.1:1",
                      message_timeout=30.0, env=env, out=lambda line: None)
    assert s.node_id is None
    s._supernode_line("\x1b[92mINFO \x1b[0m:      SuperNode ID: 99")
    assert s.node_id == 99 and sv.remembered_node_id(env, str(tmp_path / "c.key")) == 99
    assert sv.Supervisor(s.supernode_cmd, "127.0.0.1:1", message_timeout=30.0, env=env, out=lambda line: None).node_id == 99

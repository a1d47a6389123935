"""`hospitrust deploy supernode`'s supervisor with stand-in processes (no Flower, no torch): its children die
with it, a killed SuperNode is restarted with backoff, a held port is reported with its owner, and no log
file gets colour codes."""

from __future__ import annotations

import json
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
import pytest

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


# ---- the watchdog: a message left open by a ClientApp's exit, matched by task id --------------------------

def _event(kind: str, task_id: int, **fields) -> str:
    import json

    return json.dumps({"launcher": kind, "time": time.time(), "pid": 4242, "task_id": task_id, **fields})


def _watchdog(monkeypatch, **kwargs) -> sv.Supervisor:
    monkeypatch.setattr(sv, "DIED_GRACE_SECONDS", 0.0)
    return sv.Supervisor(["flower-supernode"], "127.0.0.1:1", message_timeout=600.0, env={}, out=lambda line: None,
                         **kwargs)


# Flower 1.42's SuperNode lines, as it logs them (with colour codes)
RECEIVING = "\x1b[92mINFO \x1b[0m:      Receiving: train message (ID: 5f0c)"
SENDING = "\x1b[92mINFO \x1b[0m:      Sending: train message (ID: 77aa)"
SENT = "\x1b[92mINFO \x1b[0m:      Sent successfully"


def test_a_clientapp_that_exits_0_without_a_reply_restarts_the_supernode(monkeypatch):
    """The post-crash hang: the ClientApp's token was refused, it exits 0 and no reply ever reaches the SuperNode,
    which waits for it in `_push_messages` and never pulls again."""
    s = _watchdog(monkeypatch)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 7, run_id=1, n=1))
    assert s.check() is None  # the ClientApp is working
    s._launcher_line(_event("exited", 7, seconds=71.2, rc=0))
    why = s.check()
    assert why == ("ClientApp process 4242 (task 7) ended with exit code 0 after 71.2 s and its message is still open: "
                   "the SuperNode waits for a reply that will never come"), why


def test_an_exit_within_the_grace_waits_for_the_supernodes_sending_line(monkeypatch):
    s = _watchdog(monkeypatch)
    monkeypatch.setattr(sv, "DIED_GRACE_SECONDS", 0.3)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 7))
    s._launcher_line(_event("exited", 7, seconds=3.0, rc=0))
    assert s.check() is None  # within the grace
    s._supernode_line(SENDING)  # the reply was there: the SuperNode pushes it
    time.sleep(0.35)
    assert s.check() is None and not s.exited


def test_a_refused_clientapp_exiting_1_after_its_reply_is_not_a_hang_when_the_next_message_arrives(monkeypatch):
    """Issue 46 finding 8: a refused bundle's ClientApp replies with an error, then exits 1; the next message
    arrives within the grace. Before, any non-zero exit with any message open restarted the SuperNode (and the
    next messages failed with `Node Unavailable`)."""
    s = _watchdog(monkeypatch)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 7))
    s._supernode_line(SENDING)
    s._supernode_line(SENT)
    s._supernode_line(RECEIVING.replace("5f0c", "9d21"))  # the next message, before the first ClientApp exited
    s._launcher_line(_event("exited", 7, seconds=2.1, rc=1))
    assert s.check() is None
    s._launcher_line(_event("started", 8))  # its ClientApp
    assert s.check() is None and s.inflight.count() == 1
    # and the exit of a ClientApp whose reply is still going out is not a hang either
    s._supernode_line(SENDING)
    s._launcher_line(_event("exited", 8, seconds=2.0, rc=1))
    assert s.check() is None


def test_a_message_pulled_while_the_launcher_preloads_is_timed_from_when_the_launcher_is_ready(monkeypatch):
    """CI, 2026-12-07: a restarted launcher took 12 s to preload on a loaded machine; the SuperNode pulled the run's
    first message meanwhile and the watchdog, timing it from its ``Receiving:`` line, restarted a healthy hospital
    at the 8 s bound. Its clock starts when the launcher can serve it; a launcher that never gets ready is still
    caught, after its grace."""
    s = _watchdog(monkeypatch)
    s.message_timeout = 8.0
    s.inflight.launcher_starting()  # what start() does
    s._supernode_line(RECEIVING)
    s.inflight.messages[-1].opened -= 20.0  # pulled 20 s ago, while the launcher preloads
    assert s.inflight.oldest_age() == 0.0 and s.check() is None
    s._launcher_line(json.dumps({"launcher": "ready", "time": time.time(), "preload_seconds": 12.4, "pid": 4242}))
    assert s.inflight.oldest_age() < 1.0 and s.check() is None
    s.inflight.serving_since -= 9.0  # ready 9 s ago and still no reply: a hang
    assert "in flight for 9 s (bound 8 s)" in (s.check() or "")
    # a launcher that never reports ready: its grace is the message's head start
    t = _watchdog(monkeypatch)
    t.message_timeout = 8.0
    t.inflight.launcher_starting()
    t._supernode_line(RECEIVING)
    t.inflight.messages[-1].opened -= sv.LAUNCHER_READY_GRACE_SECONDS + 10.0  # pulled as the launcher started
    t.inflight.serving_since -= sv.LAUNCHER_READY_GRACE_SECONDS + 10.0
    assert "in flight for 10 s (bound 8 s)" in (t.check() or "")


def test_a_clientapp_that_dies_before_reading_its_message_restarts_the_supernode(monkeypatch):
    s = _watchdog(monkeypatch)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 3))
    s._launcher_line(_event("exited", 3, seconds=0.01, rc=-9))
    assert "(task 3) ended with signal 9" in (s.check() or "")


def test_a_reply_stuck_in_sending_restarts_the_supernode(monkeypatch):
    s = _watchdog(monkeypatch, send_timeout=0.2)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 7))
    s._supernode_line(SENDING)
    assert s.check() is None
    time.sleep(0.25)
    assert (s.check() or "").startswith("a reply has been in Sending: for 0 s (bound 0.2 s)")
    s._supernode_line(SENT)
    assert s.check() is None


def test_a_task_started_before_its_message_line_was_read_is_still_matched(monkeypatch):
    s = _watchdog(monkeypatch)
    s._launcher_line(_event("started", 11))  # the launcher's pipe read first
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("exited", 11, seconds=1.0, rc=0))
    assert "(task 11)" in (s.check() or "")


def test_a_stopped_runs_task_started_after_its_message_was_dropped_takes_no_later_message(monkeypatch):
    """Seen in the suite on 2026-12-07 (test_deploy's stopped-and-resumed run): the stopped run's evaluate message is
    dropped by the SuperNode ("Ignoring message"), a ClientApp is started for its task all the same, and the resumed
    run's query arrives 4 s later. Matched by order alone, the query took the dropped message's task, the query's own
    task then took the train message after it, and the query ClientApp's exit (its reply sent) restarted a working
    SuperNode in the middle of a round. Matched by run, each task keeps its own message."""
    s = _watchdog(monkeypatch)
    run = "\x1b[92mINFO \x1b[0m:      [RUN {}]"
    s._supernode_line(run.format(6019))
    s._supernode_line(RECEIVING.replace("train", "evaluate"))
    s._supernode_line("\x1b[92mINFO \x1b[0m:      Run ID 6019 is not in `RUNNING` status. Ignoring message 220f.")
    s._launcher_line(_event("started", 1338, run_id=6019, n=19))  # the stopped run's ClientApp: it never exits
    s._supernode_line(run.format(1679))
    s._supernode_line(RECEIVING.replace("train", "query"))
    s._launcher_line(_event("started", 2870, run_id=1679, n=20))
    s._launcher_line(_event("exited", 2870, seconds=2.2, rc=0))
    s._supernode_line(run.format(1679))
    s._supernode_line(SENDING.replace("train", "query"))
    s._supernode_line(SENT)
    s._supernode_line(run.format(1679))
    s._supernode_line(RECEIVING)  # the resumed run's train message
    s._launcher_line(_event("started", 1531, run_id=1679, n=21))
    assert s.check() is None, "a working SuperNode restarted"
    assert [m.task_id for m in s.inflight.messages] == [1531]
    # and a task of that run whose ClientApp exits without a reply is still a hang
    s._launcher_line(_event("exited", 1531, seconds=1.0, rc=0))
    assert "(task 1531)" in (s.check() or "")


_FAKE_SUPERNODE = """
import sys, time
print("SuperNode ID: 5", flush=True)
time.sleep(0.5)
print("INFO :      Receiving: train message (ID: 5f0c)", flush=True)
print("INFO :      Received successfully", flush=True)
time.sleep(600)  # waits for a reply that never comes, as Flower's _push_messages does
"""

_FAKE_LAUNCHER = """
import json, os, sys, time
print(json.dumps({"launcher": "ready"}), flush=True)
sys.stdin.readline()  # the supervisor: the message was received
generation = os.environ.get("HOSPITRUST_LAUNCHER_GENERATION")
print(json.dumps({"launcher": "started", "pid": 99, "task_id": 40 + int(generation), "run_id": 1, "n": 1}), flush=True)
if generation == "0":  # its ClientApp: token refused, exits 0 without a reply
    print(json.dumps({"launcher": "exited", "pid": 99, "task_id": 40, "seconds": 0.2, "rc": 0}), flush=True)
time.sleep(600)
"""


def test_the_supervisor_restarts_a_supernode_left_waiting_by_a_clientapp_that_exited(tmp_path):
    """Stand-in processes: the SuperNode logs a message received, the launcher's ClientApp for it exits 0 with no
    reply; the supervisor restarts both (once: the second ClientApp is still working)."""
    marker = f"h47-{uuid.uuid4().hex}"
    script = tmp_path / "supervise.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from hospitrust.supervision import supervisor as sv
        s = sv.Supervisor({[sys.executable, "-c", _FAKE_SUPERNODE, marker]!r}, "127.0.0.1:1", message_timeout=600.0,
                          env=dict(__import__("os").environ), out=sv.console_and_file({str(tmp_path / "sup.log")!r}),
                          launcher_cmd={[sys.executable, "-c", _FAKE_LAUNCHER, marker]!r})
        sys.exit(s.run(poll=0.2))
    """))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    log = tmp_path / "sup.log"
    try:
        started = time.monotonic()
        _wait(lambda: log.is_file() and "hospitrust watchdog: restarting" in log.read_text(), 30, "the watchdog's restart")
        assert time.monotonic() - started < 15
        _wait(lambda: '"task_id": 41' in log.read_text(), 30, "the restarted launcher's task")
        time.sleep(sv.DIED_GRACE_SECONDS + 1)
        text = log.read_text()
        assert text.count("hospitrust watchdog: restarting") == 1, text
        assert ("restarting the SuperNode and its launcher: ClientApp process 99 (task 40) ended with exit code 0 after "
                "0.2 s and its message is still open") in text
    finally:
        proc.terminate()
        proc.wait(30)
    _wait(lambda: not _with_marker(marker), 15, "nothing left after the supervisor stopped")


def test_a_bundle_is_installed_all_or_nothing(tmp_path):
    """Flower copies a bundle into $FLWR_HOME/apps/NAME file by file and reuses that folder whenever it exists: a
    ClientApp killed while installing (a watchdog restart) left a folder without pyproject.toml, and every later
    message of that bundle failed with LoadClientAppError (seen on the test federation)."""
    from hospitrust.supervision.launcher import atomic_install

    def flower_install(fab, install_dir, skip_prompt):  # what validate_and_install does, file by file
        target = Path(install_dir) / "apps" / "hospitrust.hospitrust.0.1.0.abcdef01"
        target.mkdir(parents=True, exist_ok=True)
        (target / "README.md").write_text("x")
        if fab == b"killed":
            raise SystemExit(143)  # killed before pyproject.toml was copied
        (target / "pyproject.toml").write_text("[project]\n")
        return target

    home = tmp_path / "flwr"
    broken = home / "apps" / "hospitrust.hospitrust.0.1.0.abcdef01"
    broken.mkdir(parents=True)  # what a kill left before this change
    (broken / "README.md").write_text("x")
    install = atomic_install(flower_install)
    try:
        install(b"killed", home, True)
    except SystemExit:
        pass
    assert not (broken / "pyproject.toml").exists() and sorted(p.name for p in (home / "apps").iterdir()) == [broken.name]
    assert install(b"ok", home, True) == broken and (broken / "pyproject.toml").is_file()
    assert sorted(p.name for p in (home / "apps").iterdir()) == [broken.name]  # no staging folder left
    assert install(b"ok", home, True) == broken  # installed already: kept


def test_a_task_handed_out_twice_is_one_message(monkeypatch):
    """Seen on the test federation: a ClientApp paused before it started its task; Flower handed the task out again
    after 30 s, the second ClientApp replied and exited 0, and the next message arrived. Before, the second `started`
    of the same task was kept for the next message, whose task it was taken to be: the exit restarted the SuperNode
    and that message was lost."""
    s = _watchdog(monkeypatch)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 17, n=2))  # paused before it pulled its message
    s._launcher_line(_event("started", 17, n=3))  # the same task, handed out again
    s._launcher_line(_event("exited", 17, seconds=3.1, rc=0))  # replied: its reply reaches the SuperNode next
    s._supernode_line(SENDING)
    s._supernode_line(SENT)
    s._supernode_line(RECEIVING.replace("train", "evaluate"))
    s._launcher_line(_event("started", 18, n=4))
    assert s.check() is None
    assert [m.task_id for m in s.inflight.messages] == [18]
    s._launcher_line(_event("exited", 17, seconds=70.0, rc=0))  # the paused one, resumed: its token refused
    assert s.check() is None


def test_the_first_clientapp_of_a_task_handed_out_twice_exiting_is_not_a_hang_while_the_second_works(monkeypatch):
    s = _watchdog(monkeypatch)
    s._supernode_line(RECEIVING)
    s._launcher_line(_event("started", 17, n=2))
    s._launcher_line(_event("started", 17, n=3))
    s._launcher_line(_event("exited", 17, seconds=70.0, rc=0))  # the first, resumed: its token refused
    assert s.check() is None  # the second still works on the message
    s._launcher_line(_event("exited", 17, seconds=9.0, rc=0))  # the second, and no reply came
    assert "(task 17) ended with exit code 0 after 9.0 s and its message is still open" in (s.check() or "")


def test_a_supernode_whose_main_loop_raised_exits_and_is_restarted_where_flower_alone_would_linger(tmp_path):
    """Issue 63: an error on a pull (an HTTP 500 from a SuperLink whose store was locked) ends Flower 1.42's SuperNode
    loop, and its Runtime API thread keeps the process alive and offline. Real flower-superlink and flower-supernode
    on 127.0.0.1, the pull's error injected (HOSPITRUST_SUPERNODE_FAULT, once): Flower's script run plainly lingers
    (the control); under the supervisor it exits with MAIN_LOOP_CRASHED and is restarted, and connects again."""
    from hospitrust.supervision import supernode_main

    home = tmp_path / "flwr"
    port = flwr.free_port()
    superlink = flwr.start("flower-superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                                                "--isolation", "process", "--disable-runtime-dependency-installation"],
                           env=flwr.flower_env(home), cwd=tmp_path, log_file=tmp_path / "superlink.log")
    try:
        flwr.wait_healthy(f"127.0.0.1:{port}", proc=superlink, timeout=120)

        def supernode(runtime_port: int) -> list[str]:
            return ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}", "--isolation", "process",
                    "--port", str(runtime_port)]

        env = {**flwr.flower_env(home), "PYTHONPATH": str(REPO)}
        # the control: Flower's own script with the same fault, without supernode_main's exit
        runner = ("import runpy, sys; from hospitrust.supervision.supernode_main import _inject_fault; "
                  "_inject_fault(sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")
        plain_cmd = supernode_main.command(supernode(flwr.free_port()))[3:]  # Flower's script and its arguments
        control_log = tmp_path / "control.log"
        with control_log.open("w") as sink:
            control = subprocess.Popen([sys.executable, "-c", runner, f"raise-on-pull@1:{tmp_path / 'control.fault'}",
                                        *plain_cmd], env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait(lambda: "HOSPITRUST_SUPERNODE_FAULT: pull 1 failed" in control_log.read_text() or control.poll() is not None,
                  60, "the control's first pull fails")
            time.sleep(3)
            # its main loop is over (Flower logged the error and deactivated the node), and the process stays: offline,
            # yet alive to whoever watches it
            assert control.poll() is None, control_log.read_text()
        finally:
            flwr.stop_tree(control.pid, timeout=10)

        marker = f"h63-{uuid.uuid4().hex}"
        script = tmp_path / "supervise.py"
        script.write_text(textwrap.dedent(f"""
            import os, sys
            from hospitrust.supervision import supervisor as sv
            sv.RESTART_BACKOFF = (0.5, 1.0)
            s = sv.Supervisor({supernode(flwr.free_port())!r}, "127.0.0.1:1", message_timeout=600.0, env=dict(os.environ),
                              out=sv.console_and_file({str(tmp_path / "sup.log")!r}),
                              launcher_cmd={_stand_in(marker, "launcher")!r})
            sys.exit(s.run(poll=0.2))
        """))
        fault = tmp_path / "supervised.fault"
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                env={**env, supernode_main.FAULT_ENV: f"raise-on-pull@2:{fault}"})
        log = tmp_path / "sup.log"
        try:
            _wait(lambda: log.is_file() and "main loop stopped: restarting it with the same key in 0.5 s" in log.read_text(),
                  60, "the supervisor's restart of the crashed SuperNode")
            text = log.read_text()
            assert fault.exists() and f"exiting with {supernode_main.MAIN_LOOP_CRASHED}" in text, text
            def connected() -> int:  # Flower's own lines (the stand-in launcher says it too)
                return sum(sv.ACTIVATED in line and "(launcher)" not in line for line in log.read_text().splitlines())

            _wait(lambda: connected() >= 2, 60, "the restarted SuperNode connects again")
            assert proc.poll() is None  # the supervisor stayed; its SuperNode is back
        finally:
            proc.terminate()
            proc.wait(30)
        _wait(lambda: not _with_marker(marker), 15, "nothing left after the supervisor stopped")
    finally:
        superlink.stop(timeout=10)


def test_the_superlinks_store_waits_the_busy_timeout_it_is_given_and_keeps_flowers_other_pragmas(tmp_path):
    """Flower opens its SQLite store with a 5 s busy timeout (docs/experiments/2026-12-06-many-hospitals.md: "database
    is locked" under load); run under superlink_main, every connection of Flower's own store waits the given time."""
    from hospitrust.supervision import superlink_main

    probe = (
        "import sys\n"
        "from sqlalchemy import text\n"
        "from hospitrust.supervision.superlink_main import with_busy_timeout\n"
        "if sys.argv[2] != 'flower':\n"
        "    with_busy_timeout(int(sys.argv[2]))\n"
        "from flwr.supercore.object_store.sql_object_store import SqlObjectStore\n"
        "store = SqlObjectStore(sys.argv[1]); store.initialize()\n"
        "with store.session() as s:\n"
        "    print(s.execute(text('PRAGMA busy_timeout')).scalar(), s.execute(text('PRAGMA journal_mode')).scalar())\n")
    out = {}
    for given in ("flower", "45000"):  # Flower's own, then the one hospitrust gives; a fresh process each
        res = subprocess.run([sys.executable, "-c", probe, str(tmp_path / f"{given}.db"), given], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        out[given] = res.stdout.split()
    assert out == {"flower": ["5000", "wal"], "45000": ["45000", "wal"]}
    cmd = superlink_main.command(["flower-superlink", "--database", "x.db"], busy_timeout_ms=30000)
    assert cmd[:4] == [sys.executable, "-m", "hospitrust.supervision.superlink_main", "30000"]
    assert cmd[4].endswith("flower-superlink") and cmd[5:] == ["--database", "x.db"]
    with pytest.raises(ValueError, match="whole number of milliseconds >= 0, got -1"):
        superlink_main.with_busy_timeout(-1)
    res = subprocess.run([sys.executable, "-m", "hospitrust.supervision.superlink_main", "flower-superlink"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage: python -m hospitrust.supervision.superlink_main MILLISECONDS" in res.stderr

"""``hospitrust deploy supernode``'s supervisor: the SuperNode, its warm ClientApp launcher, and a
watchdog that restarts the SuperNode when a message would otherwise hang.

Flower 1.42's SuperNode handles one message at a time and waits for its ClientApp's reply; a
ClientApp that dies before it reads its message (killed, out of memory, a crash at start) never
replies, and the SuperNode waits forever: the hospital drops out of every later round. The
supervisor watches both ends:

- the SuperNode's log: a ``Receiving:`` line opens a message, a ``Sent successfully`` (or a
  dropped-message line) closes it;
- the launcher's events (``hospitrust.supervision.launcher``): which task each ClientApp runs, and
  when it exits (with any exit code).

It restarts the SuperNode (same key, so the same node id; the SuperLink sees it reconnect) and
the launcher when a ClientApp exited and its task's message is still open without a reply a few
seconds later (it died before replying, or its reply was refused: after a SuperLink crash, or
a ClientApp paused past Flower's 60 s task heartbeat, Flower refuses the task's token and the
ClientApp exits 0 without a reply), when a reply stays in ``Sending:`` longer than
``send_timeout``, or when a message has been open longer than ``message_timeout``. A ClientApp
that exits after its reply reached the SuperNode is not a hang, whatever message is open by then.
The message the SuperNode was working on is lost with it: the round records the hospital as
missing and the run goes on; the restarted SuperNode takes the next message. Every restart is
logged with its reason.

No orphans: both processes get the parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so a
supervisor killed with SIGKILL takes them with it (Flower's SuperNode leaves gracefully on SIGTERM,
and the launcher stops its ClientApps). A ``flower-supernode`` killed by a signal (SIGKILL, the OOM
killer) is restarted with the same key after a backoff (``RESTART_BACKOFF``), and so is one whose main loop raised
(an HTTP 500 on a pull: Flower 1.42 would leave that process alive and offline; it runs under
:mod:`hospitrust.supervision.supernode_main`, which makes it exit); one that exits by itself (a refused key, a bad
certificate, its retries spent) is not restarted in a loop.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hospitrust.ops import flwr
from hospitrust.supervision import supernode_main

#: What a SuperNode logs once it is done with a message it pulled (sent, or dropped).
MESSAGE_DONE = ("Sent successfully", "Ignoring reply message", "Ignoring message", "Failed to send message",
                "Failed to receive message", "The message will not be processed")
RECEIVING = "Receiving:"
SENDING = "Sending:"  # the ClientApp's reply is at the SuperNode, which pushes it to the SuperLink
RECEIVED = "Received successfully"  # the message's contents are at the SuperNode: the launcher may ask for it
DIED_GRACE_SECONDS = 3.0  # after a ClientApp exited: time for the SuperNode to log ("Sending:") a reply it did get
#: seconds a reply may stay in ``Sending:`` before the SuperNode is restarted (it waits for the reply's objects
#: forever once they are lost; a small model's reply goes out in well under a second)
SEND_TIMEOUT_SECONDS = 30.0
#: seconds a freshly started launcher has to preload (torch, the task) before the messages the SuperNode pulled
#: meanwhile start their clock: they wait for the launcher, not in a ClientApp (a loaded machine takes 12 s or more)
LAUNCHER_READY_GRACE_SECONDS = 120.0
#: flower-supernode's line when the SuperLink refuses it: an unregistered key, or (right after a crash
#: or a kill) its previous session still counting as online until its heartbeats lapse.
ACTIVATION_REFUSED = "Failed to activate SuperNode"
ACTIVATION_RETRY_SECONDS = 90.0
ACTIVATED = "SuperNode ID:"  # flower-supernode's line once the SuperLink accepted it
#: seconds before restarting a flower-supernode that a signal killed: doubling from the first, up to the last
RESTART_BACKOFF = (2.0, 60.0)
#: a SuperNode up this long since its last restart starts its backoff afresh
BACKOFF_RESET_SECONDS = 300.0
_PR_SET_PDEATHSIG = 1
#: ANSI colour codes (Flower's console handler always colours the level names)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without ANSI colour codes (what hospitrust writes to files)."""
    return ANSI.sub("", text)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child before exec (a ``preexec_fn``): receive ``sig`` when the parent dies (Linux).

    Flower's SuperNode handles SIGTERM by leaving the SuperLink gracefully; the launcher by stopping
    its ClientApps. On a system without prctl this does nothing (the supervisor's own stop still runs).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def console_and_file(log_file: str | os.PathLike | None) -> Callable[[str], None]:
    """A line sink: stdout (without colour codes unless it is a terminal) and, when given, ``log_file``
    (appended, line-buffered, never with colour codes).
    """
    keep_colour = sys.stdout.isatty()
    fh = open(log_file, "a", buffering=1, encoding="utf-8") if log_file else None  # noqa: SIM115 - lives as long as the supervisor
    lock = threading.Lock()

    def out(line: str) -> None:
        text = line if keep_colour else plain(line)
        with lock:
            print(text, flush=True)
            if fh is not None:
                fh.write(plain(line) + "\n")

    return out


def port_in_use(host: str, port: int) -> str | None:
    """None when ``host:port`` can be listened on; else what holds it, with its owner's pid and command
    (psutil), for a message instead of Flower's "[Errno 98] address already in use".
    """
    import errno
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a server
        try:
            s.bind((host, port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"{host}:{port} cannot be bound: {exc.strerror}"
    import psutil

    owners = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        conns = []
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline())
            except psutil.Error:
                cmd = "?"
            owners.append(f"pid {c.pid} ({cmd[:240]})")
    who = ", ".join(sorted(set(owners))) or "a process this user cannot see"
    return f"port {port} on {host} is already in use by {who}"


def _flag(cmd: Sequence[str], flag: str) -> str | None:
    cmd = list(cmd)
    return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None


def deactivate_session(supernode_cmd: Sequence[str], node_id: int) -> str:
    """End a killed SuperNode's session at the SuperLink, as the SuperNode itself does when it stops: the
    Fleet API's DeactivateNode, signed with the SuperNode's own key (``--auth-supernode-private-key``).

    Without it the SuperLink counts the node as online until two heartbeat intervals (60 s in Flower 1.42)
    pass since its last heartbeat, and refuses the restarted SuperNode until then. Returns what happened.
    """
    superlink, ca, key = (_flag(supernode_cmd, f) for f in ("--superlink", "--root-certificates",
                                                            "--auth-supernode-private-key"))
    if not (superlink and key):
        return "not deactivated: no --superlink or --auth-supernode-private-key in the command"
    try:
        from pathlib import Path

        from cryptography.hazmat.primitives.serialization import load_ssh_private_key
        from flwr.proto.fleet_pb2 import DeactivateNodeRequest  # pylint: disable=E0611
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supernode.fleet_http_client import FleetHttpClient
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

        private = load_ssh_private_key(Path(key).read_bytes(), None)
        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                                   NodeAuthHttpInterceptor(private, private.public_key())]  # type: ignore[arg-type]
        insecure = "--insecure" in supernode_cmd
        with FleetHttpClient.from_server_address(superlink, insecure, None if insecure else ca,
                                                 interceptors=interceptors) as client:
            client.DeactivateNode(DeactivateNodeRequest(node_id=node_id))
        return f"its session (node {node_id}) deactivated at the SuperLink"
    except Exception as exc:  # noqa: BLE001 - the restart goes on; the SuperLink then waits for the heartbeats to lapse
        return f"its session (node {node_id}) not deactivated ({type(exc).__name__}: {str(exc)[:200]}): the SuperLink " \
               f"may refuse the restart until the old session's heartbeats lapse"


def node_id_file(env: dict[str, str]) -> Path:
    """Where the supervisor remembers each key's node id: ``$FLWR_HOME/hospitrust/node-ids.json``."""
    home = env.get("FLWR_HOME") or os.environ.get("FLWR_HOME") or str(Path.home() / ".flwr")
    return Path(home).expanduser() / "hospitrust" / "node-ids.json"


def remembered_node_id(env: dict[str, str], key: str | None) -> int | None:
    """The node id the SuperLink last gave the SuperNode with this private key, if remembered."""
    if not key:
        return None
    try:
        value = json.loads(node_id_file(env).read_text()).get(str(Path(key).expanduser().resolve()))
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def remember_node_id(env: dict[str, str], key: str | None, node_id: int) -> None:
    if not key:
        return
    path = node_id_file(env)
    try:
        known = json.loads(path.read_text()) if path.is_file() else {}
        known = known if isinstance(known, dict) else {}
        known[str(Path(key).expanduser().resolve())] = node_id
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # only a faster restart is lost


def restart_delay(attempt: int) -> float:
    """Seconds before the ``attempt``-th consecutive restart (1-based) of a killed SuperNode."""
    first, cap = RESTART_BACKOFF
    return float(min(cap, first * 2 ** max(0, attempt - 1)))


@dataclass
class Message:
    """One message the SuperNode pulled: when its ``Receiving:`` line came, the launcher's task for it (from
    the launcher's ``started`` event), and when its reply began to go out (``Sending:``).
    """

    opened: float
    task_id: int | None = None
    sending_since: float | None = None
    run_id: int | None = None  # from the SuperNode's ``[RUN id]`` line before its ``Receiving:``


_RUN_LINE = re.compile(r"\[RUN (\d+)\]")  # the SuperNode's line before each message it pulls


def _same_run(a: int | None, b: int | None) -> bool:
    """Whether a message and a task can belong together: the same run, or a run not known on one side."""
    return a is None or b is None or a == b


@dataclass
class Inflight:
    """Messages the SuperNode has pulled and not yet answered, from its log and the launcher's events.

    Flower 1.42's SuperNode takes one message at a time: ``Receiving:`` opens it, the launcher's ``started``
    event names its task, ``Sending:`` says its reply reached the SuperNode, and a ``Sent successfully`` (or
    a dropped-message line) closes it.
    """

    messages: list[Message] = field(default_factory=list)
    #: (when, task id, run id) of tasks started before their message's line was read: the next ``Receiving:`` of
    #: the same run within ``UNCLAIMED_SECONDS`` is theirs
    unclaimed: list[tuple[float, int, int | None]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # every task id started since the SuperNode (re)started
    running: dict[int, int] = field(default_factory=dict)  # task id -> its ClientApps still running
    run_id: int | None = None  # the run of the SuperNode's latest ``[RUN id]`` line
    #: when the launcher could first serve a message (its ``ready`` event): a message pulled before waits for it,
    #: and its age counts from then
    serving_since: float = float("-inf")
    lock: threading.Lock = field(default_factory=threading.Lock)

    UNCLAIMED_SECONDS = 5.0

    def line(self, text: str) -> None:
        with self.lock:
            if (run := _RUN_LINE.search(text)) is not None:
                self.run_id = int(run.group(1))
            elif RECEIVING in text:
                now = time.monotonic()
                self.unclaimed = [u for u in self.unclaimed if now - u[0] < self.UNCLAIMED_SECONDS]
                message = Message(now, run_id=self.run_id)
                # a task of another run is not this message's: a stopped run's task can start after the SuperNode
                # dropped its message ("Ignoring message"), and would otherwise take the next run's message
                mine = next((u for u in self.unclaimed if _same_run(u[2], message.run_id)), None)
                if mine is not None:
                    self.unclaimed.remove(mine)
                    message.task_id = mine[1]
                self.messages.append(message)
            elif SENDING in text:
                waiting = [m for m in self.messages if m.sending_since is None]
                if waiting:
                    waiting[0].sending_since = time.monotonic()
            elif any(m in text for m in MESSAGE_DONE) and self.messages:
                self.messages.pop(0)

    def started(self, task_id: int, run_id: int | None = None) -> None:
        """The launcher started a ClientApp for ``task_id`` of run ``run_id``: the oldest open message of that run
        without a task is its.

        A task id seen before is not a new message: Flower hands a task out again when the ClientApp that claimed
        it did not start within its heartbeat (30 s: paused, or slow to start), so two ClientApps may run one task.
        """
        with self.lock:
            self.running[task_id] = self.running.get(task_id, 0) + 1
            if task_id in self.seen:
                return
            self.seen.add(task_id)
            for m in self.messages:
                if m.task_id is None and m.sending_since is None and _same_run(m.run_id, run_id):
                    m.task_id = task_id
                    return
            self.unclaimed.append((time.monotonic(), task_id, run_id))

    def exited(self, task_id: int) -> None:
        with self.lock:
            self.running[task_id] = max(0, self.running.get(task_id, 0) - 1)

    def awaiting_reply(self, task_id: int) -> Message | None:
        """The open message of ``task_id`` whose reply has not reached the SuperNode (no ``Sending:`` yet) and that
        no ClientApp works on any more.
        """
        with self.lock:
            if self.running.get(task_id, 0) > 0:
                return None
            return next((m for m in self.messages if m.task_id == task_id and m.sending_since is None), None)

    def oldest_age(self) -> float:
        """Seconds the oldest open message has waited since the launcher could serve it."""
        with self.lock:
            if not self.messages:
                return 0.0
            return max(0.0, time.monotonic() - max(self.messages[0].opened, self.serving_since))

    def launcher_starting(self) -> None:
        """A launcher starts: until it is ready (or its grace ends) no message's clock runs."""
        with self.lock:
            self.serving_since = time.monotonic() + LAUNCHER_READY_GRACE_SECONDS

    def launcher_ready(self) -> None:
        with self.lock:
            self.serving_since = min(self.serving_since, time.monotonic())

    def sending_age(self) -> float:
        """Seconds the oldest reply has been in ``Sending:`` (0 when none is)."""
        with self.lock:
            since = [m.sending_since for m in self.messages if m.sending_since is not None]
            return time.monotonic() - since[0] if since else 0.0

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def clear(self) -> None:
        with self.lock:
            self.messages.clear()
            self.unclaimed.clear()
            self.seen.clear()
            self.running.clear()


def _pump(stream, sink: Callable[[str], None]) -> None:
    for raw in iter(stream.readline, ""):
        sink(raw.rstrip("\n"))


class Supervisor:
    """Run the SuperNode (``--isolation process``) and the launcher; restart both when the watchdog fires.

    Parameters
    ----------
    supernode_cmd : Sequence[str]
        The ``flower-supernode`` command, with ``--isolation process``.
    runtime_api_address : str
        The SuperNode's Runtime API (``--host:--port``), where the launcher asks for tasks.
    message_timeout : float
        Seconds a message may stay open before the SuperNode is restarted.
    send_timeout : float
        Seconds a reply may stay in ``Sending:`` before the SuperNode is restarted.
    env : dict[str, str]
        Environment of both processes.
    out : Callable[[str], None]
        Where log lines go (the hospital's log: stdout by default, see :func:`console_and_file`).
    launcher_cmd : Sequence[str], optional
        The launcher's command (default: ``hospitrust.supervision.launcher`` on ``runtime_api_address``, with the
        SuperNode's ``--superexec-auth-secret-file`` where it has one).
    """

    def __init__(self, supernode_cmd: Sequence[str], runtime_api_address: str, *, message_timeout: float,
                 env: dict[str, str], out: Callable[[str], None] | None = None,
                 launcher_cmd: Sequence[str] | None = None, send_timeout: float = SEND_TIMEOUT_SECONDS) -> None:
        self.supernode_cmd, self.address, self.message_timeout = list(supernode_cmd), runtime_api_address, message_timeout
        self.send_timeout = send_timeout
        self.env = env
        self.out = out or console_and_file(None)
        self.inflight = Inflight()
        self.launcher_cmd = list(launcher_cmd) if launcher_cmd is not None else [
            sys.executable, "-m", "hospitrust.supervision.launcher", "--runtime-api-address", runtime_api_address,
            "--parent-pid", str(os.getpid()), "--gate-stdin"]
        secret = _flag(self.supernode_cmd, "--superexec-auth-secret-file")
        if secret and launcher_cmd is None:  # the SuperNode hands tasks out only with its secret: the launcher holds it
            self.launcher_cmd += ["--superexec-auth-secret-file", secret]
        self.supernode: subprocess.Popen | None = None
        self.launcher: subprocess.Popen | None = None
        self.exited: list[tuple[float, int, str]] = []  # (when, task id, how) ClientApps that exited, any exit code
        self.restarts: list[str] = []
        self.refused = False  # the SuperLink refused the current SuperNode's activation
        self.activated = False  # the current SuperNode got its node id
        self._stopping = False
        self.started_at = time.monotonic()
        self.killed_in_a_row = 0  # consecutive restarts of a killed SuperNode: its backoff
        # from the SuperNode's "SuperNode ID:" line; at start, what an earlier supervisor remembered for this key
        self.node_id: int | None = remembered_node_id(env, _flag(self.supernode_cmd, "--auth-supernode-private-key"))

    # ---- processes ---------------------------------------------------------------------
    def _popen(self, cmd: Sequence[str], sink: Callable[[str], None], stdin: bool = False) -> subprocess.Popen:
        # its own session (a Ctrl-C at the terminal reaches the supervisor, which stops both in order), and the
        # parent-death signal: the supervisor's SIGKILL must not leave a SuperNode online that nobody watches
        proc = subprocess.Popen(list(cmd), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
        threading.Thread(target=_pump, args=(proc.stdout, sink), daemon=True).start()
        return proc

    def _supernode_line(self, line: str) -> None:
        self.inflight.line(line)
        if ACTIVATION_REFUSED in line:
            self.refused = True
        elif ACTIVATED in line:
            self.activated = True
            if (match := re.search(rf"{ACTIVATED}\s*(\d+)", plain(line))) is not None:
                self.node_id = int(match.group(1))
                remember_node_id(self.env, _flag(self.supernode_cmd, "--auth-supernode-private-key"), self.node_id)
        if RECEIVED in line and self.launcher is not None and self.launcher.stdin is not None:
            try:  # the launcher's StdinGate: ask for the task now
                self.launcher.stdin.write("received\n")
                self.launcher.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass
        self.out(line)

    def _launcher_line(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and event.get("launcher") == "ready":
            self.inflight.launcher_ready()
        elif isinstance(event, dict) and event.get("launcher") == "started" and isinstance(event.get("task_id"), int):
            run_id = event.get("run_id")
            self.inflight.started(int(event["task_id"]), int(run_id) if isinstance(run_id, int) else None)
        elif isinstance(event, dict) and event.get("launcher") == "exited" and isinstance(event.get("task_id"), int):
            rc = int(event.get("rc", 0))
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            self.inflight.exited(int(event["task_id"]))
            self.exited.append((time.monotonic(), int(event["task_id"]),
                                f"ClientApp process {event.get('pid')} (task {event.get('task_id')}) ended with {how} "
                                f"after {event.get('seconds')} s"))
        self.out(line)

    def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless asked to stop meanwhile; True when asked to stop."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return self._stopping

    def start(self) -> None:
        """Start the SuperNode and the launcher."""
        self.started_at = time.monotonic()
        self.inflight.clear()
        self.inflight.launcher_starting()
        self.exited.clear()
        self.refused = self.activated = False
        # under supernode_main: a SuperNode whose main loop raised exits (MAIN_LOOP_CRASHED) instead of lingering offline
        self.supernode = self._popen(supernode_main.command(list(self.supernode_cmd)), self._supernode_line)
        env = self.env
        self.env = {**env, "HOSPITRUST_LAUNCHER_GENERATION": str(len(self.restarts))}
        try:
            self.launcher = self._popen(self.launcher_cmd, self._launcher_line, stdin=True)
        finally:
            self.env = env

    def stop(self) -> None:
        """Stop both, with everything they started."""
        for proc in (self.launcher, self.supernode):
            if proc is not None and proc.poll() is None:
                flwr.stop_tree(proc.pid, timeout=15)

    def restart(self, reason: str) -> None:
        """Stop both and start them again; logged."""
        self.out(f"hospitrust watchdog: restarting the SuperNode and its launcher: {reason}")
        self.restarts.append(reason)
        self.stop()
        self.start()

    # ---- the watchdog ------------------------------------------------------------------
    def check(self) -> str | None:
        """Why the SuperNode must be restarted now, or None.

        - A ClientApp exited (any exit code: Flower's ClientApp exits 0 when its task token was refused) and,
          ``DIED_GRACE_SECONDS`` later, the message of its task is still open without a reply at the SuperNode
          (no ``Sending:``): the SuperNode waits in ``_push_messages`` for a reply that will never come, and
          never pulls again. Matched by task id: a ClientApp that exits after its reply went out (a refused
          bundle exits 1 after replying with an error) is not a hang, whatever message is open by then.
        - A reply in ``Sending:`` longer than ``send_timeout``: the SuperNode waits for objects it lost.
        - A message open longer than ``message_timeout``, counted from when the launcher was ready to serve it.
        """
        now = time.monotonic()
        for when, task_id, why in list(self.exited):
            if now - when < DIED_GRACE_SECONDS:
                continue  # the SuperNode may still log the reply it got
            self.exited.remove((when, task_id, why))
            if self.inflight.awaiting_reply(task_id) is not None:
                return f"{why} and its message is still open: the SuperNode waits for a reply that will never come"
        if (sending := self.inflight.sending_age()) > self.send_timeout:
            return f"a reply has been in Sending: for {sending:.0f} s (bound {self.send_timeout:g} s)"
        age = self.inflight.oldest_age()
        if age > self.message_timeout:
            return f"a message has been in flight for {age:.0f} s (bound {self.message_timeout:g} s)"
        return None

    def run(self, poll: float = 1.0) -> int:
        """Supervise until stopped (SIGTERM / SIGINT) or the SuperNode exits by itself; its exit code."""
        def stop(signum, frame):
            self._stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.start()
        refused_since: float | None = None
        try:
            while not self._stopping:
                time.sleep(poll)
                assert self.supernode is not None and self.launcher is not None
                if (rc := self.supernode.poll()) is not None:
                    time.sleep(0.2)  # the last lines of its output
                    now = time.monotonic()
                    if self.refused and (refused_since is None or now - refused_since < ACTIVATION_RETRY_SECONDS):
                        first_refusal = refused_since is None
                        refused_since = refused_since if refused_since is not None else now
                        self.out("hospitrust deploy supernode: the SuperLink refused this SuperNode (an unregistered key, "
                                 "or its previous session still counts as online until its heartbeats lapse): retrying "
                                 f"for up to {ACTIVATION_RETRY_SECONDS - (now - refused_since):.0f} s more")
                        self.stop()
                        if first_refusal and self.node_id is not None:  # a session left by a killed supervisor, a reboot
                            self.out(f"hospitrust supervisor: ending this key's previous session: "
                                     f"{deactivate_session(self.supernode_cmd, self.node_id)}")
                            time.sleep(0.5)
                        else:
                            time.sleep(5)
                        self.start()
                        continue
                    if (rc < 0 or rc == supernode_main.MAIN_LOOP_CRASHED) and not self._stopping:
                        # killed by a signal (kill -9, the OOM killer), or its main loop raised: back, same key
                        if now - self.started_at > BACKOFF_RESET_SECONDS:
                            self.killed_in_a_row = 0
                        self.killed_in_a_row += 1
                        delay = restart_delay(self.killed_in_a_row)
                        what = f"was killed by signal {-rc}" if rc < 0 else "ended: its main loop stopped"
                        self.out(f"hospitrust supervisor: flower-supernode {what}: restarting it with "
                                 f"the same key in {delay:g} s (restart {self.killed_in_a_row} in a row)")
                        self.restarts.append(f"flower-supernode killed by signal {-rc}" if rc < 0
                                             else "flower-supernode's main loop stopped")
                        self.stop()
                        if self.node_id is not None:
                            self.out(f"hospitrust supervisor: {deactivate_session(self.supernode_cmd, self.node_id)}")
                        if self._sleep(delay):
                            break
                        self.start()
                        continue
                    # a SuperNode that gives up (refused key, bad certificate, retries spent) is not restarted in a loop
                    self.out(f"hospitrust deploy supernode: flower-supernode exited with {rc}")
                    return int(rc) or 1
                if self.activated:  # connected: a later refusal gets its own retry window
                    refused_since = None
                if self.launcher.poll() is not None:
                    time.sleep(0.5)  # stopping: the launcher may have got the same SIGTERM first
                    if self._stopping:
                        break
                    self.restart(f"the ClientApp launcher exited with {self.launcher.returncode}")
                    continue
                if (why := self.check()) is not None:
                    self.restart(why)
        finally:
            self.stop()
        return 0

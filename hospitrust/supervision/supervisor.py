"""``hospitrust deploy supernode``'s supervisor: the SuperNode, its warm ClientApp launcher, and a
watchdog that restarts the SuperNode when a message would otherwise hang.

Flower 1.42's SuperNode handles one message at a time and waits for its ClientApp's reply; a
ClientApp that dies before it reads its message (killed, out of memory, a crash at start) never
replies, and the SuperNode waits forever: the hospital drops out of every later round. The
supervisor watches both ends:

- the SuperNode's log: a ``Receiving:`` line opens a message, a ``Sent successfully`` (or a
  dropped-message line) closes it;
- the launcher's events (``hospitrust.supervision.launcher``): a child that exits with an error
  or a signal while a message is open.

It restarts the SuperNode (same key, so the same node id; the SuperLink sees it reconnect) and
the launcher when a child died with a message open, or when a message has been open longer than
``message_timeout``. The SuperLink delivers the unanswered message again to the restarted
SuperNode, so the hospital usually still answers within the round's reply timeout; otherwise the
round records it as missing and the run goes on. Every restart is logged with its reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hospitrust.ops import flwr

#: What a SuperNode logs once it is done with a message it pulled (sent, or dropped).
MESSAGE_DONE = ("Sent successfully", "Ignoring reply message", "Ignoring message", "Failed to send message",
                "Failed to receive message", "The message will not be processed")
RECEIVING = "Receiving:"
RECEIVED = "Received successfully"  # the message's contents are at the SuperNode: the launcher may ask for it
DIED_GRACE_SECONDS = 3.0  # after a ClientApp died: time for the SuperNode to log a reply it did send
#: flower-supernode's line when the SuperLink refuses it: an unregistered key, or (right after a crash
#: or a kill) its previous session still counting as online until its heartbeats lapse.
ACTIVATION_REFUSED = "Failed to activate SuperNode"
ACTIVATION_RETRY_SECONDS = 90.0
ACTIVATED = "SuperNode ID:"  # flower-supernode's line once the SuperLink accepted it  # how long a refused activation is retried before giving up


@dataclass
class Inflight:
    """Messages the SuperNode has pulled and not yet answered, from its log."""

    opened: list[float] = field(default_factory=list)  # when each open message was received
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, text: str) -> None:
        with self.lock:
            if RECEIVING in text:
                self.opened.append(time.monotonic())
            elif any(m in text for m in MESSAGE_DONE) and self.opened:
                self.opened.pop(0)

    def oldest_age(self) -> float:
        with self.lock:
            return time.monotonic() - self.opened[0] if self.opened else 0.0

    def count(self) -> int:
        with self.lock:
            return len(self.opened)

    def clear(self) -> None:
        with self.lock:
            self.opened.clear()


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
    env : dict[str, str]
        Environment of both processes.
    out : Callable[[str], None]
        Where log lines go (the hospital's log: stdout by default).
    """

    def __init__(self, supernode_cmd: Sequence[str], runtime_api_address: str, *, message_timeout: float,
                 env: dict[str, str], out: Callable[[str], None] | None = None) -> None:
        self.supernode_cmd, self.address, self.message_timeout = list(supernode_cmd), runtime_api_address, message_timeout
        self.env = env
        self.out = out or (lambda line: print(line, flush=True))
        self.inflight = Inflight()
        self.supernode: subprocess.Popen | None = None
        self.launcher: subprocess.Popen | None = None
        self.died: list[tuple[float, str]] = []  # (when, why) ClientApps that died
        self.restarts: list[str] = []
        self.refused = False  # the SuperLink refused the current SuperNode's activation
        self.activated = False  # the current SuperNode got its node id
        self._stopping = False

    # ---- processes ---------------------------------------------------------------------
    def _popen(self, cmd: Sequence[str], sink: Callable[[str], None], stdin: bool = False) -> subprocess.Popen:
        proc = subprocess.Popen(list(cmd), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        threading.Thread(target=_pump, args=(proc.stdout, sink), daemon=True).start()
        return proc

    def _supernode_line(self, line: str) -> None:
        self.inflight.line(line)
        if ACTIVATION_REFUSED in line:
            self.refused = True
        elif ACTIVATED in line:
            self.activated = True
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
        if isinstance(event, dict) and event.get("launcher") == "exited" and event.get("rc", 0) != 0:
            rc = int(event["rc"])
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            self.died.append((time.monotonic(), f"ClientApp process {event.get('pid')} (task {event.get('task_id')}) "
                                                 f"ended with {how} after {event.get('seconds')} s"))
        self.out(line)

    def start(self) -> None:
        """Start the SuperNode and the launcher."""
        self.inflight.clear()
        self.died.clear()
        self.refused = self.activated = False
        self.supernode = self._popen(self.supernode_cmd, self._supernode_line)
        launcher = [sys.executable, "-m", "hospitrust.supervision.launcher", "--runtime-api-address", self.address,
                    "--parent-pid", str(os.getpid()), "--gate-stdin"]
        env = self.env
        self.env = {**env, "HOSPITRUST_LAUNCHER_GENERATION": str(len(self.restarts))}
        try:
            self.launcher = self._popen(launcher, self._launcher_line, stdin=True)
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
        """Why the SuperNode must be restarted now, or None."""
        now = time.monotonic()
        open_messages = self.inflight.count()
        for when, why in list(self.died):
            if now - when < DIED_GRACE_SECONDS:
                continue  # the SuperNode may still log the reply it sent
            self.died.remove((when, why))
            if open_messages:
                return f"{why} while the SuperNode waited for its reply"
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
                        refused_since = refused_since if refused_since is not None else now
                        self.out("hospitrust deploy supernode: the SuperLink refused this SuperNode (an unregistered key, "
                                 "or its previous session still counts as online until its heartbeats lapse): retrying "
                                 f"for up to {ACTIVATION_RETRY_SECONDS - (now - refused_since):.0f} s more")
                        self.stop()
                        time.sleep(5)
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

"""Everything a ClientApp starts dies with it: the *keeper* between the warm launcher and each ClientApp.

The launcher forks one keeper per message (:func:`keep`); the keeper forks the ClientApp (the launcher's
``_child``) and supervises it. Without this, a ClientApp's process could outlive the message, its
``max-wall-seconds`` and a revocation: a bundle that forked a detached grandchild (double fork and ``setsid``,
SIGHUP and SIGTERM ignored) left it reparented to PID 1, alive at 110 s against a 20 s limit (issue 61,
finding 3). No cgroup and no systemd is needed (the machines here and in CI have cgroup v1 and no systemd as
PID 1); Linux's child subreaper and ``/proc`` do it:

- the keeper is a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process of the ClientApp's tree whose
  parent exits is reparented to the keeper, never to PID 1, however it detached itself (``setsid``, double
  fork), so the tree stays the keeper's descendants. The launcher is a subreaper too: what a keeper could not
  end (the keeper itself killed) comes back to the launcher, which kills it (``launcher.sweep_strays``);
- the ClientApp starts its own session and process group (``setsid``; its pid is their id);
- when the ClientApp exits, when the launcher asks (SIGTERM: ``max-wall-seconds``, the launcher stopping) or the
  launcher dies (the parent-death signal), the keeper kills (SIGKILL) every process of the tree: its descendants
  (``/proc/*/stat`` parent links; ``/proc/PID/task/*/children`` is not in every kernel, this machine's included),
  and every process of the ClientApp's session or process group, again until two scans in a row find none, then
  reaps them. The ClientApp itself is reaped last, so its pid (the session's and group's id) cannot be reused
  meanwhile;
- ``max-cpu-seconds`` counts the tree: every process of it still has RLIMIT_CPU (the kernel's, per process),
  and the keeper sums the CPU time of the whole tree (what it reaped, ``RUSAGE_CHILDREN``, which includes what
  those processes reaped; plus each live descendant's own and reaped children's time from ``/proc/PID/stat``)
  at least every ``CPU_POLL_SECONDS`` and kills the tree past the limit. The launcher's ``wait4`` of the keeper
  then reports the tree's CPU (the keeper's own bookkeeping included: well under a percent);
- the keeper relays the ClientApp's exit status as its own (an exit code, or the same signal), so the launcher
  and its audit entry see the ClientApp's; a tree it ended for a limit or on request ends with SIGKILL.

What is *not* counted or caught: a process started through another service (cron, ``at``, ``systemd-run``, a
remote shell, a container engine) is not a descendant; a descendant hidden from ``/proc`` (``hidepid``) is still
killed with its group or when its parent dies, but its live CPU time is not summed until it is reaped; the CPU
check runs every ``CPU_POLL_SECONDS`` (more seldom on a machine with very many processes), so the tree can pass
the limit by that long times the number of cores; memory (``max-memory-mb``) stays a per-process limit.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 1, 4, 36, 37
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # the keeper's "end the tree now" (blocked by the launcher around a fork)
POLL_SECONDS = 0.05  # the keeper's look at its ClientApp (exited?) and at its stop request
CPU_POLL_SECONDS = 0.5  # the tree's CPU time summed at least this often (with a max-cpu-seconds)
CPU_CHECK_SHARE = 0.02  # ... and more seldom when one sum costs more CPU than this share of the interval
#: the keeper's own max-wall-seconds: this long after the launcher's, should the launcher not have asked by then
WALL_GRACE_SECONDS = 1.0
END_TIMEOUT_SECONDS = 10.0  # the most a keeper spends ending a tree (a process stuck in the kernel cannot die at once)
TICKS = os.sysconf("SC_CLK_TCK")


def _prctl(option: int, value: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")
    return 0


def become_subreaper() -> None:
    """Make this process a child subreaper (Linux 3.4+): orphans of its descendants are reparented to it."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if not is_subreaper():
        raise OSError("prctl(PR_SET_CHILD_SUBREAPER) did not take")


def is_subreaper() -> bool:
    value = ctypes.c_int(0)
    try:
        _prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(value))
    except OSError:
        return False
    return bool(value.value)


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc/PID/stat`` shows it (times in clock ticks)."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    ticks: int  # its own user and system time
    child_ticks: int  # its reaped children's
    start: int  # its start time (ticks since boot): a pid and its start name one process, a pid alone may be reused

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def stat(pid: int) -> Proc | None:
    """The process ``pid`` (None: gone, or not readable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces and parentheses
        return Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[11]) + int(fields[12]),
                    int(fields[13]) + int(fields[14]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def processes() -> dict[int, Proc]:
    """Every process this one can see in ``/proc``."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := stat(int(name))) is not None:
            out[proc.pid] = proc
    return out


def descendants(root: int, procs: dict[int, Proc]) -> set[int]:
    """The pids of ``root``'s descendants in ``procs`` (by their parent links; ``root`` not included)."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out and child != root:
                out.add(child)
                todo.append(child)
    return out


def members(root: int, group: int | None, procs: dict[int, Proc]) -> set[int]:
    """The tree of a keeper ``root`` whose ClientApp is ``group``: its descendants, and every process of the
    ClientApp's session or process group (``group`` stays taken as long as the ClientApp is not reaped).
    """
    grouped = {p.pid for p in procs.values() if group in (p.session, p.pgrp)} if group is not None and group > 1 else set()
    return (descendants(root, procs) | grouped) - {root}


def tree_cpu_seconds(root: int, clientapp: int, procs: dict[int, Proc] | None = None) -> tuple[float, float]:
    """(CPU seconds of ``root``'s whole tree, the ClientApp's own): what ``root`` reaped (which includes what they
    reaped) plus each live descendant's own and reaped children's time.
    """
    procs = processes() if procs is None else procs
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    ticks = sum(procs[pid].ticks + procs[pid].child_ticks for pid in descendants(root, procs))
    own = procs[clientapp].ticks / TICKS if clientapp in procs else 0.0
    return usage.ru_utime + usage.ru_stime + ticks / TICKS, own


def end_tree(root: int, clientapp: int | None, timeout: float = END_TIMEOUT_SECONDS) -> tuple[set[int], set[int]]:
    """Kill (SIGKILL) every process of ``root``'s tree (:func:`members`) and reap ``root``'s children, all but
    ``clientapp`` (left for the caller: until it is reaped, its pid, the session's and group's id, is not reused;
    None once it is),
    until two scans in a row find no live process of the tree and no other child to reap. Returns (the pids
    killed, the pids it could not kill: no permission, or still there after ``timeout``).
    """
    killed: set[int] = set()
    refused: set[int] = set()
    deadline = time.monotonic() + timeout
    clean = 0
    while True:
        procs = processes()
        live = {pid for pid in members(root, clientapp, procs) if procs[pid].alive}
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                refused.add(pid)
        if clientapp is not None and clientapp > 1:
            try:
                os.killpg(clientapp, signal.SIGKILL)  # the group, as the kernel knows it (also what /proc may hide)
            except OSError:
                pass
        others = [p.pid for p in procs.values() if p.ppid == root and p.pid != clientapp]
        for pid in others:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        clean = clean + 1 if not (live - refused) and not others else 0
        if clean >= 2:
            return killed, refused
        if time.monotonic() >= deadline:
            return killed, refused | live
        time.sleep(0.002 if live else 0.01)


def _reap_others(clientapp: int) -> bool:
    """Reap the keeper's children that ended, all but ``clientapp``; True once ``clientapp`` has ended (not reaped)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # no child at all (cannot be while the ClientApp is not reaped)
        if info is None:
            return False
        if info.si_pid == clientapp:
            return True
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def _die_like(status: int) -> NoReturn:
    """End this process as the ClientApp ended: its exit code, or its signal (no core file: the keeper's memory is
    the launcher's, dumpable off and RLIMIT_CORE 0).
    """
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    _die_by(-code)


def _die_by(sig: int) -> NoReturn:
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _prctl(PR_SET_DUMPABLE, 0)
    except (OSError, ValueError):
        pass
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL, SIGSTOP: not to be handled anyway
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os.kill(os.getpid(), signal.SIGKILL)  # a signal whose default is not to end a process
    os._exit(1)


def _event(event: str, **fields: object) -> None:
    """One event line on the launcher's stdout (the format of ``launcher.emit``), written past Python's buffer (a
    fork's copy of it may hold the launcher's unwritten output).
    """
    try:
        os.write(1, (json.dumps({"launcher": event, "time": time.time(), **fields}) + "\n").encode())
    except OSError:
        pass


def keep(start: Callable[[], object], *, wall_seconds: float | None = None, cpu_seconds: float | None = None,
         task_id: int | None = None, report_fd: int | None = None, clientapp_fds: Iterable[int] = (),
         mask: Iterable[int] = ()) -> NoReturn:
    """In the launcher's freshly forked child: become the keeper of one ClientApp, which ``start`` runs (in a
    process forked here, in its own session; it must not return); never returns.

    The launcher forks with :data:`STOP_SIGNALS` blocked (``mask``: its signal mask before, restored here once the
    keeper's handlers are in place). ``wall_seconds``, ``cpu_seconds``: the site policy's limits for the tree (the
    launcher asks at ``wall_seconds``; the keeper's own deadline is ``WALL_GRACE_SECONDS`` later).
    ``report_fd``: where the keeper writes one JSON line when the tree ended (for the audit entry);
    ``clientapp_fds``: descriptors only the ClientApp keeps (its audit pipes), closed here once it is forked.
    """
    stop: list[int] = []
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda signum, frame: stop.append(signum))
        parent = os.getppid()
        gc_was = gc.isenabled()
        gc.disable()  # the keeper allocates little; a collection would copy the launcher's pages it shares
        become_subreaper()
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))  # the launcher gone (even killed): end the tree
        if os.getppid() != parent:
            stop.append(int(signal.SIGTERM))
    except BaseException as exc:  # noqa: BLE001 - no ClientApp runs that this process cannot keep
        _event("keeper-failed", pid=os.getpid(), task_id=task_id, error=f"{type(exc).__name__}: {exc}")
        os._exit(70)
    clientapp = os.fork()
    if clientapp == 0:  # the ClientApp
        code = 1
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, list(mask))
            if report_fd is not None:
                os.close(report_fd)
            if gc_was:
                gc.enable()
            os.setsid()  # its own session and process group: their id is its pid
            start()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - start() reports its own errors; this is the last resort
            code = 1
        finally:
            os._exit(code)
    for fd in clientapp_fds:
        os.close(fd)
    try:
        _prctl(PR_SET_DUMPABLE, 0)  # the ClientApp (same user without --clientapp-user) cannot ptrace its keeper
    except OSError:
        pass
    signal.pthread_sigmask(signal.SIG_SETMASK, list(mask))
    me, started = os.getpid(), time.monotonic()
    deadline = started + wall_seconds + WALL_GRACE_SECONDS if wall_seconds is not None else None
    next_cpu, why = started + CPU_POLL_SECONDS, ""
    try:
        while not _reap_others(clientapp):
            now = time.monotonic()
            if stop:
                why = "asked"  # by the launcher (its max-wall-seconds, its stop) or its death
                break
            if deadline is not None and now >= deadline:
                why = "max-wall-seconds"
                break
            if cpu_seconds is not None and now >= next_cpu:
                cost = time.process_time()
                used, own = tree_cpu_seconds(me, clientapp)
                next_cpu = now + max(CPU_POLL_SECONDS, (time.process_time() - cost) / CPU_CHECK_SHARE)
                if used >= cpu_seconds and own < cpu_seconds:  # the ClientApp alone past it: the kernel's SIGXCPU
                    why = "max-cpu-seconds"
                    break
            time.sleep(POLL_SECONDS)
    except BaseException as exc:  # noqa: BLE001 - whatever went wrong here, the tree goes
        why = f"keeper error ({type(exc).__name__})"
    killed, refused = end_tree(me, clientapp)
    try:
        _, status = os.waitpid(clientapp, 0)
    except ChildProcessError:
        status = 9  # reaped already (cannot be): as killed
    for _ in range(100):  # anything left (reparented here after the last scan): reaped, or killed then reaped
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            more, unkillable = end_tree(me, None, timeout=1.0)
            killed |= more
            refused |= unkillable
            if unkillable:
                break
    left = sorted(killed - {clientapp})
    report: dict[str, object] = {"clientapp_pid": clientapp, "leftovers_killed": len(left), "not_killed": len(refused)}
    if why:
        report["ended_by_keeper"] = why
    if cpu_seconds is not None:
        report["tree_cpu_seconds"] = round(tree_cpu_seconds(me, -1, {})[0], 3)
    if left or refused or why:
        _event("tree-ended", pid=me, task_id=task_id, **report)
    if report_fd is not None:
        try:
            os.write(report_fd, (json.dumps(report, sort_keys=True) + "\n").encode())
        except OSError:
            pass
    if why:
        _die_by(signal.SIGKILL)
    _die_like(status)

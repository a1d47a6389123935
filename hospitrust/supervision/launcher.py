"""A hospital's ClientApp launcher: Flower's SuperExec, forking each ClientApp from a warm parent.

Flower 1.42 runs every message (query, train, evaluate) in a fresh ``flwr-clientapp`` process,
which imports torch and Flower again (about 4.8 s of imports on a 2-core machine, twice a
round). With ``flower-supernode --isolation process`` the SuperNode leaves launching to a
process of our choice; this one imports the heavy libraries once (``PRELOAD``: torch, numpy,
Pillow, pydicom, scikit-learn's metrics, Flower's ClientApp runtime), then, like
``flower-superexec``, asks the SuperNode's Runtime API for tasks and runs each in a child
``os.fork()``-ed from it: Flower's own ``run_clientapp`` with the task's token. Each message
still gets its own process (a run never sees another run's state); only imported library
code is shared. hospitrust itself is *not* preloaded: the child imports it from the run's app
bundle, as Flower's own launcher would. The parent runs torch only for a single-threaded warm-up
(no thread pool, no CUDA context), so forking it is safe; a GPU child creates its own CUDA
context.

The SuperNode hands a task out only to a caller holding the secret ``deploy supernode`` makes at its start
(``--superexec-auth-secret-file``, :mod:`hospitrust.supervision.runtime_secret`): this process signs its asks with it,
so another account on the machine cannot take the hospital's messages from the SuperNode's local port.

It prints one JSON line per child on stdout (``started``, ``exited`` with exit code or signal
and seconds), which ``hospitrust deploy supernode``'s watchdog reads.

With an audit log, this process (which never imports an app bundle) writes it: each child gets two pipes,
the *decision* pipe (the gate's decision, sent and closed before the bundle is installed or imported) and
the *claim* pipe (what the reply carries, sent after the bundle's code ran: recorded as the app's claim).
The entry is written when the child exits, with its exit status as this process saw it. A child closes
the read ends of the other children's pipes and removes the gate's paths from its environment first.

Everything a ClientApp starts dies with it: this process forks a *keeper* per task
(:func:`hospitrust.supervision.tree.keep`), which forks the ClientApp in its own session, is a child subreaper (a
detached descendant is reparented to it, not to PID 1), and kills (SIGKILL) and reaps every process of the tree when
the ClientApp exits or when asked; the keeper's exit status is the ClientApp's. This process is a subreaper too, and
kills what comes back to it that is no keeper of its (:func:`sweep_strays`). The pids of the ``started`` and
``exited`` lines are the keepers'.

The site policy's limits (``max-cpu-seconds``, ``max-memory-mb``: RLIMIT_CPU and RLIMIT_DATA) are set on the child
once the gate accepted the bundle, before it is imported (every process it starts inherits them); the keeper also
sums the CPU time of the whole tree against ``max-cpu-seconds``. ``max-wall-seconds`` is this process's: past it, it
asks the keeper (SIGTERM) to kill the whole tree, and kills the keeper (SIGKILL) if it has not ended
``KEEPER_GRACE_SECONDS`` later. The ``exited`` line and the audit entry say which limit ended a child (``reason``,
``ended``) and how many processes it left behind that its keeper killed (``leftovers_killed``). With
``--clientapp-user`` ($HOSPITRUST_CLIENTAPP_USER) the child then also switches to that user for good
(:mod:`hospitrust.supervision.confine`), so the bundle's code cannot read or write the gate's files.

Fault injection for the watchdog's tests: ``HOSPITRUST_LAUNCHER_FAULT=die-before-read@N`` (the
N-th child exits with 17 before it reads its message), ``exit-0-before-read@N`` (it exits 0 before
reading it, as a ClientApp whose task token Flower refused does: the SuperNode then waits for a reply
that never comes) or ``hang@N`` (it never starts); ``KIND@N/G`` applies after the supervisor's G-th
restart.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from hospitrust.supervision import tree

#: Imported once by the parent and shared with every forked ClientApp.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch.utils.data", "PIL.Image", "pydantic",
           "pydicom", "sklearn.metrics", "flwr.app", "flwr.clientapp", "flwr.supernode.runtime.run_clientapp")
POLL_SECONDS = 0.05  # Flower's SuperExec: FLWR_SUPEREXEC_TASK_POLL_INTERVAL, 1 s by default
FAULT_ENV = "HOSPITRUST_LAUNCHER_FAULT"
PROFILE_ENV = "HOSPITRUST_LAUNCHER_PROFILE"  # a folder: profile every ClientApp (cProfile), for diagnostics
GENERATION_ENV = "HOSPITRUST_LAUNCHER_GENERATION"  # set by the supervisor: 0, then 1 after its first restart
KEEPER_GRACE_SECONDS = 5.0  # a keeper asked to end its tree (max-wall-seconds) and still there this long after: killed
SWEEP_SECONDS = 5.0  # how often, besides after each reaped keeper, this process looks for processes reparented to it


def emit(event: str, **fields: object) -> None:
    """One event line for the supervisor (and the hospital's log)."""
    print(json.dumps({"launcher": event, "time": time.time(), **fields}), flush=True)


def preload(names: tuple[str, ...] = PRELOAD) -> float:
    """Import ``names`` (the ClientApp's ``PRELOAD``) and warm torch's CPU kernels up; returns the seconds it took.

    A fresh process's first training step pays about 1.3 s of torch's lazy initialization (measured
    here: first epoch 1.33 s, second 0.04 s). The parent runs one tiny forward and backward pass
    with a single thread, so no OpenMP thread pool exists when it forks (a pool does not survive a
    fork); each child then sets its own thread count.
    """
    start = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional library (pydicom) missing: the child imports what it needs
            pass
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.GroupNorm(4, 8), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(32, 2))
    loss = torch.nn.functional.cross_entropy(model(torch.zeros(2, 1, 8, 8)), torch.zeros(2, dtype=torch.long))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    with torch.no_grad():
        torch.softmax(model.eval()(torch.zeros(2, 1, 8, 8)), dim=1)
    return time.perf_counter() - start


def _fault(launched: int) -> str:
    """The fault to inject into the ``launched``-th child (1-based) of this launcher, from
    $HOSPITRUST_LAUNCHER_FAULT: ``KIND@N`` in the first launcher the supervisor starts, ``KIND@N/G``
    in its G-th restart ($HOSPITRUST_LAUNCHER_GENERATION), so an injected fault fires once.
    """
    generation = int(os.environ.get(GENERATION_ENV, "0") or 0)
    for item in os.environ.get(FAULT_ENV, "").split(","):
        kind, _, at = item.strip().partition("@")
        n, _, gen = at.partition("/")
        if kind and n.isdigit() and int(n) == launched and int(gen or 0) == generation:
            return kind
    return ""


class AuditPipes:
    """The launcher's end of one child's two audit pipes, read without blocking as data arrives."""

    LIMIT = 1 << 18  # bytes kept per pipe: a decision is a few hundred bytes, a reply's description a few KB

    def __init__(self, task_id: int, run_id: int) -> None:
        self.task_id, self.run_id = task_id, run_id
        self.decision_r, decision_w = os.pipe()
        self.claim_r, claim_w = os.pipe()
        self.keeper_r, self.keeper_w = os.pipe()  # the keeper's report (tree.keep): what it killed when the tree ended
        self.child_fds = (decision_w, claim_w)
        self.data = {self.decision_r: bytearray(), self.claim_r: bytearray(), self.keeper_r: bytearray()}
        self.open = [self.decision_r, self.claim_r, self.keeper_r]

    def forked(self) -> None:
        """In the launcher, after the fork: only the child (and its keeper) write."""
        for fd in (*self.child_fds, self.keeper_w):
            os.close(fd)
        for fd in self.open:
            os.set_blocking(fd, False)

    def drain(self) -> None:
        for fd in list(self.open):
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:  # every writer closed it
                    self.open.remove(fd)
                    os.close(fd)
                    break
                if len(self.data[fd]) < self.LIMIT:
                    self.data[fd] += chunk[: self.LIMIT - len(self.data[fd])]

    def close(self) -> None:
        self.drain()
        for fd in self.open:
            os.close(fd)
        self.open = []

    @staticmethod
    def _one(data: bytes) -> dict | None:
        lines = data.decode(errors="replace").strip().splitlines()
        try:
            value = json.loads(lines[0]) if len(lines) == 1 else None
        except ValueError:
            value = None
        return value if isinstance(value, dict) else None

    def claim(self) -> dict | None:
        """What the app says its reply carried (one JSON object), None when it sent nothing readable."""
        return self._one(bytes(self.data[self.claim_r]))

    def keeper(self) -> dict | None:
        """The keeper's report (:func:`hospitrust.supervision.tree.keep`), None when it sent none."""
        return self._one(bytes(self.data[self.keeper_r]))

    def entry(self, rc: object, ended: str | None = None) -> dict:
        """The audit entry: the run and task as the SuperNode gave them, the gate's decision, the exit status
        seen here, what ended the child when a limit of the site policy did (``ended``), the processes it left
        running that its keeper killed (``leftovers_killed``; ``leftovers_not_killed``), and what the app says its
        reply carried.
        """
        out: dict[str, object] = {"run": self.run_id, "task": self.task_id}
        decision = self._one(bytes(self.data[self.decision_r]))
        if decision is not None and decision.get("decision") in ("accepted", "refused"):
            for key in ("app_sha256", "message", "round", "decision", "reason", "agreed", "images_this_round"):
                if key in decision:
                    value = decision[key]
                    out[key] = value[:2000] if isinstance(value, str) else value
        else:
            out["decision"] = "none"
            out["reason"] = f"the ClientApp ended ({rc}) before the gate decided"
        claim_bytes = bytes(self.data[self.claim_r])
        claim = self._one(claim_bytes)
        if claim is not None:
            out["reply_claimed_by_app"] = claim
        elif claim_bytes:
            out["reply_claimed_by_app"] = {"unreadable": f"{len(claim_bytes)} bytes, not one JSON object"}
        out["exit"] = rc
        if ended:
            out["ended"] = ended
        keeper = self.keeper() or {}
        for key, name in (("leftovers_killed", "leftovers_killed"), ("not_killed", "leftovers_not_killed")):
            if isinstance(keeper.get(key), int) and keeper[key] > 0:
                out[name] = keeper[key]
        return out


def _write_audit(gate_config, pipes: AuditPipes, rc: object, ended: str | None = None) -> None:
    """Append the child's entry; a failure is said loudly on the launcher's log, with the entry."""
    from hospitrust.ops.deploy import audit

    pipes.close()
    entry = pipes.entry(rc, ended)
    try:
        record = audit.append(gate_config.audit_log, entry, gate_config.audit_key)
    except (OSError, ValueError, RuntimeError) as exc:  # DeployError is a RuntimeError
        print(f"hospitrust audit: could not append to {gate_config.audit_log}: {exc}; the entry: "
              f"{json.dumps(entry, sort_keys=True)}", file=sys.stderr, flush=True)
        return
    # the head, in the SuperNode's log too (journal, log file): a copy of the anchor outside the log's folder
    emit("audited", entries=record["n"], mac=record["mac"], decision=entry["decision"], task_id=pipes.task_id)


def atomic_install(install):
    """Flower's ``install_from_fab`` made all-or-nothing: it copies a bundle into ``$FLWR_HOME/apps/NAME`` file by file,
    and reuses that folder whenever it exists, so a ClientApp killed while installing (a watchdog restart, the OOM
    killer) left a folder without its ``pyproject.toml`` that failed every later message of that bundle at this
    hospital (``LoadClientAppError``). This installs into a staging folder beside it and renames it into place; a
    folder left incomplete by an earlier kill is replaced.
    """
    import shutil
    import tempfile
    from pathlib import Path

    def install_from_fab(fab_file, install_dir=None, skip_prompt=False):
        from flwr.common.constant import APP_DIR
        from flwr.supercore.utils import get_flwr_home

        base = Path(install_dir).expanduser() if install_dir else get_flwr_home()
        (base / APP_DIR).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".installing-", dir=base / APP_DIR))
        try:
            staged = Path(install(fab_file, staging, skip_prompt))
            final = base / APP_DIR / staged.name
            if final.exists() and not (final / "pyproject.toml").is_file():
                shutil.rmtree(final, ignore_errors=True)  # left incomplete by a ClientApp killed while installing
            try:
                os.rename(staged, final)
            except OSError:  # another ClientApp installed the same bundle meanwhile: theirs is complete
                pass
            return final
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    return install_from_fab


class Child:
    """A ClientApp in flight: when it started, its task, the site policy's limits it was forked with, and why this
    process killed it (empty: it did not).
    """

    def __init__(self, task_id: int, limits=None) -> None:
        self.started, self.clock = time.time(), time.monotonic()
        self.task_id, self.limits, self.killed = task_id, limits, ""
        self.asked: float | None = None  # when this process asked its keeper to end the tree (SIGTERM)
        self.forced = False  # the keeper did not end in time: killed (SIGKILL)

    @property
    def wall_seconds(self) -> float | None:
        return getattr(self.limits, "wall_seconds", None)


ALLOCATION_FAILED = ("MemoryError", "Cannot allocate memory", "can't allocate memory", "bad_alloc", "out of memory")


def ending(rc: int, cpu_seconds: float, child: Child, claim: dict | None = None) -> str | None:
    """Which limit of the site policy ended a child (None: none did), from what this process saw: its own kill at
    max-wall-seconds (or the keeper's, a little later, should this process not have asked), the kernel's SIGXCPU at
    max-cpu-seconds (or SIGKILL past the CPU time: the kernel's hard limit, or the keeper's for the whole tree;
    ``cpu_seconds`` is the keeper's ``wait4``: the tree's), and, under max-memory-mb, an error reply that says an
    allocation failed (the app's own claim, said as such).
    """
    if child.killed:
        return child.killed
    limits = child.limits
    cpu = getattr(limits, "cpu_seconds", None)
    if cpu is not None and (rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu_seconds >= cpu)):
        return f"killed: past the site policy's max-cpu-seconds ({cpu} s of CPU; it used {cpu_seconds:.1f} s)"
    wall = child.wall_seconds
    if wall is not None and rc == -signal.SIGKILL and time.monotonic() - child.clock >= wall:
        return f"killed: past the site policy's max-wall-seconds ({wall:g} s)"
    memory = getattr(limits, "memory_mb", None)
    error = str(claim.get("error", "")) if isinstance(claim, dict) else ""
    if memory is not None and any(marker in error for marker in ALLOCATION_FAILED):
        return (f"failed: an allocation failed under the site policy's max-memory-mb ({memory} MiB), as the app's "
                "error reply says (its claim)")
    return None


def enforce_wall_time(children: dict[int, Child]) -> None:
    """End every child past its max-wall-seconds with every process it started: its keeper is asked (SIGTERM) to kill
    (SIGKILL) the whole tree, and is killed itself ``KEEPER_GRACE_SECONDS`` later if it is still there (what it
    leaves then comes back to this process: :func:`sweep_strays`); its ``exited`` line and audit entry say why.
    """
    now = time.monotonic()
    for pid, child in children.items():
        wall = child.wall_seconds
        if wall is None or now - child.clock < wall:
            continue
        if child.killed:
            if child.asked is not None and not child.forced and now - child.asked >= KEEPER_GRACE_SECONDS:
                child.forced = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                emit("killed", pid=pid, task_id=child.task_id, reason=child.killed + "; its keeper did not end in "
                     f"{KEEPER_GRACE_SECONDS:g} s: killed")
            continue
        child.killed = f"killed: past the site policy's max-wall-seconds ({wall:g} s)"
        child.asked = now
        try:
            os.kill(pid, signal.SIGTERM)  # the keeper: SIGKILL to the ClientApp and everything it started
        except ProcessLookupError:
            pass  # it ended meanwhile: reaped next
        except PermissionError:  # not this user's keeper (should not happen: this process forked it)
            child.killed = f"past the site policy's max-wall-seconds ({wall:g} s), but not killed: no permission"
        emit("killed", pid=pid, task_id=child.task_id, reason=child.killed)


def reap(children: dict[int, Child], pending: dict[int, AuditPipes], gate_config) -> list[tuple[int, int, str | None]]:
    """Collect the children (keepers) that ended: their audit entries, their ``exited`` lines; returns (pid, rc,
    reason). A process reparented to this one that ended is reaped without a line (:func:`sweep_strays` said it).
    """
    done = []
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        child = children.pop(pid, None)
        if child is None:
            continue
        rc = os.waitstatus_to_exitcode(status)
        pipes = pending.pop(pid, None)
        if pipes is not None:
            pipes.drain()
        reason = ending(rc, usage.ru_utime + usage.ru_stime, child, pipes.claim() if pipes is not None else None)
        left = (pipes.keeper() or {}).get("leftovers_killed") if pipes is not None else None
        if pipes is not None:
            _write_audit(gate_config, pipes, rc, reason)
        emit("exited", pid=pid, task_id=child.task_id, seconds=round(time.time() - child.started, 3), rc=rc,
             **({"reason": reason} if reason else {}), **({"leftovers_killed": left} if left else {}))
        done.append((pid, rc, reason))
    return done


def sweep_strays(children: dict[int, Child]) -> list[int]:
    """Kill (SIGKILL) and reap every child of this process (a child subreaper) that is not a keeper it forked, with
    its descendants: a ClientApp's process whose keeper is gone (killed by the ClientApp itself, which can when it
    runs as the service's user; or past ``KEEPER_GRACE_SECONDS``) is reparented here. Returns the pids killed.
    """
    me, killed = os.getpid(), set()
    for _ in range(200):
        procs = tree.processes()
        strays = [p.pid for p in procs.values() if p.ppid == me and p.pid not in children]
        if not strays:
            break
        for pid in strays:
            for target in (pid, *tree.descendants(pid, procs)):
                if target in procs and procs[target].alive:
                    try:
                        os.kill(target, signal.SIGKILL)
                        killed.add(target)
                    except OSError:
                        pass
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.005)
    if killed:
        emit("strays-killed", pids=sorted(killed))
    return sorted(killed)


def child_limits(gate_config):
    """The site policy's limits for the next child, read now (a broken policy: none; the gate refuses it)."""
    from hospitrust.errors import DeployError
    from hospitrust.ops.deploy.policy import ChildLimits, load_policy

    if gate_config is None or gate_config.policy is None:
        return ChildLimits()
    try:
        return load_policy(gate_config.policy).child_limits()
    except DeployError:
        return ChildLimits()


def _confiner(limits, user):
    """What the child does once the bundle is installed and accepted, before it is imported: set the site policy's
    CPU and memory limits, then switch to the ClientApp's user (None: nothing to do).
    """
    if user is None and (limits is None or (limits.cpu_seconds is None and limits.memory_mb is None)):
        return None
    from flwr.supercore.utils import get_flwr_home

    from hospitrust.supervision import confine

    def confine_child(target) -> None:
        if user is not None:
            confine.share_install(Path(target), get_flwr_home())
        if limits is not None:
            limits.apply()
        if user is not None:
            confine.drop_to(user)

    return confine_child


def _child(runtime_api_address: str, token: str, fault: str, gate_config=None,
           audit_fds: tuple[int, int] | None = None, limits=None, user=None) -> None:
    """In the forked child: run one ClientApp task with Flower's own runtime; never returns.

    With a ``gate_config`` (approvals, signers, site policy, audit log), the hospital's gate
    (``hospitrust.ops.deploy.gate``) wraps Flower's task input, bundle installation and reply first.
    ``audit_fds``: the decision and claim pipes' write ends (see :class:`AuditPipes`). ``limits``: the site
    policy's (``ChildLimits``), ``user``: the ClientApp's (``confine.AppUser``), set once the bundle is accepted.
    """
    code = 0
    try:
        from hospitrust.ops.deploy import gate

        gate.scrub_environment()  # the bundle's code must not learn where the approvals, policy and audit log are
        confine_child = _confiner(limits, user)
        from hospitrust.supervision.supervisor import die_with_parent

        die_with_parent()  # its keeper gone (killed with SIGKILL): the ClientApp goes too
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if fault == "die-before-read":
            os._exit(17)
        if fault == "exit-0-before-read":
            os._exit(0)
        if fault == "hang":
            while True:
                time.sleep(3600)
        if gate_config is not None and gate_config.active:
            decision_fd, claim_fd = audit_fds if audit_fds is not None else (None, None)
            # the hospital's own code, before the bundle's hospitrust replaces it
            gate.install(gate_config, decision_fd=decision_fd, claim_fd=claim_fd, accepted=confine_child)
        for name in [m for m in sys.modules if m == "hospitrust" or m.startswith("hospitrust.")]:
            del sys.modules[name]  # the launcher's own modules: the ClientApp imports hospitrust from the app bundle
        threads = os.environ.get("OMP_NUM_THREADS", "")
        import torch

        torch.set_num_threads(int(threads) if threads.isdigit() else (os.cpu_count() or 1))
        from flwr.supernode.runtime import run_clientapp as rc
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        if gate_config is None or not gate_config.active:  # the gate installs all-or-nothing itself (install_verified)
            flower_install = atomic_install(rc.install_from_fab)
            if confine_child is None:
                rc.install_from_fab = flower_install  # type: ignore[assignment]
            else:
                def install_then_confine(*args, **kwargs):
                    final = flower_install(*args, **kwargs)
                    confine_child(final)
                    return final

                rc.install_from_fab = install_then_confine  # type: ignore[assignment]

        # Flower's runner watches its parent with os.kill(pid, 0), which fails (EPERM) once this process is another
        # user's (--clientapp-user): it would read that as its parent gone and stop the task (issue 61, finding 2).
        # The parent-death signal (die_with_parent, set again after the switch) ends it with its keeper instead.
        parent = None if user is not None else os.getppid()
        profile_dir = os.environ.get(PROFILE_ENV, "")
        if profile_dir:  # diagnostics: where a ClientApp's time goes, one .prof file per task
            import cProfile

            cProfile.runctx("run_clientapp(runtime_api_address=runtime_api_address, token=token, insecure=True, "
                            "certificates=None, parent_pid=parent)", globals(), locals(),
                            os.path.join(profile_dir, f"clientapp-{os.getpid()}.prof"))
        else:
            run_clientapp(runtime_api_address=runtime_api_address, token=token, insecure=True, certificates=None,
                          parent_pid=parent)
    except SystemExit as exc:  # Flower's exit path
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it, then leave without running the parent's handlers
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork(runtime_api_address: str, token: str, fault: str, gate_config, pipes: AuditPipes | None,
          pending: dict[int, AuditPipes], limits=None, user=None, task_id: int | None = None) -> int:
    """Fork the keeper of one task (:func:`hospitrust.supervision.tree.keep`), which forks its ClientApp (see
    :func:`_child`) and ends every process the ClientApp started; returns the keeper's pid, whose exit status is the
    ClientApp's. ``pending``: the audit pipes of the messages still in flight, whose ends the keeper closes.
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, tree.STOP_SIGNALS)  # until the keeper has its own handlers
    try:
        pid = os.fork()
        if pid == 0:
            try:
                for other in pending.values():  # another message's decision is not this child's to read
                    for fd in other.open:
                        os.close(fd)
                if pipes is not None:
                    for fd in pipes.open:
                        os.close(fd)
                fds = pipes.child_fds if pipes is not None else None
                tree.keep(lambda: _child(runtime_api_address, token, fault, gate_config, fds, limits, user),
                          wall_seconds=getattr(limits, "wall_seconds", None), cpu_seconds=getattr(limits, "cpu_seconds", None),
                          task_id=task_id if task_id is not None else (pipes.task_id if pipes is not None else None),
                          report_fd=pipes.keeper_w if pipes is not None else None, clientapp_fds=fds or (), mask=mask)
            finally:
                os._exit(70)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pipes is not None:
        pipes.forked()
    return pid


def check_start(gate_config, user_spec: str = ""):
    """At the start: the gate's files and the ClientApp's user (``--clientapp-user``), checked; returns the user
    (``confine.AppUser``) or None. A DeployError says what is wrong.
    """
    gate_config.check_files()  # a broken policy or signers file stops the SuperNode now, not at its first message
    if not user_spec:
        return None
    from hospitrust.supervision import confine

    user = confine.AppUser.parse(user_spec)
    confine.check_can_switch(user)
    confine.check_private(gate_config.private_files(), user)
    return user


def _memory_warning(limits) -> None:
    """Say loudly when the policy's max-memory-mb is below what every child inherits (it could not run at all)."""
    if limits.memory_mb is None:
        return
    status = Path("/proc/self/status").read_text()
    data = next((int(line.split()[1]) // 1024 for line in status.splitlines() if line.startswith("VmData:")), 0)
    if data + 64 >= limits.memory_mb:
        print(f"hospitrust launcher: the site policy's max-memory-mb ({limits.memory_mb} MiB) is not above the {data} MiB "
              "every ClientApp inherits from this launcher (RLIMIT_DATA counts them): accepted messages will fail "
              "to allocate", file=sys.stderr, flush=True)


def run(runtime_api_address: str, *, poll: float = POLL_SECONDS, parent_pid: int | None = None,
        gate: StdinGate | None = None, clientapp_user: str = "", secret_file: str | None = None) -> None:
    """Ask the SuperNode for ClientApp tasks and fork one child per task, until stopped (with
    ``gate``: when the supervisor signals a received message, see :class:`StdinGate`; with ``clientapp_user``: the
    ClientApps run as that user; ``secret_file``: the SuperNode's ``--superexec-auth-secret-file``, without which it
    hands out no task).
    """
    from hospitrust.errors import DeployError
    from hospitrust.ops.deploy.gate import GateConfig

    gate_config = GateConfig.from_env()
    try:
        user = check_start(gate_config, clientapp_user)
        if user is not None and secret_file:  # the ClientApp's user must not take its neighbours' messages either
            from hospitrust.supervision import confine

            confine.check_private([Path(secret_file)], user)
    except DeployError as exc:
        print(f"hospitrust launcher: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    try:  # what a ClientApp's keeper could not end comes back here, not to PID 1
        tree.become_subreaper()
    except OSError as exc:
        print(f"hospitrust launcher: cannot become a child subreaper ({exc}): a ClientApp's detached processes could "
              "outlive it; Linux 3.4 or later is needed", file=sys.stderr, flush=True)
        sys.exit(2)
    seconds = preload()
    _memory_warning(child_limits(gate_config))
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret_file:  # the SuperNode hands tasks out only to the holder of this secret (runtime_secret)
        from hospitrust.supervision import runtime_secret

        interceptors.append(runtime_secret.interceptor(secret_file))
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=True, root_certificates=None, interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )
    emit("ready", preload_seconds=round(seconds, 3), runtime_api=runtime_api_address, pid=os.getpid(),
         **({"clientapp_user": user.label} if user is not None else {}))
    children: dict[int, Child] = {}
    pending: dict[int, AuditPipes] = {}  # pid -> its audit pipes (with an audit log)
    launched = 0
    swept = time.monotonic()

    def stop(signum, frame):  # the children are the keepers of messages in flight: their trees go too
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:  # gone, or another user's (it has the parent-death signal)
                pass
        for pid, pipes in pending.items():
            _write_audit(gate_config, pipes, "stopped with the launcher")
        client.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        for inflight in pending.values():  # a reply's description may not fit a pipe's buffer: read as it comes
            inflight.drain()
        enforce_wall_time(children)
        if reap(children, pending, gate_config) or time.monotonic() - swept >= SWEEP_SECONDS:
            sweep_strays(children)
            swept = time.monotonic()
        if gate is not None and not gate.wait(poll):
            continue
        res = client.AcquireTask(AcquireTaskRequest(supported_task_types={TaskType.CLIENT_APP}))
        if res.HasField("task") and res.token:
            launched += 1
            fault = _fault(launched)
            sys.stdout.flush()
            pipes = AuditPipes(int(res.task.task_id), int(res.task.run_id)) if gate_config.audit_log else None
            limits = child_limits(gate_config)
            pid = _fork(runtime_api_address, res.token, fault, gate_config, pipes, pending, limits, user,
                        task_id=int(res.task.task_id))
            if pipes is not None:
                pending[pid] = pipes
            children[pid] = Child(int(res.task.task_id), limits)
            emit("started", pid=pid, task_id=int(res.task.task_id), run_id=int(res.task.run_id), n=launched,
                 **({"fault": fault} if fault else {}))
            continue  # another task may be waiting: ask again at once
        if gate is None:
            time.sleep(poll)


class StdinGate:
    """Ask for a task when the supervisor says the SuperNode has received a message (a line on stdin),
    or every ``FALLBACK_SECONDS`` regardless (a missed line costs at most that).

    A task is listed as soon as the SuperNode starts receiving its message; a ClientApp that asks for
    the message's contents before they arrived backs off a whole second (Flower's ``pull_objects``:
    initial backoff 1 s, doubling). Waiting for the SuperNode's "Received successfully" costs only
    the transfer itself.
    """

    FALLBACK_SECONDS = 5.0

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self.last = 0.0
        self.open = True

    def wait(self, poll: float) -> bool:
        import select

        if not self.open:
            time.sleep(poll)
            return True
        ready, _, _ = select.select([self.fd], [], [], poll)
        if ready:
            if not os.read(self.fd, 4096):  # the supervisor closed the pipe: plain polling from now on
                self.open = False
            self.last = time.monotonic()
            return True
        if time.monotonic() - self.last >= self.FALLBACK_SECONDS:
            self.last = time.monotonic()
            return True
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m hospitrust.supervision.launcher --runtime-api-address HOST:PORT``."""
    parser = argparse.ArgumentParser(description="Launch a SuperNode's ClientApps by forking a preloaded process.")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (its --host:--port)")
    parser.add_argument("--poll", type=float, default=POLL_SECONDS, help="seconds between task polls")
    parser.add_argument("--parent-pid", type=int, help="exit when this process exits")
    parser.add_argument("--gate-stdin", action="store_true",
                        help="ask for a task when a line arrives on stdin (the supervisor: message received)")
    parser.add_argument("--clientapp-user", metavar="NAME|UID[:GID]",
                        default=os.environ.get("HOSPITRUST_CLIENTAPP_USER", ""),
                        help="run each ClientApp as this user once the gate accepted its bundle (default "
                             "$HOSPITRUST_CLIENTAPP_USER; needs CAP_SETUID, CAP_SETGID and CAP_KILL)")
    parser.add_argument("--superexec-auth-secret-file", metavar="FILE",
                        help="the secret the SuperNode asks of whoever acquires a task (its own option of that name)")
    args = parser.parse_args(argv)
    run(args.runtime_api_address, poll=args.poll, parent_pid=args.parent_pid,
        gate=StdinGate() if args.gate_stdin else None, clientapp_user=args.clientapp_user,
        secret_file=args.superexec_auth_secret_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())

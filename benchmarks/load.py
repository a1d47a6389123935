"""Many hospitals on one SuperLink: a load benchmark with real processes, as the docs start them.

For each N of ``--hospitals`` (default 5,10,20,35,50) it starts a fresh federation on 127.0.0.1: the CA and
certificates, ``hospitrust deploy superlink`` (flower-superlink behind its TLS gateway, with SuperNode
authentication), the operator's ``hospitrust deploy connection`` and ``deploy tunnel``, each hospital's key
registered with ``flwr supernode register``, then N ``hospitrust deploy supernode --partition I/N`` (rehearsal
hospitals: partition I of an iid split of the run's dataset, so every hospital holds every class), Flower's own
ClientApp launcher by default (``--launcher flower``: a fresh process per message, light enough for 50 hospitals on
one machine; ``warm`` keeps hospitrust's preloaded launcher per hospital, about 0.5 GB each). Then one run of
``--rounds`` rounds with ``min-hospitals = N`` through ``hospitrust deploy run`` (the supervisor that resubmits a
failed run), and it reports per N:

- memory per role (PSS, the peak over samples every few seconds, summed over the role's processes; and per process);
- CPU seconds per hospital per round (the hospitals' processes, their reaped ClientApps included) and the server's;
- each round's period and its growth with N; train and evaluate replies received against those expected;
- every error line of the SuperLink and its gateway and of the SuperNodes (counted; the distinct ones listed);
- the SuperLink database's size (with its WAL).

**Light hospitals** (``--clientapp-slots K``): here every hospital shares one machine, and each ClientApp in flight
costs about 0.45 GB (a fresh process that imports torch), so 50 hospitals training at once would not fit in 24 GB. With
K slots, a stand-in ``flwr-clientapp`` first on the hospitals' PATH runs Flower's own in its process, with one
change: before it loads the ClientApp it waits for one of K machine-wide slots (a lock file each). Flower has started
the task's heartbeat and pulled the message by then, so a queued ClientApp keeps its task alive: at most K ClientApps
train at once, the rest queue, and each N's figures say how long they waited. In a real federation each hospital has
its own machine, and no such limit. (The first version held a ClientApp before Flower started it: with no heartbeat
its SuperNode dropped the task and refused the reply, 401 "task-token authentication failed", and at N = 35, K = 4
most replies from round 2 were lost: docs/experiments/2026-12-06-many-hospitals.md.) With slots the ServerApp waits
for replies long enough for N ClientApps to pass K at a time (``reply_timeout``).

A **churn** mode (``--churn``): ``min-hospitals`` is N minus the churned hospitals (10 %, at least one); during
round 2 their whole process groups are killed with SIGKILL and started again 20 s later with the same command. The
run must complete with them recorded missing, then back (a valid reply in a later round), and no hospital counted
twice in a round.

Results go to ``--out`` (default ``runs/load``): ``load-N<N>[-churn].json`` per N, written when it is done, so an
interrupted sweep resumes at the first N without one (``--fresh`` runs them again). An N whose estimated peak memory
does not fit this machine's available memory is refused with the estimate, before anything starts.

    python benchmarks/load.py                                 # N = 5, 10, 20, 35, 50, 3 rounds
    python benchmarks/load.py --hospitals 20 --churn          # churn: 2 of 20 killed in round 2, back 20 s later
    python benchmarks/load.py --hospitals 35,50 --clientapp-slots 4   # 35 and 50 hospitals, 4 ClientApps at a time
    python benchmarks/load.py --hospitals 3 --rounds 1 --out /tmp/load   # a tiny try (about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from hospitrust.ops import deploy, flwr  # noqa: E402
from hospitrust.records import RoundRecord  # noqa: E402
from hospitrust.server_app.results import read_round_records, round_periods  # noqa: E402
from hospitrust.supervision.supervisor import ACTIVATED  # noqa: E402

GB = 1024 ** 3
# the run every hospital trains: small enough that 50 hospitals train a round on two cores within the reply bound
RUN_CONFIG = ('dataset="pneumoniamnist" partitioner="iid" train-subsample=0.1 model="tiny-cnn" local-epochs=1 '
              'batch-size=32 train.class-weighted-loss=true checkpoint=false')


def reply_timeout(hospitals: int, slots: int) -> int:
    """Seconds the ServerApp waits for a round's replies: 900, or with K slots long enough for N hospitals'
    ClientApps to pass K at a time (each about 20 s to start and train on this machine, loaded), with room to spare."""
    return max(900, 3 * 20 * -(-hospitals // slots)) if slots else 900
# peak memory (GB) per role before a sweep has measured its own (issue 63's figures, N = 5 and 20, this machine):
# the SuperLink with its gateway, one run's ServerApp with its launcher, and per hospital its supervisor, SuperNode,
# launcher (warm: preloaded torch) and one training ClientApp
DEFAULT_GB = {"server": 0.25 + 0.65, "hospital": {"flower": 0.04 + 0.11 + 0.06 + 0.30, "warm": 0.04 + 0.11 + 0.53 + 0.30}}
CHURN_RESTART_SECONDS = 20.0
CLIENTAPP_GB = 0.48  # one ClientApp in flight (PSS peak per process, 2026-12-06 sweep: 0.42-0.48 GB)
# the stand-in flwr-clientapp of --clientapp-slots: Flower's own flwr-clientapp, run in this process, whose one
# change is that loading the ClientApp first takes one of K lock files (flock, released when the process ends).
# Flower's run_clientapp calls get_load_client_app_fn after it has started the task's heartbeat and pulled the
# message, so a ClientApp waiting for a slot keeps its task alive (held before that, it sent no heartbeat and its
# SuperNode refused its reply: 2026-12-07, N = 35)
SLOT_SHIM = """#!{python}
import fcntl, os, runpy, sys, time
from flwr.supernode.runtime import run_clientapp

folder, slots = {folder!r}, {slots}
flower_load_fn = run_clientapp.get_load_client_app_fn


def take_a_slot():
    waited = time.monotonic()
    while True:
        for i in range(slots):
            fd = os.open(os.path.join(folder, "slot-%d" % i), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            with open(os.path.join(folder, "waits.log"), "a") as log:  # one line per ClientApp: its wait
                log.write("%.2f\\n" % (time.monotonic() - waited))
            return fd  # held until this process ends
        time.sleep(0.2)


def load_after_a_slot(*args, **kwargs):
    take_a_slot()
    return flower_load_fn(*args, **kwargs)


run_clientapp.get_load_client_app_fn = load_after_a_slot
sys.argv[0] = {real!r}
runpy.run_path({real!r}, run_name="__main__")
"""

ROLES = (  # (role, a test on the process's command line and its parent's), the first that matches
    ("serverapp", lambda c, parent: "flwr-serverapp" in c),
    ("clientapp", lambda c, parent: "flwr-clientapp" in c),
    ("superexec (hospital)", lambda c, parent: "flower-superexec" in c and "flower-supernode" in parent),
    ("superexec (server)", lambda c, parent: "flower-superexec" in c),
    ("warm launcher", lambda c, parent: "hospitrust.supervision.launcher" in c),
    # the SuperLink's warm ServerApp launcher (deploy superlink's default) and each run's ServerApp it forks
    ("serverapp launcher", lambda c, parent: "hospitrust.supervision.serverapp_launcher" in c),
    ("flower-supernode", lambda c, parent: "flower-supernode" in c),
    ("flower-superlink", lambda c, parent: "flower-superlink" in c),
    ("gateway (nginx)", lambda c, parent: "nginx" in c),
    ("hospital supervisor", lambda c, parent: "deploy supernode" in c),
    ("superlink wrapper", lambda c, parent: "deploy superlink" in c),
    ("tunnel", lambda c, parent: "deploy tunnel" in c),
    ("run supervisor", lambda c, parent: "deploy run" in c),
)
HOSPITAL_ROLES = ("clientapp", "superexec (hospital)", "warm launcher", "flower-supernode", "hospital supervisor")


def role_of(cmdline: list[str], parent: list[str]) -> str:
    text, parent_text = " ".join(cmdline), " ".join(parent)
    return next((name for name, test in ROLES if test(text, parent_text)), "other")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hospitrust.cli.main", *args]


class Sampler(threading.Thread):
    """Every ``period`` seconds: each process under ``roots`` by role, its PSS and its CPU. The peak of each role's
    summed PSS and of each process's; CPU from each process's last sample, its reaped children's included (a
    short-lived ClientApp between two samples is counted by the launcher that reaped it)."""

    def __init__(self, roots: list[psutil.Process], period: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.roots, self.period = roots, period
        self.stop_event = threading.Event()
        self.peak_role: dict[str, float] = defaultdict(float)
        self.peak_process: dict[str, float] = defaultdict(float)
        self.seen: dict[int, tuple[str, float, float, int]] = {}  # pid -> (role, own CPU, reaped children's, ppid)
        self.live: set[int] = set()
        self.lock = threading.Lock()

    def add_root(self, proc: psutil.Process) -> None:
        with self.lock:
            self.roots.append(proc)

    def sample(self) -> None:
        with self.lock:
            roots = list(self.roots)
        found: dict[int, psutil.Process] = {}
        for root in roots:
            try:
                for p in [root, *root.children(recursive=True)]:
                    found[p.pid] = p
            except psutil.Error:
                continue
        by_role: dict[str, float] = defaultdict(float)
        live = set()
        for pid, p in found.items():
            try:
                with p.oneshot():
                    parent = p.parent()
                    role = role_of(p.cmdline(), parent.cmdline() if parent is not None else [])
                    t = p.cpu_times()
                    pss = p.memory_full_info().pss / GB
                    ppid = p.ppid()
            except psutil.Error:
                continue
            live.add(pid)
            by_role[role] += pss
            self.peak_process[role] = max(self.peak_process[role], pss)
            self.seen[pid] = (role, t.user + t.system, t.children_user + t.children_system, ppid)
        self.live = live
        for role, gb in by_role.items():
            self.peak_role[role] = max(self.peak_role[role], gb)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds per role so far: every process's own at its last sample, and what a live process's reaped
        children used beyond what their own last samples hold (a ClientApp born and gone between two samples, the
        end of one that was sampled); that remainder goes to the parent's role."""
        out: dict[str, float] = defaultdict(float)
        sampled_children: dict[int, float] = defaultdict(float)
        for pid, (role, own, _, ppid) in self.seen.items():
            out[role] += own
            if pid not in self.live:
                sampled_children[ppid] += own
        for pid, (role, _, children, _) in self.seen.items():
            if pid in self.live:
                out[role] += max(0.0, children - sampled_children[pid])
        return dict(out)

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.period)

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        self.sample()


def estimate_gb(hospitals: int, launcher: str, measured: dict | None, slots: int = 0) -> float:
    """Peak memory the N-hospital federation needs (GB): the measured per-role figures of an earlier N when there
    are some (with ``slots``, of a run with slots too), else issue 63's; with ``slots``, at most that many
    ClientApps in flight."""
    if measured and bool(measured.get("clientapp_slots")) == bool(slots):
        server = sum(gb for role, gb in measured["peak_gb_by_role"].items() if role not in HOSPITAL_ROLES)
        per_hospital = sum(gb for role, gb in measured["peak_gb_by_role"].items()
                           if role in HOSPITAL_ROLES and not (slots and role == "clientapp"))
        per_hospital /= measured["hospitals"]
        return server + hospitals * per_hospital + (slots * CLIENTAPP_GB if slots else 0.0)
    if slots:
        return DEFAULT_GB["server"] + hospitals * (DEFAULT_GB["hospital"][launcher] - 0.30) + slots * CLIENTAPP_GB
    return DEFAULT_GB["server"] + hospitals * DEFAULT_GB["hospital"][launcher]


def error_lines(logs: list[Path]) -> dict[str, object]:
    """Every line that says ERROR, a Traceback or a locked database, counted, with the distinct ones (numbers and
    identifiers masked) and how often each came."""
    count, distinct = 0, defaultdict(int)
    for log in logs:
        if not log.is_file():
            continue
        for line in log.read_text(errors="replace").splitlines():
            if "ERROR" in line or "Traceback" in line or "database is locked" in line or "[error]" in line:
                count += 1
                distinct[re.sub(r"\d+", "N", line.strip())[:240]] += 1
    return {"count": count, "distinct": dict(sorted(distinct.items(), key=lambda kv: -kv[1])[:40])}


def database_mb(database: Path) -> float:
    return sum(p.stat().st_size for p in database.parent.glob(database.name + "*") if p.is_file()) / 1e6


def replies(rounds: list[RoundRecord]) -> list[dict[str, object]]:
    """Per round: the hospitals whose train reply counted, the train and evaluate replies received, and whether a
    hospital was counted twice."""
    out = []
    for r in rounds:
        clients = [c.hospital for c in r.clients if not c.rejected]
        evaluated = list(r.timing.get("evaluate_clients", {}) or r.hospital_accuracy)
        out.append({"round": r.number, "train": len(clients), "evaluate": len(evaluated),
                    "hospitals": sorted(clients), "counted_twice": sorted({h for h in clients if clients.count(h) > 1})})
    return out


class Federation:
    """One locked-down SuperLink and N rehearsal hospitals, started as docs/deployment.md starts them."""

    def __init__(self, work: Path, hospitals: int, launcher: str, say, slots: int = 0) -> None:
        self.work, self.hospitals, self.launcher, self.say, self.slots = work, hospitals, launcher, say, slots
        self.procs: dict[str, flwr.FlowerProcess] = {}
        self.commands: dict[str, tuple[list[str], Path]] = {}
        self.names = [f"hospital-{i}" for i in range(hospitals)]

    def start(self, name: str, cmd: list[str], home: Path, extra: dict[str, str] | None = None) -> flwr.FlowerProcess:
        home.mkdir(parents=True, exist_ok=True)
        self.commands[name] = (cmd, home)
        env = flwr.flower_env(home, {"OMP_NUM_THREADS": "1", **(extra or {})})
        proc = flwr.start(name, cmd, env=env, cwd=self.work, log_file=self.work / "logs" / f"{name}.log")
        self.procs[name] = proc
        return proc

    def up(self, sampler: Sampler) -> None:
        work = self.work
        (work / "logs").mkdir(parents=True, exist_ok=True)
        certs, keys, operator = work / "certs", work / "keys", work / "operator"
        deploy.create_ca(certs)
        deploy.create_server_cert(certs / "ca.crt", certs / "ca.key", certs, ["127.0.0.1"])
        deploy.create_operator_cert(certs / "ca.crt", certs / "ca.key", operator, "alice")
        for name in self.names:
            deploy.create_supernode_keys(keys, name)
        self.port, operator_port, superlink_port, tunnel_port = (flwr.free_port() for _ in range(4))
        self.address = f"127.0.0.1:{self.port}"
        self.database = work / "superlink" / "state.db"
        link = self.start("superlink", _cli("deploy", "superlink", "--certs", str(certs), "--database", str(self.database),
                                            "--host", "127.0.0.1", "--port", str(self.port), "--operator-port",
                                            str(operator_port), "--superlink-port", str(superlink_port)), work / "superlink")
        sampler.add_root(psutil.Process(link.pid))
        deploy.wait_healthy(self.address, ca=certs / "ca.crt", timeout=120, proc=link)
        self.cli_home = work / "cli"
        self.env = flwr.flower_env(self.cli_home)
        res = subprocess.run(_cli("deploy", "connection", "load", "--address", f"127.0.0.1:{operator_port}", "--ca",
                                  str(certs / "ca.crt"), "--operator-cert", str(operator / "alice.crt"), "--operator-key",
                                  str(operator / "alice.key"), "--tunnel-port", str(tunnel_port), "--default"),
                             env=self.env, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise SystemExit(f"load: deploy connection failed:\n{res.stdout}{res.stderr}")
        tunnel = self.start("tunnel", _cli("deploy", "tunnel", "load"), self.cli_home)
        sampler.add_root(psutil.Process(tunnel.pid))
        deploy.wait_healthy(f"127.0.0.1:{tunnel_port}", ca=certs / "ca.crt", timeout=60, proc=tunnel)
        for i, name in enumerate(self.names):
            res = flwr.flwr_cli(["supernode", "register", str(keys / f"{name}.pub"), "load"], env=self.env, cwd=work)
            if "registered successfully" not in res.stdout:
                raise SystemExit(f"load: registering {name} failed:\n{res.stdout}{res.stderr}")
            self.say(f"registered {i + 1}/{self.hospitals} hospitals", end="\r")
        self.say(f"registered {self.hospitals} hospitals")
        self.hospital_env = self.slot_env() if self.slots else None
        for i, name in enumerate(self.names):
            proc = self.start(name, _cli("deploy", "supernode", "--superlink", self.address, "--ca", str(certs / "ca.crt"),
                                         "--key", str(keys / f"{name}.key"), "--partition", f"{i}/{self.hospitals}",
                                         "--hospital", name, "--port", str(flwr.free_port()), "--launcher",
                                         self.launcher), work / f"sn-{name}", self.hospital_env)
            sampler.add_root(psutil.Process(proc.pid))
        deadline = time.monotonic() + 120 + 6 * self.hospitals
        while (online := len(flwr.online_nodes("load", env=self.env))) < self.hospitals:
            dead = [n for n in self.names if not self.procs[n].alive()]
            if dead or time.monotonic() > deadline:
                raise SystemExit(f"load: {online} of {self.hospitals} hospitals online; exited: {dead}\n"
                                 + (self.procs[dead[0]].log_tail() if dead else ""))
            self.say(f"online {online}/{self.hospitals}", end="\r")
            time.sleep(2)
        self.say(f"online {self.hospitals}/{self.hospitals}")

    def slot_env(self) -> dict[str, str]:
        """The hospitals' environment with the stand-in flwr-clientapp first on PATH (``--clientapp-slots``)."""
        shim_dir, locks = self.work / "clientapp-slots" / "bin", self.work / "clientapp-slots" / "locks"
        shim_dir.mkdir(parents=True)
        locks.mkdir()
        real = Path(sys.executable).parent / "flwr-clientapp"
        if not real.is_file():
            raise SystemExit(f"load: --clientapp-slots needs Flower's flwr-clientapp beside {sys.executable}")
        shim = shim_dir / "flwr-clientapp"
        shim.write_text(SLOT_SHIM.format(python=sys.executable, folder=str(locks), slots=self.slots, real=str(real)))
        shim.chmod(0o755)
        return {"PATH": os.pathsep.join([str(shim_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}

    def kill_group(self, name: str) -> None:
        """SIGKILL the hospital's whole process group (its supervisor, SuperNode, launcher and ClientApps)."""
        proc = self.procs[name]
        try:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.popen.wait(timeout=30)

    def restart(self, name: str, sampler: Sampler) -> None:
        cmd, home = self.commands[name]
        proc = self.start(name, cmd, home, self.hospital_env)
        sampler.add_root(psutil.Process(proc.pid))

    def stop(self) -> None:
        """Stop the run's supervisor, then every hospital at once, then the server side: one bound for all (35
        hospitals stopped one after another, each with its own 20 s bound, outlasted a benchmark's patience)."""
        from concurrent.futures import ThreadPoolExecutor

        server = [n for n in ("superlink", "tunnel") if n in self.procs]
        first = [n for n in self.procs if n not in server]
        for group in (first, server[::-1]):
            with ThreadPoolExecutor(max_workers=max(1, min(16, len(group)))) as pool:
                list(pool.map(self._stop_one, group))

    def _stop_one(self, name: str) -> None:
        proc = self.procs[name]
        try:
            proc.stop(timeout=20)
        except Exception as exc:  # noqa: BLE001 - one that will not stop must not keep the others running
            self.say(f"stopping {name}: {exc}; killing its process group")
            try:
                self.kill_group(name)
            except subprocess.TimeoutExpired:
                self.say(f"{name} outlived SIGKILL by 30 s; leaving it")


def run_one(hospitals: int, rounds: int, launcher: str, churn: bool, out: Path, say, slots: int = 0) -> dict:
    """Start the federation, run, measure, stop; the figures of one N."""
    churned = max(1, hospitals // 10) if churn else 0
    sampler = Sampler([])
    with tempfile.TemporaryDirectory(prefix=f"hospitrust-load-{hospitals}-") as tmp:
        work = Path(tmp)
        fed = Federation(work, hospitals, launcher, say, slots)
        started = time.monotonic()
        sampler.start()
        try:
            fed.up(sampler)
            up_seconds = time.monotonic() - started
            cpu_before = sampler.cpu_by_role()
            record, run_dir = work / "attempts.jsonl", work / "runs" / "load"
            config = (f'{RUN_CONFIG} reply-timeout={reply_timeout(hospitals, slots)} num-server-rounds={rounds} '
                      f'min-hospitals={hospitals - churned} '
                      f'output-dir="{work / "runs"}" run-name="load"')
            submitted = time.monotonic()
            supervisor = fed.start("run-supervisor", _cli("deploy", "run", str(REPO), "--connection", "load",
                                                          "--run-config", config, "--record", str(record), "--poll", "2",
                                                          "--attempts", "3"), fed.cli_home)
            sampler.add_root(psutil.Process(supervisor.pid))
            victims, killed_at, restarted = fed.names[-churned:] if churned else [], None, False
            # seconds from the kill until every churned hospital's new SuperNode was accepted by the SuperLink (its log's
            # "SuperNode ID:"; a count of online nodes would include the killed sessions until their heartbeats lapse)
            online_again: float | None = None
            shown, last_asked = 0, 0.0
            while supervisor.popen.poll() is None:
                progress = run_dir / "progress.jsonl"
                events = [json.loads(x) for x in progress.read_text().splitlines()] if progress.is_file() else []
                done = len((run_dir / "rounds.jsonl").read_text().splitlines()) if (run_dir / "rounds.jsonl").is_file() else 0
                replied = sum(1 for e in events if e.get("event") == "replied" and e.get("round") == done + 1)
                if done != shown or int(time.monotonic()) % 10 == 0:
                    say(f"round {min(done + 1, rounds)}/{rounds}: {replied}/{hospitals} replies, "
                        f"{time.monotonic() - submitted:.0f} s since submit", end="\r")
                    shown = done
                if victims and killed_at is None and any(e.get("event") == "asked" and e.get("round") == 2 for e in events):
                    for name in victims:
                        fed.kill_group(name)
                    killed_at = time.monotonic()
                    say(f"churn: killed {', '.join(victims)} (SIGKILL, whole process groups) in round 2")
                if killed_at is not None and not restarted and time.monotonic() - killed_at >= CHURN_RESTART_SECONDS:
                    for name in victims:
                        fed.restart(name, sampler)
                    restarted = True
                    say(f"churn: restarted {', '.join(victims)} {CHURN_RESTART_SECONDS:.0f} s later")
                if restarted and online_again is None and time.monotonic() - last_asked >= 5:
                    last_asked = time.monotonic()
                    if all(ACTIVATED in (work / "logs" / f"{name}.log").read_text(errors="replace") for name in victims):
                        online_again = time.monotonic() - cast(float, killed_at)
                        say(f"churn: the churned hospitals' SuperNodes accepted again {online_again:.0f} s after the kill")
                time.sleep(1)
            run_seconds = time.monotonic() - submitted
            attempts = [json.loads(x) for x in record.read_text().splitlines()] if record.is_file() else []
            sampler.stop()
            cpu_after = sampler.cpu_by_role()
            rounds_done = read_round_records(run_dir) if (run_dir / "rounds.jsonl").is_file() else []
            logs = sorted((work / "logs").glob("*.log"))
            hospital_cpu = sum(cpu_after.get(r, 0.0) - cpu_before.get(r, 0.0) for r in HOSPITAL_ROLES)
            result = {
                "hospitals": hospitals, "rounds": rounds, "launcher": launcher, "clientapp_slots": slots,
                "churned": victims,
                "status": attempts[-1]["status"] if attempts else f"no attempt recorded (exit {supervisor.popen.returncode})",
                "attempts": len(attempts), "startup_seconds": round(up_seconds, 1), "run_seconds": round(run_seconds, 1),
                "round_periods": [round(p, 2) for p in round_periods(rounds_done)] if rounds_done else [],
                "replies": replies(rounds_done),
                "peak_gb_by_role": {k: round(v, 3) for k, v in sorted(sampler.peak_role.items())},
                "peak_gb_per_process": {k: round(v, 3) for k, v in sorted(sampler.peak_process.items())},
                "peak_gb_total": round(sum(sampler.peak_role.values()), 2),
                "cpu_seconds_by_role": {k: round(cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0), 1)
                                        for k in sorted(cpu_after)},
                "cpu_seconds_per_hospital_round": round(hospital_cpu / max(1, hospitals * max(1, len(rounds_done))), 2),
                "database_mb": round(database_mb(fed.database), 1),
                "errors": {"superlink and gateway": error_lines([work / "logs" / "superlink.log"]),
                           "supernodes": error_lines([p for p in logs if p.stem.startswith("hospital-")])},
                "machine": {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / GB, 1)},
            }
            waits_log = work / "clientapp-slots" / "locks" / "waits.log"
            if waits_log.is_file():  # each ClientApp's wait for a slot, its task's heartbeat running meanwhile
                waits = [float(x) for x in waits_log.read_text().split()]
                result["clientapp_slot_waits"] = {"clientapps": len(waits), "mean_seconds": round(statistics.mean(waits), 1),
                                                  "max_seconds": round(max(waits), 1)} if waits else {"clientapps": 0}
            result["attempt_statuses"] = [f"{a.get('status')} ({a.get('details', '')})"[:300] for a in attempts]
            if result["status"] != deploy.COMPLETED or churn:  # what the operator would read: kept beside the figures
                kept = out / f"load-N{hospitals}{'-churn' if churn else ''}-logs"
                kept.mkdir(parents=True, exist_ok=True)
                for log in (work / "logs" / "superlink.log", work / "logs" / "run-supervisor.log", record,
                            run_dir / "server.log", *[work / "logs" / f"{name}.log" for name in victims]):
                    if log.is_file():
                        (kept / log.name).write_text(log.read_text(errors="replace")[-2_000_000:])
                result["logs_kept"] = str(kept)
            if churn:
                kill_round = 2
                back = {r["round"]: set(r["hospitals"]) & set(victims) for r in result["replies"]}
                refused = [name for name in victims if "Failed to activate SuperNode" in
                           (work / "logs" / f"{name}.log").read_text(errors="replace")]
                result["churn"] = {"killed_in_round": kill_round, "online_again_seconds_after_kill":
                                   None if online_again is None else round(online_again, 1),
                                   "refused_at_restart": refused,
                                   "missing": {r: sorted(set(victims) - h) for r, h in back.items() if r >= kill_round},
                                   "rejoined": sorted(set().union(*[h for r, h in back.items() if r > kill_round] or [set()]))}
            return result
        finally:
            if sampler.is_alive():
                sampler.stop_event.set()
            fed.stop()


def summary_line(r: dict) -> str:
    per_round = [x["train"] for x in r["replies"]]
    return (f"N={r['hospitals']:>3}  {r['status']:<20} rounds {' '.join(f'{p:.0f}' for p in r['round_periods']) or '-':<14} s  "
            f"train replies {per_round}  peak {r['peak_gb_total']:.1f} GB  CPU/hospital/round "
            f"{r['cpu_seconds_per_hospital_round']:.1f} s  db {r['database_mb']:.0f} MB  "
            f"errors {r['errors']['superlink and gateway']['count']} + {r['errors']['supernodes']['count']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--hospitals", default="5,10,20,35,50", help="the N to run, comma-separated (default 5,10,20,35,50)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launcher", choices=("flower", "warm"), default="flower")
    parser.add_argument("--clientapp-slots", type=int, default=0, metavar="K",
                        help="at most K ClientApps in flight on this machine, the rest queue (0: no limit; the "
                             "hospitals share one machine here: 50 at once would not fit)")
    parser.add_argument("--churn", action="store_true", help="kill 10%% of the hospitals in round 2, back 20 s later")
    parser.add_argument("--out", default=str(REPO / "runs" / "load"), help="where each N's figures go (resumable)")
    parser.add_argument("--fresh", action="store_true", help="run every N again, even those with figures in --out")
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.hospitals.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--hospitals {args.hospitals!r}: expected numbers separated by commas, e.g. 5,10,20")
    if not sizes or min(sizes) < 2:
        parser.error("--hospitals: every N must be at least 2")
    if args.clientapp_slots < 0:
        parser.error(f"--clientapp-slots {args.clientapp_slots}: expected 0 (no limit) or more")
    if args.churn and args.rounds < 3:
        parser.error("--churn needs at least 3 rounds (hospitals killed in round 2 rejoin in a later one)")
    flwr.stop_on_signals()  # a stopped benchmark stops every process it started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(text: str, end: str = "\n") -> None:
        print(f"\r[load] {text}" if sys.stdout.isatty() else f"[load] {text}", end=end if sys.stdout.isatty() else "\n",
              flush=True)

    measured = None
    for n in sorted(sizes):
        path = out / f"load-N{n}{'-churn' if args.churn else ''}{f'-slots{args.clientapp_slots}' if args.clientapp_slots else ''}.json"
        if path.is_file() and not args.fresh:
            result = json.loads(path.read_text())
            say(f"N={n}: done before ({path}); --fresh runs it again")
            print(summary_line(result), flush=True)
            measured = result if result["launcher"] == args.launcher else measured
            continue
        need, free = estimate_gb(n, args.launcher, measured, args.clientapp_slots), psutil.virtual_memory().available / GB
        if need > 0.9 * free:
            print(f"load: N={n} needs about {need:.1f} GB at its peak ({'measured at N=' + str(measured['hospitals']) if measured else 'estimated'}), "
                  f"and this machine has {free:.1f} GB available: not starting it (run a smaller N, --launcher flower, or "
                  f"--clientapp-slots K)",
                  file=sys.stderr)
            return 2
        say(f"N={n}: starting (about {need:.1f} GB at the peak, {free:.1f} GB available)")
        result = run_one(n, args.rounds, args.launcher, args.churn, out, say, args.clientapp_slots)
        path.write_text(json.dumps(result, indent=1))
        print(summary_line(result), flush=True)
        measured = result
    if len(sizes) > 1:
        tail = f"{'-churn' if args.churn else ''}{f'-slots{args.clientapp_slots}' if args.clientapp_slots else ''}"
        rows = [json.loads((out / f"load-N{n}{tail}.json").read_text()) for n in sorted(sizes)]
        first = rows[0]
        base = statistics.mean(first["round_periods"]) if first["round_periods"] else float("nan")
        for r in rows[1:]:
            if r["round_periods"] and base == base:
                print(f"N={r['hospitals']}: round period {statistics.mean(r['round_periods']) / base:.2f}x N={first['hospitals']}'s "
                      f"for {r['hospitals'] / first['hospitals']:.1f}x the hospitals")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The deployed federation the real-process tests share: a locked-down SuperLink on 127.0.0.1 started with
`hospitrust deploy superlink` (the SuperLink on a loopback port of its own, nginx publishing the Fleet API for
the hospitals and the Control API for operators), an operator's certificate and local tunnel
(`hospitrust deploy operator-cert / connection / tunnel`) through which every `flwr` call goes, and three
hospitals' SuperNodes with their own images in three formats (PNG class folders, a CSV manifest, DICOM),
exported from PneumoniaMNIST with `hospitrust task export`.

One federation serves the whole test session (`federation` fixture in conftest.py); a test that kills a
process restarts what it killed. Every process is started in its own session and killed (with its children)
at the end. Timeouts are generous: on a loaded 2-core machine one deployment phase can take a minute or more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from conftest import DATA_DIR, REPO
from hospitrust.ops import deploy, flwr
from hospitrust.cli.export import export

SUPERNODE_HEARTBEAT = Path(__file__).resolve().parent / "supernode_heartbeat"
RUN_TIMEOUT = float(os.environ.get("HOSPITRUST_TEST_RUN_TIMEOUT", "900"))
REPLY_TIMEOUT = float(os.environ.get("HOSPITRUST_TEST_REPLY_TIMEOUT", "300"))
# a ClientApp's task token lapses this long after its last beat (supernode_heartbeat/sitecustomize.py; Flower: 60 s)
TASK_TOKEN_LAPSE = float(os.environ.get("HOSPITRUST_TEST_TASK_TOKEN_LAPSE", "15"))
# the task and the server's sets come from the export (task.file, server-data.*): no dataset flag
QUICK = "batch-size=32 local-epochs=2 train.class-weighted-loss=true"
EXPORT = dict(formats=["png", "csv", "dicom"], hospitals=3, test_fraction=0.3,
              overrides={"partitioner": "iid", "seed": 42, "train-subsample": 0.1})
# the run the real federation is compared with (hospital-1 sends NaN: a red team's node, malicious = true)
HTA_RUN = 'strategy="hta" attack="nan-update"'
# its rounds (and those of the runs stopped or crashed and resumed to its model): one before the break, one after
HTA_ROUNDS = 2


def flwr_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    # three hospitals share this machine's cores: one torch thread each, as simulation gives each one CPU
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "HOSPITRUST_DATA_DIR": str(DATA_DIR), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra or {})}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # flower-supernode's heartbeat at 10 s (the folder's sitecustomize.py says why, and that nothing else changes)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPERNODE_HEARTBEAT), env.get("PYTHONPATH", "")) if p)
    return env


# what a SuperNode logs once it is done with a message it pulled (sent, or dropped for a run no longer running)
_MESSAGE_DONE = ("Sent successfully", "Ignoring reply message", "Ignoring message", "Failed to send message",
                 "Failed to receive message", "The message will not be processed")
HOSPITALS = ("st-mary", "hospital-1", "hospital-2")


class Federation:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.commands: dict[str, tuple[list[str], Path]] = {}
        self.restarted: list[str] = []  # "name (why)" for every SuperNode restarted between runs
        self.node_ids: dict[str, str] = {}  # hospital -> its SuperNode's node id (fixed by its registered key)

    def start(self, name: str, cmd: list[str], home: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        self.commands[name] = (cmd, home)
        log = self.work / f"{name}.log"
        if log.exists():  # a restart: keep the earlier process's log beside the new one
            log.rename(self.work / f"{name}.{sum(1 for r in self.restarted if r.startswith(name + ' '))}.log")
        proc = flwr.start(name, cmd, env=flwr_env(home, env), cwd=cwd or self.work, log_file=log)  # stopped with its children
        self.procs[name], self.logs[name] = proc, log
        return proc.popen

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        self.procs[name].stop(sig)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):  # the hospitals first, the SuperLink last
            try:
                self.kill(name, signal.SIGTERM)
            except Exception:  # keep killing the others
                pass

    def flwr(self, *args: str, timeout: float = 180, home: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=flwr_env(home or self.cli_home), cwd=self.work, capture_output=True, text=True,
                              timeout=timeout)

    def tail(self, name: str, n: int = 3000) -> str:
        return f"--- {name} ---\n" + self.logs[name].read_text()[-n:]

    def busy(self) -> list[str]:
        """SuperNodes (alive) still working on a message they pulled.

        A SuperNode handles one message at a time and pulls the next only after the reply is out,
        so a stopped run's ClientApp still training holds the next run's messages back."""
        out = []
        for name in HOSPITALS:
            if name in self.procs and self.procs[name].popen.poll() is None:
                text = self.logs[name].read_text(errors="replace")
                # the current session only: the supervisor restarts a killed SuperNode into the same log
                text = text[text.rfind("SuperNode ID:") + 1:] if "SuperNode ID:" in text else text
                if text.count("Receiving:") > sum(text.count(m) for m in _MESSAGE_DONE):
                    out.append(name)
        return out

    def unavailable(self) -> dict[str, str]:
        """SuperNodes a run could not use: the process is gone, or the SuperLink lists its node offline."""
        online = {n["node-id"] for n in deploy.online_nodes("tls", env=flwr_env(self.cli_home))}
        if not online:  # one failed `flwr supernode list` must not read as every node offline
            time.sleep(2)
            online = {n["node-id"] for n in deploy.online_nodes("tls", env=flwr_env(self.cli_home))}
        out = {}
        for name in HOSPITALS:
            if name not in self.procs:
                continue
            if (rc := self.procs[name].popen.poll()) is not None:
                out[name] = f"exited with {rc}"
            elif self.node_ids.get(name) not in online:
                out[name] = "alive but offline at the SuperLink"
        return out

    def wait_idle(self, timeout: float = 240) -> None:
        """Before a run starts: every SuperNode done with earlier runs' messages, alive and online.

        Flower 1.42's SuperNode waits forever for the reply of a ClientApp that failed before it read
        its message (e.g. its run was stopped meanwhile); a SuperNode whose heartbeat stopped stays
        listed offline though its process runs. Either is restarted, as an operator would, and the
        restart is recorded in ``self.restarted`` (the old log is kept as ``<name>.<k>.log``)."""
        deadline = time.monotonic() + timeout
        while (stuck := self.busy()) and time.monotonic() < deadline:
            time.sleep(0.5)  # three log files read: cheap
        restart = {name: "stuck on an earlier run's message" for name in stuck} | self.unavailable()
        for name, why in restart.items():
            self.kill(name)
            self.start(name, *self.commands[name])
            self.restarted.append(f"{name} ({why})")
        if restart:
            self.wait_online(list(HOSPITALS))

    def wait_online(self, names: list[str], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        count = len(names)
        while len(deploy.online_nodes("tls", env=flwr_env(self.cli_home))) < count:
            for name in names:
                assert self.procs[name].popen.poll() is None, self.tail(name)
            assert time.monotonic() < deadline, f"{count} SuperNodes not online in {timeout:.0f} s\n" + self.tail("superlink")
            time.sleep(0.5)  # asked in this process (Flower's Control API client): a few milliseconds a time

    def wait_connected(self, name: str, sessions: int = 1, timeout: float = 240) -> None:
        """Wait until SuperNode ``name``'s current log shows ``sessions`` sessions the SuperLink accepted.

        Counting online nodes is not enough after a restart with the same key: the SuperLink lists the old
        session as online until its heartbeats lapse, and refuses the new one until then."""
        deadline = time.monotonic() + timeout
        while self.logs[name].read_text(errors="replace").count("SuperNode ID:") < sessions:
            assert self.procs[name].popen.poll() is None, self.tail(name)
            assert time.monotonic() < deadline, f"{name}: {sessions} accepted sessions not reached in {timeout:.0f} s\n" + self.tail(name)
            time.sleep(1)

    def diagnostics(self, run_dir: Path | None = None) -> str:
        """SuperNode log tails (and the run's rounds.jsonl) for an assertion message."""
        parts = [f"restarted SuperNodes: {self.restarted}"]
        if run_dir is not None and (run_dir / "rounds.jsonl").is_file():
            parts.append("--- rounds.jsonl ---\n" + (run_dir / "rounds.jsonl").read_text()[-4000:])
        parts += [self.tail(name, 1500) for name in HOSPITALS if name in self.logs]
        parts.append(self.tail("superlink", 1500))
        return "\n".join(parts)

    def submit(self, run_config: str, app: Path | None = None) -> int:
        """``flwr run APP tls --run-config ...`` in this process (``flwr.start_run``: Flower's bundle builder and its
        StartRun through the operator's connection, no `flwr` process); the `flwr run` command itself is played by
        test_control_plane and the paused-ClientApps scenario."""
        self.wait_idle()
        return flwr.start_run(app or self.app, "tls", run_config=run_config, env=flwr_env(self.cli_home))

    def wait(self, run_id: int, timeout: float = RUN_TIMEOUT) -> tuple[str, str]:
        """Until the run has finished: its status as `flwr ls` gives it (what the tests assert), asked every second
        in this process (``deploy.run_status``: Flower's Control API client, no `flwr` process)."""
        env, deadline = flwr_env(self.cli_home), time.monotonic() + timeout
        status, details = "unknown", ""
        while time.monotonic() < deadline:
            status, details = deploy.run_status(run_id, "tls", env=env)
            if status.startswith("finished"):
                return status, details
            time.sleep(1.0)
        self.flwr("stop", str(run_id), "tls")
        return "timeout", f"still {status} after {timeout:.0f} s"

    def wait_for(self, done, run_id: int, what: str, timeout: float = RUN_TIMEOUT) -> None:
        """Until ``done()`` (checked every 0.2 s); fails if the run finishes first (its status asked every second)
        or after ``timeout`` seconds."""
        env, deadline, asked_at = flwr_env(self.cli_home), time.monotonic() + timeout, -1e9
        while not done():
            assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s\n" + self.run_log(run_id)
            if time.monotonic() - asked_at >= 1.0:
                asked_at = time.monotonic()
                status, details = deploy.run_status(run_id, "tls", env=env)
                if status.startswith("finished") and not done():
                    raise AssertionError(f"the run ended before {what}: {status}: {details}\n{self.run_log(run_id)}")
            time.sleep(0.2)

    def run_log(self, run_id: int) -> str:
        return self.flwr("log", str(run_id), "tls", "--show").stdout[-6000:]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hospitrust.cli.main", *args]


def start_federation(work: Path):
    """Generator: the started federation, stopped when the generator is closed (the conftest fixture)."""
    fed = Federation(work)
    certs, keys, operator = work / "certs", work / "keys", work / "operator"
    deploy.create_ca(certs)
    deploy.create_server_cert(certs / "ca.crt", certs / "ca.key", certs, ["127.0.0.1"])
    deploy.create_operator_cert(certs / "ca.crt", certs / "ca.key", operator, "alice")
    deploy.create_ca(work / "other-ca")  # a CA the SuperLink's certificate is not signed by
    for name in ("st-mary", "hospital-1", "hospital-2", "rogue"):
        deploy.create_supernode_keys(keys, name)
    fed.certs, fed.keys, fed.operator = certs, keys, operator
    fed.app = flwr.stage_app(REPO, work / "app")  # the app bundle every run sends, built without the clone's .venv
    fixed = bool(os.environ.get("HOSPITRUST_TEST_FIXED_PORT"))
    fed.port = deploy.DEFAULT_PORT if fixed else free_port()
    fed.operator_port, fed.superlink_port, tunnel_port = (9095, 9092, 9096) if fixed else (free_port(), free_port(), free_port())
    fed.address = f"127.0.0.1:{fed.port}"  # what hospitals reach: the gateway's Fleet listener
    fed.operator_address = f"127.0.0.1:{fed.operator_port}"
    try:
        # the operator: the locked-down SuperLink, exactly as docs/deployment.md starts it
        fed.start("superlink", _cli("deploy", "superlink", "--certs", str(certs), "--database", str(work / "superlink" / "state.db"),
                                    "--host", "127.0.0.1", "--port", str(fed.port), "--operator-port", str(fed.operator_port),
                                    "--superlink-port", str(fed.superlink_port)), work / "superlink")
        # while it starts (about 3 s): the operator's machine, whose connection goes through the local tunnel holding
        # alice's certificate, and three hospitals' own images, in three formats, and the operator's test set and
        # cohort, exported in this process
        fed.cli_home = work / "cli"
        res = subprocess.run(_cli("deploy", "connection", "tls", "--address", fed.operator_address, "--ca", str(certs / "ca.crt"),
                                  "--operator-cert", str(operator / "alice.crt"), "--operator-key", str(operator / "alice.key"),
                                  "--tunnel-port", str(tunnel_port), "--default"),
                             env=flwr_env(fed.cli_home), capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        os.environ.setdefault("HOSPITRUST_DATA_DIR", str(DATA_DIR))
        fed.export = export("pneumoniamnist", work / "export", **EXPORT)
        deploy.wait_healthy(fed.address, ca=certs / "ca.crt", timeout=120, proc=fed.procs["superlink"])
        fed.start("tunnel", _cli("deploy", "tunnel", "tls"), fed.cli_home, env={"FLWR_HOME": str(fed.cli_home)})
        deploy.wait_healthy(f"127.0.0.1:{tunnel_port}", ca=certs / "ca.crt", timeout=60, proc=fed.procs["tunnel"])
        # what `flwr supernode register KEY.pub tls` does for each hospital, in this process (Flower's key loader and
        # RegisterNode through the operator's connection: a `flwr` process costs about 1.3 s); test_control_plane plays
        # the command itself
        from flwr.cli.supernode.register import try_load_public_key
        from flwr.proto.control_pb2 import RegisterNodeRequest

        with flwr.control_client("tls", flwr_env(fed.cli_home)) as client:
            for name in HOSPITALS:
                registered = client.RegisterNode(RegisterNodeRequest(public_key=try_load_public_key(keys / f"{name}.pub")))
                assert registered.node_id, f"{name}'s SuperNode was not registered"
                fed.node_ids[name] = str(registered.node_id)
        # every hospital starts through `hospitrust deploy supernode`: its data checked against the task file, then
        # its SuperNode with the warm ClientApp launcher and the watchdog. st-mary: PNG folders; hospital-1: a CSV
        # manifest (and a red team's node: it attacks in runs with an attack configured); hospital-2: DICOM
        for name, key in (("st-mary", 0), ("hospital-1", 1), ("hospital-2", 2)):
            fed.start(name, supernode_cli(fed, name, fed.export[f"hospital-{key}"], *(["--malicious"] if key == 1 else [])),
                      work / f"sn-{name}")
        fed.arrays = export("pneumoniamnist", work / "export-npz", **{**EXPORT, "formats": ["npz"]})  # the same images
        fed.wait_online(list(HOSPITALS))
        yield fed
    finally:
        fed.stop_all()


def supernode_cli(fed: Federation, name: str, data: Path, *extra: str) -> list[str]:
    """``hospitrust deploy supernode`` for hospital ``name`` (key ``name.key``), as a hospital starts it."""
    return [sys.executable, "-m", "hospitrust.cli.main", "deploy", "supernode", "--superlink", fed.address,
            "--ca", str(fed.certs / "ca.crt"), "--key", str(fed.keys / f"{name}.key"), "--data-path", str(data),
            "--task", str(fed.export["task"]), "--hospital", name, "--cache-dir", str(fed.work / "cache" / name),
            "--port", str(free_port()), *extra]


def free_port() -> int:
    return flwr.free_port()


def task_keys(fed: Federation, cohort: bool = True, test: bool = True) -> str:
    """The run config keys of the consortium's own task: its task file and the server's own sets."""
    out = f'task.file="{fed.export["task"]}"'
    if test:
        out += f' server-data.test-path="{fed.export["test"]}"'
    if cohort:
        out += f' server-data.cohort-path="{fed.export["cohort"]}"'
    return out + f' server-data.cache-dir="{fed.work / "cache" / "server"}"'


def run_config(fed: Federation, name: str, extra: str = "", reply_timeout: float = REPLY_TIMEOUT, rounds: int = 3) -> str:
    return (f'num-server-rounds={rounds} {QUICK} reply-timeout={reply_timeout} output-dir="{fed.work / "runs"}" '
            f'run-name="{name}" {extra}').strip()




def superlinks(wrapper: psutil.Process) -> list[psutil.Process]:
    """The `deploy superlink` wrapper's live flower-superlink children."""
    out = []
    for p in wrapper.children():
        try:
            # Flower's script, run by hospitrust.supervision.superlink_main (python -m it MILLISECONDS script ...)
            if any("flower-superlink" in a for a in p.cmdline()[:5]) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:  # exited
            pass
    return out

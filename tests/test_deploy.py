"""A real deployment on 127.0.0.1: SuperLink with TLS and SuperNode authentication, three
hospitals' SuperNodes with their own images in three formats (PNG class folders, a CSV manifest,
DICOM), exported from PneumoniaMNIST with `hospitrust task export`; a task file and the
operator's own test set and reference cohort; `flwr run` with no dataset flag.

One federation (module fixture) serves every test; the test that kills a SuperNode runs
last. Every process is started in its own session and killed (with its children) at the end.
Timeouts are generous: on a loaded 2-core machine one deployment phase (a fresh
`flwr-clientapp` process per message, importing torch) can take a minute or more.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA_DIR, REPO
from hospitrust.ops import deploy, flwr
from hospitrust.tasks.export import export

pytestmark = [pytest.mark.slow, pytest.mark.data]

RUN_TIMEOUT = float(os.environ.get("HOSPITRUST_TEST_RUN_TIMEOUT", "900"))
REPLY_TIMEOUT = float(os.environ.get("HOSPITRUST_TEST_REPLY_TIMEOUT", "300"))
# the task and the server's sets come from the export (task.file, server-data.*): no dataset flag
QUICK = "batch-size=32 local-epochs=2 train.class-weighted-loss=true"
EXPORT = dict(formats=["png", "csv", "dicom"], hospitals=3, test_fraction=0.3,
              overrides={"partitioner": "iid", "seed": 42, "train-subsample": 0.1})
# the run the real federation is compared with (hospital-1 sends NaN: a red team's node, malicious = true)
HTA_RUN = 'strategy="hta" attack="nan-update"'


def _env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    # three hospitals share this machine's cores: one torch thread each, as simulation gives each one CPU
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               HOSPITRUST_DATA_DIR=str(DATA_DIR), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(extra or {}))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
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

    def start(self, name: str, cmd: list[str], home: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        self.commands[name] = (cmd, home)
        log = self.work / f"{name}.log"
        if log.exists():  # a restart: keep the earlier process's log beside the new one
            log.rename(self.work / f"{name}.{sum(1 for r in self.restarted if r.startswith(name + ' '))}.log")
        proc = flwr.start(name, cmd, env=_env(home, env), cwd=self.work, log_file=log)  # stopped with its children
        self.procs[name], self.logs[name] = proc, log
        return proc.popen

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        self.procs[name].stop(sig)

    def stop_all(self) -> None:
        for name in list(self.procs):
            try:
                self.kill(name, signal.SIGTERM)
            except Exception:  # keep killing the others
                pass

    def flwr(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=_env(self.cli_home), cwd=self.work, capture_output=True, text=True,
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
                if text.count("Receiving:") > sum(text.count(m) for m in _MESSAGE_DONE):
                    out.append(name)
        return out

    def unavailable(self) -> dict[str, str]:
        """SuperNodes a run could not use: the process is gone, or the SuperLink lists its node offline."""
        online = {n["node-id"] for n in deploy.online_nodes("tls", env=_env(self.cli_home))}
        if not online:  # one failed `flwr supernode list` must not read as every node offline
            time.sleep(2)
            online = {n["node-id"] for n in deploy.online_nodes("tls", env=_env(self.cli_home))}
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
            time.sleep(2)
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
        while len(deploy.online_nodes("tls", env=_env(self.cli_home))) < count:
            for name in names:
                assert self.procs[name].popen.poll() is None, self.tail(name)
            assert time.monotonic() < deadline, f"{count} SuperNodes not online in {timeout:.0f} s\n" + self.tail("superlink")
            time.sleep(2)

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

    def submit(self, run_config: str) -> int:
        self.wait_idle()
        res = self.flwr("run", str(REPO), "tls", "--run-config", run_config, "--format", "json")
        assert res.returncode == 0, res.stdout + res.stderr
        return int(json.loads(res.stdout)["run-id"])

    def wait(self, run_id: int, timeout: float = RUN_TIMEOUT) -> tuple[str, str]:
        status, details = deploy.wait_for_run(run_id, "tls", timeout, env=_env(self.cli_home), poll=3)
        if status == "timeout":
            self.flwr("stop", str(run_id), "tls")
        return status, details

    def run_log(self, run_id: int) -> str:
        return self.flwr("log", str(run_id), "tls", "--show").stdout[-6000:]


@pytest.fixture(scope="module")
def federation(tmp_path_factory, _medmnist_problem):
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    work = tmp_path_factory.mktemp("deploy")
    fed = Federation(work)
    certs, keys = work / "certs", work / "keys"
    deploy.create_ca(certs)
    deploy.create_server_cert(certs / "ca.crt", certs / "ca.key", certs, ["127.0.0.1", "localhost"])
    deploy.create_ca(work / "other-ca")  # a CA the SuperLink's certificate is not signed by
    for name in ("st-mary", "hospital-1", "hospital-2", "rogue"):
        deploy.create_supernode_keys(keys, name)
    fed.certs, fed.keys = certs, keys
    fed.port = deploy.DEFAULT_PORT if os.environ.get("HOSPITRUST_TEST_FIXED_PORT") else _free_port()
    fed.address = f"127.0.0.1:{fed.port}"
    try:
        cmd = deploy.superlink_command(ca=certs / "ca.crt", cert=certs / "server.pem", key=certs / "server.key",
                                       database=work / "superlink" / "state.db", host="127.0.0.1", port=fed.port)
        fed.start("superlink", cmd, work / "superlink")
        deploy.wait_healthy(fed.address, ca=certs / "ca.crt", timeout=120, proc=fed.procs["superlink"])

        fed.cli_home = work / "cli"
        deploy.write_connection("tls", fed.address, certs / "ca.crt", make_default=True, home=fed.cli_home)
        for name in ("st-mary", "hospital-1", "hospital-2"):
            res = fed.flwr("supernode", "register", str(keys / f"{name}.pub"), "tls")
            assert res.returncode == 0 and "registered successfully" in res.stdout, res.stdout + res.stderr
            fed.node_ids[name] = re.search(r"SuperNode (\d+) registered", res.stdout).group(1)

        # three hospitals' own images, in three formats, and the operator's test set and cohort
        os.environ.setdefault("HOSPITRUST_DATA_DIR", str(DATA_DIR))
        fed.export = export("pneumoniamnist", work / "export", **EXPORT)
        fed.arrays = export("pneumoniamnist", work / "export-npz", **{**EXPORT, "formats": ["npz"]})  # the same images
        # every hospital starts through `hospitrust deploy supernode`: its data checked against the task file, then
        # its SuperNode with the warm ClientApp launcher and the watchdog. st-mary: PNG folders; hospital-1: a CSV
        # manifest (and a red team's node: it attacks in runs with an attack configured); hospital-2: DICOM
        for name, key in (("st-mary", 0), ("hospital-1", 1), ("hospital-2", 2)):
            fed.start(name, supernode_cli(fed, name, fed.export[f"hospital-{key}"], *(["--malicious"] if key == 1 else [])),
                      work / f"sn-{name}")
        fed.wait_online(list(HOSPITALS))
        yield fed
    finally:
        fed.stop_all()


def supernode_cli(fed: Federation, name: str, data: Path, *extra: str) -> list[str]:
    """``hospitrust deploy supernode`` for hospital ``name`` (key ``name.key``), as a hospital starts it."""
    return [sys.executable, "-m", "hospitrust.ops.cli", "deploy", "supernode", "--superlink", fed.address,
            "--ca", str(fed.certs / "ca.crt"), "--key", str(fed.keys / f"{name}.key"), "--data-path", str(data),
            "--task", str(fed.export["task"]), "--hospital", name, "--cache-dir", str(fed.work / "cache" / name),
            "--port", str(_free_port()), *extra]


def _free_port() -> int:
    return flwr.free_port()


def _task(fed: Federation, cohort: bool = True, test: bool = True) -> str:
    """The run config keys of the consortium's own task: its task file and the server's own sets."""
    out = f'task.file="{fed.export["task"]}"'
    if test:
        out += f' server-data.test-path="{fed.export["test"]}"'
    if cohort:
        out += f' server-data.cohort-path="{fed.export["cohort"]}"'
    return out + f' server-data.cache-dir="{fed.work / "cache" / "server"}"'


def _run_config(fed: Federation, name: str, extra: str = "", reply_timeout: float = REPLY_TIMEOUT, rounds: int = 3) -> str:
    return (f'num-server-rounds={rounds} {QUICK} reply-timeout={reply_timeout} output-dir="{fed.work / "runs"}" '
            f'run-name="{name}" {extra}').strip()


def test_own_task_in_three_formats_matches_the_inprocess_run_and_a_nan_hospital_is_rejected(federation):
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.ops.simulate import parse_overrides

    fed = federation
    extra = f"{HTA_RUN} {_task(fed)}"
    run_id = fed.submit(_run_config(fed, "nan", extra))
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail('st-mary')}"
    run_dir = fed.work / "runs" / "nan"
    for name in ("summary.json", "rounds.jsonl", "config.json", "model.pt", "class_counts.csv"):
        assert (run_dir / name).is_file(), name
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        by = {c["hospital"]: c for c in r["clients"]}
        assert set(by) == {"st-mary", "hospital-1", "hospital-2"}, by.keys()
        assert by["hospital-1"]["rejected"] and "NaN" in by["hospital-1"]["reason"]
        assert not by["st-mary"]["rejected"] and not by["hospital-2"]["rejected"]
        assert r["missing"] == [] and r["evaluation"] == "central"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["hospitals"] == 3 and summary["rounds"] == 3 and summary["task"] == "pneumoniamnist-export"
    config = json.loads((run_dir / "config.json").read_text())
    assert {h: d["format"] for h, d in config["hospital-data"].items()} == {
        "st-mary": "folder (png)", "hospital-1": "csv (png)", "hospital-2": "folder (dicom)"}
    assert config["test-set"].startswith(str(fed.export["test"])) and config["reference-cohort-size"] == 40
    log = fed.run_log(run_id)
    assert "task pneumoniamnist-export" in log and "partitioner" not in log, log
    # the data check ran, against the task file, before the hospital's SuperNode started
    assert "OK: ready to join the federation" in fed.logs["st-mary"].read_text()

    # the same run in process, each hospital's same images from a .npz archive
    values = parse_overrides([_run_config(fed, "nan-inprocess", extra)])
    run_inprocess({**values, "output-dir": str(fed.work / "runs-inprocess")}, 3, node_configs=[
        {"data-path": str(fed.arrays["hospital-0"]), "hospital": "st-mary", "cache-dir": str(fed.work / "cache" / "ip")},
        {"data-path": str(fed.arrays["hospital-1"]), "hospital": "hospital-1", "malicious": True,
         "cache-dir": str(fed.work / "cache" / "ip")},
        {"data-path": str(fed.arrays["hospital-2"]), "hospital": "hospital-2", "cache-dir": str(fed.work / "cache" / "ip")},
    ])
    inprocess = json.loads((fed.work / "runs-inprocess" / "nan-inprocess" / "summary.json").read_text())
    deployed, local = summary["final"]["balanced_accuracy"], inprocess["final"]["balanced_accuracy"]
    assert abs(deployed - local) <= 0.01, (deployed, local)
    assert deployed > 0.6, deployed  # it learned something: the comparison is not of two untrained models


def test_a_rule_that_needs_a_cohort_refuses_a_run_without_one(federation):
    fed = federation
    run_id = fed.submit(_run_config(fed, "no-cohort", f'strategy="hta" {_task(fed, cohort=False)}'))
    status, details = fed.wait(run_id)
    log = fed.run_log(run_id)
    assert status == "finished:failed", f"{status}: {details}\n{log}"
    assert "needs the server's reference cohort" in log and "server-data.cohort-path" in log, log
    assert "hta.validation-exponent = 0" in log, log
    assert not (fed.work / "runs" / "no-cohort" / "rounds.jsonl").exists()  # refused before any round


def _model_hash(path: Path) -> str:
    import hashlib

    import torch

    state, h = torch.load(path), hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def test_a_stopped_run_resumes_and_ends_with_the_unbroken_runs_model(federation):
    from hospitrust.server_app.checkpoint import load_checkpoint

    fed = federation
    extra = f"{HTA_RUN} {_task(fed)}"  # the first test's run: its model is the unbroken one
    reference = fed.work / "runs" / "nan" / "model.pt"
    if not reference.is_file():  # that test was deselected: run it unbroken here
        assert fed.wait(fed.submit(_run_config(fed, "nan", extra)))[0] == deploy.COMPLETED
    run_dir = fed.work / "runs" / "resume"
    run_id = fed.submit(_run_config(fed, "resume", extra))
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (run_dir / "checkpoint.pt").is_file():  # round 1 done
        assert time.monotonic() < deadline, fed.run_log(run_id)
        time.sleep(1)
    res = fed.flwr("stop", str(run_id), "tls")
    assert res.returncode == 0, res.stdout + res.stderr
    assert fed.wait(run_id)[0] == "finished:stopped"
    assert not (run_dir / "summary.json").exists()
    stopped_after = load_checkpoint(run_dir)["round"]
    assert stopped_after == 1

    # operator: the same run config plus resume-from; it waits for the stopped ServerApp to let go
    resumed = fed.submit(_run_config(fed, "resume", f'{extra} resume-from="{run_dir}"'))
    status, details = fed.wait(resumed)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(resumed)}"
    assert _model_hash(run_dir / "model.pt") == _model_hash(reference), (
        "--- the unbroken run's rounds.jsonl ---\n" + (reference.parent / "rounds.jsonl").read_text()[-4000:] + "\n"
        + fed.diagnostics(run_dir))
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert json.loads((run_dir / "summary.json").read_text())["resumed_at"] == [1]


def test_the_watchdog_restarts_a_supernode_whose_clientapp_died_or_hung_and_the_run_completes(federation):
    """hospital-2's launcher is told to fail twice: its 2nd ClientApp exits before reading its message (Flower's
    SuperNode would wait for that reply forever), and after the restart its 2nd ClientApp hangs. The watchdog
    restarts the SuperNode each time, and the run completes with hospital-2 back in it.
    """
    fed = federation
    name = "hospital-2"
    fed.kill(name, signal.SIGTERM)  # the supervisor stops its SuperNode gracefully
    fed.restarted.append(f"{name} (fault injection)")
    cmd = supernode_cli(fed, name, fed.export["hospital-2"], "--message-timeout", "8")
    fed.start(name, cmd, fed.work / f"sn-{name}", env={"HOSPITRUST_LAUNCHER_FAULT": "die-before-read@2,hang@2/1"})
    try:
        fed.wait_connected(name)
        fed.wait_online(list(HOSPITALS))
        # 4 rounds: the hang is hospital-2's 2nd message after its first restart, round 3's at the latest
        # on a loaded machine (the SuperLink's redelivery of the unanswered message can come too late), so
        # a round after it is left to come back in
        run_id = fed.submit(_run_config(fed, "watchdog", f"min-hospitals=2 {_task(fed)}", reply_timeout=25, rounds=4))
        status, details = fed.wait(run_id)
        assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(name)}"
        log = fed.logs[name].read_text()
        restarts = [line for line in log.splitlines() if "hospitrust watchdog: restarting" in line]
        assert len(restarts) == 2, fed.tail(name, 6000)
        assert "ended with exit code 17" in restarts[0] and "while the SuperNode waited for its reply" in restarts[0]
        assert "in flight for" in restarts[1] and "bound 8 s" in restarts[1]
        rounds = [json.loads(line) for line in (fed.work / "runs" / "watchdog" / "rounds.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rounds] == [1, 2, 3, 4]
        # the SuperLink delivers the unanswered message again to the restarted SuperNode: hospital-2 answers
        # within the round (or, if the restart took longer than reply-timeout, is recorded missing)
        assert log.count("Receiving: train message") >= 4 or any(name in r["missing"] for r in rounds), (
            fed.diagnostics(fed.work / "runs" / "watchdog"))

        # and it comes back by itself: by the last round it trains, or (restarted while the round was sampled,
        # so recorded offline for its training) answers the round's evaluation; on a loaded machine the run
        # can end first (the SuperLink refuses the restarted SuperNode until its old session's heartbeats
        # lapse), and then the SuperLink must accept its third session (the first, and one per restart)
        last = rounds[-1]
        back = {c["hospital"] for c in last["clients"] if not c.get("rejected")} | set(last.get("hospital_accuracy", {}))
        if name not in back:
            fed.wait_connected(name, sessions=3)
    finally:  # the later tests get hospital-2 without faults, and connected (not its old session)
        fed.kill(name, signal.SIGTERM)
        fed.restarted.append(f"{name} (after fault injection)")
        fed.start(name, supernode_cli(fed, name, fed.export["hospital-2"]), fed.work / f"sn-{name}")
        fed.wait_connected(name)
        fed.wait_online(list(HOSPITALS))


def test_unregistered_supernode_is_refused(federation):
    fed = federation
    cmd = deploy.supernode_command(superlink=fed.address, ca=fed.certs / "ca.crt", key=fed.keys / "rogue.key",
                                   node_config={"partition-id": 0, "num-partitions": 3}, port=_free_port(), max_retries=1,
                                   max_wait_time=30)
    proc = fed.start("rogue", cmd, fed.work / "sn-rogue")
    try:
        rc = proc.wait(timeout=180)
    finally:
        fed.kill("rogue")
    log = fed.logs["rogue"].read_text()
    # Flower's exit code 305 is printed; the process itself exits 1
    assert rc != 0 and "Failed to activate SuperNode" in log and "305" in log, fed.tail("rogue")
    assert len(deploy.online_nodes("tls", env=_env(fed.cli_home))) == 3


def test_a_client_without_the_federation_ca_cannot_connect(federation):
    fed = federation
    # the flwr CLI with another CA's certificate
    other_home = fed.work / "cli-other-ca"
    deploy.write_connection("tls", fed.address, fed.work / "other-ca" / "ca.crt", make_default=True, home=other_home)
    res = subprocess.run(["flwr", "ls", "tls", "--format", "json"], env=_env(other_home), cwd=fed.work,
                         capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0 or '"success": false' in out, out
    assert "runs" not in json.loads(res.stdout or "{}") if res.stdout.strip().startswith("{") else True
    # a registered SuperNode that trusts another CA never gets online and gives up
    cmd = deploy.supernode_command(superlink=fed.address, ca=fed.work / "other-ca" / "ca.crt",
                                   key=fed.keys / "hospital-2.key", node_config={"partition-id": 2, "num-partitions": 3},
                                   port=_free_port(), max_retries=1, max_wait_time=20)
    proc = fed.start("wrong-ca", cmd, fed.work / "sn-wrong-ca")
    try:
        rc = proc.wait(timeout=180)
    finally:
        fed.kill("wrong-ca")
    assert rc != 0, fed.tail("wrong-ca")
    assert "CERTIFICATE_VERIFY_FAILED" in fed.logs["wrong-ca"].read_text() or "certificate" in fed.logs["wrong-ca"].read_text().lower()


def test_a_supernode_killed_mid_run_is_recorded_and_the_run_completes_with_federated_evaluation(federation):
    fed = federation
    fed.wait_connected("hospital-2")  # its current session, not one the SuperLink still lists from a restart
    fed.wait_online(list(HOSPITALS))
    # no test set and no cohort: FedAvg, evaluated on the hospitals' held-out images
    run_id = fed.submit(_run_config(fed, "killed", f"min-hospitals=2 {_task(fed, cohort=False, test=False)}", rounds=2))
    config = fed.work / "runs" / "killed" / "config.json"  # written right after the query round
    deadline = time.monotonic() + RUN_TIMEOUT
    while not config.is_file():
        assert time.monotonic() < deadline, "the run never got past its query round\n" + fed.run_log(run_id)
        status, details = deploy.run_status(run_id, "tls", env=_env(fed.cli_home))
        assert not status.startswith("finished"), f"{status}: {details}\n{fed.run_log(run_id)}"
        time.sleep(1)
    fed.kill("hospital-2")
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}"
    rounds = [json.loads(line) for line in (fed.work / "runs" / "killed" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    first = rounds[0]
    by = {c["hospital"]: c for c in first["clients"]}
    # asked and never answered; or, once the SuperLink has missed its heartbeats, listed offline and not asked
    assert "hospital-2" in first["missing"] + first["offline"], (
        f"missing={first['missing']}; offline={first['offline']}; hospital-2's entry: {by.get('hospital-2')}; "
        f"asked={first['asked']}\n" + fed.diagnostics(fed.work / "runs" / "killed"))
    for r in rounds:
        assert "hospital-2" in r["missing"] + r["offline"], fed.diagnostics(fed.work / "runs" / "killed")
        valid = {c["hospital"] for c in r["clients"] if not c.get("rejected")}
        assert valid == {"st-mary", "hospital-1"}, fed.diagnostics(fed.work / "runs" / "killed")
        assert not r["kept_previous_model"]
        assert r["evaluation"] == "federated" and 0.0 <= r["central"]["balanced_accuracy"] <= 1.0
        # pooled over the hospitals that answered: st-mary's and hospital-1's held-out images
        assert set(r["hospital_accuracy"]) == {"st-mary", "hospital-1"} and r["central"]["num_examples"] > 0
    assert json.loads((fed.work / "runs" / "killed" / "summary.json").read_text())["evaluation"] == "federated"

"""A federation that runs unattended, on the shared deployed federation (tests/federation.py: TLS, SuperNode
authentication, the locked-down SuperLink): a hospital's supervisor killed with SIGKILL leaves no Flower process
behind and its restart joins the same run; a `flower-supernode` killed alone is restarted by its supervisor and
the hospital is back within two rounds; `hospitrust deploy hospitals` names the federation's hospitals.
Each test leaves the hospitals as it found them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from federation import HOSPITALS, flwr_env, run_config, task_keys
from hospitrust.ops import deploy

pytestmark = [pytest.mark.slow, pytest.mark.data]

REPLY_TIMEOUT = 25  # a round waits this long for a hospital whose message died with its SuperNode


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def _left_behind(key: str, port: str) -> list[str]:
    """Processes whose command line carries the hospital's key or its Runtime API port: its SuperNode, its
    launcher and the ClientApps forked from it."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        text = " ".join(cmd)
        if key in text or f"127.0.0.1:{port}" in text or ("--port" in cmd and port in cmd):
            out.append(f"{p.pid}: {text[:200]}")
    return out


def _wait_round_one(fed, run_id: int, run_dir: Path) -> None:
    """Until the query round is over (config.json written): round 1's messages are out."""
    fed.wait_for((run_dir / "config.json").is_file, run_id, "the end of the query round")


def _rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def _answered(record: dict) -> set[str]:
    """Hospitals with a valid reply in the round: a training update, or the round's evaluation."""
    return {c["hospital"] for c in record["clients"] if not c.get("rejected")} | set(record.get("hospital_accuracy", {}))


def _restore(fed, name: str) -> None:
    """The hospital as the federation started it, connected."""
    if fed.procs[name].popen.poll() is None:
        return
    fed.restarted.append(f"{name} (restored after a test)")
    fed.start(name, *fed.commands[name])
    fed.wait_connected(name)
    fed.wait_online(list(HOSPITALS))


def test_a_killed_supervisor_leaves_no_flower_process_and_its_restart_joins_the_same_run(federation):
    fed, name = federation, "st-mary"
    cmd = fed.commands[name][0]
    key, port = _flag(cmd, "--key"), _flag(cmd, "--port")
    run_dir = fed.work / "runs" / "orphans"
    run_id = fed.submit(run_config(fed, "orphans", f"min-hospitals=2 {task_keys(fed)}", reply_timeout=REPLY_TIMEOUT,
                                   rounds=2))
    try:
        _wait_round_one(fed, run_id, run_dir)
        supervisor = fed.procs[name].popen
        assert [p for p in psutil.Process(supervisor.pid).children(recursive=True)
                if any(a.endswith("flower-supernode") for a in p.cmdline())], "no flower-supernode under the supervisor"
        os.kill(supervisor.pid, signal.SIGKILL)  # the supervisor alone: what it started must go by itself
        supervisor.wait(30)
        deadline = time.monotonic() + 30
        while (left := _left_behind(key, port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"left behind by the killed supervisor: {left}\n{fed.tail(name)}"
        killed_after = round(30 - (deadline - time.monotonic()), 1)

        # the hospital restarts it, as systemd would: same command, same key, same port (free again)
        fed.restarted.append(f"{name} (supervisor killed)")
        fed.start(name, *fed.commands[name])
        status, details = fed.wait(run_id)
        assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(name)}"
        rounds = _rounds(run_dir)
        assert [r["round"] for r in rounds] == [1, 2]
        # killed as round 1 began: back by the last round (it trains in it, or answers its evaluation)
        assert name in _answered(rounds[-1]), f"gone {killed_after} s after the kill; not back\n" + fed.diagnostics(run_dir)
        assert "already in use" not in fed.logs[name].read_text(), fed.tail(name)
    finally:
        _restore(fed, name)


def test_a_killed_flower_supernode_is_restarted_by_its_supervisor_and_back_within_two_rounds(federation):
    fed, name = federation, "hospital-2"
    fed.wait_connected(name)
    run_dir = fed.work / "runs" / "respawn"
    run_id = fed.submit(run_config(fed, "respawn", f"min-hospitals=2 {task_keys(fed)}", reply_timeout=REPLY_TIMEOUT))
    supervisor = fed.procs[name].popen
    try:
        _wait_round_one(fed, run_id, run_dir)
        supernodes = [p for p in psutil.Process(supervisor.pid).children(recursive=True)
                      if any(a.endswith("flower-supernode") for a in p.cmdline())]
        assert len(supernodes) == 1, supernodes
        supernodes[0].kill()
        status, details = fed.wait(run_id)
        assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(name)}"
        assert supervisor.poll() is None  # the supervisor stayed; it restarted flower-supernode itself
        log = fed.logs[name].read_text()
        assert "flower-supernode was killed by signal 9: restarting it with the same key" in log, fed.tail(name)
        assert "deactivated at the SuperLink" in log, fed.tail(name)
        assert "\x1b[" not in log  # no colour codes in the log file
        rounds = _rounds(run_dir)
        assert [r["round"] for r in rounds] == [1, 2, 3]
        # killed during round 1: back by round 3 at the latest
        assert name in _answered(rounds[2]), fed.diagnostics(run_dir)
    finally:
        if supervisor.poll() is not None:
            _restore(fed, name)
        else:
            fed.wait_connected(name, sessions=2)


def test_deploy_hospitals_names_the_federations_hospitals_with_their_data_and_runs(federation):
    fed = federation
    runs = fed.work / "runs"
    if not list(runs.glob("*/config.json")):  # the tests above were deselected: one short run
        assert fed.wait(fed.submit(run_config(fed, "one", task_keys(fed), rounds=1)))[0] == deploy.COMPLETED
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "hospitals", "--connection", "tls",
                          "--runs-dir", str(runs), "--format", "json"], env=flwr_env(fed.cli_home), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["hospital"]: r for r in json.loads(res.stdout)["hospitals"]}
    assert set(HOSPITALS) <= set(rows), rows.keys()
    for name in HOSPITALS:
        assert rows[name]["node-id"] == fed.node_ids[name] and rows[name]["status"] == "online", rows[name]
        assert rows[name]["last-seen"].startswith("now") and rows[name]["runs"], rows[name]
        assert 0 < sum(rows[name]["train-class-counts"]) + sum(rows[name]["val-class-counts"]) <= rows[name]["images"]
    assert rows["st-mary"]["data-format"] == "folder (png)" and rows["hospital-2"]["data-format"] == "folder (dicom)"
    assert rows["hospital-1"]["data-format"] == "csv (png)"
    table = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "hospitals", "--connection", "tls",
                            "--runs-dir", str(runs)], env=flwr_env(fed.cli_home), capture_output=True, text=True,
                           timeout=120)
    assert table.returncode == 0 and "st-mary: took part in" in table.stdout, table.stdout + table.stderr
    (fed.work / "deploy-hospitals.txt").write_text(table.stdout)  # what docs/operators.md shows


def _cmdline(proc: psutil.Process) -> list[str]:
    """A process's command line, empty if it exited while we looked."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _ppid(proc: psutil.Process) -> int:
    try:
        return proc.ppid()
    except psutil.Error:
        return -1


def test_a_hospital_online_that_never_answers_is_recorded_unresponsive(federation):
    """(d) hospital-1's launcher is frozen (SIGSTOP): its SuperNode keeps its heartbeats, so the SuperLink lists it
    online, but no ClientApp ever answers. The query round records it `unresponsive`, and the run goes on."""
    fed = federation
    fed.wait_idle()
    # the launcher, not the ClientApps it forks (they carry its command line); one that is still exiting after
    # an earlier run (seen beside a busy second xdist worker) is waited for
    deadline = time.monotonic() + 60
    while True:
        children = psutil.Process(fed.procs["hospital-1"].pid).children(recursive=True)
        matches = [p for p in children if "hospitrust.supervision.launcher" in " ".join(_cmdline(p))]
        launcher = [p for p in matches if _ppid(p) not in {q.pid for q in matches}]
        if len(launcher) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(launcher) == 1, [(p.pid, _ppid(p), _cmdline(p)) for p in matches]
    run_dir = fed.work / "runs" / "unresponsive"
    launcher[0].suspend()
    try:
        run_id = fed.submit(run_config(fed, "unresponsive", f"min-hospitals=2 {task_keys(fed)}", reply_timeout=REPLY_TIMEOUT,
                                       rounds=1))
        status, details = fed.wait(run_id)
    finally:
        launcher[0].resume()
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}"
    config = json.loads((run_dir / "config.json").read_text())
    (entry,) = config["failed-hospitals"]
    assert entry["node_id"] == int(fed.node_ids["hospital-1"]) and entry["reason"].startswith("unresponsive: online"), entry
    assert "unresponsive" in fed.run_log(run_id)
    assert _answered(_rounds(run_dir)[0]) == {"st-mary", "hospital-2"}
    assert json.loads((run_dir / "summary.json").read_text())["failed_hospitals"] == [entry]


def _launcher_of(fed, name: str) -> psutil.Process:
    """Hospital ``name``'s ClientApp launcher (not a ClientApp forked from it: they carry its command line)."""
    deadline = time.monotonic() + 60
    while True:
        children = psutil.Process(fed.procs[name].pid).children(recursive=True)
        matches = [p for p in children if "hospitrust.supervision.launcher" in " ".join(_cmdline(p))]
        launcher = [p for p in matches if _ppid(p) not in {q.pid for q in matches}]
        if len(launcher) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(launcher) == 1, [(p.pid, _ppid(p), _cmdline(p)) for p in matches]
    return launcher[0]


TOKEN_LAPSE = 65  # Flower 1.42 drops a task's token 60 s (2 x 30 s) after its last heartbeat


def test_a_clientapp_paused_past_its_token_leaves_its_hospital_healed_within_a_minute_of_the_resume(federation):
    """Issue 47's recipe without the SuperLink kill: hospital-2's round-1 ClientApp is paused (SIGSTOP) past Flower's
    task heartbeat (60 s), as one in flight across a SuperLink crash is, then resumed: Flower refuses its token and
    it exits 0. Within a minute of the resume its SuperNode is free again: Flower's own error reply for a lapsed task
    whose message it had pulled went out, or (its message not pulled yet: no reply ever) the watchdog restarted it.
    The next run, which needs all three hospitals, gets hospital-2's answers, without the fixture's own restart."""
    fed, name = federation, "hospital-2"
    run_dir = fed.work / "runs" / "paused"
    run_id = fed.submit(run_config(fed, "paused", f"min-hospitals=2 {task_keys(fed)}", reply_timeout=REPLY_TIMEOUT,
                                   rounds=1))
    _wait_round_one(fed, run_id, run_dir)
    launcher, queried = _launcher_of(fed, name), (run_dir / "config.json").stat().st_mtime
    deadline = time.monotonic() + 120
    while not (clientapps := [p for p in launcher.children() if p.create_time() > queried
                              and p.status() != psutil.STATUS_ZOMBIE]):
        assert time.monotonic() < deadline, "hospital-2's round-1 ClientApp never started\n" + fed.tail(name)
        time.sleep(0.2)
    for p in clientapps:
        p.suspend()
    try:
        time.sleep(TOKEN_LAPSE)
    finally:
        for p in clientapps:
            with contextlib.suppress(psutil.NoSuchProcess):  # gone with a restart of its SuperNode meanwhile
                p.resume()
    resumed = time.monotonic()
    while name in fed.busy():  # its current session still has a message without its reply
        assert time.monotonic() - resumed < 60, "not healed within 60 s of the resume\n" + fed.tail(name)
        time.sleep(0.5)
    healed_after = time.monotonic() - resumed
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}"
    restarted = list(fed.restarted)
    res = fed.flwr("run", str(fed.app), "tls", "--run-config",
                   run_config(fed, "after-pause", f"min-hospitals=3 {task_keys(fed)}", reply_timeout=REPLY_TIMEOUT,
                              rounds=1), "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    after = int(json.loads(res.stdout)["run-id"])
    status, details = fed.wait(after)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(after)}\n{fed.tail(name)}"
    assert fed.restarted == restarted
    assert name in _answered(_rounds(fed.work / "runs" / "after-pause")[0]), (
        f"free {healed_after:.0f} s after the resume, yet silent\n" + fed.diagnostics(fed.work / "runs" / "after-pause"))

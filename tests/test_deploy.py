"""A real deployment on 127.0.0.1 (tests/federation.py, shared by the session): a locked-down SuperLink with
TLS and SuperNode authentication, three hospitals' SuperNodes with their own images in three formats; a
task file and the operator's own test set and reference cohort; `flwr run` with no dataset flag, through
the operator's tunnel. The test that kills a SuperNode runs last.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest

from federation import HOSPITALS, HTA_ROUNDS, HTA_RUN, RUN_TIMEOUT, flwr_env, free_port, run_config, supernode_cli, task_keys
from hospitrust.ops import deploy
from hospitrust.server_app.results import read_round_records

pytestmark = [pytest.mark.slow, pytest.mark.data]


def test_own_task_in_three_formats_matches_the_inprocess_run_and_a_nan_hospital_is_rejected(federation):
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.ops.simulate import parse_overrides

    fed = federation
    extra = f"{HTA_RUN} {task_keys(fed)}"
    run_id = fed.submit(run_config(fed, "nan", extra, rounds=HTA_ROUNDS))
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail('st-mary')}"
    run_dir = fed.work / "runs" / "nan"
    for name in ("summary.json", "rounds.jsonl", "config.json", "model.pt", "class_counts.csv"):
        assert (run_dir / name).is_file(), name
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == list(range(1, HTA_ROUNDS + 1))
    for r in rounds:
        by = {c.hospital: c for c in r.clients}
        assert set(by) == {"st-mary", "hospital-1", "hospital-2"}, by.keys()
        assert by["hospital-1"].rejected and "NaN" in by["hospital-1"].reason
        assert not by["st-mary"].rejected and not by["hospital-2"].rejected
        assert r.missing == [] and r.evaluation == "central"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["hospitals"] == 3 and summary["rounds"] == HTA_ROUNDS and summary["task"] == "pneumoniamnist-export"
    config = json.loads((run_dir / "config.json").read_text())
    assert {h: d["format"] for h, d in config["hospital-data"].items()} == {
        "st-mary": "folder (png)", "hospital-1": "csv (png)", "hospital-2": "folder (dicom)"}
    assert config["test-set"].startswith(str(fed.export["test"])) and config["reference-cohort-size"] == 40
    log = fed.run_log(run_id)
    assert "task pneumoniamnist-export" in log and "partitioner" not in log, log
    # the data check ran, against the task file, before the hospital's SuperNode started
    assert "OK: ready to join the federation" in fed.logs["st-mary"].read_text()

    # the same run in process, each hospital's same images from a .npz archive
    values = parse_overrides([run_config(fed, "nan-inprocess", extra, rounds=HTA_ROUNDS)])
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
    run_id = fed.submit(run_config(fed, "no-cohort", f'strategy="hta" {task_keys(fed, cohort=False)}'))
    status, details = fed.wait(run_id)
    log = fed.run_log(run_id)
    assert status == "finished:failed", f"{status}: {details}\n{log}"
    assert "needs the server's reference cohort" in log and "server-data.cohort-path" in log, log
    assert "hta.validation-exponent = 0" in log, log
    assert not (fed.work / "runs" / "no-cohort" / "rounds.jsonl").exists()  # refused before any round


def test_a_secure_aggregation_run_scores_every_hospital_while_the_server_holds_only_their_sum(federation):
    """SecAgg+ through the deployed SuperNodes (their gates, the warm ClientApp launcher): each hospital's update is
    masked, the server sums them and still scores each hospital's contribution (FP, EE: docs/config.md, contribution.*)."""
    fed = federation
    run_id = fed.submit(run_config(fed, "secagg", f"secagg.enabled=true contribution-scoring.enabled=true "
                                                  f"{task_keys(fed)}", rounds=1))
    status, details = fed.wait(run_id)
    log = fed.run_log(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{log}\n{fed.diagnostics()}"
    assert "Secure aggregation completed" in log, log
    run_dir = fed.work / "runs" / "secagg"
    [r] = read_round_records(run_dir)
    assert {c.hospital for c in r.clients} == set(HOSPITALS)
    assert all(c.signals["secagg"]["secure_aggregation"] for c in r.clients), r.clients
    scores = r.entries["contribution"]
    assert scores["scored"] and set(scores["hospitals"]) == set(HOSPITALS), scores
    assert all(math.isfinite(v["fp"]) and math.isfinite(v["ee"]) for v in scores["hospitals"].values()), scores
    assert (run_dir / "contribution_ledger.csv").is_file()


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
    extra = f"{HTA_RUN} {task_keys(fed)}"  # the first test's run: its model is the unbroken one
    reference = fed.work / "runs" / "nan" / "model.pt"
    if not reference.is_file():  # that test was deselected: run it unbroken here
        assert fed.wait(fed.submit(run_config(fed, "nan", extra, rounds=HTA_ROUNDS)))[0] == deploy.COMPLETED
    run_dir = fed.work / "runs" / "resume"
    run_id = fed.submit(run_config(fed, "resume", extra, rounds=HTA_ROUNDS))
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
    resumed = fed.submit(run_config(fed, "resume", f'{extra} resume-from="{run_dir}"', rounds=HTA_ROUNDS))
    status, details = fed.wait(resumed)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(resumed)}"
    assert _model_hash(run_dir / "model.pt") == _model_hash(reference), (
        "--- the unbroken run's rounds.jsonl ---\n" + (reference.parent / "rounds.jsonl").read_text()[-4000:] + "\n"
        + fed.diagnostics(run_dir))
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == list(range(1, HTA_ROUNDS + 1))
    assert json.loads((run_dir / "summary.json").read_text())["resumed_at"] == [1]


def test_the_watchdog_restarts_a_supernode_whose_clientapp_died_or_hung_and_the_run_completes(federation):
    """hospital-2's launcher is told to fail twice: its 2nd ClientApp exits 0 before reading its message, as one
    whose task token Flower refused after a SuperLink crash does (Flower's SuperNode would wait for that reply
    forever, online, never pulling again; before issue 47 an exit 0 was not watched), and after the restart its
    2nd ClientApp hangs. The watchdog
    restarts the SuperNode each time, and the run completes with hospital-2 back in it.
    """
    fed = federation
    name = "hospital-2"
    fed.kill(name, signal.SIGTERM)  # the supervisor stops its SuperNode gracefully
    fed.restarted.append(f"{name} (fault injection)")
    cmd = supernode_cli(fed, name, fed.export["hospital-2"], "--message-timeout", "8")
    fed.start(name, cmd, fed.work / f"sn-{name}", env={"HOSPITRUST_LAUNCHER_FAULT": "exit-0-before-read@2,hang@2/1"})
    try:
        fed.wait_connected(name)
        fed.wait_online(list(HOSPITALS))
        # 4 rounds: the hang is hospital-2's 2nd message after its first restart, round 3's at the latest
        # on a loaded machine, so a round after it is left to come back in
        run_id = fed.submit(run_config(fed, "watchdog", f"min-hospitals=2 {task_keys(fed)}", reply_timeout=25, rounds=4))
        status, details = fed.wait(run_id)
        assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(name)}"
        log = fed.logs[name].read_text()
        restarts = [line for line in log.splitlines() if "hospitrust watchdog: restarting" in line]
        # what no load can produce: the injected death is the first restart, and the injected hang is caught by
        # the bound. A loaded machine can also push a healthy message past 8 s: one more restart, not a failure
        assert len(restarts) >= 2, fed.tail(name, 6000)
        assert "ended with exit code 0" in restarts[0] and "its message is still open" in restarts[0], restarts[0]
        assert any("in flight for" in r and "bound 8 s" in r for r in restarts[1:]), restarts
        rounds = read_round_records(fed.work / "runs" / "watchdog")
        assert [r.number for r in rounds] == [1, 2, 3, 4]
        # the message the restarted SuperNode had pulled is lost with it (Flower does not deliver a pulled message
        # twice): hospital-2 is recorded missing in that round
        assert any(name in r.missing for r in rounds), fed.diagnostics(fed.work / "runs" / "watchdog")

        # and it comes back by itself: by the last round it trains, or (restarted while the round was sampled,
        # so recorded offline for its training) answers the round's evaluation; on a loaded machine the run
        # can end first (the SuperLink refuses the restarted SuperNode until its old session's heartbeats
        # lapse), and then the SuperLink must accept its third session (the first, and one per restart)
        last = rounds[-1]
        back = {c.hospital for c in last.clients if not c.rejected} | set(last.hospital_accuracy)
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
                                   node_config={"partition-id": 0, "num-partitions": 3}, port=free_port(), max_retries=1,
                                   max_wait_time=30)
    proc = fed.start("rogue", cmd, fed.work / "sn-rogue")
    try:
        rc = proc.wait(timeout=180)
    finally:
        fed.kill("rogue")
    log = fed.logs["rogue"].read_text()
    # Flower's exit code 305 is printed; the process itself exits 1
    assert rc != 0 and "Failed to activate SuperNode" in log and "305" in log, fed.tail("rogue")
    assert len(deploy.online_nodes("tls", env=flwr_env(fed.cli_home))) == 3


def test_a_client_without_the_federation_ca_cannot_connect(federation):
    fed = federation
    # the flwr CLI with another CA's certificate
    other_home = fed.work / "cli-other-ca"
    deploy.write_connection("tls", fed.address, fed.work / "other-ca" / "ca.crt", make_default=True, home=other_home)
    res = subprocess.run(["flwr", "ls", "tls", "--format", "json"], env=flwr_env(other_home), cwd=fed.work,
                         capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0 or '"success": false' in out, out
    assert "runs" not in json.loads(res.stdout or "{}") if res.stdout.strip().startswith("{") else True
    # a registered SuperNode that trusts another CA never gets online and gives up
    cmd = deploy.supernode_command(superlink=fed.address, ca=fed.work / "other-ca" / "ca.crt",
                                   key=fed.keys / "hospital-2.key", node_config={"partition-id": 2, "num-partitions": 3},
                                   port=free_port(), max_retries=1, max_wait_time=20)
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
    run_id = fed.submit(run_config(fed, "killed", f"min-hospitals=2 {task_keys(fed, cohort=False, test=False)}", rounds=2))
    config = fed.work / "runs" / "killed" / "config.json"  # written right after the query round
    fed.wait_for(config.is_file, run_id, "the end of the query round")
    fed.kill("hospital-2")
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}"
    rounds = read_round_records(fed.work / "runs" / "killed")
    assert [r.number for r in rounds] == [1, 2]
    first = rounds[0]
    # asked and never answered; or, once the SuperLink has missed its heartbeats, listed offline and not asked
    assert "hospital-2" in first.missing + first.offline, (
        f"missing={first.missing}; offline={first.offline}; hospital-2's entry: {first.client('hospital-2')}; "
        f"asked={first.asked}\n" + fed.diagnostics(fed.work / "runs" / "killed"))
    if "hospital-2" in first.missing:  # asked, then killed: Flower answers for it once it is offline
        assert first.node_unavailable == ["hospital-2"] and first.unresponsive == [], (
            f"{first.node_unavailable=} {first.unresponsive=}\n" + fed.diagnostics(fed.work / "runs" / "killed"))
    for r in rounds:
        assert "hospital-2" in r.missing + r.offline, fed.diagnostics(fed.work / "runs" / "killed")
        valid = {c.hospital for c in r.clients if not c.rejected}
        assert valid == {"st-mary", "hospital-1"}, fed.diagnostics(fed.work / "runs" / "killed")
        assert not r.kept_previous_model
        assert r.evaluation == "federated" and 0.0 <= r.central["balanced_accuracy"] <= 1.0
        # pooled over the hospitals that answered: st-mary's and hospital-1's held-out images
        assert set(r.hospital_accuracy) == {"st-mary", "hospital-1"} and r.central["num_examples"] > 0
    assert json.loads((fed.work / "runs" / "killed" / "summary.json").read_text())["evaluation"] == "federated"

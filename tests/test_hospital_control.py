"""A hospital decides which code runs on its machine and what leaves it, in the session's real federation
(TLS, SuperNode authentication, the warm launcher): hospital-2 restarts with an approvals file, a trusted
signer, a site policy and an audit log; the operator sends it bundles it did and did not approve.

Each run is one round on the tiny export; the bundles differ from the approved one by one line, which
writes a file in the importing SuperNode's FLWR_HOME: the file shows whose ClientApp imported the bundle, and
holds every value of the ClientApp's environment that names one of the gate's files (none should).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from federation import run_config, supernode_cli, task_keys
from hospitrust.ops import deploy
from hospitrust.ops.deploy import approval, audit, gate

pytestmark = [pytest.mark.slow, pytest.mark.data]
NAME = "hospital-2"
MARK = "imported-by-bundle"
SIDE_EFFECT = ('import os as _os; open(_os.path.join(_os.environ.get("FLWR_HOME", "."), "{mark}"), "a").write("".join('
               'f"{{_k}}={{_v}}\\n" for _k, _v in _os.environ.items() if "gate" in _v or _k.startswith("HOSPITRUST_")))'
               '  # {tag}\n')


def _variant(fed, tag: str) -> Path:
    """The federation's app with one line added to the ClientApp package: an import side effect."""
    dst = fed.work / f"app-{tag}"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(fed.app, dst)
    init = dst / "hospitrust" / "client_app" / "__init__.py"
    init.write_text(init.read_text() + SIDE_EFFECT.format(mark=MARK, tag=tag))
    return dst


@pytest.fixture(scope="module")
def guarded(federation):
    """hospital-2 restarted with its gate; restored to the plain SuperNode afterwards."""
    fed = federation
    gate = fed.work / "gate"
    gate.mkdir(exist_ok=True)
    store = approval.Approvals(gate / "approved-apps.toml")
    store.approve(approval.build_fab(fed.app), by="security-officer", comment="the consortium's release")
    key, pub, key_id = approval.create_signing_key(gate, "release")
    (gate / "policy.toml").write_text("max-local-epochs = 2\nallow-attacks = false\n")
    extra = ["--approved-apps", str(store.path), "--trusted-signers", str(pub), "--policy", str(gate / "policy.toml"),
             "--audit-log", str(gate / "audit.jsonl")]
    fed.kill(NAME, signal.SIGTERM)
    fed.restarted.append(f"{NAME} (with its gate)")
    fed.start(NAME, supernode_cli(fed, NAME, fed.export[NAME], *extra), fed.work / f"sn-{NAME}")
    fed.wait_connected(NAME)
    fed.wait_online(list(fed.node_ids))
    fed.gate = {"store": store, "key": key, "key_id": key_id, "audit": gate / "audit.jsonl"}
    try:
        yield fed
    finally:
        fed.kill(NAME, signal.SIGTERM)
        fed.restarted.append(f"{NAME} (without its gate)")
        fed.start(NAME, supernode_cli(fed, NAME, fed.export[NAME]), fed.work / f"sn-{NAME}")
        fed.wait_connected(NAME)


def _run(fed, name: str, app: Path, extra: str = "", keys: bool = True) -> tuple[dict, list[dict]]:
    config = run_config(fed, name, f"{task_keys(fed) if keys else ''} {extra}", rounds=1)
    if "local-epochs=" in extra:  # flwr refuses a key given twice: the federation's default gives way
        config = config.replace("local-epochs=2 ", "", 1)
    run_id = fed.submit(config, app=app)
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(NAME)}"
    run_dir = fed.work / "runs" / name
    config = json.loads((run_dir / "config.json").read_text())
    return config, [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def _trained(rounds: list[dict]) -> set[str]:
    return {c["hospital"] for c in rounds[0]["clients"] if not c.get("rejected")}


def test_an_unapproved_bundle_is_refused_unimported_then_approved_signed_or_refused_by_policy(guarded):
    fed = guarded
    marks = {h: fed.work / f"sn-{h}" / MARK for h in ("st-mary", NAME)}
    for m in marks.values():
        m.unlink(missing_ok=True)

    # (a) one line differs from the approved bundle: hospital-2 refuses it, before any of its code is imported
    changed = _variant(fed, "one-line")
    sha = approval.fab_sha256(approval.build_fab(changed))
    config, rounds = _run(fed, "gate-unapproved", changed)
    refused = {f["hospital"]: f["reason"] for f in config["failed-hospitals"]}
    assert refused == {NAME: f"refused: app not approved (sha256 {sha})"}, config["failed-hospitals"]
    assert _trained(rounds) == {"st-mary", "hospital-1"}
    assert marks["st-mary"].exists() and not marks[NAME].exists()  # the others imported it; hospital-2 did not
    log = fed.logs[NAME].read_text()
    assert f"hospitrust gate: refused: app not approved (sha256 {sha})" in log and "hospitrust app review" in log

    # (b) the security officer reviews and approves the bundle the gate kept; the same run trains there
    pending = fed.gate["store"].bundles / "pending" / f"{sha}.fab"
    review = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "app", "review", str(pending), "--approvals",
                             str(fed.gate["store"].path)], capture_output=True, text=True, timeout=60)
    assert review.returncode == 0 and "+import os as _os" in review.stdout, review.stdout + review.stderr
    fed.gate["store"].approve(pending.read_bytes(), by="security-officer")
    config, rounds = _run(fed, "gate-approved", changed)
    assert config["failed-hospitals"] == [] and NAME in _trained(rounds)
    assert marks[NAME].exists()
    # the approved bundle's code ran without the gate's paths: no approvals, signers, policy, audit log or key
    seen = marks[NAME].read_text()
    assert str(fed.work / "gate") not in seen and not any(name in seen for name in gate.PRIVATE_ENV), seen

    # (c) a bundle nobody approved, signed by the trusted key, runs: hospital-2 answers its query (the bundle's
    # import side effect happens there) ... (d) ... and, asked for more local epochs than its policy allows, refuses
    # to train, which the server records as the policy's refusal (within the policy it trained: (b))
    signed = _variant(fed, "signed-release")
    content = approval.build_fab(signed)
    good = approval.sign(content, fed.gate["key"], fed.gate["key_id"])
    marks[NAME].unlink()
    config, rounds = _run(fed, "gate-signed-policy", signed, f'app-signature="{good}" local-epochs=3')
    assert config["failed-hospitals"] == [] and marks[NAME].exists()
    entry = next(c for c in rounds[0]["clients"] if c["hospital"] == NAME)
    assert entry["rejected"] and entry["reason"] == "refused by site policy: max-local-epochs: 3 > 2", entry
    # the same bundle with a signature by a key hospital-2 does not trust is refused before it runs
    stranger_key, _, stranger_id = approval.create_signing_key(fed.work / "gate-stranger", "stranger")
    bad = approval.sign(content, stranger_key, stranger_id)
    config, rounds = _run(fed, "gate-wrong-signature", signed, f'app-signature="{bad}"')
    assert [(f["hospital"], f["reason"]) for f in config["failed-hospitals"]] == [
        (NAME, f"refused: app signed by an untrusted key ({stranger_id})")]

    # (e) hospital-2's audit log, written by its launcher, verifies; an edited entry, a cut end are found
    audit_log = fed.gate["audit"]
    for _ in range(100):  # the launcher writes an entry when its ClientApp has exited, just after the reply
        entries, problem = audit.verify(audit_log)
        if any(e.get("reason") == f"refused: app signed by an untrusted key ({stranger_id})" for e in entries):
            break
        time.sleep(0.1)
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "audit", str(audit_log)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "every entry's MAC and the head verify" in res.stdout, res.stdout + res.stderr
    superlink = fed.work / "superlink"  # and the operator's side: the SuperLink's state, the gateway's access log
    state = [superlink / "state.db", superlink / "state.db-wal", superlink / "state.db-shm", superlink / "gateway" / "access.log"]
    for path in (audit_log, audit.head_path(audit_log), audit.key_path(audit_log), *state):
        assert path.stat().st_mode & 0o777 == 0o600, path
    lines = audit_log.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert {e["decision"] for e in entries} == {"accepted", "refused"}
    assert any(e["decision"] == "refused" and e["app_sha256"] == sha for e in entries)
    trains = [e for e in entries if e["message"] == "train" and e["decision"] == "accepted"]
    assert trains and all(set(e["reply_claimed_by_app"]) >= {"arrays", "metrics"} and e["exit"] == 0 for e in trains)
    assert not any(str(fed.export[NAME]) in line for line in lines)  # no path of the hospital's data
    edited = json.loads(lines[2])
    edited["decision"] = "accepted" if edited["decision"] == "refused" else "refused"
    audit_log.write_text("\n".join([*lines[:2], json.dumps(edited, sort_keys=True), *lines[3:]]) + "\n")
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "audit", str(audit_log), "--quiet"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "entry 3: its MAC does not verify" in res.stderr, res.stdout + res.stderr
    audit_log.write_text("\n".join(lines[:-1]) + "\n")  # the last entry, a refusal, cut
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "audit", str(audit_log), "--quiet"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and f"entry {len(lines)}: missing" in res.stderr, res.stdout + res.stderr
    audit_log.write_text("\n".join(lines) + "\n")  # restored for the fixture's next tests


POLICY = "max-local-epochs = 2\nallow-attacks = false\n"  # the guarded fixture's policy, restored after each test


def test_the_image_limit_is_checked_against_the_images_the_hospital_trains_on(guarded):
    """Finding 1: max-images-per-round = 50 with train-subsample = 0.02 was accepted (the policy scaled this hospital's
    count by train-subsample, which its own data ignores) and it trained on every image. Now the gate counts what the
    ClientApp will use: local epochs x its data check's images, whatever train-subsample says."""
    fed = guarded
    policy = fed.work / "gate" / "policy.toml"
    images = sum(1 for p in Path(fed.export[NAME]).rglob("*") if p.is_file() and p.suffix.lower() == ".dcm")
    assert images * 2 * 0.02 < 50 < images * 2  # the old rule accepted this run, the new one refuses it
    policy.write_text(POLICY + "max-images-per-round = 50\n")
    try:
        config, rounds = _run(fed, "gate-images", fed.app, "train-subsample=0.02")
    finally:
        policy.write_text(POLICY)
    assert config["failed-hospitals"] == []  # it answered the query: the rule is about training
    entry = next(c for c in rounds[0]["clients"] if c["hospital"] == NAME)
    assert entry["rejected"] and entry["reason"] == (
        f"refused by site policy: max-images-per-round: 2 epochs x {images} images = {2 * images} > 50"), entry
    assert _trained(rounds) == {"st-mary", "hospital-1"}
    # the gate's resolved values are in the audit entry of every message it decided
    def refusals():  # the launcher writes an entry when the child has exited, just after its reply
        return [e for e in map(json.loads, fed.gate["audit"].read_text().splitlines())
                if e.get("message") == "train" and e.get("decision") == "refused"
                and "max-images-per-round" in e.get("reason", "")]

    deadline = time.monotonic() + 10
    while not (entries := refusals()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert entries and entries[-1]["agreed"] == {
        "task": "pneumoniamnist-export", "classes": ["normal", "pneumonia"], "local-epochs": 2, "batch-size": 32,
        "images-per-epoch": images, "images-per-round": 2 * images}, entries[-1]


def test_a_message_without_a_task_is_refused_where_the_policy_names_tasks(guarded):
    """Finding 2: an operator-side ServerApp edit sends its query without the task, and the run's task.file names
    another task (64x64 chest-xray). The old policy read the run config's default dataset (pneumoniamnist, a task this
    hospital joins), skipped the class check and accepted; the ClientApp then decoded the images as chest-xray."""
    fed = guarded
    variant = _variant(fed, "no-task")
    discovery = variant / "hospitrust" / "server_app" / "discovery.py"
    sent = 'RecordDict({"config": ConfigRecord({TASK_KEY: task.to_json()})}) if task is not None else RecordDict()'
    assert sent in discovery.read_text()
    discovery.write_text(discovery.read_text().replace(sent, "RecordDict()"))
    fed.gate["store"].approve(approval.build_fab(variant), by="security-officer")  # approved: the policy must hold
    policy = fed.work / "gate" / "policy.toml"
    policy.write_text(POLICY + 'tasks = ["pneumoniamnist-export", "pneumoniamnist"]\n')
    try:
        config, rounds = _run(fed, "gate-no-task", variant, 'task.file="tasks/chest-xray.toml"', keys=False)
    finally:
        policy.write_text(POLICY)
    refused = {f["hospital"]: f["reason"] for f in config["failed-hospitals"]}
    assert refused.get(NAME, "").startswith("refused by site policy: tasks: the message names no task"), config["failed-hospitals"]
    assert NAME not in _trained(rounds)

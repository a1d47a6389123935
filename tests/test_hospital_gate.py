"""A hospital's control over what runs on its machine, without processes: approvals by hash, consortium
signatures, the site policy, and the gate's decision that combines them (the audit log: tests/test_audit_log.py;
tests/test_hospital_control.py runs them in a real federation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hospitrust.ops.deploy import approval
from hospitrust.errors import DeployError
from hospitrust.ops.deploy.gate import GateConfig, decide
from hospitrust.ops.deploy.policy import SitePolicy, load_policy, refusal

APP_TOML = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tinyapp"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "consortium"

[tool.flwr.app.components]
serverapp = "tinyapp.server:app"
clientapp = "tinyapp.client:app"

[tool.flwr.app.config]
rounds = 1
"""


def make_app(root: Path, line: str = "VALUE = 1") -> Path:
    (root / "tinyapp").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(APP_TOML)
    (root / "tinyapp" / "__init__.py").write_text("")
    (root / "tinyapp" / "client.py").write_text(f"{line}\napp = None\n")
    (root / "tinyapp" / "server.py").write_text("app = None\n")
    return root


def test_app_build_gives_the_bundle_and_hash_flwr_build_gives(tmp_path):
    app = make_app(tmp_path / "app")
    content = approval.build_fab(app)
    assert approval.build_fab(app) == content  # deterministic: fixed zip dates, sorted files
    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run(["flwr", "build", "--app", str(app)], cwd=out, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    (built,) = list(out.glob("*.fab"))
    sha = approval.fab_sha256(content)
    assert built.read_bytes() == content and built.name == f"consortium.tinyapp.1-0-0.{sha[:8]}.fab"


def test_approve_review_diff_and_revoke(tmp_path):
    store = approval.Approvals(tmp_path / "hospital" / "approved-apps.toml")
    first = approval.build_fab(make_app(tmp_path / "v1"))
    second = approval.build_fab(make_app(tmp_path / "v2", line="VALUE = 2  # one line differs"))
    assert not store.is_approved(approval.fab_sha256(first))
    text = approval.review(first, store)
    assert f"sha256 {approval.fab_sha256(first)}" in text and "no approved bundle" in text
    assert "code" in next(line for line in text.splitlines() if line.endswith("tinyapp/client.py"))
    done = store.approve(first, by="security-officer", comment="ticket 42")
    assert store.is_approved(done.sha256) and not store.is_approved(approval.fab_sha256(second))
    assert store.path.stat().st_mode & 0o777 == 0o600 and store.bundles.stat().st_mode & 0o777 == 0o700
    diff = approval.review(second, store)
    assert "-VALUE = 1" in diff and "+VALUE = 2  # one line differs" in diff and "approved/tinyapp/server.py" not in diff
    assert approval.review(first, store).endswith(f"already approved in {store.path}")
    gone = store.revoke(done.sha256[:12])
    assert gone.comment == "ticket 42" and not store.is_approved(done.sha256)
    with pytest.raises(DeployError, match="no approval matches"):
        store.revoke(done.sha256)
    store.path.write_text('[[approved]]\nsha256 = "abc"\n')
    with pytest.raises(DeployError, match="all 64 lower-case hex"):
        store.load()


def test_a_signature_is_the_consortiums_and_covers_the_bundle(tmp_path):
    content = approval.build_fab(make_app(tmp_path / "app"))
    key, pub, key_id = approval.create_signing_key(tmp_path / "keys", "release")
    other_key, _, other_id = approval.create_signing_key(tmp_path / "keys", "stranger")
    trusted = approval.load_trusted(pub)  # the .pub file is one trusted-entities line
    assert list(trusted) == [key_id] and pub.read_text().startswith(f"{key_id}: \"ssh-ed25519 ")
    sha = approval.fab_sha256(content)
    value = approval.sign(content, key, key_id, timestamp=1_800_000_000)
    assert approval.verify(value, sha, trusted, now=1_800_000_100) is None
    # the operator cannot swap the code under a valid signature: another bundle's hash does not verify
    swapped = approval.build_fab(make_app(tmp_path / "swapped", line="import os; os.system('exfiltrate')"))
    assert "bad app signature" in approval.verify(value, approval.fab_sha256(swapped), trusted, now=1_800_000_100)
    assert "untrusted key" in approval.verify(approval.sign(content, other_key, other_id), sha, trusted)
    assert "expired" in approval.verify(value, sha, trusted, max_age_seconds=86400, now=1_800_000_000 + 2 * 86400)
    assert "malformed" in approval.verify("garbage", sha, trusted)
    # Flower's signed message: 8-byte big-endian timestamp, then the 32-byte digest
    assert approval.signed_message(1, sha) == b"\0" * 7 + b"\1" + bytes.fromhex(sha)
    (tmp_path / "bad.yaml").write_text("fpk_x: \"ecdsa-sha2-nistp384 AAAA\"\n")
    with pytest.raises(DeployError, match="trusted-entities format"):
        approval.load_trusted(tmp_path / "bad.yaml")


TRAIN = "train"


def test_the_site_policy_rule_by_rule():
    policy = SitePolicy.model_validate({"max-local-epochs": 2, "max-batch-size": 64, "max-images-per-round": 1000,
                                        "tasks": ["chest"], "classes": ["normal", "pneumonia"]})
    task = json.dumps({"name": "chest", "class_names": ["normal", "pneumonia"]})
    run = {"attack": "none", "local-epochs": 1, "batch-size": 32, "train-subsample": 1.0}
    ok = {"local-epochs": 2, "batch-size": 32, "task": task}
    assert refusal(policy, TRAIN, ok, run, hospital_images=400) is None
    assert refusal(policy, TRAIN, {**ok, "local-epochs": 3}, run, hospital_images=400) == "max-local-epochs: 3 > 2"
    assert refusal(policy, TRAIN, {**ok, "batch-size": 128}, run, hospital_images=400) == "max-batch-size: 128 > 64"
    assert refusal(policy, TRAIN, ok, run, hospital_images=600) == "max-images-per-round: 1200 > 1000"
    assert refusal(policy, TRAIN, ok, {**run, "train-subsample": 0.5}, hospital_images=600) is None
    assert "unknown" in refusal(policy, TRAIN, ok, run)
    assert refusal(policy, "query", {"task": task}, {**run, "attack": "sign-flip"}) == \
        "allow-attacks: the run configures attack 'sign-flip'"
    other = json.dumps({"name": "derma", "class_names": ["a"]})
    assert refusal(policy, "query", {"task": other}, run).startswith("tasks: task 'derma'")
    more = json.dumps({"name": "chest", "class_names": ["normal", "pneumonia", "covid"]})
    assert refusal(policy, "query", {"task": more}, run) == "classes: ['covid'] not agreed"
    dp = SitePolicy.model_validate({"require-local-dp": True, "max-epsilon": 4.0})
    assert refusal(dp, "evaluate", {}, {"privacy.mode": "off"}) == "require-local-dp: the run trains with privacy.mode 'off'"
    assert refusal(dp, "evaluate", {}, {"privacy.mode": "local", "privacy.target-epsilon": 8.0}).startswith("max-epsilon")
    assert refusal(dp, "evaluate", {}, {"privacy.mode": "both", "privacy.target-epsilon": 3.0}) is None
    quorum = SitePolicy.model_validate({"min-hospitals": 3})
    assert "needs SecAgg+" in refusal(quorum, TRAIN, {}, {"min-hospitals": 5})
    assert refusal(quorum, TRAIN, {}, {"min-hospitals": 2, "secagg.enabled": True}).startswith("min-hospitals: the run's")
    assert refusal(quorum, TRAIN, {}, {"min-hospitals": 3, "secagg.enabled": True}) is None
    # at SecAgg+'s key-sharing stage the hospital counts the keys it will mask with: the server cannot state more
    run = {"min-hospitals": 3, "secagg.enabled": True}
    two = {"stage": "share_keys", "11": (b"a", b"b"), "12": (b"c", b"d")}
    assert refusal(quorum, TRAIN, {}, run, secagg=two) == "min-hospitals: SecAgg+ shares keys among 2 hospitals < 3"
    assert refusal(quorum, TRAIN, {}, run, secagg={**two, "13": (b"e", b"f")}) is None
    assert refusal(quorum, TRAIN, {}, run, secagg={"stage": "setup", "sample_num": 2}) is None
    silent = SitePolicy.model_validate({"messages": ["query", "train", "evaluate"]})
    assert refusal(silent, "evaluate", {"contribution-weight": 0.3}, {}) == "messages: contribution messages are not answered here"


def test_a_bad_policy_file_names_the_problem(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("max-local-epochs = 0\nmesages = ['train']\n")
    with pytest.raises(DeployError) as err:
        load_policy(path)
    assert "max-local-epochs" in str(err.value) and "mesages" in str(err.value)


def test_the_gate_decides_from_approvals_signatures_and_policy(tmp_path):
    content = approval.build_fab(make_app(tmp_path / "app"))
    sha = approval.fab_sha256(content)
    key, pub, key_id = approval.create_signing_key(tmp_path / "keys", "release")
    policy = tmp_path / "policy.toml"
    policy.write_text("max-local-epochs = 2\nmax-signature-age-days = 30\n")
    store = tmp_path / "approved.toml"
    cfg = GateConfig(approvals=store, trusted=pub, policy=policy)
    train = {"local-epochs": 1}
    assert decide(cfg, content, "train", train, {}) == f"refused: app not approved (sha256 {sha})"
    signed = {approval.SIGNATURE_KEY: approval.sign(content, key, key_id)}
    assert decide(cfg, content, "train", train, signed) is None  # signed by a trusted key: approved
    assert decide(cfg, content, "train", {"local-epochs": 5}, signed) == "refused by site policy: max-local-epochs: 5 > 2"
    old = {approval.SIGNATURE_KEY: approval.sign(content, key, key_id, timestamp=1_000_000_000)}
    assert "expired" in decide(cfg, content, "train", train, old)
    approval.Approvals(store).approve(content)
    assert decide(cfg, content, "train", train, {}) is None
    policy.write_text("max-local-epochs = 'many'\n")
    assert "gate configuration is broken" in decide(cfg, content, "train", train, {})
    assert not GateConfig().active and GateConfig.from_env({"HOSPITRUST_SITE_POLICY": str(policy)}).active


def test_the_server_records_a_refusal_as_the_hospital_stated_it():
    from hospitrust.strategies.validation import error_reason

    flower = "<class 'hospitrust.ops.deploy.gate.Refused'>:<'refused by site policy: max-local-epochs: 3 > 2'>"
    assert error_reason(flower) == "refused by site policy: max-local-epochs: 3 > 2"
    assert error_reason("<class 'ValueError'>:<'refused to converge'>").startswith("error reply: ")  # not the gate's
    assert error_reason("<class 'RuntimeError'>:<'out of memory'>") == "error reply: <class 'RuntimeError'>:<'out of memory'>"


def test_data_check_prints_what_the_policy_allows(tmp_path):
    from PIL import Image

    for k, c in enumerate(("normal", "pneumonia")):
        (tmp_path / "data" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (28, 28), color=40 * i + 7 * k).save(tmp_path / "data" / c / f"{i}.png")
    (tmp_path / "policy.toml").write_text('max-local-epochs = 3\nmessages = ["query", "train"]\n')
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "data", "check", str(tmp_path / "data"),
                          "--classes", "normal,pneumonia",
                          "--image-size", "28", "--policy", str(tmp_path / "policy.toml")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.split("site policy")[1].splitlines()
    assert any(line.split()[:2] == ["max-local-epochs", "3"] for line in lines)
    assert any(line.split()[:3] == ["messages", "query,", "train"] for line in lines)
    assert any(line.split()[:2] == ["allow-attacks", "false"] for line in lines)

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
from hospitrust.ops.deploy.gate import REVOKED_BUNDLE, REVOKED_KEY, GateConfig, Refused, decide
from hospitrust.ops.deploy.policy import SitePolicy, load_policy, refusal, resolve

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
    entry, gone = store.revoke(done.sha256[:12], comment="incident 7")
    assert gone is not None and gone.comment == "ticket 42" and not store.is_approved(done.sha256)
    assert entry.sha256 == done.sha256 and store.revoked_bundle(done.sha256).comment == "incident 7"
    with pytest.raises(DeployError, match="no approval matches"):
        store.revoke(done.sha256[:12])  # a prefix names an approved bundle only; the full hash revokes any
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
    assert refusal(policy, TRAIN, ok, run, hospital_images=600) == "max-images-per-round: 2 epochs x 600 images = 1200 > 1000"
    # a hospital's own data ignores train-subsample: the count it trains on is not scaled by it
    assert refusal(policy, TRAIN, ok, {**run, "train-subsample": 0.5}, hospital_images=600) == \
        "max-images-per-round: 2 epochs x 600 images = 1200 > 1000"
    assert "unknown" in refusal(policy, TRAIN, ok, run)
    # NaN, infinite or zero counts are refused with the key named, before any rule compares them (NaN made the gate
    # raise before it decided: no reply, and no decision on the record)
    assert refusal(policy, TRAIN, {**ok, "local-epochs": float("nan")}, run, hospital_images=400) == \
        "local-epochs: nan is not a finite positive integer (expected a count of at least 1)"
    assert refusal(policy, TRAIN, {**ok, "batch-size": float("inf")}, run, hospital_images=400) == \
        "batch-size: inf is not a finite positive integer (expected a count of at least 1)"
    assert refusal(policy, TRAIN, {**ok, "local-epochs": 0}, run, hospital_images=400) == \
        "local-epochs: 0 is not a finite positive integer (expected a count of at least 1)"
    assert refusal(SitePolicy(), TRAIN, {"local-epochs": float("nan")}, run) == \
        "local-epochs: nan is not a finite positive integer (expected a count of at least 1)"
    assert resolve(TRAIN, {"local-epochs": float("nan")}, run).local_epochs is None  # resolving no longer raises
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
    assert refusal(quorum, TRAIN, {}, run, secagg=two) == "min-hospitals: SecAgg+ shares keys among 2 key entries < 3"
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
    app = make_app(tmp_path / "app")
    (app / "pyproject.toml").write_text(APP_TOML + "\n[tool.hospitrust]\ngate-values = 1\n")  # it uses the gate's values
    content = approval.build_fab(app)
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


# -- issue 46: signatures dated in the future or expired, revocation, installed equals approved, one-line errors ----

def _gate_files(tmp_path):
    """A bundle, a release key in a trusted-signers file, and an (empty) approvals file: real files."""
    content = approval.build_fab(make_app(tmp_path / "app"))
    key, pub, key_id = approval.create_signing_key(tmp_path / "keys", "release")
    return content, key, key_id, GateConfig(approvals=tmp_path / "approved.toml", trusted=pub)


def test_a_signature_dated_in_the_future_or_past_its_expiry_is_refused(tmp_path):
    content, key, key_id, cfg = _gate_files(tmp_path)
    sha = approval.fab_sha256(content)
    trusted = approval.load_trusted(cfg.trusted)
    # the finding: a signature dated 2100-01-01 was accepted, and never expired
    future = approval.sign(content, key, key_id, timestamp=4_102_444_800)
    why = decide(cfg, content, "train", {}, {approval.SIGNATURE_KEY: future})
    assert why.startswith(f"refused: app signature by {key_id} is dated in the future (2100-01-01T00:00:00Z; ")
    assert "5 minutes of clock skew" in why and "\n" not in why
    now = 1_800_000_000
    skewed = approval.sign(content, key, key_id, timestamp=now + approval.CLOCK_SKEW_SECONDS)
    assert approval.verify(skewed, sha, trusted, now=now) is None  # a clock up to 5 minutes behind the signer's: fine
    late = approval.sign(content, key, key_id, timestamp=now + approval.CLOCK_SKEW_SECONDS + 1)
    assert "dated in the future" in approval.verify(late, sha, trusted, now=now)
    # an expiry of its own, signed with the rest: valid until then, refused after, and cannot be cut off
    expiring = approval.sign(content, key, key_id, timestamp=now, expires=now + 86400)
    assert expiring.count(":") == 3 and approval.verify(expiring, sha, trusted, now=now + 86400) is None
    assert approval.verify(expiring, sha, trusted, now=now + 86401) == \
        f"app signature by {key_id} expired at 2027-01-16T08:00:00Z"
    key_id_, ts, expires, sig = expiring.split(":")
    assert "bad app signature" in approval.verify(f"{key_id_}:{ts}:{sig}", sha, trusted, now=now)  # expiry stripped
    assert "bad app signature" in approval.verify(f"{key_id_}:{ts}:{int(expires) + 10**6}:{sig}", sha, trusted, now=now)
    assert approval.signed_message(1, sha, 2) == approval.signed_message(1, sha) + b"\0" * 7 + b"\2"
    valid = approval.sign(content, key, key_id, expires=approval.parse_expires("30d"))
    assert decide(cfg, content, "train", {}, {approval.SIGNATURE_KEY: valid}) is None
    assert approval.parse_expires("2027-01-15", now=now) == now + 57599  # the date's end, UTC
    assert approval.parse_expires("2027-01-15T08:00:00Z", now=now - 1) == now
    with pytest.raises(DeployError, match="not in the future"):
        approval.parse_expires("2020-01-01")
    with pytest.raises(DeployError, match="expected a number of days"):
        approval.parse_expires("soon")
    with pytest.raises(DeployError, match="expire"):
        approval.sign(content, key, key_id, timestamp=now, expires=now)


def test_a_revoked_bundle_or_key_is_refused_by_the_gate(tmp_path):
    from hospitrust.cli.main import main

    content, key, key_id, cfg = _gate_files(tmp_path)
    sha = approval.fab_sha256(content)
    signed = {approval.SIGNATURE_KEY: approval.sign(content, key, key_id)}
    store = approval.Approvals(cfg.approvals)
    store.approve(content)
    assert decide(cfg, content, "train", {}, signed) is None and decide(cfg, content, "train", {}, {}) is None
    # the finding: `hospitrust app revoke HASH` ended in a traceback, and a signed bundle could not be revoked
    assert main(["app", "revoke", sha[:8], "--approvals", str(cfg.approvals), "--comment", "incident 7"]) == 0
    assert not store.is_approved(sha)
    assert decide(cfg, content, "train", {}, signed) == f"{REVOKED_BUNDLE} (sha256 {sha})"  # signed, and still refused
    assert decide(cfg, content, "train", {}, {}) == f"{REVOKED_BUNDLE} (sha256 {sha})"
    assert "REVOKED in" in approval.review(content, store)
    store.approve(content)  # an explicit approval lifts the revocation
    assert store.revoked_bundle(sha) is None and decide(cfg, content, "train", {}, {}) is None
    # a bundle never approved here, only signed: revoked by its full hash
    other = approval.build_fab(make_app(tmp_path / "other", line="VALUE = 3"))
    other_signed = {approval.SIGNATURE_KEY: approval.sign(other, key, key_id)}
    assert decide(cfg, other, "train", {}, other_signed) is None
    assert main(["app", "revoke", approval.fab_sha256(other), "--approvals", str(cfg.approvals)]) == 0
    assert decide(cfg, other, "train", {}, other_signed).startswith(REVOKED_BUNDLE)
    # the signer's key: its signatures count for nothing; bundles approved by hash still run
    third = approval.build_fab(make_app(tmp_path / "third", line="VALUE = 4"))
    third_signed = {approval.SIGNATURE_KEY: approval.sign(third, key, key_id)}
    assert decide(cfg, third, "train", {}, third_signed) is None
    assert main(["app", "revoke", "--key-id", key_id, "--approvals", str(cfg.approvals)]) == 0
    assert decide(cfg, third, "train", {}, third_signed) == f"{REVOKED_KEY} ({key_id})"
    assert decide(cfg, content, "train", {}, signed) is None  # approved by hash
    assert [(r.sha256[:8], r.key) for r in store.load_revoked()] == [(approval.short(approval.fab_sha256(other)), ""),
                                                                     ("", key_id)]
    assert cfg.approvals.stat().st_mode & 0o777 == 0o600
    cfg.approvals.write_text('[[revoked]]\nkey = "not-a-key"\n')
    assert "gate configuration is broken" in decide(cfg, content, "train", {}, {})
    # the revocation list lives in the approvals file: a SuperNode that trusts signers must name it
    from types import SimpleNamespace

    from hospitrust.cli.deploy import _gate_env

    args = SimpleNamespace(approved_apps=None, trusted_signers=str(cfg.trusted), policy=None, audit_log=None)
    with pytest.raises(DeployError, match="--trusted-signers needs --approved-apps too"):
        _gate_env(args)
    args.approved_apps = str(tmp_path / "not-yet.toml")
    assert _gate_env(args)["HOSPITRUST_APPROVED_APPS"] == str(tmp_path / "not-yet.toml")


def test_app_errors_are_one_line_without_a_traceback(tmp_path, capsys):
    from hospitrust.cli.main import main

    approvals = str(tmp_path / "approved.toml")
    (tmp_path / "bad-key").write_text("not a key\n")
    app = make_app(tmp_path / "app")
    cases = [
        (["app", "revoke", "3f9a2c1b", "--approvals", approvals], "no approval matches"),  # the finding's command
        (["app", "revoke", "--approvals", approvals], "give a bundle's SHA-256 or --key-id"),
        (["app", "revoke", "--key-id", "release", "--approvals", approvals], "expected the signer's fpk_<uuid> id"),
        (["app", "review", str(tmp_path / "missing.fab")], "no such .fab file"),
        (["app", "sign", str(app), "--key", str(tmp_path / "bad-key"), "--key-id", "fpk_x"], "not an unencrypted"),
        (["app", "sign", str(app), "--key", str(tmp_path / "bad-key"), "--key-id", "fpk_x", "--expires", "soon"],
         "--expires 'soon'"),
        (["app", "build", str(tmp_path)], "not a Flower app"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("hospitrust app: ") and expected in err, (argv, err)
        assert "Traceback" not in err
    (tmp_path / "app" / "pyproject.toml").write_text('[project]\nname = "x"\n')  # Flower's multi-line complaint
    assert main(["app", "build", str(app)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "version" in err and "Traceback" not in err


def _rezip(content: bytes, *, comment: bytes = b"", reverse: bool = False) -> bytes:
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(content)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist()[::-1] if reverse else src.infolist():
            dst.writestr(info, src.read(info.filename))
        dst.comment = comment
    return out.getvalue()


def test_app_review_says_when_a_bundle_differs_only_outside_its_files(tmp_path):
    store = approval.Approvals(tmp_path / "approved.toml")
    content = approval.build_fab(make_app(tmp_path / "app"))
    store.approve(content)
    commented = _rezip(content, comment=b"same files, new hash")
    assert approval.fab_sha256(commented) != approval.fab_sha256(content)
    assert approval.fab_files(commented) == approval.fab_files(content)
    text = approval.review(commented, store)
    assert "no file differs, but the bundle's bytes do: its zip comment (0 B approved, 20 B now)" in text
    assert "zip comment: 20 B" in text and "\n  no file differs\n" not in text + "\n"
    assert "its zip structure" in approval.review(_rezip(content, reverse=True), store)  # re-packed: same files


def _wired_gate(tmp_path, monkeypatch, cfg, run_config=None, *, run_fab=None, message_config=None, decision_fd=None):
    """The gate's wrappers on Flower's own ``run_clientapp`` module, as in a gated ClientApp: ``deliver(content)``
    pulls a train message for that bundle (``run_fab``: what the run names instead: id, version, hash; its config
    record: ``server-round`` 1 and ``message_config``) and calls the wrapped ``install_from_fab``; it returns the folder
    Flower would import from, or raises ``Refused``. ``decision_fd``: the decision pipe's write end, as the launcher
    gives its child. Once per test: the wrappers stay on the module until the test ends.
    """
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.cli.config_utils import get_fab_metadata
    from flwr.supercore.fab import Fab
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.runtime import run_clientapp as rc

    from hospitrust.ops.deploy import gate

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    for name in ("_run_id", "_node_id", "_task_id"):  # else Message() raises outside a real ClientApp process
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    task: dict = {}

    def pull(client):
        content = task["content"]
        fab_id, fab_version = get_fab_metadata(content)
        fab_id, fab_version, fab_hash = run_fab or (fab_id, fab_version, approval.fab_sha256(content))
        run = Run.create_empty(7)
        run.fab_id, run.fab_version, run.fab_hash = fab_id, fab_version, fab_hash
        config = ConfigRecord({"server-round": 1, **(message_config or {})})
        message = Message(RecordDict({"config": config}), dst_node_id=1, message_type="train")
        context = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config=dict(run_config or {}))
        return message, context, run, Fab(fab_hash, content, {})

    # restored after the test: gate.install replaces these three in the module, as in a forked child
    monkeypatch.setattr(rc, "pull_task_input", pull)
    monkeypatch.setattr(rc, "install_from_fab", rc.install_from_fab)
    monkeypatch.setattr(rc, "push_message", rc.push_message)
    gate.install(cfg, decision_fd=decision_fd)
    assert sys.dont_write_bytecode  # gated children write no bytecode beside the checked sources

    def deliver(content: bytes) -> Path:
        task["content"] = content
        rc.pull_task_input(None)
        return rc.install_from_fab(content, skip_prompt=True)

    return deliver


def test_the_gate_imports_only_a_folder_that_holds_exactly_the_approved_bundle(tmp_path, monkeypatch, capfd):
    content, _, _, cfg = _gate_files(tmp_path)
    sha = approval.fab_sha256(content)
    approval.Approvals(cfg.approvals).approve(content)
    deliver = _wired_gate(tmp_path, monkeypatch, cfg)
    folder = deliver(content)
    assert folder == tmp_path / "flwr-home" / "apps" / f"consortium.tinyapp.1.0.0.{sha[:8]}"
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert files == {"pyproject.toml", "tinyapp/__init__.py", "tinyapp/client.py", "tinyapp/server.py"}
    assert deliver(content) == folder  # installed and unchanged: accepted again
    # Python's caches are not the bundle's: removed before the check, so stale or planted bytecode never runs
    (folder / "tinyapp" / "__pycache__").mkdir()
    (folder / "tinyapp" / "__pycache__" / "client.cpython-311.pyc").write_bytes(b"planted")
    assert deliver(content) == folder and not (folder / "tinyapp" / "__pycache__").exists()
    # the finding: Flower skips the install when the folder exists, and imports whatever is in it
    (folder / "torch.py").write_text("import os  # shadows the real torch: the app dir is first on sys.path\n")
    with pytest.raises(Refused) as refused:
        deliver(content)
    assert str(refused.value) == "refused: the installed app folder differs from the approved bundle: 1 extra file not in " \
                                 "the bundle"
    assert "torch.py" in capfd.readouterr().err  # the name in the hospital's own log only
    (folder / "torch.py").unlink()
    (folder / "tinyapp" / "client.py").write_text("VALUE = 666\napp = None\n")
    (folder / "tinyapp" / "server.py").unlink()
    with pytest.raises(Refused, match=r"1 changed \(tinyapp/client.py\), 1 missing \(tinyapp/server.py\)$"):
        deliver(content)
    (folder / "tinyapp" / "client.py").unlink()
    (folder / "tinyapp" / "client.py").symlink_to(tmp_path / "app" / "tinyapp" / "client.py")  # same bytes, elsewhere
    with pytest.raises(Refused, match="1 changed"):
        deliver(content)


def test_the_gate_refuses_a_run_that_names_another_install_folder(tmp_path, monkeypatch):
    content, _, _, cfg = _gate_files(tmp_path)
    approval.Approvals(cfg.approvals).approve(content)
    other = approval.short(approval.fab_sha256(approval.build_fab(make_app(tmp_path / "other", line="VALUE = 2"))))
    # Flower imports from the folder the run's metadata names, not the one it installs the bundle into
    lying = _wired_gate(tmp_path, monkeypatch, cfg, run_fab=("consortium/tinyapp", "1.0.0", other + "0" * 56))
    with pytest.raises(Refused, match=rf"refused: the run names app consortium/tinyapp 1.0.0 \({other}\), but the "
                                      rf"bundle sent is consortium/tinyapp 1.0.0 \({approval.short(approval.fab_sha256(content))}\)"):
        lying(content)
    assert not (tmp_path / "flwr-home" / "apps").exists()  # nothing installed


def test_refused_bundles_are_kept_private_and_only_the_newest_ten(tmp_path, monkeypatch):
    """Hygiene: every refused bundle was copied to pending/ (2 MB each, no limit: a server sending new bundles fills the
    hospital's disk), and approved bundles' kept copies were 0644."""
    import os

    content, _, _, cfg = _gate_files(tmp_path)
    deliver = _wired_gate(tmp_path, monkeypatch, cfg)
    pending = cfg.approvals.with_name(cfg.approvals.stem + ".d") / "pending"
    shas = []
    for i in range(approval.PENDING_KEPT + 2):
        bundle = approval.build_fab(make_app(tmp_path / f"app-{i}", line=f"VALUE = {i}"))
        shas.append(approval.fab_sha256(bundle))
        with pytest.raises(Refused, match="app not approved"):
            deliver(bundle)
        os.utime(pending / f"{shas[-1]}.fab", (1_000_000 + i, 1_000_000 + i))  # distinct ages, whatever the clock
    kept = {p.stem for p in pending.glob("*.fab")}
    assert kept == set(shas[2:]), "the newest ten are kept, the two oldest removed"
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in pending.glob("*.fab"))
    with pytest.raises(Refused):  # the same bundle again: kept once
        deliver(approval.build_fab(make_app(tmp_path / "app-11", line="VALUE = 11")))
    assert len(list(pending.glob("*.fab"))) == approval.PENDING_KEPT
    # the approved bundle's copy is the hospital's service user's only
    store = approval.Approvals(cfg.approvals)
    store.approve(content)
    assert (store.bundles / f"{approval.fab_sha256(content)}.fab").stat().st_mode & 0o777 == 0o600


def test_the_gate_removes_a_revoked_bundles_install(tmp_path, monkeypatch):
    content, _, _, cfg = _gate_files(tmp_path)
    sha = approval.fab_sha256(content)
    store = approval.Approvals(cfg.approvals)
    store.approve(content)
    other = approval.build_fab(make_app(tmp_path / "other", line="VALUE = 2"))
    store.approve(other)
    deliver = _wired_gate(tmp_path, monkeypatch, cfg)
    folder, other_folder = deliver(content), deliver(other)
    assert folder.is_dir() and other_folder.is_dir() and folder != other_folder
    store.revoke(sha)
    with pytest.raises(Refused, match=REVOKED_BUNDLE):
        deliver(content)
    assert not folder.exists() and other_folder.is_dir()  # the revoked bundle's install is gone, the other stays
    folder.mkdir(parents=True)  # put back by hand, or left by an old launcher: removed at the next message of any bundle
    (folder / "pyproject.toml").write_text(APP_TOML)
    assert deliver(other) == other_folder and not folder.exists()


@pytest.mark.parametrize(("bad", "shown"), [(float("nan"), "nan"), (float("inf"), "inf"), (0, "0"), ("many", "'many'")],
                         ids=["nan", "inf", "zero", "text"])
@pytest.mark.parametrize("with_policy", [False, True], ids=["approvals-only", "site-policy"])
def test_a_train_message_whose_local_epochs_is_not_a_count_is_refused_with_a_recorded_decision(
        tmp_path, monkeypatch, bad, shown, with_policy):
    """Issue 61, item 7: ``local-epochs = NaN`` in a train message made the gate raise before it decided (no reply,
    and the audit entry said decision "none"). Now it is refused, with or without a site policy, and the decision the
    launcher records names the key and what was expected.
    """
    import os

    from hospitrust.ops.deploy import audit
    from hospitrust.supervision import launcher

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    app = make_app(tmp_path / "app")
    if with_policy:
        (app / "pyproject.toml").write_text(APP_TOML + "\n[tool.hospitrust]\ngate-values = 1\n")
    content = approval.build_fab(app)
    approval.Approvals(tmp_path / "approved.toml").approve(content)
    policy = tmp_path / "policy.toml"
    policy.write_text("max-local-epochs = 5\n")
    cfg = GateConfig(approvals=tmp_path / "approved.toml", policy=policy if with_policy else None)
    pipes = launcher.AuditPipes(task_id=3, run_id=7)  # the launcher's end of the child's decision pipe
    deliver = _wired_gate(tmp_path, monkeypatch, cfg, message_config={"local-epochs": bad, "server-round": bad},
                          decision_fd=pipes.child_fds[0])
    reason = f"refused: local-epochs: {shown} is not a finite positive integer (expected a count of at least 1)"
    with pytest.raises(Refused) as refused:
        deliver(content)
    assert str(refused.value) == reason  # what the server records: Flower's error reply carries it
    os.close(pipes.child_fds[1])  # no reply's claim: the bundle never ran
    for fd in pipes.open:
        os.set_blocking(fd, False)
    pipes.close()  # read what the child sent, as the launcher does when it reaps it
    log = tmp_path / "audit.jsonl"
    audit.append(log, pipes.entry(1))
    (entry,), problem = audit.verify(log)
    assert problem is None and entry["decision"] == "refused" and entry["reason"] == reason
    assert entry["round"] == (0 if bad == 0 else None)  # a server round that is no number: none, not raised on
    assert entry["agreed"]["local-epochs"] == (0 if bad == 0 else None)  # what resolve() made of it
    assert decide(cfg, content, TRAIN, {"local-epochs": 2}, {}) is None  # a count is accepted
    assert decide(cfg, content, "evaluate", {"local-epochs": float("nan")}, {}) is None  # only train counts epochs


def test_the_round_ledger_counts_a_round_is_bounded_and_never_reopens_a_round(tmp_path):
    """max-images-per-round's count (issue 61, finding 4): per (hospital, run), the latest round's images, kept in one
    file of the service user's; the process-level test is tests/test_clientapp_confinement.py."""
    import stat

    from hospitrust.ops.deploy.policy import RoundLedger

    ledger = RoundLedger(tmp_path / "state" / "gate" / "rounds.json", keep_runs=3)

    def charge(run, rnd, images=60, hospital="h"):
        return ledger.charge(hospital=hospital, run_id=run, server_round=rnd, images=images, limit=100)

    assert charge(1, 1) == (None, 60) and charge(1, 1, 40) == (None, 100)
    assert charge(1, 1, 1) == ("max-images-per-round: round 1 of run 1 has trained 100 images here already; this "
                               "message's 1 would make 101 > 100", 100)
    assert charge(1, 2) == (None, 60)  # the next round starts afresh, and replaces the run's previous one
    assert charge(1, 1) == ("max-images-per-round: round 1 of run 1 comes after its round 2 here; an earlier round's "
                            "count is not opened again", 0)
    assert charge(1, 2, 60, hospital="other") == (None, 60)  # another hospital's SuperNode with the same policy
    ledger.refund(hospital="h", run_id=1, server_round=2, images=60)  # a message that did not run after all
    assert charge(1, 2, 100) == (None, 100)
    for run in (2, 3):
        charge(run, 1)
    assert [(e["hospital"], e["run"], e["round"], e["images"]) for e in ledger.load()] == [
        ("h", 1, 2, 100), ("h", 2, 1, 60), ("h", 3, 1, 60)]  # 3 runs kept: the oldest charged dropped
    assert stat.S_IMODE(ledger.path.stat().st_mode) == 0o600 and stat.S_IMODE(ledger.path.parent.stat().st_mode) == 0o700
    ledger.path.write_text('{"v": 1, "rounds": [{"hospital": "h", "run": "1", "round": 1, "images": 0}]}')
    with pytest.raises(DeployError, match="not a file hospitrust wrote"):  # never begun afresh: that reopens rounds
        charge(4, 1)
    ledger.path.write_text("{")
    with pytest.raises(DeployError, match="not readable"):
        charge(4, 1)


def test_max_images_per_run_sums_every_round_of_a_run_however_it_is_numbered(tmp_path, monkeypatch):
    """The per-round count alone lets a ServerApp that numbers each train message as a new round train without
    bound; ``max-images-per-run`` sums a run's rounds in the same ledger."""
    from hospitrust.ops.deploy.gate import charge_round
    from hospitrust.ops.deploy.policy import Agreed, RoundLedger, refusal

    ledger = RoundLedger(tmp_path / "state" / "gate" / "rounds.json")

    def charge(run, rnd, images=79, limit=None, run_limit=200):
        return ledger.charge(hospital="h", run_id=run, server_round=rnd, images=images, limit=limit, run_limit=run_limit)

    assert charge(1, 1) == (None, 79) and charge(1, 2) == (None, 79)  # the round's count starts afresh, the run's not
    assert charge(1, 3) == ("max-images-per-run: run 1 has trained 158 images here already; this message's 79 would "
                            "make 237 > 200", 0)
    assert charge(1, 4, 42) == (None, 42)  # what still fits the run
    assert charge(2, 1) == (None, 79)  # another run has its own
    assert charge(1, 5, 60, limit=100, run_limit=1000) == (None, 60)
    assert charge(1, 5, 60, limit=100, run_limit=1000)[0].startswith("max-images-per-round: round 5 of run 1 has "
                                                                      "trained 60")  # both rules at once
    ledger.refund(hospital="h", run_id=1, server_round=5, images=60)
    assert next(e for e in ledger.load() if e["run"] == 1)["run_images"] == 200
    # a count written before run_images was kept: its latest round's images are all it knows of the run
    ledger.path.write_text('{"v": 1, "rounds": [{"hospital": "h", "run": 5, "round": 3, "images": 150}]}')
    assert charge(5, 4)[0] == "max-images-per-run: run 5 has trained 150 images here already; this message's 79 would " \
                              "make 229 > 200"
    # through the gate: a policy with the run's rule only
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    policy = tmp_path / "policy.toml"
    policy.write_text("max-images-per-run = 100\n")
    cfg = GateConfig(policy=policy)
    seen = {"message_type": "train", "msg_config": {"server-round": 1}, "agreed": Agreed(local_epochs=1, images_per_epoch=79),
            "hospital": "h", "run_id": 42, "round": 1}
    reason, refund = charge_round(cfg, dict(seen))
    assert reason is None and refund is not None
    reason, _ = charge_round(cfg, {**seen, "msg_config": {"server-round": 2}, "round": 2})
    assert reason == ("refused by site policy: max-images-per-run: run 42 has trained 79 images here already; this "
                      "message's 79 would make 158 > 100")
    from hospitrust.ops.deploy.policy import SitePolicy

    only_run = SitePolicy(max_images_per_run=100)
    assert refusal(only_run, TRAIN, {"local-epochs": 1}, {}, agreed=Agreed(local_epochs=1)) == (
        "max-images-per-run: this hospital's image count is unknown (start it with its data check)")


def test_only_messages_that_train_are_counted_for_the_round():
    from hospitrust.ops.deploy.policy import trains

    assert trains("train", {"server-round": 1}) and not trains("evaluate", {}) and not trains("query", {})
    assert not trains("evaluate", {"contribution-weight": 1.0})
    for stage in ("setup", "share_keys", "unmask"):  # SecAgg+'s key stages: Flower's mod answers them, nothing trains
        assert not trains("train", {}, {"stage": stage})
    assert trains("train", {"server-round": 1}, {"stage": "collect_masked_vectors"})


def test_a_damaged_round_count_refuses_train_messages_and_stops_the_launcher(tmp_path, monkeypatch):
    from hospitrust.ops.deploy.gate import charge_round
    from hospitrust.ops.deploy.policy import Agreed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    policy = tmp_path / "policy.toml"
    policy.write_text("max-images-per-round = 100\n")
    cfg = GateConfig(policy=policy)
    ledger = cfg.round_ledger
    assert ledger is not None and ledger.parent == tmp_path / "state-home" / "hospitrust" / "gate"
    assert ledger in cfg.private_files()
    seen = {"message_type": "train", "msg_config": {"server-round": 1}, "agreed": Agreed(local_epochs=1, images_per_epoch=79),
            "round": 1, "run_id": 5, "hospital": "h"}
    reason, refund = charge_round(cfg, seen)
    assert reason is None and refund is not None and seen["images_this_round"] == 79
    refund()
    assert "images_this_round" not in seen and charge_round(cfg, dict(seen))[0] is None
    assert charge_round(cfg, {**seen, "message_type": "evaluate"}) == (None, None)
    assert charge_round(cfg, {**seen, "round": None})[0].startswith(
        "refused by site policy: max-images-per-round: the message's server-round is not a number")
    ledger.write_text("garbage")
    reason, _ = charge_round(cfg, dict(seen))
    assert reason.startswith(f"refused: this hospital's gate configuration is broken (site policy's round count {ledger}")
    with pytest.raises(DeployError, match="round count"):
        cfg.check_files()

"""The hospital's audit log on real files, played as an attacker would: cut its last lines, empty it, rewrite
its refusals as acceptances with a recomputed chain, edit or delete its head, wipe it (with its key) to start
afresh, name a key twice in an entry; and the launcher's side: the
entry is written by the launcher from the child's decision pipe, which the child closes before the bundle's
code runs, and the bundle's code sees no path of the gate's files (tests/test_hospital_control.py runs it in
the real federation).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hospitrust.errors import DeployError
from hospitrust.ops.deploy import approval, audit, gate
from hospitrust.supervision import launcher

from test_hospital_gate import make_app


def _append_many(path: str, tag: int) -> None:
    for i in range(10):
        audit.append(Path(path), {"run": tag, "round": i, "message": "train",
                                  "decision": "refused" if i % 3 == 0 else "accepted"})


@pytest.fixture(autouse=True)
def _state_home(tmp_path, monkeypatch) -> Path:
    """The logs' state files (audit.state_dir) in this test's own folder, outside every log's folder."""
    home = tmp_path / "state-home"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture
def log(tmp_path) -> Path:
    """A log of 40 entries by 4 forked writers at once."""
    path = tmp_path / "audit" / "audit.jsonl"
    procs = [multiprocessing.get_context("fork").Process(target=_append_many, args=(str(path), t)) for t in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "deploy", "audit", *args], capture_output=True,
                          text=True, timeout=60)


def test_the_log_head_and_key_are_0600_and_the_chain_verifies_and_names_an_edited_or_deleted_entry(log):
    entries, problem = audit.verify(log)
    assert problem is None and len(entries) == 40  # forked writers under the lock: one unbroken chain
    assert [e["n"] for e in entries] == list(range(1, 41))
    for path in (log, audit.head_path(log), audit.key_path(log)):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert log.parent.stat().st_mode & 0o777 == 0o700
    assert not audit.head_path(log).with_name("audit.jsonl.head.tmp").exists()
    lines = log.read_text().splitlines()
    edited = json.loads(lines[6])
    edited["decision"] = "accepted" if edited["decision"] == "refused" else "refused"
    log.write_text("\n".join([*lines[:6], json.dumps(edited, sort_keys=True), *lines[7:]]) + "\n")
    assert audit.verify(log)[1].startswith("entry 7: its MAC does not verify")
    log.write_text("\n".join([*lines[:12], *lines[13:]]) + "\n")
    assert audit.verify(log)[1].startswith("entry 13: its MAC does not verify")


def test_cutting_the_last_entries_or_emptying_the_log_is_detected(log):
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1]) + "\n")  # the last entry, say a refusal, removed
    entries, problem = audit.verify(log)
    assert len(entries) == 39
    assert problem == "entry 40: missing: the head records 40 entries, the log has 39 (the log was cut)"
    log.write_text("\n".join(lines[:-3]) + "\n")
    assert audit.verify(log)[1].startswith("entry 38: missing: the head records 40 entries, the log has 37")
    log.write_text("")
    assert audit.verify(log) == ([], "entry 1: missing: the head records 40 entries, the log has 0 (the log was "
                                     "emptied)")
    res = _cli(str(log), "--quiet")  # the hospital's command: one line, no traceback
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "hospitrust deploy audit: does not verify: entry 1: missing: the head records 40 entries, the log has 0 "
        "(the log was emptied)"]
    with pytest.raises(DeployError, match="it was emptied"):  # and the SuperNode does not start on it
        audit.check(log)


def _rewrite(lines: list[str], key: bytes | None) -> list[str]:
    """Every refusal made an acceptance, the chain recomputed: unkeyed SHA-256 (format 1's chain) or HMAC under
    ``key``.
    """
    out, previous = [], audit.GENESIS
    for line in lines:
        record = json.loads(line)
        record.pop("mac")
        if record["decision"] == "refused":
            record["decision"] = "accepted"
        body = json.dumps(record, sort_keys=True, separators=(",", ":"))
        if key is None:
            previous = hashlib.sha256((previous + body).encode()).hexdigest()
        else:
            previous = audit._mac(key, previous, record)
        out.append(json.dumps({**record, "mac": previous}, sort_keys=True))
    return out


def test_rewriting_refusals_as_acceptances_with_a_recomputed_chain_is_detected(log, tmp_path):
    lines = log.read_text().splitlines()
    assert sum(json.loads(line)["decision"] == "refused" for line in lines) == 16
    head = audit.head_path(log)
    # the attack that verified before: the chain recomputed with plain SHA-256
    log.write_text("\n".join(_rewrite(lines, None)) + "\n")
    assert audit.verify(log)[1].startswith("entry 1: its MAC does not verify")
    # recomputed with a key of the attacker's, and a head to match: neither verifies under the log's key
    guess = os.urandom(32)
    forged = _rewrite(lines, guess)
    log.write_text("\n".join(forged) + "\n")
    last = json.loads(forged[-1])["mac"]
    head.write_text(json.dumps({"v": 2, "entries": 40, "mac": last, "head_mac": audit._head_mac(guess, 40, last)}))
    assert audit.verify(log)[1].startswith("entry 1: its MAC does not verify")
    # the key the attacker made is not the log's: replacing the key file is seen by whoever kept the key
    kept = tmp_path / "kept.key"
    shutil.copy(audit.key_path(log), kept)
    audit.key_path(log).write_text(guess.hex() + "\n")
    assert audit.verify(log) == (audit.verify(log)[0], None)  # under the attacker's key it verifies, of course ...
    assert audit.verify(log, kept)[1].startswith("entry 1: its MAC does not verify")  # ... not under the kept one


def test_a_tampered_or_missing_head_is_detected(log):
    head = audit.head_path(log)
    lines = log.read_text().splitlines()
    original = head.read_text()
    record = json.loads(original)
    # the log cut to 38 entries and the head's count edited to match: the head's own MAC breaks
    log.write_text("\n".join(lines[:38]) + "\n")
    head.write_text(json.dumps({**record, "entries": 38, "mac": json.loads(lines[37])["mac"]}))
    assert audit.verify(log)[1] == (f"entry 39: cannot be shown absent: head file {head}: its MAC does not verify "
                                    f"(the head was edited, or the key is not this log's)")
    head.write_text("not json")
    assert "not a head this module wrote" in audit.verify(log)[1]
    head.unlink()
    assert audit.verify(log)[1] == (f"entry 39: cannot be shown absent: the head {head} is missing (the log may have "
                                    f"been cut)")
    with pytest.raises(DeployError, match="head .* is missing"):  # the SuperNode refuses to start on it
        audit.check(log)
    with pytest.raises(DeployError, match="no head"):  # and the writer refuses to append to it
        audit.append(log, {"decision": "accepted"})
    head.write_text(original)
    log.write_text("\n".join(lines) + "\n")
    assert audit.verify(log)[1] is None


def test_an_append_cut_short_before_its_head_update_is_recovered(log):
    head = audit.head_path(log)
    before = head.read_text()
    audit.append(log, {"run": 9, "decision": "accepted"})
    head.write_text(before)  # a crash between the entry's fsync and the head's rename
    entries, problem = audit.verify(log)
    assert problem is None and len(entries) == 41  # the extra entry is keyed: it hides nothing
    audit.append(log, {"run": 10, "decision": "refused"})
    entries, problem = audit.verify(log)
    assert problem is None and [e["n"] for e in entries[-2:]] == [41, 42] and json.loads(head.read_text())["entries"] == 42
    head.write_text(before)  # two entries past the head: a rolled-back head, not a crash
    assert audit.verify(log)[1].startswith("entry 42: past the head, which records 40 entries")


def test_a_format_1_log_is_read_and_reported_unverifiable_and_the_key_is_checked(tmp_path):
    old = tmp_path / "old.jsonl"
    previous, lines = audit.GENESIS, []
    for i in range(3):  # what the format-1 writer wrote
        record = {"time": 1.0 + i, "run": 1, "round": i, "decision": "accepted"}
        previous = hashlib.sha256((previous + json.dumps(record, sort_keys=True, separators=(",", ":"))).encode()).hexdigest()
        lines.append(json.dumps({**record, "hash": previous}, sort_keys=True))
    old.write_text("\n".join(lines) + "\n")
    entries, problem = audit.verify(old)
    assert [e["round"] for e in entries] == [0, 1, 2]
    assert problem.startswith("entry 1: a format-1 log (unkeyed SHA-256 chain, no head): its 3 entries chain")
    res = _cli(str(old))
    assert res.returncode == 1 and "format-1 log" in res.stderr and res.stdout.count("accepted") == 3, res.stderr
    with pytest.raises(DeployError, match="not of format 2.*move it aside"):
        audit.check(old)
    # the key: created 0600 beside a new log; one readable by others, or not a key, is refused with its path
    new = tmp_path / "new" / "audit.jsonl"
    audit.check(new)
    key = audit.key_path(new)
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64
    key.chmod(0o644)
    with pytest.raises(DeployError, match=r"readable or writable by others \(mode 644\): chmod 600 it"):
        audit.check(new)
    given = tmp_path / "given.key"
    with pytest.raises(DeployError, match="given.key not found"):
        audit.check(new, given)
    given.write_text("short\n")
    given.chmod(0o600)
    with pytest.raises(DeployError, match="expected at least 64 hex digits"):
        audit.check(new, given)
    given.write_text(os.urandom(32).hex())
    audit.append(new, {"decision": "accepted"}, given)
    assert audit.verify(new, given)[1] is None and audit.verify(new)[1].startswith("entry 1: cannot be checked")


# -- issue 61, item 6: a wiped log (and key) is not begun again silently; an entry names each key once ------------------

def _wipe(log: Path, *, key: bool = False) -> None:
    """What an attacker with the log's folder does: remove the log and its head (and the default key beside them)."""
    log.unlink()
    audit.head_path(log).unlink()
    if key:
        audit.key_path(log).unlink()


def test_a_wiped_log_is_refused_at_the_start_and_reported_as_wiped_not_as_a_mistyped_path(log, _state_home):
    state = audit.state_path(log)
    assert state.is_file() and log.parent not in state.parents and state.parent.is_relative_to(_state_home)
    assert state.stat().st_mode & 0o777 == 0o600 and state.parent.stat().st_mode & 0o777 == 0o700
    assert audit.read_state(log)["entries"] is True
    _wipe(log)
    # the finding: the next start began a new log, and `deploy audit` said "not found" as for a mistyped path
    with pytest.raises(DeployError, match=r"audit log .*audit\.jsonl and its head are missing, but .*\.state records "
                                          r"that this log was started \(.*\) and has entries: it was wiped; not starting"):
        audit.check(log)
    with pytest.raises(DeployError, match="it was wiped: not appending"):  # nor while the launcher runs
        audit.append(log, {"decision": "accepted"})
    assert not log.exists()  # no empty log left in its place
    res = _cli(str(log))
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.startswith("hospitrust deploy audit: does not verify: entry 1: missing: audit log ")
    assert "has entries: it was wiped" in res.stderr and "not found" not in res.stderr
    typo = _cli(str(log.with_name("audti.jsonl")))  # a mistyped path: no state records it
    assert typo.returncode == 2 and "not found" in typo.stderr and "it was wiped" not in typo.stderr, typo.stderr
    # emptied rather than removed, its head gone too: the state says it had entries
    log.write_text("")
    assert audit.verify(log)[1].startswith(f"entry 1: missing: the head {audit.head_path(log)} is gone and {state} "
                                           f"records that this log has entries (the log was wiped")


def test_a_wiped_log_and_key_are_not_replaced_by_a_new_key(log):
    _wipe(log, key=True)
    key = audit.key_path(log)
    # the finding: with the key deleted too, a new key was made silently and a new log began
    with pytest.raises(DeployError, match=r"audit key .* is missing, but .* records that log .* was started .* the key "
                                          r"was deleted; put it back"):
        audit.check(log)
    with pytest.raises(DeployError, match="the key was deleted"):
        audit.append(log, {"decision": "accepted"})
    assert not key.exists() and not log.exists()
    # a key the attacker makes instead is not the one the state records
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    with pytest.raises(DeployError, match=r"is not the key log .* was started under .* the key was replaced"):
        audit.check(log)
    with pytest.raises(DeployError, match="the key was replaced"):
        audit.append(log, {"decision": "accepted"})


def test_an_upgraded_hospital_starts_normally_and_gets_a_state_and_a_lone_key_is_refused(tmp_path, log):
    state = audit.state_path(log)
    state.unlink()  # a log and key written by the version before the state file
    audit.check(log)
    assert audit.read_state(log)["entries"] is True and audit.verify(log)[1] is None
    _wipe(log)
    with pytest.raises(DeployError, match="it was wiped"):  # from now on a wipe is seen
        audit.check(log)
    # a new hospital: the first start makes key and state (no entries yet); a restart before any message is fine
    new = tmp_path / "new" / "audit.jsonl"
    audit.check(new)
    audit.check(new)
    assert audit.read_state(new)["entries"] is False and not new.exists()
    record = audit.append(new, {"decision": "accepted"})
    assert record["n"] == 1 and audit.read_state(new)["entries"] is True
    # a default key with neither log nor state: wiped together with the state (or an older version's unused key)
    lone = tmp_path / "lone" / "audit.jsonl"
    audit.check(lone)
    audit.state_path(lone).unlink()
    with pytest.raises(DeployError, match=r"is missing but its key .* exists and no state .* records the log"):
        audit.check(lone)
    # a state file that is not one: named, not read as "never started"
    audit.state_path(new).write_text('{"v": 1, "entries": true, "entries": false}')
    with pytest.raises(DeployError, match=r"\.state: not a state file this module wrote"):
        audit.check(new)


def test_an_entry_with_a_duplicated_key_does_not_verify(log):
    lines = log.read_text().splitlines()
    n = next(i for i, line in enumerate(lines, 1) if json.loads(line)["decision"] == "refused")
    # the attack: a second "decision" ahead of the real one; a reader that keeps the first sees "accepted", Python's
    # json keeps the last, whose canonical form is the one the MAC covers, so the entry verified
    forged = '{"decision": "accepted", ' + lines[n - 1][1:]
    assert json.loads(forged) == json.loads(lines[n - 1])
    log.write_text("\n".join([*lines[: n - 1], forged, *lines[n:]]) + "\n")
    entries, problem = audit.verify(log)
    assert len(entries) == n - 1
    assert problem.startswith(f"entry {n} (line {n}): the key 'decision' appears twice in it"), problem
    res = _cli(str(log), "--quiet")
    assert res.returncode == 1 and f"entry {n} (line {n}): the key 'decision' appears twice" in res.stderr, res.stderr
    with pytest.raises(audit.DuplicateKey, match="the key 'n' appears twice"):
        audit.loads('{"n": 1, "reply_claimed_by_app": {}, "n": 2}')


def test_the_child_environment_loses_the_gates_paths():
    env = {gate.APPROVALS_ENV: "/etc/h/approved.toml", gate.AUDIT_ENV: "/var/h/audit.jsonl", gate.AUDIT_KEY_ENV: "/k",
           gate.TRUSTED_ENV: "/etc/h/signers", gate.POLICY_ENV: "/etc/h/policy.toml", gate.IMAGES_ENV: "120",
           "PATH": "/usr/bin"}
    assert sorted(gate.scrub_environment(env)) == sorted(gate.PRIVATE_ENV)
    assert env == {gate.IMAGES_ENV: "120", "PATH": "/usr/bin"}


def _pipes(pids: str = "self") -> set[int]:
    """The inodes of the pipes a process has open."""
    out = set()
    for fd in os.listdir(f"/proc/{pids}/fd"):
        try:
            target = os.readlink(f"/proc/{pids}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:["):
            out.add(int(target[6:-1]))
    return out


def _fake_runtime(bundle_view: Path):
    """What Flower's ``run_clientapp`` does, without a SuperNode: pull, install, import and run the bundle, push.
    The "bundle" records what it can see: its environment and the pipes it has open.
    """
    from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
    from flwr.cli.config_utils import get_fab_metadata
    from flwr.supercore.fab import Fab
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.runtime import run_clientapp as rc

    def pull(client):
        message = Message(RecordDict({"config": ConfigRecord({"server-round": 3})}), dst_node_id=5, message_type="train")
        context = Context(run_id=42, node_id=5, node_config={"hospital": "h"}, state=RecordDict(), run_config={})
        content = bundle_view.with_suffix(".fab").read_bytes()
        run = Run.create_empty(42)  # the run names the bundle's own install folder, as Flower's SuperLink does
        (run.fab_id, run.fab_version), run.fab_hash = get_fab_metadata(content), approval.fab_sha256(content)
        return message, context, run, Fab(run.fab_hash, content, {})

    def run_clientapp(**kwargs):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 42, 5, 7
        message, context, run, fab = rc.pull_task_input(None)  # the gate's wrappers around the functions below
        try:
            rc.install_from_fab(fab.content, skip_prompt=True)
            bundle_view.write_text(json.dumps({"env": sorted(k for k in os.environ if k.startswith("HOSPITRUST_")),
                                               "paths": [v for v in os.environ.values() if "/hospital/" in v],
                                               "pipes": sorted(_pipes())}))
            reply = Message(RecordDict({"metrics": MetricRecord({"loss": 0.5})}), reply_to=message)
        except Exception as exc:  # Flower's error path: an error reply with the reason
            reply = Message(Error(code=0, reason=str(exc)), reply_to=message)
        rc.push_message(None, reply, context)
        sys.exit(0)

    return run_clientapp, pull


@pytest.mark.parametrize("approved", [True, False], ids=["accepted", "refused"])
def test_the_launcher_writes_the_entry_from_the_childs_decision_pipe(tmp_path, monkeypatch, capsys, approved):
    import torch  # noqa: F401  # the launcher has it preloaded when it forks (launcher.PRELOAD)
    from flwr.supernode.runtime import run_clientapp as rc

    content = approval.build_fab(make_app(tmp_path / "app"))
    sha = approval.fab_sha256(content)
    store = approval.Approvals(tmp_path / "gate" / "approved.toml")
    if approved:
        store.approve(content)
    log = tmp_path / "gate" / "audit.jsonl"
    config = gate.GateConfig(approvals=store.path, audit_log=log)
    config.check_files()
    view = tmp_path / "bundle-view.json"
    view.with_suffix(".fab").write_bytes(content)
    for name in gate.PRIVATE_ENV:
        monkeypatch.setenv(name, f"/hospital/{name}")
    run_clientapp, pull = _fake_runtime(view)
    monkeypatch.setattr(rc, "run_clientapp", run_clientapp)
    monkeypatch.setattr(rc, "pull_task_input", pull)
    monkeypatch.setattr(rc, "install_from_fab", rc.install_from_fab)  # Flower's own: the gate installs and checks
    monkeypatch.setattr(rc, "push_message", lambda client, message, context: None)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))

    other = launcher.AuditPipes(6, 41)  # another message in flight: its pipes are not this child's
    other.forked()
    pipes = launcher.AuditPipes(7, 42)
    inode = {fd: os.fstat(fd).st_ino for fd in (pipes.decision_r, pipes.claim_r, *other.open)}
    pid = launcher._fork("127.0.0.1:1", "token", "", config, pipes, {999: other})
    for fd in pipes.child_fds:  # the launcher keeps only the read ends
        with pytest.raises(OSError):
            os.fstat(fd)
    _, status = os.waitpid(pid, 0)
    launcher._write_audit(config, pipes, os.waitstatus_to_exitcode(status))
    other.close()

    entries, problem = audit.verify(log)
    assert problem is None and len(entries) == 1
    entry = entries[0]
    audited = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"audited"' in line]
    assert [(e["entries"], e["mac"]) for e in audited] == [(1, entry["mac"])]  # the head, in the launcher's log too
    assert {k: entry[k] for k in ("run", "task", "app_sha256", "message", "round", "exit")} == {
        "run": 42, "task": 7, "app_sha256": sha, "message": "train", "round": 3, "exit": 0}
    if approved:
        assert entry["decision"] == "accepted" and "reason" not in entry
        assert entry["reply_claimed_by_app"] == {"metrics": ["metrics/loss"]}
        seen = json.loads(view.read_text())
        # no path of the approvals, signers, policy, audit log or its key, under their names or any other
        assert not set(seen["env"]) & set(gate.PRIVATE_ENV) and seen["paths"] == [], seen
        # the bundle's code holds the claim pipe, not its decision pipe (closed before the install) nor another's
        assert inode[pipes.claim_r] in seen["pipes"]
        assert not {inode[pipes.decision_r], *(inode[fd] for fd in other.open)} & set(seen["pipes"])
    else:
        assert entry["decision"] == "refused" and entry["reason"] == f"refused: app not approved (sha256 {sha})"
        assert entry["reply_claimed_by_app"]["error"].startswith("refused: app not approved")
        assert not view.exists()  # the "bundle" never ran


def test_a_child_that_dies_before_deciding_or_writes_garbage_gets_an_entry_saying_so(tmp_path):
    log = tmp_path / "audit.jsonl"
    config = gate.GateConfig(audit_log=log)
    pipes = launcher.AuditPipes(3, 9)
    garbage = b'{"decision": "accepted"}\n{"arrays": {}}\n'
    pid = os.fork()
    if pid == 0:  # a ClientApp that never reached the gate's decision, and wrote two lines on the claim pipe
        os.write(pipes.child_fds[1], garbage)
        os._exit(17)
    pipes.forked()
    _, status = os.waitpid(pid, 0)
    launcher._write_audit(config, pipes, os.waitstatus_to_exitcode(status))
    entries, problem = audit.verify(log)
    assert problem is None
    assert {k: v for k, v in entries[0].items() if k not in ("time", "mac", "v", "n")} == {
        "run": 9, "task": 3, "decision": "none", "reason": "the ClientApp ended (17) before the gate decided",
        "exit": 17, "reply_claimed_by_app": {"unreadable": f"{len(garbage)} bytes, not one JSON object"}}


@pytest.fixture
def pki(tmp_path):
    from hospitrust.ops import deploy

    deploy.create_ca(tmp_path / "pki")
    deploy.create_server_cert(tmp_path / "pki" / "ca.crt", tmp_path / "pki" / "ca.key", tmp_path / "pki", ["superlink.example.org"])
    return tmp_path / "pki"


def test_the_superlinks_state_and_the_gateways_access_log_are_0600(tmp_path, pki):
    import sqlite3

    from hospitrust.ops.deploy import gateway
    from hospitrust.ops.deploy.superlink import private_database

    old = os.umask(0o022)  # the usual umask: what SQLite and nginx would create 0644
    try:
        database = tmp_path / "superlink" / "state.db"
        database.parent.mkdir()
        private_database(database)
        db = sqlite3.connect(database)
        db.execute("PRAGMA journal_mode=WAL")  # as Flower's SuperLink opens it
        db.execute("CREATE TABLE runs (id INTEGER)")
        db.execute("INSERT INTO runs VALUES (1)")
        db.commit()
        files = [database, database.with_name("state.db-wal"), database.with_name("state.db-shm")]
        assert {p.name: p.stat().st_mode & 0o777 for p in files} == {p.name: 0o600 for p in files}
        db.close()
        for p in files:  # a database an older hospitrust left 0644
            if p.exists():
                p.chmod(0o644)
        private_database(database)
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in files if p.exists())

        layout = gateway.GatewayLayout(host="127.0.0.1", port=19093, operator_host="127.0.0.1", operator_port=19095,
                                       superlink_port=19094)
        state = tmp_path / "gw"
        text = gateway.gateway_config(layout, ca=pki / "ca.crt", cert=pki / "server.pem", key=pki / "server.key",
                                      state=state)
        gateway.write_nginx_config(text, state)  # runs `nginx -t`, which opens the access log
        assert (state / "access.log").stat().st_mode & 0o777 == 0o600
        (state / "access.log").chmod(0o644)
        gateway.write_nginx_config(text, state)
        assert (state / "access.log").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def _reply(node_id: int, head=None, **record):
    """A train reply as the server's features see it: its content (a real RecordDict) and the node it came from."""
    from types import SimpleNamespace

    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    content = RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord({"num-examples": 3})})
    if head is not None or record:
        content[audit.ANCHOR_RECORD] = ConfigRecord(record or {"entries": head[0], "mac": head[1]})
    return SimpleNamespace(content=content, has_content=lambda: True, metadata=SimpleNamespace(src_node_id=node_id))


def test_a_rolled_back_log_verifies_alone_and_fails_against_the_heads_the_federation_recorded(tmp_path):
    """Issue 61: restoring an older copy of log and head together verifies (nothing on the machine shows it); the
    heads the train replies carried, recorded by the server per hospital and round, show it: the rolled-back log
    lacks the entries the federation saw, and one rolled back and written on has other MACs at their places."""
    from hospitrust.features import audit_anchor

    path = tmp_path / "audit" / "audit.jsonl"
    heads = []
    for n in range(6):
        heads.append(audit.current_head(path) if path.exists() else (0, audit.GENESIS))  # what message n carries
        audit.append(path, {"decision": "accepted", "run": 7, "message": "train", "round": n + 1}, None)
        if n == 2:  # an older copy of log and head (and key), kept aside
            old = tmp_path / "old"
            old.mkdir()
            for src in (path, audit.head_path(path), audit.key_path(path)):
                shutil.copy2(src, old / src.name)
    assert heads[0] == (0, audit.GENESIS) and [h[0] for h in heads] == list(range(6))
    # the server side: the feature records each hospital's head per round, as rounds.jsonl gets it
    feature = audit_anchor.AuditAnchors({11: "hospital-2", 12: "st-mary"})
    lines = []
    for rnd, head in enumerate(heads, 1):
        replies = [_reply(11, head), _reply(12)]  # st-mary runs without an audit log: nothing recorded for it
        round_ = type("R", (), {"number": rnd})()
        assert feature.on_replies(round_, replies) == replies
        lines.append({"round": rnd, **feature.record(round_)})
    assert lines[2]["audit_heads"] == {"hospital-2": {"entries": 2, "mac": heads[2][1]}}
    malformed = type("R", (), {"number": 9})()
    feature.on_replies(malformed, [_reply(11, entries="12", mac="x")])
    assert feature.record(malformed) == {"audit_heads": {"hospital-2": {"malformed": True}}}
    run = tmp_path / "runs" / "gate"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    entries, problem = audit.verify(path)
    assert problem is None and audit.against(entries, [{"round": r["round"], **r["audit_heads"]["hospital-2"]}
                                                       for r in lines]) == []
    res = _cli(str(path), "--against", str(run))
    assert res.returncode == 0 and "6 heads the federation recorded for hospital-2 in gate (up to entry 5): every one " \
                                   "is in this log" in res.stdout, res.stdout + res.stderr
    res = _cli(str(old / path.name), "--quiet")  # the rolled-back copy, alone: verifies
    assert res.returncode == 0 and "3 entries; every entry's MAC and the head verify" in res.stdout, res.stdout + res.stderr
    res = _cli(str(old / path.name), "--quiet", "--against", str(run / "rounds.jsonl"), "--hospital", "hospital-2")
    assert res.returncode == 1 and ("entry 4: missing: the federation saw 4 entries at run gate round 5, the log has 3 "
                                    "(the log was rolled back or cut)") in res.stderr, res.stdout + res.stderr
    # rolled back and written on: as many entries as the federation saw, other MACs
    audit.append(old / path.name, {"decision": "accepted", "run": 7, "message": "train", "round": 99}, None)
    audit.append(old / path.name, {"decision": "accepted", "run": 7, "message": "train", "round": 99}, None)
    res = _cli(str(old / path.name), "--quiet", "--against", str(run))
    assert res.returncode == 1 and "entry 4: is not the entry the federation saw at run gate round 5" in res.stderr, \
        res.stdout + res.stderr
    res = _cli(str(path), "--quiet", "--against", str(tmp_path))
    assert res.returncode == 2 and "no rounds.jsonl there" in res.stderr, res.stderr
    (tmp_path / "broken.jsonl").write_text((run / "rounds.jsonl").read_text() + "{not json\n")
    res = _cli(str(path), "--quiet", "--against", str(tmp_path / "broken.jsonl"))
    assert res.returncode == 2 and "line 7 is not a round's record" in res.stderr, res.stderr

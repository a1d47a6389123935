"""A hospital decides which code runs on its machine and what leaves it, in the session's real federation
(TLS, SuperNode authentication, the warm launcher): hospital-2 restarts with an approvals file, a trusted
signer, a site policy and an audit log; the operator sends it bundles it did and did not approve.

Each run is one round on the tiny export; the bundles differ from the approved one by one line, which
writes a file in the importing SuperNode's FLWR_HOME: the file shows whose ClientApp imported the bundle, and
holds every value of the ClientApp's environment that names one of the gate's files (none should).
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from federation import REPO, free_port, run_config, supernode_cli, task_keys
from test_service_files import _exec_start, _rewrite
from hospitrust.ops import deploy
from hospitrust.ops.deploy import approval, audit, gate
from hospitrust.records import RoundRecord
from hospitrust.server_app.results import read_round_records
from hospitrust.supervision import confine

pytestmark = [pytest.mark.slow, pytest.mark.data]
NAME = "hospital-2"
MARK = "imported-by-bundle"
MARKS_ENV = "HOSPITRUST_TEST_MARKS"  # where the confined hospital's bundle writes its mark (its user's own folder)
# The bundle's added lines: its mark holds the values of its environment that name a gate file (none should), and
# whether it could open each of the gate's files for writing (opened without O_CREAT and closed, never written).
SIDE_EFFECT = """import os as _os; _m = open(_os.path.join(_os.environ.get({marks!r}) or _os.environ.get("FLWR_HOME", "."), {mark!r}), "a")  # {tag}
_m.write("".join(f"{{_k}}={{_v}}\\n" for _k, _v in _os.environ.items() if "gate" in _v or _k.startswith("HOSPITRUST_")))
for _p in {probes!r}:
    try:
        _os.close(_os.open(_p, _os.O_WRONLY | _os.O_APPEND)); _m.write(f"writable {{_p}}\\n")
    except PermissionError:
        _m.write(f"denied {{_p}}\\n")
    except OSError:
        _m.write(f"missing {{_p}}\\n")
_m.close()
"""


def _gate_files(fed) -> list[Path]:
    """What the ClientApp must not write: the approvals, the policy, the signers' key, the audit log, its key, its head."""
    log = fed.gate["audit"]
    return [fed.gate["store"].path, fed.gate["policy"], fed.gate["signers"], log, audit.key_path(log), audit.head_path(log)]


def _variant(fed, tag: str) -> Path:
    """The federation's app with a few lines added to the ClientApp package: an import side effect."""
    dst = fed.work / f"app-{tag}"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(fed.app, dst)
    init = dst / "hospitrust" / "client_app" / "__init__.py"
    probes = [str(p) for p in _gate_files(fed)]
    init.write_text(init.read_text() + SIDE_EFFECT.format(marks=MARKS_ENV, mark=MARK, tag=tag, probes=probes))
    return dst


def _traversable(paths, user: confine.AppUser) -> list[tuple[Path, int]]:
    """Let ``user`` reach ``paths``: o+x on every folder above each that lacks it (this machine's Python and pytest's
    folders live under 0700 folders; a hospital's venv and Python must be readable by the ClientApp's user:
    docs/deployment.md). Returns the folders changed, with their old modes, for :func:`_restore`."""
    changed = []
    for path in paths:
        for folder in reversed(Path(path).resolve().parents):
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & 0o001 and not any(f == folder for f, _ in changed):
                os.chmod(folder, mode | 0o001)
                changed.append((folder, mode))
    return changed


def _restore(changed: list[tuple[Path, int]]) -> None:
    for folder, mode in reversed(changed):
        os.chmod(folder, mode)


# Becomes the unit's User= with its AmbientCapabilities= and NoNewPrivileges=, then runs the unit's ExecStart: argv is
# UID GID COMMAND... (run as root; Python's modules come from a venv the service user can read)
AS_SERVICE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = int(sys.argv[1]), int(sys.argv[2])
assert libc.prctl(8, 1, 0, 0, 0) == 0  # PR_SET_KEEPCAPS: the capabilities survive the switch
os.setgroups([]); os.setresgid(gid, gid, gid); os.setresuid(uid, uid, uid)
caps = (1 << 5) | (1 << 6) | (1 << 7)  # CAP_KILL, CAP_SETGID, CAP_SETUID: the unit's AmbientCapabilities=
class Header(ctypes.Structure): _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure): _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
data = (Data * 2)(); data[0].effective = data[0].permitted = data[0].inheritable = caps
assert libc.capset(ctypes.byref(Header(0x20080522, 0)), data) == 0
for cap in (5, 6, 7):
    assert libc.prctl(47, 2, cap, 0, 0) == 0  # PR_CAP_AMBIENT_RAISE: kept across execve, as systemd does
assert libc.prctl(38, 1, 0, 0, 0) == 0  # NoNewPrivileges=true
os.execv(sys.argv[3], sys.argv[3:])
"""


def _give(owner: pwd.struct_passwd, *paths: Path, mode: int | None = None) -> None:
    for path in paths:
        os.chown(path, owner.pw_uid, owner.pw_gid)
        if mode is not None:
            os.chmod(path, mode)


@pytest.fixture(scope="module")
def guarded(federation):
    """hospital-2 restarted by the shipped unit's ExecStart (tests/test_service_files.py's rewrite: its paths under a
    folder of its own), run as the unit's service user with the unit's three capabilities, plus the trusted signer the
    tests use: its gate, and its ClientApps confined to ``nobody`` (the unit's ``--clientapp-user``, Flower's own
    ClientApp runner). Restored to the plain SuperNode afterwards.
    """
    fed = federation
    if os.geteuid() != 0:
        pytest.fail("the unit's service user and the confined ClientApp need root to set up (the suite runs as root "
                    "here and in CI)", pytrace=False)
    service, user = pwd.getpwnam("daemon"), confine.AppUser.parse("nobody")  # the unit's User= and hospitrust-app
    # what the service user and the ClientApp's user reach lives outside pytest's folders (pytest makes its root 0700
    # again at the start of any session, a nested one too)
    world = Path(tempfile.mkdtemp(prefix="hospitrust-unit-"))
    os.chmod(world, 0o755)
    etc, lib, cache, logs = (world / name for name in ("etc-hospitrust", "var-lib-hospitrust", "var-cache-hospitrust",
                                                        "var-log-hospitrust"))
    etc.mkdir(mode=0o755)  # /etc/hospitrust: root's; the files the service reads in it are given to it
    for folder, mode in ((lib, 0o755), (cache, 0o755), (logs, 0o700)):  # the unit's *Directory= modes
        folder.mkdir()
        _give(service, folder, mode=mode)
    data = world / "data"
    shutil.copytree(fed.export[NAME], data)
    subprocess.run(["chmod", "-R", "o+rX", str(data)], check=True)
    shutil.copy(fed.certs / "ca.crt", etc / "ca.crt")
    shutil.copy(fed.keys / f"{NAME}.key", etc / f"{NAME}.key")
    shutil.copy(fed.export["task"], etc / "task.toml")
    os.chmod(etc / "ca.crt", 0o644)
    os.chmod(etc / "task.toml", 0o644)
    gate = fed.work / "gate"  # the consortium's signing key stays with the test (the operator's side)
    gate.mkdir(exist_ok=True)
    key, pub, key_id = approval.create_signing_key(gate, "release")
    shutil.copy(pub, etc / "release.pub")
    (etc / "policy.toml").write_text(POLICY)
    _give(service, etc / f"{NAME}.key", etc / "release.pub", etc / "policy.toml", mode=0o600)
    store = approval.Approvals(lib / "approved-apps.toml")
    store.approve(approval.build_fab(fed.app), by="security-officer", comment="the consortium's release")
    subprocess.run(["chown", "-R", f"{service.pw_uid}:{service.pw_gid}", str(store.path), str(store.bundles)], check=True)
    # the unit's ExecStartPre: the ClientApp's own folders, for hospitrust-app (here nobody)
    app_home, app_cache = lib / "app", cache / "app"
    for folder in (app_home, app_cache):
        folder.mkdir(mode=0o700)
        os.chown(folder, user.uid, user.gid)
    changed = _traversable([sys.prefix, sys.base_prefix, REPO], user)
    line, unit_env = _exec_start("hospitrust-supernode.service")
    for name, value in {"SUPERLINK": fed.address, "HOSPITAL": NAME, "DATA_PATH": str(data),
                        "TASK": str(etc / "task.toml")}.items():
        line = line.replace("${" + name + "}", value)
    cmd = shlex.split(_rewrite(line, world))
    cmd[cmd.index("--port") + 1] = str(free_port())  # one machine, three hospitals
    cmd += ["--trusted-signers", str(etc / "release.pub")]  # the unit's header: add it where the consortium signs
    env = {k: _rewrite(v, world) for k, v in unit_env.items()}
    Path(env["FLWR_HOME"]).mkdir(mode=0o700)
    _give(service, Path(env["FLWR_HOME"]))
    env.update({"XDG_STATE_HOME": f"{env['HOME']}/.local/state",  # the unit's HOME's, not the suite's own
                MARKS_ENV: str(app_home)})
    fed.kill(NAME, signal.SIGTERM)
    fed.restarted.append(f"{NAME} (the unit's ExecStart)")
    fed.start(NAME, [sys.executable, "-c", AS_SERVICE, str(service.pw_uid), str(service.pw_gid), *cmd],
              Path(env["FLWR_HOME"]), env=env, cwd=world)
    fed.wait_connected(NAME)
    fed.wait_online(list(fed.node_ids))
    fed.gate = {"store": store, "key": key, "key_id": key_id, "audit": logs / "audit.log", "user": user,
                "service": service, "marks": app_home, "cache": app_cache / "images", "flwr_home": Path(env["FLWR_HOME"]),
                "data": data, "policy": etc / "policy.toml", "signers": etc / "release.pub", "command": cmd}
    try:
        yield fed
    finally:
        fed.kill(NAME, signal.SIGTERM)
        _restore(changed)
        shutil.rmtree(world, ignore_errors=True)
        fed.restarted.append(f"{NAME} (without its gate)")
        fed.start(NAME, supernode_cli(fed, NAME, fed.export[NAME]), fed.work / f"sn-{NAME}")
        fed.wait_connected(NAME)


def _approve(fed, content: bytes) -> None:
    """The security officer approves a bundle (as root here): the files stay the service user's."""
    fed.gate["store"].approve(content, by="security-officer")
    subprocess.run(["chown", "-R", f"{fed.gate['service'].pw_uid}:{fed.gate['service'].pw_gid}",
                    str(fed.gate["store"].path), str(fed.gate["store"].bundles)], check=True)


def _run(fed, name: str, app: Path, extra: str = "", keys: bool = True) -> tuple[dict, list[RoundRecord]]:
    config = run_config(fed, name, f"{task_keys(fed) if keys else ''} {extra}", rounds=1)
    if "local-epochs=" in extra:  # flwr refuses a key given twice: the federation's default gives way
        config = config.replace("local-epochs=2 ", "", 1)
    run_id = fed.submit(config, app=app)
    status, details = fed.wait(run_id)
    assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}\n{fed.tail(NAME)}"
    run_dir = fed.work / "runs" / name
    config = json.loads((run_dir / "config.json").read_text())
    return config, read_round_records(run_dir)


def _runtime_apis(fed) -> dict[str, tuple[str, str]]:
    """Each hospital's SuperNode: its local Runtime API (``--port``) and its secret file, from its command line."""
    found = {}
    for name, proc in fed.procs.items():
        if name not in fed.node_ids:
            continue
        for child in psutil.Process(proc.pid).children(recursive=True):
            cmd = child.cmdline()
            if any(part.endswith("flower-supernode") for part in cmd[:4]) and "--port" in cmd:  # under supernode_main
                secret = cmd[cmd.index("--superexec-auth-secret-file") + 1] if "--superexec-auth-secret-file" in cmd else ""
                found[name] = (cmd[cmd.index("--port") + 1], secret)
    return found


def _neighbour(user: confine.AppUser, apis: dict[str, tuple[str, str]], seconds: float, apps: Path) -> subprocess.Popen:
    """Another account on the hospitals' machine (the confined ClientApp's user): for ``seconds`` it asks each
    SuperNode's local Runtime API for a task, as Flower's SuperExec does, and tries to read each secret; then it tries
    to swap the bundles installed under ``apps`` (to write each file, to add one to each folder). Prints what it got,
    one JSON line. Python's modules are imported before it becomes ``user`` (this machine's Python is not readable
    by it).
    """
    code = f"""
import json, os, sys, time
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore.constant import TaskType
from flwr.supercore.runtime import RuntimeHttpClient
apis = {apis!r}
clients = {{n: RuntimeHttpClient.from_server_address(server_address=f"127.0.0.1:{{port}}", insecure=True,
                                                    root_certificates=None, interceptors=[]) for n, (port, _) in apis.items()}}
os.setgroups([]); os.setresgid({user.gid}, {user.gid}, {user.gid}); os.setresuid({user.uid}, {user.uid}, {user.uid})
got = {{"uid": os.getuid(), "asked": 0, "tasks": [], "answers": {{}}, "secrets": {{}}}}
for name, (_, secret) in apis.items():
    try:
        open(secret, "rb").read(); got["secrets"][name] = "READ"
    except OSError as exc:
        got["secrets"][name] = type(exc).__name__
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    for name, client in clients.items():
        got["asked"] += 1
        try:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types={{TaskType.CLIENT_APP}}))
            if res.HasField("task"):
                got["tasks"].append(name)
            answer = "no task"
        except Exception as exc:
            response = getattr(exc, "response", None)
            answer = f"{{response.status_code}} {{response.text[:160]}}" if response is not None else repr(exc)[:160]
        got["answers"].setdefault(answer, 0)
        got["answers"][answer] += 1
    time.sleep(0.2)
got["swaps"] = {{}}
for root, dirs, files in os.walk({str(apps)!r}):
    for path in [os.path.join(root, "swapped.py")] + [os.path.join(root, f) for f in files]:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | (os.O_CREAT if path.endswith("swapped.py") else 0)))
            outcome = "WROTE"
        except OSError as exc:
            outcome = type(exc).__name__
        got["swaps"][outcome] = got["swaps"].get(outcome, 0) + 1
print(json.dumps(got))
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trained(rounds: list[RoundRecord]) -> set[str]:
    return {c.hospital for c in rounds[0].clients if not c.rejected}


def test_an_unapproved_bundle_is_refused_unimported_then_approved_signed_or_refused_by_policy(guarded):
    fed = guarded
    marks = {"st-mary": fed.work / "sn-st-mary" / MARK, NAME: fed.gate["marks"] / MARK}
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
    rollback = fed.work / "audit-rollback"  # an older copy of hospital-2's log, head and key, for (e)
    rollback.mkdir(exist_ok=True)
    for path in (fed.gate["audit"], audit.head_path(fed.gate["audit"]), audit.key_path(fed.gate["audit"])):
        shutil.copy2(path, rollback / path.name)

    # (b) the security officer reviews and approves the bundle the gate kept; the same run trains there
    pending = fed.gate["store"].bundles / "pending" / f"{sha}.fab"
    review = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "app", "review", str(pending), "--approvals",
                             str(fed.gate["store"].path)], capture_output=True, text=True, timeout=60)
    assert review.returncode == 0 and "+import os as _os" in review.stdout, review.stdout + review.stderr
    _approve(fed, pending.read_bytes())
    # meanwhile another account of the hospitals' machine asks each SuperNode's local Runtime API for the messages
    # (issue 61, finding 1: it used to get them, with the token to answer them without the gate)
    apis = _runtime_apis(fed)
    assert set(apis) == set(fed.node_ids) and all(secret for _, secret in apis.values()), apis
    neighbour = _neighbour(fed.gate["user"], apis, seconds=20, apps=fed.gate["flwr_home"] / "apps")
    config, rounds = _run(fed, "gate-approved", changed)
    out, err = neighbour.communicate(timeout=60)
    assert config["failed-hospitals"] == [] and NAME in _trained(rounds)
    got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"stderr": err}
    (fed.work / "neighbour.json").write_text(json.dumps(got, indent=1))  # for the record (docs/security.md's figures)
    assert got.get("uid") == fed.gate["user"].uid and got["asked"] >= 3 * len(apis) and got["tasks"] == [], got
    assert set(got["secrets"].values()) == {"PermissionError"}, got  # the secret: the service user's alone
    # the bundles installed there (hashed by the gate, then imported): none of their files or folders writable by it
    # (issue 61, finding 5: a swap after the hash ran the swapped code)
    assert set(got["swaps"]) == {"PermissionError"} and sum(got["swaps"].values()) > 10, got
    assert all(answer.startswith(("401", "403")) and "authentication failed" in answer.lower()
               for answer in got["answers"]), got  # every ask refused for want of the secret, none "no task"
    # the approved bundle's code ran at hospital-2 as nobody (--clientapp-user, in Flower's own ClientApp runner: it
    # trained and replied), without the gate's paths, and could open none of the gate's files for writing; the same
    # code at st-mary, which runs as the service user there, could (the control)
    assert marks[NAME].exists() and marks[NAME].stat().st_uid == fed.gate["user"].uid
    seen = marks[NAME].read_text()
    environment = [line for line in seen.splitlines() if not line.startswith(("writable ", "denied ", "missing "))]
    assert not any(any(str(p) in line for p in _gate_files(fed)) or line.split("=")[0] in gate.PRIVATE_ENV
                   for line in environment), seen
    probes = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in seen.splitlines()
              if line.startswith(("writable ", "denied ", "missing "))}
    assert probes and set(probes) == {str(p) for p in _gate_files(fed)}, seen
    assert set(probes.values()) == {"denied"}, probes
    control = {line.split(" ", 1)[1] for line in marks["st-mary"].read_text().splitlines() if line.startswith("writable ")}
    assert control == set(probes), marks["st-mary"].read_text()
    cache = fed.gate["cache"]
    assert any(cache.rglob("*")) and all(p.stat().st_uid == fed.gate["user"].uid for p in cache.rglob("*"))

    # (c) a bundle nobody approved, signed by the trusted key, runs: hospital-2 answers its query (the bundle's
    # import side effect happens there) ... (d) ... and, asked for more local epochs than its policy allows, refuses
    # to train, which the server records as the policy's refusal (within the policy it trained: (b))
    signed = _variant(fed, "signed-release")
    content = approval.build_fab(signed)
    good = approval.sign(content, fed.gate["key"], fed.gate["key_id"])
    marks[NAME].unlink()
    config, rounds = _run(fed, "gate-signed-policy", signed, f'app-signature="{good}" local-epochs=3')
    assert config["failed-hospitals"] == [] and marks[NAME].exists()
    entry = rounds[0].client(NAME)
    assert entry is not None and entry.rejected and entry.reason == "refused by site policy: max-local-epochs: 3 > 2", entry
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
    # the heads hospital-2's train replies carried, recorded by the server: its log holds every one; the older copy
    # (after run (a)) verifies on its own but not against them (a rollback, issue 61)
    approved_run = fed.work / "runs" / "gate-approved"
    recorded = [r.entries.get("audit_heads", {}) for r in read_round_records(approved_run)]
    assert any(NAME in heads for heads in recorded) and not any("st-mary" in heads for heads in recorded), recorded
    against = [sys.executable, "-m", "hospitrust.cli.main", "deploy", "audit", "--quiet", "--against", str(approved_run),
               "--hospital", NAME]
    res = subprocess.run([*against, str(audit_log)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "every one is in this log" in res.stdout, res.stdout + res.stderr
    old = fed.work / "audit-rollback" / audit_log.name
    res = subprocess.run([*against[:5], str(old)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "every entry's MAC and the head verify" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([*against, str(old)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "the log was rolled back or cut" in res.stderr, res.stdout + res.stderr
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
    assert not any(str(fed.gate["data"]) in line for line in lines)  # no path of the hospital's data
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
    policy = fed.gate["policy"]
    images = sum(1 for p in Path(fed.export[NAME]).rglob("*") if p.is_file() and p.suffix.lower() == ".dcm")
    assert images * 2 * 0.02 < 50 < images * 2  # the old rule accepted this run, the new one refuses it
    policy.write_text(POLICY + "max-images-per-round = 50\n")
    try:
        config, rounds = _run(fed, "gate-images", fed.app, "train-subsample=0.02")
    finally:
        policy.write_text(POLICY)
    assert config["failed-hospitals"] == []  # it answered the query: the rule is about training
    entry = rounds[0].client(NAME)
    assert entry is not None and entry.rejected and entry.reason == (
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
    _approve(fed, approval.build_fab(variant))  # approved: the policy must hold
    policy = fed.gate["policy"]
    policy.write_text(POLICY + 'tasks = ["pneumoniamnist-export", "pneumoniamnist"]\n')
    try:
        config, rounds = _run(fed, "gate-no-task", variant, 'task.file="tasks/chest-xray.toml"', keys=False)
    finally:
        policy.write_text(POLICY)
    refused = {f["hospital"]: f["reason"] for f in config["failed-hospitals"]}
    assert refused.get(NAME, "").startswith("refused by site policy: tasks: the message names no task"), config["failed-hospitals"]
    assert NAME not in _trained(rounds)


def test_three_train_messages_in_one_round_are_counted_as_one_round(guarded):
    """Finding 4: an operator's ServerApp that sends each hospital three train messages in one round got three
    accepted (3 x 79 images under a 100-image policy). Now the launcher counts the round's images across messages:
    the first is accepted, the second and third refused, whatever the ServerApp does."""
    fed = guarded
    variant = _variant(fed, "three-trains")
    base = variant / "hospitrust" / "strategies" / "messages.py"  # where a rule's round messages are built
    one = ('''            Message(content, dst_node_id=nid, message_type=MessageType.TRAIN)
            for nid in self.sample_hospitals(grid, excluded)''')
    assert one in base.read_text()
    base.write_text(base.read_text().replace(one, '''            Message(RecordDict({"arrays": arrays, "config": ConfigRecord({**cfg, "copy": copy})}), dst_node_id=nid,
                    message_type=MessageType.TRAIN)
            for nid in self.sample_hospitals(grid, excluded) for copy in range(3)'''))
    _approve(fed, approval.build_fab(variant))  # the operator's change is approved: the site limit must still hold
    images = sum(1 for p in Path(fed.gate["data"]).rglob("*") if p.is_file() and p.suffix.lower() == ".dcm")
    limit = images + images // 2  # one message's images fit, two do not
    fed.gate["policy"].write_text(POLICY + f"max-images-per-round = {limit}\n")
    try:
        config = run_config(fed, "gate-three-trains", f"{task_keys(fed)} local-epochs=1", rounds=1)
        run_id = fed.submit(config.replace("local-epochs=2 ", "", 1), app=variant)
        fed.wait(run_id)  # its status does not matter here: what hospital-2 ran does
    finally:
        fed.gate["policy"].write_text(POLICY)

    def trains():  # the launcher writes an entry when the child has exited, just after the reply
        return [e for e in map(json.loads, fed.gate["audit"].read_text().splitlines())
                if e.get("run") == run_id and e.get("message") == "train"]

    deadline = time.monotonic() + 30
    while len(entries := trains()) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [(e["round"], e["decision"]) for e in entries] == [(1, "accepted"), (1, "refused"), (1, "refused")], entries
    assert entries[0]["images_this_round"] == images
    refused = (f"refused by site policy: max-images-per-round: round 1 of run {run_id} has trained {images} images "
               f"here already; this message's {images} would make {2 * images} > {limit}")
    assert entries[1]["reason"] == entries[2]["reason"] == refused, entries

"""Only the operator controls the federation: the locked-down SuperLink of `hospitrust deploy superlink`,
played against by a stranger who holds the consortium's `ca.crt` (every hospital has it) and reaches the
hospitals' address, and used by the operator through their certificate and local tunnel.

Real processes on 127.0.0.1 (the session's federation, tests/federation.py): before the gateway, the same
stranger registered a rogue SuperNode, ran a foreign app on every hospital and read every run's log.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest

from federation import HOSPITALS, flwr_env, run_config, supernode_cli, task_keys
from federation import superlinks as federation_superlinks
from hospitrust.ops import deploy

pytestmark = [pytest.mark.slow, pytest.mark.data]


def _status(url: str, ca, method: str = "GET", cert=None) -> int:
    """The HTTP status of one request (the body is an empty protobuf for POSTs)."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                 headers={"Content-Type": "application/protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _refused(res) -> bool:
    out = res.stdout + res.stderr
    return res.returncode != 0 or '"success": false' in out


def test_a_stranger_with_only_ca_crt_can_neither_register_nor_run_nor_read(federation):
    fed = federation
    stranger = fed.work / "cli-stranger"
    deploy.write_connection("consortium", fed.address, fed.certs / "ca.crt", make_default=True, home=stranger)
    attempts = {
        "supernode register": fed.flwr("supernode", "register", str(fed.keys / "rogue.pub"), "consortium", home=stranger),
        "run": fed.flwr("run", str(fed.app), "consortium", "--format", "json", home=stranger),
        "ls": fed.flwr("ls", "consortium", "--format", "json", home=stranger),
        "log": fed.flwr("log", "1", "consortium", "--show", home=stranger),
        "supernode list": fed.flwr("supernode", "list", "consortium", "--format", "json", home=stranger),
    }
    for what, res in attempts.items():
        out = res.stdout + res.stderr
        assert _refused(res) and "403" in out, f"flwr {what} as a stranger was not refused:\n{out}"
    # the same reads in process (hospitrust's run supervisor, grids and console use Flower's client so): refused too
    status, details = deploy.run_status(1, "consortium", env=flwr_env(stranger))
    assert status == "unknown" and "403" in details, details
    assert deploy.online_nodes("consortium", env=flwr_env(stranger)) == []
    # nor on the operators' listener without an operator certificate: TLS asks for one
    deploy.write_connection("direct", fed.operator_address, fed.certs / "ca.crt", make_default=True, home=stranger)
    res = fed.flwr("ls", "direct", "--format", "json", home=stranger)
    assert _refused(res) and '"runs"' not in res.stdout, res.stdout + res.stderr
    # and nothing changed: the operator sees the three hospitals' SuperNodes, no rogue one, and no run of the stranger
    nodes = json.loads(fed.flwr("supernode", "list", "tls", "--format", "json").stdout)["nodes"]
    assert {str(n["node-id"]) for n in nodes} == set(fed.node_ids.values()), nodes


def test_the_superlink_listens_on_loopback_only_and_the_hospitals_listener_serves_only_the_fleet_api(federation):
    fed = federation
    # the wrapper's live flower-superlink (a run's ServerApp that has just exited may linger as a zombie beside it)
    superlinks = federation_superlinks(psutil.Process(fed.procs["superlink"].pid))
    assert len(superlinks) == 1, superlinks
    listening = [c.laddr for c in superlinks[0].net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    assert {addr.port for addr in listening} == {fed.superlink_port}, listening

    ca = fed.certs / "ca.crt"
    base = f"https://{fed.address}"
    for path in ("/v1/runtime/pull-messages", "/v1/runtime/push-messages", "/v1/control/list-runs", "/v1/control/start-run",
                 "/v1/control/register-node", "/v1/control/stream-logs", "/docs", "/openapi.json", "/redoc", "/"):
        for method in ("GET", "POST"):
            assert _status(base + path, ca, method) == 403, f"{method} {path} was not refused on the hospitals' listener"
    assert _status(base + "/health", ca) == 200
    # a Fleet call reaches Flower (which answers the empty request itself); only POST, only the twelve paths
    assert _status(base + "/v1/fleet/pull-messages", ca, "POST") not in (403, 404)
    assert _status(base + "/v1/fleet/pull-messages", ca, "GET") == 403
    assert _status(base + "/v1/fleet/not-a-fleet-call", ca, "POST") == 403
    # the operators' listener: the Control API with an operator's certificate only (not with the SuperLink's own)
    operator = f"https://{fed.operator_address}"
    alice = (fed.operator / "alice.crt", fed.operator / "alice.key")
    assert _status(operator + "/v1/control/list-runs", ca, "POST", cert=alice) not in (400, 403)
    assert _status(operator + "/v1/runtime/pull-messages", ca, "POST", cert=alice) == 403
    assert _status(operator + "/docs", ca, "GET", cert=alice) == 403
    server = (fed.certs / "server.pem", fed.certs / "server.key")
    assert _status(operator + "/v1/control/list-runs", ca, "POST", cert=server) in (400, 403)
    try:
        code = _status(operator + "/v1/control/list-runs", ca, "POST")
    except (ssl.SSLError, urllib.error.URLError):  # TLS 1.3 may end the handshake before any HTTP status
        code = 400
    assert code == 400, code

    # another account of the SuperLink's machine, on its local port with ca.crt, asks for a pending run's ServerApp
    # token, as Flower's SuperExec does: refused for want of the secret the warm launcher holds (with Flower's own
    # launcher, subprocess isolation, the SuperLink ignores a secret and hands the token to whoever asks first)
    cmd = superlinks[0].cmdline()
    assert cmd[cmd.index("--isolation") + 1] == "process", cmd
    secret = Path(cmd[cmd.index("--superexec-auth-secret-file") + 1])
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.parent.stat().st_mode & 0o777 == 0o700
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType
    from flwr.supercore.runtime import RuntimeHttpClient

    client = RuntimeHttpClient.from_server_address(server_address=f"127.0.0.1:{fed.superlink_port}", insecure=False,
                                                   root_certificates=ca.read_bytes(), interceptors=[])
    try:
        for task_type in (TaskType.SERVER_APP, TaskType.CLIENT_APP):
            with pytest.raises(Exception) as refused:
                client.AcquireTask(AcquireTaskRequest(supported_task_types={task_type}))
            response = getattr(refused.value, "response", None)
            assert response is not None and response.status_code in (401, 403), repr(refused.value)
            assert "authentication failed" in response.text.lower(), response.text
    finally:
        client.close()


PLANTED = ("P-SECRET-4711", "DOE_JANE", "DOE^JANE", "PID-31337", "ACC-99812")


def _bad_dicom_site(fed, root: Path) -> Path:
    """hospital-2's DICOM folders plus one file without pixel data, in an accession-numbered folder, named after
    its patient, with the patient's id and name in its header."""
    import pydicom

    from hospitrust.datasets.dicom import write_dicom

    shutil.copytree(fed.export["hospital-2"], root)
    first = sorted(p for p in root.iterdir() if p.is_dir())[0]
    bad = first / "ACC-99812" / "P-SECRET-4711_DOE_JANE.dcm"
    bad.parent.mkdir()
    write_dicom(bad, np.zeros((28, 28), dtype=np.uint8), patient_id="PID-31337")
    ds = pydicom.dcmread(bad)
    ds.PatientName = "DOE^JANE"
    del ds.PixelData
    ds.save_as(bad)
    return root


def test_with_the_operator_credential_register_run_ls_and_log_work_and_no_identifier_leaves(federation):
    from identifier_scan import as_text, find_identifiers, identifiers_under

    fed = federation
    # registration went through the tunnel when the federation started; three SuperNodes joined
    assert set(fed.node_ids) == set(HOSPITALS)
    online = {str(n["node-id"]) for n in deploy.online_nodes("tls", env=flwr_env(fed.cli_home))}
    assert online == set(fed.node_ids.values())
    # a fourth hospital with a bad DICOM file and patient-like names, started past its data check
    site = _bad_dicom_site(fed, fed.work / "site-bad-dicom")
    deploy.create_supernode_keys(fed.keys, "bad-dicom")
    res = fed.flwr("supernode", "register", str(fed.keys / "bad-dicom.pub"), "tls")
    assert res.returncode == 0 and "registered successfully" in res.stdout, res.stdout + res.stderr
    bad_id = re.search(r"SuperNode (\d+) registered", res.stdout).group(1)
    cmd = [*supernode_cli(fed, "bad-dicom", site), "--skip-data-check"]
    cmd[cmd.index("--key") + 1] = str(fed.keys / "bad-dicom.key")
    fed.start("bad-dicom", cmd, fed.work / "sn-bad-dicom")
    try:
        deadline = time.monotonic() + 240
        while bad_id not in {str(n["node-id"]) for n in deploy.online_nodes("tls", env=flwr_env(fed.cli_home))}:
            assert time.monotonic() < deadline and fed.procs["bad-dicom"].alive(), fed.tail("bad-dicom")
            time.sleep(2)
        run_id = fed.submit(run_config(fed, "operator", task_keys(fed), rounds=1))
        status, details = fed.wait(run_id)
        assert status == deploy.COMPLETED, f"{status}: {details}\n{fed.run_log(run_id)}"
        listed = json.loads(fed.flwr("ls", "tls", "--format", "json").stdout)
        (row,) = [r for r in listed["runs"] if int(r["run-id"]) == run_id]
        assert row["status"] == deploy.COMPLETED, listed
        # hospitrust's in-process reads (Flower's Control API client, no `flwr` process) say what the CLI says
        assert deploy.run_status(run_id, "tls", env=flwr_env(fed.cli_home)) == (row["status"], row["status-details"])
        nodes = json.loads(fed.flwr("supernode", "list", "tls", "--format", "json").stdout)["nodes"]
        assert ({n["node-id"] for n in nodes if n["status"] == "online"}
                == {n["node-id"] for n in deploy.online_nodes("tls", env=flwr_env(fed.cli_home))} >= {bad_id}), nodes
        log = fed.run_log(run_id)
        assert re.search(r"round 1", log, re.IGNORECASE), log
    finally:
        fed.kill("bad-dicom")
        fed.procs.pop("bad-dicom")
    res = fed.flwr("supernode", "unregister", bad_id, "tls")
    assert res.returncode == 0, res.stdout + res.stderr

    # the bad hospital was left out with a reason that names the problem and an index, never a name or path
    run_dir = fed.work / "runs" / "operator"
    config = json.loads((run_dir / "config.json").read_text())
    (failed,) = config["failed-hospitals"]
    assert failed["hospital"] == "bad-dicom" and "without pixel data" in failed["reason"], failed
    classes = [p.name for p in site.iterdir() if p.is_dir()]
    forbidden = identifiers_under([site], classes, PLANTED)
    texts = {"flwr log": log, **{name: (run_dir / name).read_text() for name in ("config.json", "summary.json", "rounds.jsonl")}}
    leaks = {where: found for where, text in texts.items() if (found := find_identifiers(as_text(text), forbidden))}
    assert not leaks, leaks

"""`hospitrust deploy`: certificates, keys, the flwr connection file and the commands it runs (no processes)."""

from __future__ import annotations

import contextlib
import io
import stat
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hospitrust.ops import deploy
from hospitrust.cli.main import main as cli_main


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(list(args))
    return rc, out.getvalue(), err.getvalue()


def test_ca_server_cert_and_keys(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_crt, ca_key = deploy.create_ca(tmp_path / "ca")
    crt, key = deploy.create_server_cert(ca_crt, ca_key, tmp_path / "ca", ["127.0.0.1", "localhost,superlink.example.org"])
    assert _mode(ca_key) == 0o600 and _mode(key) == 0o600
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(i) for i in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "superlink.example.org"}
    ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)

    priv, pub = deploy.create_supernode_keys(tmp_path / "keys", "st-mary")
    assert _mode(priv) == 0o600
    assert priv.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert pub.read_text().startswith("ecdsa-sha2-nistp384 ")
    loaded = serialization.load_ssh_private_key(priv.read_bytes(), password=None)
    assert isinstance(loaded.curve, ec.SECP384R1)
    with pytest.raises(deploy.DeployError, match="refusing to overwrite"):
        deploy.create_supernode_keys(tmp_path / "keys", "st-mary")
    deploy.create_supernode_keys(tmp_path / "keys", "st-mary", force=True)
    assert _mode(priv) == 0o600


def test_write_connection_keeps_other_entries(tmp_path):
    ca, _ = deploy.create_ca(tmp_path / "ca")
    home = tmp_path / "flwr"
    path = deploy.write_connection("consortium", "superlink.example.org:9093", ca, home=home)
    data = tomllib.loads(path.read_text())
    assert data["superlink"]["local"]["address"] == ":local:"  # flwr's own default entry is kept
    assert data["superlink"]["consortium"] == {"address": "superlink.example.org:9093", "root-certificates": str(ca.resolve())}
    assert data["superlink"]["default"] == "local"
    deploy.write_connection("test", "127.0.0.1:9093", ca, make_default=True, home=home)
    data = tomllib.loads(path.read_text())
    assert set(data["superlink"]) >= {"consortium", "test", "local"} and data["superlink"]["default"] == "test"
    assert "insecure" not in data["superlink"]["test"]


def test_commands_have_the_required_flags(tmp_path):
    cmd = deploy.superlink_command(ca=tmp_path / "ca.crt", cert=tmp_path / "s.pem", key=tmp_path / "s.key",
                                   database=tmp_path / "db" / "state.db", host="0.0.0.0", port=9093)
    for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile", "--enable-supernode-auth", "--database",
                 "--disable-runtime-dependency-installation", "--host", "--port"):
        assert flag in cmd
    assert "--insecure" not in cmd
    cmd = deploy.supernode_command(superlink="h:9093", ca=tmp_path / "ca.crt", key=tmp_path / "k",
                                   node_config={"data-path": "/data/my images", "hospital": "st-mary"}, port=9100)
    assert cmd[cmd.index("--node-config") + 1] == 'data-path="/data/my images" hospital="st-mary"'
    assert "--root-certificates" in cmd and "--auth-supernode-private-key" in cmd
    # flwr's own parser reads it back whole
    from flwr.common.config import parse_config_args

    assert parse_config_args([cmd[cmd.index("--node-config") + 1]]) == {"data-path": "/data/my images", "hospital": "st-mary"}
    assert parse_config_args([deploy.node_config_string({"data-path": 'C:\\x "y"'})]) == {"data-path": 'C:\\x "y"'}


def test_the_runtime_secret_is_private_fresh_and_given_to_the_supernode_and_its_launcher_alone(tmp_path):
    """Issue 61, finding 1: the SuperNode hands tasks only to the holder of a secret made at each start (the
    real-process test: tests/test_hospital_control.py, another account is refused)."""
    import stat as _stat

    from hospitrust.supervision import runtime_secret
    from hospitrust.supervision import supervisor as sv

    first, second = runtime_secret.create(str(tmp_path)), runtime_secret.create(str(tmp_path))
    assert first.read_bytes() != second.read_bytes() and len(first.read_bytes()) == runtime_secret.SECRET_BYTES
    assert _stat.S_IMODE(first.stat().st_mode) == 0o600 and _stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    cmd = deploy.supernode_command(superlink="h:9093", ca=tmp_path / "ca.crt", key=tmp_path / "k", node_config={},
                                   isolation="process", superexec_secret=first)
    assert cmd[cmd.index("--superexec-auth-secret-file") + 1] == str(first)
    s = sv.Supervisor(cmd, "127.0.0.1:9094", message_timeout=30.0, env={}, out=lambda line: None)
    assert s.launcher_cmd[s.launcher_cmd.index("--superexec-auth-secret-file") + 1] == str(first)
    plain = deploy.supernode_command(superlink="h:9093", ca=tmp_path / "ca.crt", key=tmp_path / "k", node_config={})
    assert "--superexec-auth-secret-file" not in plain  # Flower's own launcher (subprocess isolation) ignores one
    assert "--superexec-auth-secret-file" not in sv.Supervisor(plain, "127.0.0.1:9094", message_timeout=30.0, env={},
                                                                out=lambda line: None).launcher_cmd
    runtime_secret.remove(first)
    assert not first.parent.exists() and second.exists()
    assert runtime_secret.interceptor(second) is not None


def test_supernode_refuses_to_start_on_bad_data(tmp_path):
    ca, _ = deploy.create_ca(tmp_path / "ca")
    key, _ = deploy.create_supernode_keys(tmp_path, "h")
    data = tmp_path / "data"
    (data / "normal").mkdir(parents=True)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(data / "normal" / "a.png")
    args = ["deploy", "supernode", "--superlink", "127.0.0.1:9093", "--ca", str(ca), "--key", str(key),
            "--data-path", str(data), "--hospital", "h", "--dry-run"]
    rc, out, err = _cli(*args)
    assert rc == 3 and "missing class 1=pneumonia" in out and "not starting the SuperNode" in err
    rc, out, _ = _cli(*args, "--skip-data-check")
    assert rc == 0 and "flower-supernode --root-certificates" in out
    (data / "pneumonia").mkdir()
    Image.fromarray(np.full((28, 28), 255, np.uint8)).save(data / "pneumonia" / "b.png")
    rc, out, _ = _cli(*args)
    assert rc == 0 and "OK: ready to join" in out
    assert f"data-path=\"{data.resolve()}\" data-format=\"auto\" hospital=\"h\"" in out


def test_superlink_dry_run_and_missing_certificates(tmp_path):
    rc, _, err = _cli("deploy", "superlink", "--certs", str(tmp_path), "--database", str(tmp_path / "db"), "--dry-run")
    assert rc == 2 and "not found" in err
    certs = tmp_path / "certs"
    ca, ca_key = deploy.create_ca(certs)
    deploy.create_server_cert(ca, ca_key, certs, ["127.0.0.1"])
    rc, out, _ = _cli("deploy", "superlink", "--certs", str(certs), "--database", str(tmp_path / "db" / "s.db"),
                      "--host", "127.0.0.1", "--port", "19999", "--dry-run")
    # the SuperLink on its own loopback port; the hospitals' port is nginx's
    assert rc == 0 and "--enable-supernode-auth" in out and "--host 127.0.0.1 --port 9092" in out
    assert "listen 127.0.0.1:19999 ssl;" in out


def test_register_rejects_a_file_that_is_not_a_public_key(tmp_path):
    bad = tmp_path / "h.pub"
    bad.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    rc, _, err = _cli("deploy", "register", str(bad), "--connection", "x")
    assert rc == 1 and "not an OpenSSH ecdsa-sha2-nistp384 public key" in err


def test_the_watchdog_fires_on_a_clientapp_that_died_with_a_message_open_or_a_message_past_its_bound(monkeypatch):
    """Supervisor.check from the SuperNode's log lines and the launcher's events (no processes)."""
    import json as _json

    from hospitrust.supervision import supervisor as sv

    s = sv.Supervisor(["true"], "127.0.0.1:1", message_timeout=30.0, env={}, out=lambda line: None)
    s._supernode_line("INFO :      Receiving: train message (ID: abc)")
    s._launcher_line(_json.dumps({"launcher": "started", "pid": 7, "task_id": 1}))  # the message's task
    s._launcher_line(_json.dumps({"launcher": "exited", "pid": 7, "task_id": 1, "seconds": 0.1, "rc": 17}))
    assert s.check() is None  # within the grace: the SuperNode may still log the reply it sent
    monkeypatch.setattr(sv, "DIED_GRACE_SECONDS", 0.0)
    why = s.check()
    assert why is not None and "exit code 17" in why and "waits for a reply that will never come" in why
    # a ClientApp that died after its reply was sent: nothing to do
    s._supernode_line("INFO :      Sent successfully")
    s._supernode_line("INFO :      Receiving: train message (ID: xyz)")
    s._launcher_line(_json.dumps({"launcher": "started", "pid": 8, "task_id": 2}))
    s._supernode_line("INFO :      Sending: train reply")
    s._supernode_line("INFO :      Sent successfully")
    s._launcher_line(_json.dumps({"launcher": "exited", "pid": 8, "task_id": 2, "seconds": 0.1, "rc": -9}))
    assert s.check() is None
    # a message open longer than the bound
    s._supernode_line("INFO :      Receiving: evaluate message (ID: def)")
    s.inflight.messages[-1].opened -= 31.0
    assert "in flight for 31 s (bound 30 s)" in (s.check() or "")

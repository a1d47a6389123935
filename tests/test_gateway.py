"""The gateway's and the tunnel's configurations, and the operator's certificate, without starting a federation
(tests/test_control_plane.py plays the attacker against the real processes)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hospitrust.ops import deploy
from hospitrust.ops.deploy import gateway
from hospitrust.errors import DeployError
from hospitrust.ops.deploy.tunnel import server_name, split_address, tunnel_dir, write_tunnel


def test_the_fleet_paths_are_exactly_those_flower_uses():
    """The hospitals' listener forwards these twelve: every path the installed SuperNode calls, and every
    route of the SuperLink's fleet router (a new Flower that adds one fails here, not in a hospital)."""
    from flwr.superlink.routers.fleet.router import router
    from flwr.supernode import fleet_http_client

    source = inspect.getsource(fleet_http_client)
    called = set(re.findall(r'path="/v1/fleet/([a-z-]+)"', source))
    served = {route.path.removeprefix("/v1/fleet/") for route in router.routes}
    assert called == served == set(gateway.FLEET_PATHS), (called, served)
    assert len(gateway.FLEET_PATHS) == 12


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    certs = tmp_path_factory.mktemp("pki")
    deploy.create_ca(certs)
    deploy.create_server_cert(certs / "ca.crt", certs / "ca.key", certs, ["superlink.example.org"])
    deploy.create_operator_cert(certs / "ca.crt", certs / "ca.key", certs / "op", "alice")
    return certs


def test_the_operator_certificate_is_a_client_and_loopback_server_certificate(pki):
    cert = x509.load_pem_x509_certificate((pki / "op" / "alice.crt").read_bytes())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == gateway.OPERATOR_OU
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(v) for v in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert (pki / "op" / "alice.key").stat().st_mode & 0o777 == 0o600
    server = x509.load_pem_x509_certificate((pki / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # the gateway reaches the SuperLink as localhost; its own ServerApps as 127.0.0.1
    assert {"superlink.example.org", "localhost"} <= set(names.get_values_for_type(x509.DNSName))
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    with pytest.raises(DeployError, match="bad operator name"):
        deploy.create_operator_cert(pki / "ca.crt", pki / "ca.key", pki / "op", "../evil")


def _nginx_location_blocks(conf: str) -> list[str]:
    return re.findall(r"location ([^{]+)\{", conf)


def test_the_gateway_configuration_publishes_only_fleet_and_control_and_nginx_accepts_it(pki, tmp_path):
    layout = gateway.GatewayLayout(host="0.0.0.0", port=19093, operator_host="127.0.0.1", operator_port=19095,
                                   superlink_port=19092)
    text = gateway.gateway_config(layout, ca=pki / "ca.crt", cert=pki / "server.pem", key=pki / "server.key",
                                  state=tmp_path / "gw")
    conf = gateway.write_nginx_config(text, tmp_path / "gw")  # runs `nginx -t`
    assert conf.stat().st_mode & 0o777 == 0o600 and (tmp_path / "gw").stat().st_mode & 0o777 == 0o700
    hospitals, operators = text.split("# the operator's listener")
    assert "listen 0.0.0.0:19093 ssl;" in hospitals and "ssl_verify_client" not in hospitals
    assert [b.strip() for b in _nginx_location_blocks(hospitals)] == [
        "~ ^/v1/fleet/(" + "|".join(gateway.FLEET_PATHS) + ")$", "= /health", "/"]
    assert "location / { return 403; }" in hospitals
    assert "listen 127.0.0.1:19095 ssl;" in operators and "ssl_verify_client on;" in operators
    # the subject matched attribute by attribute (tests/test_operator_ou.py: real nginx, real certificates)
    assert 'if ($ssl_client_s_dn !~ "^((\\\\\\\\.|[^\\\\\\\\,+])*[,+])*OU=hospitrust-operators([,+]|$)")' in operators
    assert [b.strip() for b in _nginx_location_blocks(operators)] == ["/v1/control/", "= /health", "/"]
    assert "proxy_buffering off;" in operators  # flwr log --stream
    assert text.count("proxy_pass https://127.0.0.1:19092;") == 4 and "/v1/runtime" not in text
    assert f"client_max_body_size {gateway.MAX_BODY};" in text  # above Flower's 5 MB chunks and 10 MB bundles
    assert "worker_connections 512;" in text  # about 5 per connected hospital: about 100 hospitals
    wide = gateway.gateway_config(gateway.GatewayLayout(host="0.0.0.0", port=19093, operator_port=19095,
                                                        superlink_port=19092, connections=2048),
                                  ca=pki / "ca.crt", cert=pki / "server.pem", key=pki / "server.key", state=tmp_path / "gw2")
    gateway.write_nginx_config(wide, tmp_path / "gw2")  # nginx accepts it
    assert "worker_connections 2048;" in wide


def test_bad_layouts_and_paths_are_refused(pki, tmp_path):
    with pytest.raises(DeployError, match="must differ"):
        gateway.GatewayLayout(port=9093, operator_port=9093).check()
    with pytest.raises(DeployError, match="between 1 and 65535"):
        gateway.GatewayLayout(port=70000).check()
    with pytest.raises(DeployError, match="--gateway-connections 10: expected 64 to 65536"):
        gateway.GatewayLayout(connections=10).check()
    with pytest.raises(DeployError, match="double quote"):
        gateway.gateway_config(gateway.GatewayLayout(), ca=tmp_path / 'a"b.crt', cert=pki / "server.pem",
                               key=pki / "server.key", state=tmp_path)


def test_the_tunnel_and_its_connection(pki, tmp_path):
    home = tmp_path / "flwr"
    # nginx resolves the upstream when it reads its configuration: a name this machine resolves
    conf, config = write_tunnel("consortium", "localhost:19095", ca=pki / "ca.crt", cert=pki / "op" / "alice.crt",
                                key=pki / "op" / "alice.key", port=19096, home=home)
    text = conf.read_text()
    assert conf == tunnel_dir("consortium", home) / "nginx.conf"
    assert "listen 127.0.0.1:19096 ssl;" in text and "proxy_pass https://localhost:19095;" in text
    assert "proxy_ssl_name localhost;" in text and "proxy_ssl_verify on;" in text
    assert text.count(str(pki / "op" / "alice.crt")) == 2  # served to flwr, and presented to the SuperLink
    toml = config.read_text()
    assert 'address = "127.0.0.1:19096"' in toml and f'root-certificates = "{pki / "ca.crt"}"' in toml
    assert "insecure" not in toml
    assert server_name("127.0.0.1", None) == "localhost" and server_name("203.0.113.10", "sl.example.org") == "sl.example.org"
    with pytest.raises(DeployError, match="--server-name"):
        server_name("203.0.113.10", None)
    with pytest.raises(DeployError, match="HOST:PORT"):
        split_address("superlink.example.org")
    with pytest.raises(DeployError, match="bad connection name"):
        tunnel_dir("../../etc", home)
    with pytest.raises(DeployError, match="host not found"):  # nginx's own word, before anything starts
        write_tunnel("other", "no-such-host.invalid:9095", ca=pki / "ca.crt", cert=pki / "op" / "alice.crt",
                     key=pki / "op" / "alice.key", port=19097, home=home)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hospitrust.cli.main", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_deploy_superlink_dry_run_and_own_proxy(pki, tmp_path):
    res = _cli("deploy", "superlink", "--certs", str(pki), "--database", str(tmp_path / "db" / "state.db"), "--dry-run")
    assert res.returncode == 0, res.stderr
    superlink = res.stdout.splitlines()[0]
    # Flower's flower-superlink script, run under the module that gives its store a 30 s busy timeout first
    assert " -m hospitrust.supervision.superlink_main 30000 " in superlink and "--host 127.0.0.1 --port 9092" in superlink
    assert superlink.split(" 30000 ")[1].split()[0].endswith("/flower-superlink"), superlink
    assert "--enable-supernode-auth" in superlink and "--insecure" not in superlink
    assert "listen 0.0.0.0:9093 ssl;" in res.stdout and "listen 127.0.0.1:9095 ssl;" in res.stdout
    # the warm ServerApp launcher (the default): process isolation, the secret given to both, TLS with the CA
    assert "--isolation process --superexec-auth-secret-file" in superlink
    launcher = res.stdout.splitlines()[1]
    assert "-m hospitrust.supervision.serverapp_launcher --runtime-api-address 127.0.0.1:9092" in launcher, launcher
    assert f"--root-certificates {(pki / 'ca.crt').resolve()}" in launcher and "--superexec-auth-secret-file" in launcher
    res = _cli("deploy", "superlink", "--certs", str(pki), "--database", str(tmp_path / "db" / "state.db"), "--gateway", "none",
               "--dry-run")
    assert res.returncode == 0 and "127.0.0.1:9092 only" in res.stdout and "--host 127.0.0.1" in res.stdout, res.stdout
    assert "hospitrust.supervision.serverapp_launcher" in res.stdout, res.stdout
    # Flower's own launcher: flower-superlink starts flower-superexec itself (subprocess isolation), no secret
    res = _cli("deploy", "superlink", "--certs", str(pki), "--database", str(tmp_path / "db" / "state.db"),
               "--serverapp-launcher", "flower", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "--isolation" not in res.stdout and "serverapp_launcher" not in res.stdout and "secret" not in res.stdout



class _Upstream:
    """The SuperLink's place behind the gateway: an HTTPS server (the SuperLink's certificate) that records the
    request line nginx forwards, and answers 200."""

    def __init__(self, pki, port: int) -> None:
        import http.server
        import ssl
        import threading

        self.paths: list[str] = []
        seen = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                seen.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _raw(port: int, ca, line: str, cert: tuple | None = None) -> int:
    """Send ``line`` (method and target exactly as given) over TLS; the status code nginx answers."""
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    if cert:
        ctx.load_cert_chain(*cert)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw) as s:
        s.sendall(f"{line} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n" not in data and (chunk := s.recv(4096)):
            data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.fixture
def running_gateway(pki, tmp_path):
    """nginx with the gateway's configuration, in front of a recording stand-in for the SuperLink."""
    from hospitrust.ops import flwr

    layout = gateway.GatewayLayout(host="127.0.0.1", port=flwr.free_port(), operator_port=flwr.free_port(),
                                   superlink_port=flwr.free_port())
    upstream = _Upstream(pki, layout.superlink_port)
    conf = gateway.write_nginx_config(gateway.gateway_config(layout, ca=pki / "ca.crt", cert=pki / "server.pem",
                                                             key=pki / "server.key", state=tmp_path / "gw"), tmp_path / "gw")
    nginx = subprocess.Popen(gateway.nginx_command(conf), stderr=subprocess.PIPE, text=True)
    try:
        deadline = __import__("time").monotonic() + 30
        while True:
            try:
                if _raw(layout.port, pki / "ca.crt", "GET /health") == 200:
                    break
            except OSError:
                assert nginx.poll() is None and __import__("time").monotonic() < deadline, nginx.stderr.read()
                __import__("time").sleep(0.2)
        upstream.paths.clear()
        yield layout, upstream, nginx, tmp_path / "gw"
    finally:
        nginx.terminate()
        nginx.wait(timeout=30)
        upstream.close()


def test_the_gateway_forwards_only_canonical_uris(pki, running_gateway):
    """nginx matches a location on the decoded, slash-merged path but forwards the request line as the client sent
    it: `/v1//fleet/...` and `.../pull-messages%0a` (a newline before the regex's `$`) used to reach the SuperLink
    raw. Now anything but the canonical form is refused (400) and never forwarded."""
    layout, upstream, _, _ = running_gateway
    ca, op = pki / "ca.crt", (pki / "op" / "alice.crt", pki / "op" / "alice.key")
    assert _raw(layout.port, ca, "POST /v1/fleet/pull-messages") == 200
    assert _raw(layout.port, ca, "GET /health") == 200
    for target in ("/v1//fleet/pull-messages", "/v1/fleet/pull-messages%0a", "/v1/fleet/pull-messages%0A",
                   "/v1/fleet/%70ull-messages", "/v1/./fleet/pull-messages", "/v1/x/../fleet/pull-messages",
                   "/v1/fleet/pull-messages?x=1", "//v1/fleet/pull-messages", "/health/", "/v1/fleet/pull-messages/"):
        assert _raw(layout.port, ca, f"POST {target}") == 400, target
    # canonical but not published: the listener's own refusal, as before
    assert _raw(layout.port, ca, "POST /v1/fleet/no-such-path") == 403
    assert _raw(layout.port, ca, "POST /v1/control/list-runs") == 403
    # the operators' listener: the same rule for the Control API
    assert _raw(layout.operator_port, ca, "POST /v1/control/list-runs", cert=op) == 200
    for target in ("/v1//control/list-runs", "/v1/control/list-runs%0a", "/v1/control/%6cist-runs",
                   "/v1/control/../fleet/pull-messages", "/v1/control/list-runs?x=1"):
        assert _raw(layout.operator_port, ca, f"POST {target}", cert=op) == 400, target
    assert _raw(layout.operator_port, ca, "GET /openapi.json", cert=op) == 403
    assert upstream.paths == ["/v1/fleet/pull-messages", "/health", "/v1/control/list-runs"]


def test_the_access_log_is_rotated_and_nginx_writes_the_new_one(pki, running_gateway):
    import os
    import signal
    import stat

    layout, _, nginx, state = running_gateway
    log = state / "access.log"
    ca = pki / "ca.crt"
    _raw(layout.port, ca, "GET /health")
    assert gateway.rotate_log(log, max_bytes=10**9, keep=2, reopen=lambda: None) is False  # small: left alone
    import time

    def lands_in_the_current_file(n: int) -> None:  # nginx reopens on SIGUSR1 a moment later: ask until it has
        deadline = time.monotonic() + 15
        while f"get-run?n={n}" not in log.read_text():
            assert time.monotonic() < deadline, [p.read_text() for p in state.glob("access.log*")]
            assert _raw(layout.port, ca, f"POST /v1/fleet/get-run?n={n}") == 400
            time.sleep(0.2)

    for n in range(1, 4):  # three rotations with two kept
        lands_in_the_current_file(n)
        assert gateway.rotate_log(log, max_bytes=1, keep=2, reopen=lambda: os.kill(nginx.pid, signal.SIGUSR1)) is True
        assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.stat().st_size == 0
    assert sorted(p.name for p in state.glob("access.log*")) == ["access.log", "access.log.1", "access.log.2"]
    assert "get-run?n=3" in (state / "access.log.1").read_text() and "get-run?n=2" in (state / "access.log.2").read_text()
    assert "get-run?n=1" not in (state / "access.log.2").read_text()  # the oldest was dropped
    lands_in_the_current_file(4)
    assert "get-run?n=4" not in (state / "access.log.1").read_text()

"""Only a certificate whose subject has the attribute OU=hospitrust-operators opens the operator listener (issue 46,
finding 7): real certificates from hospitrust's pki module, checked by is_operator() (cryptography's attribute
lookup) and by the gateway's real nginx; a CN containing ",OU=hospitrust-operators" used to get in.
"""

from __future__ import annotations

import http.client
import re
import signal
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hospitrust.ops import deploy, flwr
from hospitrust.ops.deploy import gateway
from hospitrust.pki import certificates
from hospitrust.pki.certificates import OPERATOR_DN_PATTERN, OPERATOR_OU, is_operator

OU, CN, O = NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME
# name -> (subject RDNs, whether it is an operator's): each RDN a list of (attribute, value)
SUBJECTS = {
    "cn-with-ou-text": ([[(CN, f"mallory,OU={OPERATOR_OU}")]], False),  # the finding
    "cn-with-backslash": ([[(CN, f"mallory\\,OU={OPERATOR_OU}")]], False),
    "cn-with-plus": ([[(CN, f"mallory+OU={OPERATOR_OU}")]], False),
    "ou-longer": ([[(OU, OPERATOR_OU + "-x")], [(CN, "mallory")]], False),
    "ou-containing-it": ([[(OU, f"x,OU={OPERATOR_OU}")], [(CN, "mallory")]], False),
    "organisation": ([[(O, OPERATOR_OU)], [(CN, "mallory")]], False),
    "multi-valued-rdn": ([[(CN, "bob"), (OU, OPERATOR_OU)]], True),
    "second-ou": ([[(OU, "radiology")], [(OU, OPERATOR_OU)], [(CN, "carol")]], True),
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """The CA, the SuperLink's certificate, alice's from `deploy operator-cert`, and the crafted subjects above,
    each issued by the same CA with hospitrust's own issuer (client authentication, like an operator's)."""
    root = tmp_path_factory.mktemp("ou")
    deploy.create_ca(root)
    deploy.create_server_cert(root / "ca.crt", root / "ca.key", root, ["superlink.example.org"])
    deploy.create_operator_cert(root / "ca.crt", root / "ca.key", root / "op", "alice")
    ca, ca_key = certificates._load_ca(root / "ca.crt", root / "ca.key")
    made = {"alice": (root / "op" / "alice.crt", root / "op" / "alice.key", True)}
    for name, (rdns, expected) in SUBJECTS.items():
        subject = x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(oid, v) for oid, v in rdn]) for rdn in rdns])
        crt, key = certificates._issue(ca, ca_key, subject, certificates.san_entries(["127.0.0.1"]),
                                       [ExtendedKeyUsageOID.CLIENT_AUTH], root / f"{name}.crt", root / f"{name}.key", 1, False)
        made[name] = (crt, key, expected)
    return root, made


def test_is_operator_is_an_exact_attribute_match(certs):
    _, made = certs
    decided = {name: is_operator(x509.load_pem_x509_certificate(crt.read_bytes())) for name, (crt, _, _) in made.items()}
    assert decided == {name: expected for name, (_, _, expected) in made.items()}
    # the old rule, a substring of the DN string, let the finding's CN in (cryptography prints it RFC 4514-escaped)
    dn = x509.load_pem_x509_certificate(made["cn-with-ou-text"][0].read_bytes()).subject.rfc4514_string()
    assert re.search(f",OU={OPERATOR_OU}(,|$)", dn) and not re.search(OPERATOR_DN_PATTERN, dn)


def _status(port: int, ca: Path, crt: Path, key: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(crt), str(key))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=20)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_gateway_admits_exactly_the_operators(certs, tmp_path):
    """Real nginx with the gateway's configuration: 403 for every non-operator subject; an operator's request passes
    the check and reaches the (absent) SuperLink, 502."""
    root, made = certs
    layout = gateway.GatewayLayout(host="127.0.0.1", port=flwr.free_port(), operator_port=flwr.free_port(),
                                   superlink_port=flwr.free_port())
    text = gateway.gateway_config(layout, ca=root / "ca.crt", cert=root / "server.pem", key=root / "server.key",
                                  state=tmp_path / "gw")
    conf = gateway.write_nginx_config(text, tmp_path / "gw")
    proc = subprocess.Popen(gateway.nginx_command(conf), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _status(layout.operator_port, root / "ca.crt", *made["alice"][:2])
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.stderr else ""
                time.sleep(0.2)
        got = {name: _status(layout.operator_port, root / "ca.crt", crt, key) for name, (crt, key, _) in made.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert got == {name: 502 if expected else 403 for name, (_, _, expected) in made.items()}

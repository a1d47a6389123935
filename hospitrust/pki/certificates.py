"""The federation's keys and certificates: a CA, the SuperLink's TLS certificate, each hospital's SuperNode key pair.

Keys follow Flower 1.42: EC SECP384R1; the private key in OpenSSH format (PEM, unencrypted,
mode 0600); the public key in OpenSSH format (``ecdsa-sha2-nistp384 ...``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hospitrust.errors import DeployError

# the organizational unit of the certificates `deploy operator-cert` issues; the gateway admits only these to the Control API
OPERATOR_OU = "hospitrust-operators"
# What the gateway's nginx matches the client certificate's subject against ($ssl_client_s_dn: RFC 2253 as OpenSSL
# prints it, a value's ',', '+' and '\' escaped with a backslash): the DN read attribute by attribute, each
# separated by an unescaped ',' or '+' (a multi-valued RDN), one of them exactly OU=hospitrust-operators. So a CN
# or another OU containing ",OU=hospitrust-operators" does not match; tests/test_operator_ou.py checks real nginx
# against is_operator() on real certificates.
OPERATOR_DN_PATTERN = r"^((\\.|[^\\,+])*[,+])*OU=" + OPERATOR_OU + r"([,+]|$)"


def is_operator(cert: x509.Certificate) -> bool:
    """Whether a certificate's subject has an organizational-unit attribute exactly ``OPERATOR_OU``."""
    from cryptography.x509.oid import NameOID

    return any(a.value == OPERATOR_OU for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME))

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes


def write_private(path: Path, data: bytes, force: bool) -> None:
    path = Path(path)
    if path.exists() and not force:
        raise DeployError(f"{path} exists; refusing to overwrite a key (pass --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def write_public(path: Path, data: bytes, force: bool) -> None:
    path = Path(path)
    if path.exists() and not force:
        raise DeployError(f"{path} exists; refusing to overwrite it (pass --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def create_ca(out_dir: Path, *, name: str = "hospitrust federation CA", days: int = 3650, force: bool = False) -> tuple[Path, Path]:
    """A self-signed CA: ``ca.crt`` (give to everyone) and ``ca.key`` (0600, stays with the operator)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out_dir = Path(out_dir).expanduser().resolve()
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(utc_now() - dt.timedelta(minutes=5))
        .not_valid_after(utc_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    key_path, cert_path = out_dir / "ca.key", out_dir / "ca.crt"
    write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), force)
    write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def san_entries(names: list[str]) -> list[x509.GeneralName]:
    from cryptography import x509

    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for raw in names:
        for item in str(raw).split(","):
            item = item.strip()
            if not item or item in seen:
                continue
            seen.add(item)
            try:
                entries.append(x509.IPAddress(ipaddress.ip_address(item)))
            except ValueError:
                entries.append(x509.DNSName(item))
    if not entries:
        raise DeployError("the server certificate needs at least one --san (a host name or IP address the SuperLink is reached by)")
    return entries


def create_server_cert(ca_cert: Path, ca_key: Path, out_dir: Path, sans: list[str], *, days: int = 825,
                       force: bool = False) -> tuple[Path, Path]:
    """The SuperLink's certificate (``server.pem``, ``server.key`` 0600), signed by the CA, with the host
    names and IP addresses given as subject alternative names, and ``localhost`` and ``127.0.0.1`` (the
    SuperLink listens there, behind the gateway).
    """
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca, ca_private = _load_ca(ca_cert, ca_key)
    # the SuperLink listens on 127.0.0.1, where the gateway and its own ServerApps reach it by these names
    entries = san_entries([*sans, "localhost", "127.0.0.1"])
    common = next((str(e.value) for e in entries if isinstance(e, x509.DNSName)), str(entries[0].value))
    out_dir = Path(out_dir).expanduser().resolve()
    return _issue(ca, ca_private, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]), entries,
                  [ExtendedKeyUsageOID.SERVER_AUTH], out_dir / "server.pem", out_dir / "server.key", days, force)


def create_operator_cert(ca_cert: Path, ca_key: Path, out_dir: Path, name: str, *, days: int = 365,
                         force: bool = False) -> tuple[Path, Path]:
    """An operator's credential: ``NAME.crt`` and ``NAME.key`` (0600), signed by the consortium CA.

    It opens the SuperLink machine's operator listener (client authentication, ``OU=hospitrust-operators``),
    and the operator's local tunnel serves it on 127.0.0.1 to ``flwr`` (server authentication for
    127.0.0.1 and localhost), so one file pair does both.
    """
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not name or not all(ch.isalnum() or ch in "-_." for ch in name) or name.startswith("."):
        raise DeployError(f"bad operator name {name!r}: letters, digits, '-', '_' and '.' only, e.g. 'alice'")
    ca, ca_private = _load_ca(ca_cert, ca_key)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, OPERATOR_OU),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    out_dir = Path(out_dir).expanduser().resolve()
    return _issue(ca, ca_private, subject, san_entries(["127.0.0.1", "localhost"]),
                  [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
                  out_dir / f"{name}.crt", out_dir / f"{name}.key", days, force)


def _load_ca(ca_cert: Path, ca_key: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_cert, ca_key = Path(ca_cert).expanduser().resolve(), Path(ca_key).expanduser().resolve()
    for p in (ca_cert, ca_key):
        if not p.is_file():
            raise DeployError(f"{p} not found (create the CA first: hospitrust deploy ca --out DIR)")
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    # the CA's key: create_ca writes an EC key, which can sign certificates
    return ca, cast("CertificateIssuerPrivateKeyTypes", serialization.load_pem_private_key(ca_key.read_bytes(), password=None))


def _issue(ca, ca_private, subject, entries, usages, cert_path: Path, key_path: Path, days: int,
           force: bool) -> tuple[Path, Path]:
    """A fresh EC P-384 key and its certificate, signed by the CA, written as ``cert_path`` / ``key_path`` (0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(utc_now() - dt.timedelta(minutes=5))
        .not_valid_after(utc_now() + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(entries), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_private.public_key()), critical=False)
        .sign(ca_private, hashes.SHA384())
    )
    write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), force)
    write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def create_supernode_keys(out_dir: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """A hospital's SuperNode key pair: ``NAME.key`` (OpenSSH private key, 0600) and ``NAME.pub``
    (``ecdsa-sha2-nistp384 ...``, sent to the operator to register).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not name or "/" in name or name.startswith("."):
        raise DeployError(f"bad key name {name!r}: use the hospital's short name, e.g. 'st-mary'")
    key = ec.generate_private_key(ec.SECP384R1())
    out_dir = Path(out_dir).expanduser().resolve()
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()), force)
    write_public(pub_path, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                          serialization.PublicFormat.OpenSSH) + b"\n", force)
    return key_path, pub_path

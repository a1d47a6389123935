"""``hospitrust deploy ...``: the operator's and the hospitals' side of a real federation.

Operator (runs the SuperLink):

- ``deploy ca``            a certificate authority (``ca.crt``, ``ca.key``)
- ``deploy server-cert``   the SuperLink's TLS certificate, with the host names and IPs it is reached by
- ``deploy superlink``     ``flower-superlink`` with TLS, SuperNode authentication, a persistent
                           database and no runtime dependency installation
- ``deploy connection``    the ``[superlink.NAME]`` entry in ``$FLWR_HOME/config.toml`` for ``flwr``
- ``deploy register``      ``flwr supernode register`` for each hospital's public key
- ``deploy status``        wait for a run and exit 0 only if it ended ``finished:completed``

Hospital (runs a SuperNode):

- ``deploy keygen``        the hospital's SuperNode key pair (the private key never leaves the hospital)
- ``deploy supernode``     ``hospitrust data check``, then ``flower-supernode`` with TLS and the key

Keys follow Flower 1.42: EC SECP384R1; the private key in OpenSSH format (PEM, unencrypted,
mode 0600); the public key in OpenSSH format (``ecdsa-sha2-nistp384 ...``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shlex
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

COMPLETED = "finished:completed"
DEFAULT_PORT = 9093  # hospitrust's suggested SuperLink port (Flower's own default is 8000)


class DeployError(RuntimeError):
    """A deployment step cannot be done; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# files with secrets

def _write_private(path: Path, data: bytes, force: bool) -> None:
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


def _write_public(path: Path, data: bytes, force: bool) -> None:
    path = Path(path)
    if path.exists() and not force:
        raise DeployError(f"{path} exists; refusing to overwrite it (pass --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# ---------------------------------------------------------------------------------------------
# certificates and keys

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
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    key_path, cert_path = out_dir / "ca.key", out_dir / "ca.crt"
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), force)
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def _san_entries(names: list[str]):
    from cryptography import x509

    entries, seen = [], set()
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
    """The SuperLink's certificate (``server.pem``, ``server.key`` 0600), signed by the CA, with exactly
    the host names and IP addresses given as subject alternative names."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert, ca_key = Path(ca_cert).expanduser().resolve(), Path(ca_key).expanduser().resolve()
    for p in (ca_cert, ca_key):
        if not p.is_file():
            raise DeployError(f"{p} not found (create the CA first: hospitrust deploy ca --out DIR)")
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    ca_private = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    entries = _san_entries(sans)
    key = ec.generate_private_key(ec.SECP384R1())
    common = next((str(e.value) for e in entries if isinstance(e, x509.DNSName)), str(entries[0].value))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(entries), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_private.public_key()), critical=False)
        .sign(ca_private, hashes.SHA384())
    )
    out_dir = Path(out_dir).expanduser().resolve()
    key_path, cert_path = out_dir / "server.key", out_dir / "server.pem"
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), force)
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def create_supernode_keys(out_dir: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """A hospital's SuperNode key pair: ``NAME.key`` (OpenSSH private key, 0600) and ``NAME.pub``
    (``ecdsa-sha2-nistp384 ...``, sent to the operator to register)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not name or "/" in name or name.startswith("."):
        raise DeployError(f"bad key name {name!r}: use the hospital's short name, e.g. 'st-mary'")
    key = ec.generate_private_key(ec.SECP384R1())
    out_dir = Path(out_dir).expanduser().resolve()
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()), force)
    _write_public(pub_path, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                          serialization.PublicFormat.OpenSSH) + b"\n", force)
    return key_path, pub_path


# ---------------------------------------------------------------------------------------------
# commands

def superlink_command(*, ca: Path, cert: Path, key: Path, database: Path, host: str = "0.0.0.0",
                      port: int = DEFAULT_PORT, log_file: Path | None = None) -> list[str]:
    cmd = [
        "flower-superlink",
        "--ssl-ca-certfile", str(Path(ca).expanduser().resolve()),
        "--ssl-certfile", str(Path(cert).expanduser().resolve()),
        "--ssl-keyfile", str(Path(key).expanduser().resolve()),
        "--enable-supernode-auth",
        "--database", str(Path(database).expanduser().resolve()),
        "--disable-runtime-dependency-installation",
        "--host", host,
        "--port", str(port),
    ]
    if log_file is not None:
        cmd += ["--log-file", str(Path(log_file).expanduser().resolve())]
    return cmd


def toml_string(value: str) -> str:
    """A TOML string that flwr's ``--node-config`` parser keeps whole (it splits on unquoted spaces)."""
    value = str(value)
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    if "'" not in value and "\n" not in value:
        return f"'{value}'"
    raise DeployError(f"cannot pass {value!r} in --node-config: it holds both kinds of quote")


def node_config_string(values: dict[str, object]) -> str:
    parts = []
    for k, v in values.items():
        if isinstance(v, bool):
            parts.append(f"{k}={'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            parts.append(f"{k}={v!r}")
        else:
            parts.append(f"{k}={toml_string(str(v))}")
    return " ".join(parts)


def supernode_command(*, superlink: str, ca: Path, key: Path, node_config: dict[str, object], port: int = 9094,
                      host: str = "127.0.0.1", max_retries: int | None = None, max_wait_time: float | None = None) -> list[str]:
    cmd = [
        "flower-supernode",
        "--root-certificates", str(Path(ca).expanduser().resolve()),
        "--superlink", superlink,
        "--auth-supernode-private-key", str(Path(key).expanduser().resolve()),
        "--node-config", node_config_string(node_config),
        "--host", host,
        "--port", str(port),
    ]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", f"{max_wait_time:g}"]
    return cmd


# ---------------------------------------------------------------------------------------------
# the flwr CLI's connection file

def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


FLWR_DEFAULT_CONFIG = {"superlink": {"default": "local", "supergrid": {"address": "api.flower.ai"},
                                     "local": {"address": ":local:"}}}


def write_connection(name: str, address: str, ca: Path, *, make_default: bool = False, home: Path | None = None) -> Path:
    """Add or replace ``[superlink.NAME]`` (address, absolute root-certificates) in ``$FLWR_HOME/config.toml``,
    keeping every other entry."""
    import tomli_w

    if not name or not all(ch.isalnum() or ch in "-_" for ch in name) or name in ("default",):
        raise DeployError(f"bad connection name {name!r}: letters, digits, '-' and '_' only")
    ca = Path(ca).expanduser().resolve()
    if not ca.is_file():
        raise DeployError(f"CA certificate {ca} not found")
    home = Path(home).expanduser().resolve() if home else flwr_home()
    path = home / "config.toml"
    data = tomllib.loads(path.read_text()) if path.is_file() else json.loads(json.dumps(FLWR_DEFAULT_CONFIG))
    links = data.setdefault("superlink", {})
    links[name] = {"address": address, "root-certificates": str(ca)}
    if make_default or "default" not in links:
        links["default"] = name
    # scalars first, so tomli_w writes `default = ...` under [superlink] before the sub-tables
    data["superlink"] = {k: v for k, v in links.items() if not isinstance(v, dict)} | {
        k: v for k, v in links.items() if isinstance(v, dict)}
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return path


# ---------------------------------------------------------------------------------------------
# waiting

def wait_healthy(address: str, ca: Path | None, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Until ``https://ADDRESS/health`` answers 200 (verified against the CA), or raise."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    scheme = "https" if ca else "http"
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise DeployError(f"the process exited with code {proc.returncode} before {address} was healthy")
        try:
            with urllib.request.urlopen(f"{scheme}://{address}/health", timeout=3, context=context) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise DeployError(f"{address} did not answer /health within {timeout:.0f} s ({last})")


def flwr_cli(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None):
    return subprocess.run(["flwr", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_status(run_id: int, connection: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    res = flwr_cli(["ls", connection, "--run-id", str(run_id), "--format", "json"], env=env)
    try:
        run = json.loads(res.stdout)["runs"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        return "unknown", (res.stdout + res.stderr)[-2000:]
    return str(run.get("status", "unknown")), str(run.get("status-details", ""))


def wait_for_run(run_id: int, connection: str, timeout: float, env: dict[str, str] | None = None,
                 poll: float = 2.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    status, details = "unknown", ""
    while time.monotonic() < deadline:
        status, details = run_status(run_id, connection, env)
        if status.startswith("finished"):
            return status, details
        time.sleep(poll)
    return "timeout", f"still {status} after {timeout:.0f} s"


def online_nodes(connection: str, env: dict[str, str] | None = None) -> list[dict]:
    res = flwr_cli(["supernode", "list", connection, "--format", "json"], env=env)
    try:
        nodes = json.loads(res.stdout).get("nodes", [])
    except json.JSONDecodeError:
        return []
    return [n for n in nodes if n.get("status") == "online"]


# ---------------------------------------------------------------------------------------------
# CLI handlers (wired in hospitrust.ops.cli)

def _exec(cmd: list[str], dry_run: bool) -> int:
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    try:
        os.execvp(cmd[0], cmd)  # the Flower process replaces this one: signals and exit code are its own
    except FileNotFoundError:
        raise DeployError(f"{cmd[0]} not found on PATH (pip install 'flwr>=1.42,<2')") from None
    return 0  # pragma: no cover


def cmd_ca(args) -> int:
    cert, key = create_ca(Path(args.out), name=args.name, days=args.days, force=args.force)
    print(f"CA certificate: {cert}   (give it to the hospitals and to whoever runs `flwr`)\n"
          f"CA private key: {key}   (mode 0600; keep it offline, it signs the SuperLink's certificate)")
    return 0


def cmd_server_cert(args) -> int:
    ca_dir = Path(args.ca_dir)
    cert, key = create_server_cert(Path(args.ca_cert or ca_dir / "ca.crt"), Path(args.ca_key or ca_dir / "ca.key"),
                                   Path(args.out or ca_dir), args.san, days=args.days, force=args.force)
    print(f"SuperLink certificate: {cert} (SANs: {', '.join(s for x in args.san for s in x.split(',') if s)})\n"
          f"SuperLink private key: {key} (mode 0600)")
    return 0


def cmd_keygen(args) -> int:
    key, pub = create_supernode_keys(Path(args.out), args.name, force=args.force)
    print(f"private key: {key}   (mode 0600; stays on the SuperNode machine)\n"
          f"public key:  {pub}   (send this file to the federation operator to register)")
    return 0


def cmd_superlink(args) -> int:
    certs = Path(args.certs)
    database = Path(args.database).expanduser().resolve()
    database.parent.mkdir(parents=True, exist_ok=True)
    cmd = superlink_command(ca=Path(args.ca or certs / "ca.crt"), cert=Path(args.cert or certs / "server.pem"),
                            key=Path(args.key or certs / "server.key"), database=database, host=args.host,
                            port=args.port, log_file=Path(args.log_file) if args.log_file else None)
    for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        p = Path(cmd[cmd.index(flag) + 1])
        if not p.is_file():
            raise DeployError(f"{flag} {p} not found (hospitrust deploy ca / server-cert make them)")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    return _exec(cmd, args.dry_run)


def cmd_connection(args) -> int:
    path = write_connection(args.name, args.address, Path(args.ca), make_default=args.default)
    print(f"wrote [superlink.{args.name}] (address {args.address}, root-certificates {Path(args.ca).resolve()}) to {path}")
    return 0


def cmd_register(args) -> int:
    rc = 0
    for key in args.public_keys:
        key = Path(key).expanduser().resolve()
        text = key.read_text().strip() if key.is_file() else ""
        if not text.startswith("ecdsa-sha2-nistp384 "):
            print(f"{key}: not an OpenSSH ecdsa-sha2-nistp384 public key (hospitrust deploy keygen makes one)",
                  file=sys.stderr)
            rc = 1
            continue
        res = flwr_cli(["supernode", "register", str(key), args.connection])
        out = (res.stdout + res.stderr).strip()
        print(f"{key.name}: {out.splitlines()[-1] if out else 'rc ' + str(res.returncode)}")
        if res.returncode != 0:
            rc = 1
    return rc


def cmd_status(args) -> int:
    status, details = (wait_for_run(args.run_id, args.connection, args.timeout) if args.wait
                       else run_status(args.run_id, args.connection))
    print(f"run {args.run_id}: {status}" + (f"\n{details}" if details and status != COMPLETED else ""))
    return 0 if status == COMPLETED else 1


def cmd_supernode(args) -> int:
    from hospitrust.ops import data_check

    data_path = Path(args.data_path).expanduser().resolve()
    if not args.skip_data_check:
        report = data_check.check_folder(data_path, args.dataset, args.image_size, allow_odd_sizes=args.allow_odd_sizes)
        print(report.format(), flush=True)
        if not report.ok:
            print("\nhospitrust deploy supernode: not starting the SuperNode: fix the problems above "
                  "(or pass --skip-data-check to start anyway)", file=sys.stderr)
            return 3
    for label, p in (("--ca", Path(args.ca)), ("--key", Path(args.key))):
        if not p.expanduser().is_file():
            raise DeployError(f"{label} {p} not found")
    key_mode = Path(args.key).expanduser().stat().st_mode & 0o777
    if key_mode & 0o077:
        print(f"warning: {args.key} is readable by others (mode {key_mode:o}); chmod 600 it", file=sys.stderr)
    node_config: dict[str, object] = {"data-path": str(data_path), "hospital": args.hospital}
    cmd = supernode_command(superlink=args.superlink, ca=Path(args.ca), key=Path(args.key), node_config=node_config,
                            port=args.port, host=args.host, max_retries=args.max_retries,
                            max_wait_time=args.max_wait_time)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    return _exec(cmd, args.dry_run)


def cmd_data_check(args) -> int:
    from hospitrust.ops import data_check

    return data_check.main(args.path, args.dataset, args.image_size, args.allow_odd_sizes)


def add_deploy_parser(sub) -> None:
    dep = sub.add_parser("deploy", help="certificates, keys, SuperLink and SuperNode for a real federation",
                         description="Operator and hospital commands for a TLS-secured, authenticated Flower deployment "
                                     "(see docs/deployment.md).")
    dsub = dep.add_subparsers(dest="deploy_command", required=True)

    p = dsub.add_parser("ca", help="operator: create the federation's certificate authority")
    p.add_argument("--out", required=True, help="folder for ca.crt and ca.key")
    p.add_argument("--name", default="hospitrust federation CA", help="CA common name")
    p.add_argument("--days", type=int, default=3650)
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_ca)

    p = dsub.add_parser("server-cert", help="operator: the SuperLink's TLS certificate, signed by the CA")
    p.add_argument("--ca-dir", required=True, help="folder with ca.crt and ca.key (also the default --out)")
    p.add_argument("--ca-cert", help="CA certificate (default CA_DIR/ca.crt)")
    p.add_argument("--ca-key", help="CA private key (default CA_DIR/ca.key)")
    p.add_argument("--out", help="folder for server.pem and server.key (default: --ca-dir)")
    p.add_argument("--san", action="append", required=True, metavar="HOST_OR_IP",
                   help="host name or IP address the SuperLink is reached by; repeat or comma-separate "
                        "(e.g. --san superlink.example.org --san 10.0.0.5 --san localhost --san 127.0.0.1)")
    p.add_argument("--days", type=int, default=825)
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_server_cert)

    p = dsub.add_parser("keygen", help="hospital: the SuperNode's key pair (send NAME.pub to the operator)")
    p.add_argument("--out", required=True, help="folder for NAME.key and NAME.pub")
    p.add_argument("--name", required=True, help="the hospital's short name, e.g. st-mary")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_keygen)

    p = dsub.add_parser("superlink", help="operator: start flower-superlink (TLS, SuperNode auth, persistent database)")
    p.add_argument("--certs", default=".", help="folder with ca.crt, server.pem, server.key (default .)")
    p.add_argument("--ca", help="CA certificate (default CERTS/ca.crt)")
    p.add_argument("--cert", help="server certificate (default CERTS/server.pem)")
    p.add_argument("--key", help="server private key (default CERTS/server.key)")
    p.add_argument("--database", required=True, help="SQLite state file (keeps registered SuperNodes and runs across restarts)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the one HTTP port (default {DEFAULT_PORT})")
    p.add_argument("--log-file", help="also log to this file")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not start it")
    p.set_defaults(func=cmd_superlink)

    p = dsub.add_parser("connection", help="operator/researcher: write the flwr connection to $FLWR_HOME/config.toml")
    p.add_argument("name", help="connection name used as `flwr run . NAME`")
    p.add_argument("--address", required=True, help="SuperLink HOST:PORT (a host name or IP in the certificate's SANs)")
    p.add_argument("--ca", required=True, help="the federation's CA certificate (stored as an absolute path)")
    p.add_argument("--default", action="store_true", help="make it the default connection")
    p.set_defaults(func=cmd_connection)

    p = dsub.add_parser("register", help="operator: register hospitals' SuperNode public keys")
    p.add_argument("public_keys", nargs="+", metavar="KEY.pub")
    p.add_argument("--connection", required=True, help="flwr connection name (see `deploy connection`)")
    p.set_defaults(func=cmd_register)

    p = dsub.add_parser("status", help="a run's status; exit 0 only if it ended finished:completed")
    p.add_argument("run_id", type=int)
    p.add_argument("--connection", required=True)
    p.add_argument("--wait", action="store_true", help="wait until the run has finished")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)")
    p.set_defaults(func=cmd_status)

    p = dsub.add_parser("supernode", help="hospital: check the data, then start flower-supernode")
    p.add_argument("--superlink", required=True, metavar="HOST:PORT")
    p.add_argument("--ca", required=True, help="the federation's CA certificate")
    p.add_argument("--key", required=True, help="this hospital's SuperNode private key (deploy keygen)")
    p.add_argument("--data-path", required=True, help="class-per-folder images")
    p.add_argument("--hospital", required=True, help="this hospital's name (as the federation records it)")
    p.add_argument("--port", type=int, default=9094, help="the SuperNode's local Runtime API port (default 9094)")
    p.add_argument("--host", default="127.0.0.1", help="the SuperNode's local Runtime API address (default 127.0.0.1)")
    p.add_argument("--dataset", default="pneumoniamnist", help="the federation's dataset (default pneumoniamnist)")
    p.add_argument("--image-size", type=int, default=28, help="the federation's image size (default 28)")
    p.add_argument("--allow-odd-sizes", action="store_true", help="non-square or small images are warnings, not problems")
    p.add_argument("--skip-data-check", action="store_true", help="start even if the data check finds problems")
    p.add_argument("--max-retries", type=int, help="reconnection attempts before giving up (default: unlimited)")
    p.add_argument("--max-wait-time", type=float, help="seconds of reconnecting before giving up (default: unlimited)")
    p.add_argument("--dry-run", action="store_true", help="check and print the command, do not start it")
    p.set_defaults(func=cmd_supernode)


def add_data_parser(sub) -> None:
    data = sub.add_parser("data", help="check a hospital's own data before joining")
    dsub = data.add_subparsers(dest="data_command", required=True)
    p = dsub.add_parser("check", help="check a class-per-folder image dataset against the federation's classes",
                        description="Exit 0 when the folder is ready, 1 when it has problems.")
    p.add_argument("path", help="folder with one sub-folder per class")
    p.add_argument("--dataset", default="pneumoniamnist", help="the federation's dataset (default pneumoniamnist)")
    p.add_argument("--image-size", type=int, default=28, help="the federation's image size (default 28)")
    p.add_argument("--allow-odd-sizes", action="store_true", help="non-square or small images are warnings, not problems")
    p.set_defaults(func=cmd_data_check)

"""Which app bundles a hospital runs: its own approvals by hash, and the consortium's signatures.

An app bundle (``.fab``) is identified by the SHA-256 of its bytes (Flower's FAB hash; ``flwr run``
and ``flwr build`` show its first 8 hex digits). A hospital keeps an **approvals file** (TOML, one
``[[approved]]`` table per bundle: the full hash, who, when, a comment) and beside it a copy of each
approved bundle, so that a review can diff a new bundle against the last approved one.

A consortium's release manager can instead **sign** a bundle's hash with an Ed25519 key. The signed
message is Flower's: the 8-byte big-endian timestamp followed by the 32-byte SHA-256 of the bundle
(``flwr/supernode/start_client_internal.py``), and the public keys are listed in Flower's
trusted-entities format (YAML lines ``fpk_<id>: "ssh-ed25519 AAAA..."``), so one file serves
Flower Hub's verification and hospitrust's. The signature travels in the run config
(``app-signature = "<key id>:<timestamp>:<base64url signature>"``): the bundle's own files would
change the hash it signs.
"""

from __future__ import annotations

import base64
import datetime as dt
import difflib
import getpass
import hashlib
import io
import os
import time
import tomllib
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hospitrust.errors import DeployError

SIGNATURE_KEY = "app-signature"  # the run-config key that carries a signature
CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".sh", ".pth")


def fab_sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def short(sha: str) -> str:
    """The 8 hex digits ``flwr build``'s file name and ``flwr run`` show."""
    return sha[:8]


def build_fab(app: Path) -> bytes:
    """The bundle ``flwr run APP`` sends: Flower's own builder (fixed zip dates, sorted files), so the same hash."""
    from flwr.cli.build import build_fab_from_disk

    app = Path(app).expanduser().resolve()
    if not (app / "pyproject.toml").is_file():
        raise DeployError(f"{app}: not a Flower app (no pyproject.toml)")
    return build_fab_from_disk(app)


def read_fab(path: Path) -> bytes:
    """A ``.fab`` file's bytes, or the bundle of an app folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        return build_fab(path)
    if not path.is_file():
        raise DeployError(f"{path}: no such .fab file or app folder")
    content = path.read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(content)):
        raise DeployError(f"{path}: not an app bundle (a .fab is a zip archive)")
    return content


def fab_files(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as zf:
        return {name: zf.read(name) for name in sorted(zf.namelist())}


@dataclass(frozen=True)
class Approval:
    sha256: str
    by: str
    at: str
    comment: str = ""


class Approvals:
    """A hospital's approvals file and the folder of approved bundles beside it (``<file stem>.d/<sha>.fab``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser().resolve()
        self.bundles = self.path.with_name(self.path.stem + ".d")

    def load(self) -> list[Approval]:
        if not self.path.is_file():
            return []
        try:
            data = tomllib.loads(self.path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise DeployError(f"{self.path}: not a valid approvals file ({exc})") from None
        out = []
        for i, row in enumerate(data.get("approved", [])):
            sha = str(row.get("sha256", ""))
            if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise DeployError(f"{self.path}: approval {i + 1} has sha256 {sha!r}; expected all 64 lower-case hex "
                                  f"digits of the bundle's SHA-256")
            out.append(Approval(sha, str(row.get("by", "")), str(row.get("at", "")), str(row.get("comment", ""))))
        return out

    def is_approved(self, sha: str) -> bool:
        return any(a.sha256 == sha for a in self.load())

    def _write(self, approvals: list[Approval]) -> None:
        import tomli_w

        from hospitrust.pki.certificates import write_private

        text = "# hospitrust app approvals: the app bundles this hospital's SuperNode may run (hospitrust app approve)\n"
        text += tomli_w.dumps({"approved": [a.__dict__ for a in approvals]})
        write_private(self.path, text.encode(), force=True)

    def approve(self, content: bytes, *, by: str | None = None, comment: str = "") -> Approval:
        sha = fab_sha256(content)
        approvals = [a for a in self.load() if a.sha256 != sha]
        approval = Approval(sha, by or getpass.getuser(), dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            comment)
        self.bundles.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.bundles / f"{sha}.fab").write_bytes(content)
        self._write([*approvals, approval])
        return approval

    def revoke(self, sha: str) -> Approval:
        approvals = self.load()
        found = [a for a in approvals if a.sha256 == sha or (len(sha) >= 8 and a.sha256.startswith(sha))]
        if len(found) != 1:
            raise DeployError(f"{sha}: {'no' if not found else 'more than one'} approval matches in {self.path}")
        self._write([a for a in approvals if a is not found[0]])
        (self.bundles / f"{found[0].sha256}.fab").unlink(missing_ok=True)
        return found[0]

    def last_bundle(self) -> tuple[Approval, bytes] | None:
        for approval in reversed(self.load()):
            path = self.bundles / f"{approval.sha256}.fab"
            if path.is_file():
                return approval, path.read_bytes()
        return None


def review(content: bytes, approvals: Approvals | None) -> str:
    """What a security officer reads before approving: hash, files (code marked), the diff against the last approval."""
    sha = fab_sha256(content)
    files = fab_files(content)
    lines = [f"app bundle sha256 {sha} (flwr shows {short(sha)})", f"{len(files)} files:"]
    for name, data in files.items():
        kind = "code" if name.endswith(CODE_SUFFIXES) else "data"
        lines.append(f"  {kind:4}  {len(data):>8} B  {hashlib.sha256(data).hexdigest()[:16]}  {name}")
    if approvals is None:
        return "\n".join(lines)
    if approvals.is_approved(sha):
        lines.append(f"already approved in {approvals.path}")
        return "\n".join(lines)
    last = approvals.last_bundle()
    if last is None:
        lines.append(f"no approved bundle in {approvals.path} to compare with: review every code file above")
        return "\n".join(lines)
    approval, old = last
    old_files = fab_files(old)
    lines.append(f"against the last approved bundle {short(approval.sha256)} (by {approval.by}, {approval.at}):")
    changed = False
    for name in sorted(set(files) | set(old_files)):
        a, b = old_files.get(name), files.get(name)
        if a == b:
            continue
        changed = True
        if a is None or b is None:
            lines.append(f"  {'added' if a is None else 'removed'}: {name}")
            continue
        try:
            diff = difflib.unified_diff(a.decode().splitlines(), b.decode().splitlines(), f"approved/{name}", f"new/{name}",
                                        lineterm="")
            lines.extend("  " + d for d in diff)
        except UnicodeDecodeError:
            lines.append(f"  changed (binary): {name}")
    if not changed:
        lines.append("  no file differs")
    return "\n".join(lines)


# -- signatures ---------------------------------------------------------------------------------------------------

def signed_message(timestamp: int, sha: str) -> bytes:
    """Flower's signed message: the 8-byte big-endian timestamp, then the bundle's 32-byte SHA-256."""
    return int(timestamp).to_bytes(8, "big") + bytes.fromhex(sha)


def create_signing_key(out_dir: Path, name: str, *, force: bool = False) -> tuple[Path, Path, str]:
    """An Ed25519 key pair for a release manager: ``NAME.key`` (0600), ``NAME.pub`` (``ssh-ed25519 ...``) and its
    key id (``fpk_<uuid>``), printed as the trusted-entities line hospitals add.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from hospitrust.pki.certificates import write_private, write_public

    if not name or "/" in name or name.startswith("."):
        raise DeployError(f"bad key name {name!r}: e.g. 'release-manager'")
    key = ed25519.Ed25519PrivateKey.generate()
    out_dir = Path(out_dir).expanduser().resolve()
    key_id = f"fpk_{uuid.uuid4()}"
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()), force)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    write_public(pub_path, f"{key_id}: \"{public}\"\n".encode(), force)
    return key_path, pub_path, key_id


def sign(content: bytes, key_file: Path, key_id: str, *, timestamp: int | None = None) -> str:
    """The run-config value that signs this bundle: ``<key id>:<timestamp>:<base64url signature>``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = serialization.load_ssh_private_key(Path(key_file).expanduser().read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise DeployError(f"{key_file}: not an Ed25519 private key (hospitrust app keygen makes one)")
    if not key_id.startswith("fpk_"):
        raise DeployError(f"key id {key_id!r}: expected fpk_<uuid>, as in the .pub file")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    signature = key.sign(signed_message(ts, fab_sha256(content)))
    return f"{key_id}:{ts}:{base64.urlsafe_b64encode(signature).decode().rstrip('=')}"


def load_trusted(path: Path) -> dict[str, object]:
    """Flower's trusted-entities file: ``fpk_<id>: "ssh-ed25519 AAAA..."`` per line -> key id -> public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    path = Path(path).expanduser()
    if not path.is_file():
        raise DeployError(f"trusted signers file {path} not found")
    keys: dict[str, object] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key_id, sep, value = line.partition(":")
        value = value.strip().strip('"').strip("'")
        try:
            key = serialization.load_ssh_public_key(value.encode())
        except (ValueError, TypeError):
            key = None
        if not sep or not key_id.strip().startswith("fpk_") or not isinstance(key, ed25519.Ed25519PublicKey):
            raise DeployError(f"{path}:{n}: expected `fpk_<id>: \"ssh-ed25519 AAAA...\"` (Flower's trusted-entities format)")
        keys[key_id.strip()] = key
    return keys


def verify(signature: str, sha: str, trusted: dict[str, object], *, max_age_seconds: float | None = None,
           now: float | None = None) -> str | None:
    """None when ``signature`` is a trusted key's valid signature of ``sha`` (and young enough), else why not."""
    from cryptography.exceptions import InvalidSignature

    parts = signature.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return "malformed app signature (expected <key id>:<timestamp>:<signature>)"
    key_id, ts, sig = parts[0], int(parts[1]), parts[2]
    key = trusted.get(key_id)
    if key is None:
        return f"app signed by an untrusted key ({key_id})"
    try:
        key.verify(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)), signed_message(ts, sha))  # type: ignore[attr-defined]
    except (InvalidSignature, ValueError):
        return f"bad app signature by {key_id} for sha256 {sha}"
    age = (time.time() if now is None else now) - ts
    if max_age_seconds is not None and age > max_age_seconds:
        return f"app signature by {key_id} expired ({age / 86400:.1f} days old; the policy allows {max_age_seconds / 86400:g})"
    return None


def default_approvals_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hospitrust" / "approved-apps.toml"

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
change the hash it signs. A signature dated more than :data:`CLOCK_SKEW_SECONDS` ahead of the hospital's
clock is refused; ``app sign --expires`` adds an end to its validity (``<key id>:<timestamp>:<expires>:<sig>``,
the 8-byte big-endian expiry appended to the signed message, so such a signature is hospitrust's own).

The approvals file also holds the hospital's **revocation list** (``[[revoked]]`` tables, by bundle hash
or by signer key, ``hospitrust app revoke``): a revoked bundle is refused whatever approves or signs it,
and a revoked key's signatures count for nothing.
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
CLOCK_SKEW_SECONDS = 300  # a signature dated later than this ahead of the hospital's clock is refused
INFO_DIR = ".info/"  # the bundle's manifest folder, which Flower removes when it installs the bundle
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
    try:
        return build_fab_from_disk(app)
    except ValueError as exc:  # Flower's configuration errors, one problem a line: one line here
        lines = [line.strip(" -") for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        raise DeployError(f"{app}: {lines[0]} {'; '.join(lines[1:])}".strip()) from None



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
    try:
        fab_files(content)
    except DeployError as exc:
        raise DeployError(f"{path}: {exc}") from None
    return content


def fab_files(content: bytes) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as zf:
            return {name: zf.read(name) for name in sorted(zf.namelist()) if not name.endswith("/")}
    except (zipfile.BadZipFile, EOFError) as exc:
        raise DeployError(f"not a readable app bundle ({exc})") from None


def zip_comment(content: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(content)) as zf:
        return zf.comment


def installed_files(content: bytes) -> dict[str, str]:
    """What Flower's ``install_from_fab`` puts in the install folder: every file of the bundle but its ``.info/``
    manifest, by relative path -> SHA-256 of its bytes.
    """
    return {name: hashlib.sha256(data).hexdigest() for name, data in fab_files(content).items()
            if not name.startswith(INFO_DIR)}


def check_installed(folder: Path, expected: dict[str, str]) -> tuple[str, str] | None:
    """None when ``folder`` holds exactly the files ``expected`` lists with those hashes, else (public, detail).

    The public text names the bundle's own files that are missing or changed and counts the extra ones; the
    detail (for the hospital's own log) names the extra ones too. A link or anything not a regular file counts
    as extra (or changed, where the bundle has a file by that name).
    """
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return "the app's install folder is missing or not a folder", f"{folder}: missing or not a folder"
    found: dict[str, str | None] = {}  # None: a link or not a regular file
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        for name in [*files, *[d for d in dirs if (here / d).is_symlink()]]:
            path = here / name
            rel = path.relative_to(folder).as_posix()
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else None
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    changed = sorted(n for n in set(expected) & set(found) if found[n] != expected[n])
    if not (missing or extra or changed):
        return None
    public, detail = [], []
    if changed:
        public.append(f"{len(changed)} changed ({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''})")
        detail.append(f"changed: {', '.join(changed)}")
    if missing:
        public.append(f"{len(missing)} missing ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})")
        detail.append(f"missing: {', '.join(missing)}")
    if extra:
        public.append(f"{len(extra)} extra file{'s' if len(extra) > 1 else ''} not in the bundle")
        detail.append(f"extra: {', '.join(extra)}")
    head = "the installed app folder differs from the approved bundle: "
    return head + ", ".join(public), f"{folder}: " + "; ".join(detail)


@dataclass(frozen=True)
class Approval:
    sha256: str
    by: str
    at: str
    comment: str = ""


@dataclass(frozen=True)
class Revocation:
    """One row of the revocation list: a bundle (``sha256``) or a signer's key (``key``, its ``fpk_`` id)."""

    sha256: str = ""
    key: str = ""
    by: str = ""
    at: str = ""
    comment: str = ""

    def row(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v or k in ("by", "at")}


def _is_sha(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


#: Refused bundles kept for review: the newest ones, so that a server sending new bundles cannot fill the disk.
PENDING_KEPT = 10


class Approvals:
    """A hospital's approvals file and the folder of approved bundles beside it (``<file stem>.d/<sha>.fab``).

    The same file holds the revocation list (``[[revoked]]``): revoked bundles and signer keys.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser().resolve()
        self.bundles = self.path.with_name(self.path.stem + ".d")

    def _read(self) -> dict:
        if not self.path.is_file():
            return {}
        try:
            return tomllib.loads(self.path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise DeployError(f"{self.path}: not a valid approvals file ({exc})") from None

    def load(self) -> list[Approval]:
        out = []
        for i, row in enumerate(self._read().get("approved", [])):
            sha = str(row.get("sha256", ""))
            if not _is_sha(sha):
                raise DeployError(f"{self.path}: approval {i + 1} has sha256 {sha!r}; expected all 64 lower-case hex "
                                  f"digits of the bundle's SHA-256")
            out.append(Approval(sha, str(row.get("by", "")), str(row.get("at", "")), str(row.get("comment", ""))))
        return out

    def load_revoked(self) -> list[Revocation]:
        out = []
        for i, row in enumerate(self._read().get("revoked", [])):
            sha, key = str(row.get("sha256", "")), str(row.get("key", ""))
            if bool(sha) == bool(key) or (sha and not _is_sha(sha)) or (key and not key.startswith("fpk_")):
                raise DeployError(f"{self.path}: revocation {i + 1} must have either sha256 (all 64 lower-case hex "
                                  f"digits) or key (a signer's fpk_... id), not {dict(row)!r}")
            out.append(Revocation(sha, key, str(row.get("by", "")), str(row.get("at", "")), str(row.get("comment", ""))))
        return out

    def is_approved(self, sha: str) -> bool:
        return any(a.sha256 == sha for a in self.load())

    def revoked_bundle(self, sha: str) -> Revocation | None:
        return next((r for r in self.load_revoked() if r.sha256 == sha), None)

    def revoked_key(self, key_id: str) -> Revocation | None:
        return next((r for r in self.load_revoked() if r.key == key_id), None)

    def _write(self, approvals: list[Approval], revoked: list[Revocation] | None = None) -> None:
        import tomli_w

        from hospitrust.pki.certificates import write_private

        revoked = self.load_revoked() if revoked is None else revoked
        text = "# hospitrust app approvals: the app bundles this hospital's SuperNode may run (hospitrust app approve)\n"
        text += "# and its revocation list: bundles and signer keys it refuses (hospitrust app revoke)\n"
        text += tomli_w.dumps({"approved": [a.__dict__ for a in approvals], "revoked": [r.row() for r in revoked]})
        write_private(self.path, text.encode(), force=True)

    def approve(self, content: bytes, *, by: str | None = None, comment: str = "") -> Approval:
        """Approve a bundle (an explicit approval lifts an earlier revocation of the same hash)."""
        from hospitrust.pki.certificates import write_private

        sha = fab_sha256(content)
        approvals = [a for a in self.load() if a.sha256 != sha]
        approval = Approval(sha, by or getpass.getuser(), _now(), comment)
        self.bundles.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.bundles / f"{sha}.fab", content, force=True)  # the hospital's copy: its service user's only
        self._write([*approvals, approval], [r for r in self.load_revoked() if r.sha256 != sha])
        return approval

    def keep_pending(self, sha: str, content: bytes) -> Path:
        """Keep a refused bundle for the security officer's review (``<file stem>.d/pending/<sha>.fab``, mode 0600),
        at most ``PENDING_KEPT`` of them: the oldest beyond go. Returns its path.
        """
        from hospitrust.pki.certificates import write_private

        folder = self.bundles / "pending"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        pending = folder / f"{sha}.fab"
        if not pending.is_file():
            write_private(pending, content, force=True)
        kept = sorted(folder.glob("*.fab"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[PENDING_KEPT:]:
            if old != pending:
                old.unlink(missing_ok=True)
        return pending

    def revoke(self, sha: str, *, by: str | None = None, comment: str = "") -> tuple[Revocation, Approval | None]:
        """Put a bundle on the revocation list and remove its approval, if any.

        ``sha`` is the full hash, or a prefix of 8 or more hex digits of exactly one approved bundle's hash.
        """
        sha = sha.strip().lower()
        if len(sha) < 8 or any(c not in "0123456789abcdef" for c in sha):
            raise DeployError(f"{sha!r}: expected a bundle's SHA-256 (64 hex digits, or a unique prefix of 8 or more "
                              f"of an approved bundle's)")
        approvals = self.load()
        found = [a for a in approvals if a.sha256.startswith(sha)]
        if len(found) > 1:
            raise DeployError(f"{sha}: more than one approval matches in {self.path}; give more hex digits")
        if not found and not _is_sha(sha):
            raise DeployError(f"{sha}: no approval matches in {self.path}; to revoke a bundle this hospital did not "
                              f"approve (a signed one), give all 64 hex digits of its SHA-256")
        full = found[0].sha256 if found else sha
        revoked = [r for r in self.load_revoked() if r.sha256 != full]
        entry = Revocation(sha256=full, by=by or getpass.getuser(), at=_now(), comment=comment)
        self._write([a for a in approvals if a.sha256 != full], [*revoked, entry])
        (self.bundles / f"{full}.fab").unlink(missing_ok=True)
        return entry, (found[0] if found else None)

    def revoke_key(self, key_id: str, *, by: str | None = None, comment: str = "") -> Revocation:
        """Put a signer's key on the revocation list: its signatures no longer approve any bundle here."""
        key_id = key_id.strip()
        if not key_id.startswith("fpk_") or any(c in key_id for c in ": \t\"'"):
            raise DeployError(f"key id {key_id!r}: expected the signer's fpk_<uuid> id (the part before ':' in its "
                              f".pub line)")
        entry = Revocation(key=key_id, by=by or getpass.getuser(), at=_now(), comment=comment)
        self._write(self.load(), [*[r for r in self.load_revoked() if r.key != key_id], entry])
        return entry

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
    lines = [f"app bundle sha256 {sha} (flwr shows {short(sha)})"]
    comment = zip_comment(content)
    if comment:
        lines.append(f"zip comment: {len(comment)} B (not a file: Flower does not install it, but it changes the hash)")
    lines.append(f"{len(files)} files:")
    for name, data in files.items():
        kind = "code" if name.endswith(CODE_SUFFIXES) else "data"
        lines.append(f"  {kind:4}  {len(data):>8} B  {hashlib.sha256(data).hexdigest()[:16]}  {name}")
    if approvals is None:
        return "\n".join(lines)
    if (revoked := approvals.revoked_bundle(sha)) is not None:
        lines.append(f"REVOKED in {approvals.path} (by {revoked.by}, {revoked.at}): approving it again lifts the "
                     f"revocation")
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
        old_comment = zip_comment(old)
        where = (f"its zip comment ({len(old_comment)} B approved, {len(comment)} B now)" if old_comment != comment
                 else "its zip structure (entry dates, order, attributes or compression)")
        lines.append(f"  no file differs, but the bundle's bytes do: {where}. The same files would be installed, "
                     f"yet the hash is new; approve it only if you expected a re-packed bundle")
    return "\n".join(lines)


# -- signatures ---------------------------------------------------------------------------------------------------

def signed_message(timestamp: int, sha: str, expires: int | None = None) -> bytes:
    """Flower's signed message: the 8-byte big-endian timestamp, then the bundle's 32-byte SHA-256 (and, for a
    signature with an expiry, hospitrust's: the 8-byte big-endian expiry appended).
    """
    tail = b"" if expires is None else int(expires).to_bytes(8, "big")
    return int(timestamp).to_bytes(8, "big") + bytes.fromhex(sha) + tail


def _utc(ts: float) -> str:
    try:
        return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"Unix time {ts}"


def parse_expires(text: str, *, now: float | None = None) -> int:
    """``--expires``: ``<N>d`` (days from now), an ISO date (its end, UTC) or an ISO date-time (UTC if unzoned)."""
    now = time.time() if now is None else now
    text = text.strip()
    if text[:-1].isdigit() and text.endswith("d") and int(text[:-1]) > 0:
        return int(now + int(text[:-1]) * 86400)
    try:
        if len(text) == 10:
            when = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(23, 59, 59), dt.timezone.utc)
        else:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            when = when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise DeployError(f"--expires {text!r}: expected a number of days (90d), a date (2027-06-30) or a UTC "
                          f"date-time (2027-06-30T12:00:00Z)") from None
    if when.timestamp() <= now:
        raise DeployError(f"--expires {text!r}: that is not in the future")
    return int(when.timestamp())


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


def sign(content: bytes, key_file: Path, key_id: str, *, timestamp: int | None = None, expires: int | None = None) -> str:
    """The run-config value that signs this bundle: ``<key id>:<timestamp>:<base64url signature>``, or with an
    expiry (Unix time) ``<key id>:<timestamp>:<expires>:<base64url signature>``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    try:
        key = serialization.load_ssh_private_key(Path(key_file).expanduser().read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise DeployError(f"{key_file}: not an unencrypted OpenSSH private key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise DeployError(f"{key_file}: not an Ed25519 private key (hospitrust app keygen makes one)")
    if not key_id.startswith("fpk_"):
        raise DeployError(f"key id {key_id!r}: expected fpk_<uuid>, as in the .pub file")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    if expires is not None and int(expires) <= ts:
        raise DeployError(f"the signature would expire ({_utc(expires)}) before it is made ({_utc(ts)})")
    signature = key.sign(signed_message(ts, fab_sha256(content), expires))
    encoded = base64.urlsafe_b64encode(signature).decode().rstrip("=")
    return f"{key_id}:{ts}:{encoded}" if expires is None else f"{key_id}:{ts}:{int(expires)}:{encoded}"


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
           now: float | None = None, revoked_keys: set[str] | frozenset[str] = frozenset()) -> str | None:
    """None when ``signature`` is a trusted, unrevoked key's valid signature of ``sha``, dated no later than
    :data:`CLOCK_SKEW_SECONDS` ahead of ``now``, not past its expiry and young enough; else why not (one line).
    """
    from cryptography.exceptions import InvalidSignature

    parts = signature.split(":")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[1:-1]):
        return "malformed app signature (expected <key id>:<timestamp>:<signature> or <key id>:<timestamp>:<expires>:<signature>)"
    key_id, ts, sig = parts[0], int(parts[1]), parts[-1]
    expires = int(parts[2]) if len(parts) == 4 else None
    if key_id in revoked_keys:
        return f"app signed by a revoked key ({key_id})"
    key = trusted.get(key_id)
    if key is None:
        return f"app signed by an untrusted key ({key_id})"
    try:
        key.verify(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)), signed_message(ts, sha, expires))  # type: ignore[attr-defined]
    except (InvalidSignature, ValueError, OverflowError):
        return f"bad app signature by {key_id} for sha256 {sha}"
    now = time.time() if now is None else now
    if ts > now + CLOCK_SKEW_SECONDS:
        return (f"app signature by {key_id} is dated in the future ({_utc(ts)}; this hospital's clock says {_utc(now)}, "
                f"and allows {CLOCK_SKEW_SECONDS // 60} minutes of clock skew)")
    if expires is not None and now > expires:
        return f"app signature by {key_id} expired at {_utc(expires)}"
    age = now - ts
    if max_age_seconds is not None and age > max_age_seconds:
        return f"app signature by {key_id} expired ({age / 86400:.1f} days old; the policy allows {max_age_seconds / 86400:g})"
    return None


def default_approvals_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hospitrust" / "approved-apps.toml"

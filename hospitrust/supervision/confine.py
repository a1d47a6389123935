"""An approved ClientApp confined by the launcher: another user than the gate's files, without capabilities.

The warm launcher's child runs the hospital's gate as the service user (it reads the approvals, the signers,
the site policy, and installs and checks the bundle); once the gate accepted the bundle, and before any of the
bundle is imported, the child (:func:`drop_to`) switches to the ClientApp's user (``deploy supernode
--clientapp-user NAME``): that user's own groups (``initgroups``; none for a bare ``UID[:GID]``), its gid and uid
(real, effective and saved alike), no capabilities left (permitted, effective, inheritable, ambient) and
``no_new_privs`` set (a set-user-ID program it runs gains nothing); then it checks that ``setuid(0)`` and a return
to the service user fail. The gate's files stay 0600 for the service user; :func:`check_private` refuses to
start a launcher whose gate files (or their folders) that user could read or write.

What the ClientApp needs after the switch: the installed bundle (made readable by others here,
:func:`share_install`: it is the approved code, nothing secret; it stays writable by the service user only), its
data folder (readable by that user or one of its groups), and the folders it writes: the image cache
(``--cache-dir``) and the privacy ledger (``$HOSPITRUST_PRIVACY_LEDGER``), owned by that user (the shipped unit
creates ``/var/lib/hospitrust/app`` and ``/var/cache/hospitrust/app`` for it). ``HOME`` becomes that user's home.

Switching user needs CAP_SETUID and CAP_SETGID in the launcher, and killing the switched child at the site
policy's ``max-wall-seconds`` needs CAP_KILL (a process may only signal its own user's processes): the unit gives
the three as ambient capabilities; :func:`check_can_switch` says at the start which is missing.
"""

from __future__ import annotations

import ctypes
import grp
import os
import pwd
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

from hospitrust.errors import DeployError

CLIENTAPP_USER_ENV = "HOSPITRUST_CLIENTAPP_USER"  # the launcher's --clientapp-user, set by deploy supernode
CAP_KILL, CAP_SETGID, CAP_SETUID = 5, 6, 7
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 1, 38, 47, 4
_PR_SET_KEEPCAPS = 8
_CAPABILITY_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class AppUser:
    """The user an approved ClientApp runs as."""

    name: str  # "" for a bare uid
    uid: int
    gid: int
    groups: tuple[int, ...]  # its supplementary groups (initgroups), () for a bare uid
    home: str | None

    @classmethod
    def parse(cls, spec: str) -> AppUser:
        """``NAME`` (a user of this system: its group, groups and home) or ``UID[:GID]`` (no supplementary group)."""
        spec = spec.strip()
        user, _, group = spec.partition(":")
        try:
            if user.isdigit():
                uid = int(user)
                gid = int(group) if group.isdigit() else (_by_uid(uid).pw_gid if not group else grp.getgrnam(group).gr_gid)
                return cls("", uid, gid, (), None)
            entry = pwd.getpwnam(user)
        except KeyError:
            raise DeployError(f"--clientapp-user {spec!r}: no such user or group on this system; expected a user name "
                              "(useradd --system hospitrust-app) or UID[:GID]") from None
        gid = entry.pw_gid if not group else (int(group) if group.isdigit() else _group(group, spec))
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, gid))))
        return cls(entry.pw_name, entry.pw_uid, gid, groups, entry.pw_dir)

    @property
    def label(self) -> str:
        return self.name or f"uid {self.uid}"


def _by_uid(uid: int):
    try:
        return pwd.getpwuid(uid)
    except KeyError:  # a uid without a passwd entry: its own group number
        return pwd.struct_passwd(("", "", uid, uid, "", "", ""))


def _group(name: str, spec: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise DeployError(f"--clientapp-user {spec!r}: no group {name!r} on this system") from None


def capabilities(which: str = "CapEff") -> int:
    """The capability set ``which`` of this process (CapEff, CapPrm, CapInh, CapAmb, CapBnd) as a bit mask."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(which + ":"):
            return int(line.split()[1], 16)
    return 0


def check_can_switch(user: AppUser) -> None:
    """At the launcher's start: the switch would work (a service user with the capabilities it needs)."""
    if user.uid == 0:
        raise DeployError("--clientapp-user: the ClientApp must not run as root (uid 0)")
    if user.uid == os.geteuid():
        raise DeployError(f"--clientapp-user {user.label}: that is the service's own user; the ClientApp must run as "
                          "another user than the gate's files (useradd --system hospitrust-app)")
    if os.geteuid() == 0:
        return
    have = capabilities("CapEff")
    missing = [name for bit, name in ((CAP_SETUID, "CAP_SETUID"), (CAP_SETGID, "CAP_SETGID"), (CAP_KILL, "CAP_KILL"))
               if not have >> bit & 1]
    if missing:
        raise DeployError(f"--clientapp-user {user.label} needs {' '.join(missing)} in this process (the unit's "
                          "AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL; CAP_KILL ends a ClientApp past the site "
                          "policy's max-wall-seconds)")


def exposed(path: Path, user: AppUser) -> str | None:
    """'readable', 'writable' or 'readable and writable' when ``user`` has that access to ``path`` by its mode
    bits (owner, group, others; ACLs are not read), else None.
    """
    st = path.stat()
    if st.st_uid == user.uid:
        bits = (st.st_mode >> 6) & 7
    elif st.st_gid == user.gid or st.st_gid in user.groups:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    kinds = [k for k, bit in (("readable", 4), ("writable", 2)) if bits & bit]
    return " and ".join(kinds) or None


def check_private(paths: list[Path], user: AppUser) -> None:
    """Refuse when the ClientApp's user could read or write one of the gate's files (approvals, signers, site
    policy, audit log, its key and head) or write the folder that holds it (and so replace it).
    """
    for path in paths:
        if not path.exists():
            continue
        how = exposed(path, user)
        if how is not None and not path.is_dir():
            st = path.stat()
            raise DeployError(f"{path} is {how} by the ClientApp's user {user.label} (mode {stat.S_IMODE(st.st_mode):o}, "
                              f"owner uid {st.st_uid}, group {st.st_gid}): chmod 600 it, owned by the service user")
        folder = path.parent
        if "writable" in (exposed(folder, user) or "") and not folder.stat().st_mode & stat.S_ISVTX:
            raise DeployError(f"{folder}, which holds {path.name}, is writable by the ClientApp's user {user.label}: "
                              "the gate's files must be in a folder only the service user writes")


def share_install(target: Path, top: Path) -> None:
    """Let another user import the installed bundle: its folders o+rx, its files o+r (written under UMask=0077 they
    are the service user's alone), the folders from ``top`` down to it o+x (traversed, not listed). Nothing becomes
    writable.
    """
    target, top = Path(target), Path(top)
    for root, dirs, files in os.walk(target):
        os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) | 0o005)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | 0o004)
    folder = target.parent
    while True:
        os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) | 0o001)
        if folder == top or folder.parent == folder or top not in folder.parents:
            break
        folder = folder.parent


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def clear_capabilities() -> None:
    """Drop every capability of this process (ambient, then effective, permitted and inheritable) and set
    no_new_privs. A service user's process keeps its capabilities across setuid (only a change away from uid 0
    clears them), so without this the ClientApp could switch back.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_Data * 2)()
    if libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset: could not drop the capabilities")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def thread_credentials() -> dict[int, dict[str, int]]:
    """Every thread of this process: its effective uid and gid and its capability sets (CapEff, CapPrm, CapInh,
    CapAmb as bit masks), by thread id. Credentials are per thread on Linux.
    """
    out: dict[int, dict[str, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task.name)] = {"uid": int(fields["Uid"].split()[1]), "gid": int(fields["Gid"].split()[1]),
                               **{k: int(fields[k].split()[0], 16) for k in ("CapEff", "CapPrm", "CapInh", "CapAmb")}}
    return out


def drop_to(user: AppUser) -> None:
    """Become ``user`` for good (see the module's docstring); raises when anything of the old identity is left."""
    service_uid, parent = os.geteuid(), os.getppid()
    if service_uid != 0:
        # Capabilities are per thread, and other threads run beside this one (Flower's task heartbeat). glibc applies
        # a uid or gid change to every thread, capset only to its caller, and a uid change clears capabilities only
        # on the way from uid 0 (capabilities(7)): a service user's capabilities would survive the switch in the
        # other threads (found with the shipped unit's User= and AmbientCapabilities=). Pass through uid 0 (CAP_SETUID
        # allows it; it grants no capability the service lacks) so that the switch below clears every thread's.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0)
        os.setresuid(0, 0, 0)
    if user.name:
        os.initgroups(user.name, user.gid)
    else:
        os.setgroups(list(user.groups))
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
    clear_capabilities()
    if os.getresuid() != (user.uid,) * 3 or os.getresgid() != (user.gid,) * 3:
        raise OSError(f"still uid {os.getresuid()} gid {os.getresgid()} after switching to {user.label}")
    left = {which: capabilities(which) for which in ("CapEff", "CapPrm", "CapInh", "CapAmb")}
    if any(left.values()):
        raise OSError(f"capabilities left after switching to {user.label}: {left}")
    for tid, creds in thread_credentials().items():  # every thread, not only this one
        if (creds["uid"], creds["gid"]) != (user.uid, user.gid) or any(creds[k] for k in ("CapEff", "CapPrm", "CapAmb")):
            raise OSError(f"thread {tid} kept part of the old identity after switching to {user.label}: {creds}")
    for uid in {0, service_uid} - {user.uid}:
        try:
            os.setuid(uid)
        except PermissionError:
            continue
        raise OSError(f"the ClientApp's user {user.label} could switch back to uid {uid}")
    if user.home:
        os.environ["HOME"] = user.home
    if user.name:
        os.environ["USER"] = os.environ["LOGNAME"] = user.name
    # a change of the effective uid clears the parent-death signal: set it again (the launcher's SIGTERM, as
    # hospitrust.supervision.supervisor.die_with_parent sets it before the switch)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before that
        os._exit(1)

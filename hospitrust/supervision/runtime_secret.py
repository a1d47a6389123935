"""The secret that keeps a SuperNode's local Runtime API to the hospital's own launcher.

With ``flower-supernode --isolation process`` the SuperNode hands each pending message, with the token that
answers it, to whatever process on the machine asks first (the Runtime API's ``AcquireTask``, an HTTP endpoint on
``--host:--port``): issue 61 found another local account taking a hospital's messages and answering them without
its gate. Flower 1.42 can require a shared secret for that call (``--superexec-auth-secret-file``: an HMAC over the
request, a timestamp and a nonce; the later calls of a task need its random token). ``hospitrust deploy supernode``
makes a fresh secret at each start, in a folder only the service user can enter (0700, the file 0600), gives its
path to the SuperNode and to the launcher, and removes it when it stops; the supervisor's restarts reuse it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: The only Runtime API call that hands out a task (and its token): the one the secret guards, as Flower's own
#: SuperExec guards it (``flwr.supercore.superexec.run_superexec._SUPEREXEC_AUTH_METHODS``).
PROTECTED_METHODS = frozenset({"/flwr.proto.Runtime/AcquireTask"})
SECRET_BYTES = 32


def create(parent: str | None = None) -> Path:
    """A fresh secret file in a new private folder (under ``parent``, else systemd's ``$RUNTIME_DIRECTORY``, else
    the system's temporary folder); returns its path.
    """
    parent = parent or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or None
    folder = Path(tempfile.mkdtemp(prefix="hospitrust-runtime-", dir=parent))  # 0700, this user's
    path = folder / "superexec-secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(SECRET_BYTES))
    finally:
        os.close(fd)
    return path


def remove(path: Path) -> None:
    """Remove the secret and its folder (what :func:`create` made)."""
    shutil.rmtree(Path(path).parent, ignore_errors=True)


def interceptor(path: str | Path):
    """The launcher's side: Flower's HTTP interceptor that signs ``AcquireTask`` with the secret in ``path``."""
    from flwr.supercore.auth import load_superexec_auth_secret
    from flwr.supercore.interceptors.http.superexec_auth import SuperExecAuthHttpInterceptor

    secret = load_superexec_auth_secret(str(path))
    assert secret is not None
    return SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=PROTECTED_METHODS)

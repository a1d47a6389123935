"""Files only the hospital's (or the operator's) service user may read: 0600 files in 0700 folders.

The decoded image cache (with ``patients.npy``: the DICOM headers' PatientIDs) and the privacy
ledger are created through these functions. Modes are set explicitly (``os.open`` with a mode,
``fchmod`` / ``chmod`` after creating), so a permissive umask does not widen them; a folder that
already exists is only tightened where hospitrust made it (``tighten=True``), never a user's
own folder such as the home directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | Path, *, tighten: bool = False) -> Path:
    """``path`` as a folder: created 0700 with every missing parent; with ``tighten``, an existing
    one owned by this user is set to 0700 as well (use it only for folders hospitrust made).
    """
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it between the check and here
            continue
        os.chmod(folder, DIR_MODE)
    if tighten and not missing:
        tighten_path(path, DIR_MODE)
    return path


def tighten_path(path: str | Path, mode: int) -> None:
    """Set ``mode`` on ``path`` when it is wider and this user owns it (a file or folder hospitrust wrote)."""
    st = os.stat(path)
    if st.st_uid == os.getuid() and st.st_mode & 0o777 & ~mode:
        os.chmod(path, mode)


def open_private(path: str | Path, mode: str = "wb") -> IO[Any]:
    """Open ``path`` for writing (truncated), created 0600; an existing file is set to 0600 first."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # O_CREAT's mode applies to new files only
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def write_private_text(path: str | Path, text: str) -> None:
    """Write ``text`` to a 0600 file."""
    with open_private(path, "w") as f:
        f.write(text)


def save_private_npy(path: str | Path, array: Any) -> None:
    """``np.save`` into a 0600 file."""
    import numpy as np

    with open_private(path, "wb") as f:
        np.save(f, array)


__all__ = ["DIR_MODE", "FILE_MODE", "open_private", "private_dir", "save_private_npy", "tighten_path",
           "write_private_text"]

"""The errors a user sees as one clear message (no traceback): what was wrong, and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A run or node config value is wrong; the message says which key, the value and what is allowed."""


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest known key, or ''."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close and "." not in key:  # an option named without its section: ema-rate -> hta.ema-rate
        close = [k for k in known if k.endswith("." + key)][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


class HospitalError(Exception):
    """A failure on a hospital's side, in two texts.

    ``public`` may leave the hospital: it names the problem, a count and an index ("file not found
    (rows 4, 17 of the manifest)"), never a path, a file name, a folder name other than a task's
    class folder, a patient id or a DICOM header value. ``detail`` says everything, paths included,
    and goes only to the hospital's own log and terminal. ``str()`` is the public text, so an error
    that reaches a reply by any road carries no more than that.
    """

    def __init__(self, public: str, detail: str | None = None) -> None:
        super().__init__(public)
        self.public = public
        self.detail = public if detail is None else detail

    def __str__(self) -> str:
        return self.public


class DeployError(RuntimeError):
    """A deployment step cannot be done (keys, certificates, the SuperLink, a SuperNode, an app
    bundle); the message says why and what to do.
    """

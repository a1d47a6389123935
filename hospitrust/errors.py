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

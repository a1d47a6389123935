"""Flower's ``flower-superlink``, with a SQLite busy timeout that a loaded machine does not outwait.

Flower 1.42 opens the SuperLink's store (``--database``) with ``PRAGMA busy_timeout = 5000``
(``flwr.supercore.constant.SQLITE_PRAGMAS``, applied to every new connection by ``flwr.supercore.sql_mixin``) and
retries nothing above it: a request whose write waits more than 5 s for the lock fails with "database is locked",
an HTTP 500 (a reply lost, a heartbeat refused, and once its ``runtime/acquire-task`` killed ``flower-superexec``).
Measured in docs/experiments/2026-12-06-many-hospitals.md: 8 to 18 such errors a run at 20 hospitals on one 2-core
machine. SQLite's own wait is the one place to give the store more time without forking Flower.

The supervisor (``hospitrust deploy superlink``) starts it as
``python -m hospitrust.supervision.superlink_main MILLISECONDS /path/to/flower-superlink ARGS``: the pragma's value
replaced before Flower's entry script runs, unchanged, in this process (the process's other pragmas are Flower's).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from pathlib import Path

#: the busy timeout hospitrust's SuperLink runs with (Flower's own: 5,000 ms)
DEFAULT_BUSY_TIMEOUT_MS = 30_000


def with_busy_timeout(milliseconds: int) -> None:
    """Make every SQLite connection Flower opens from now on in this process wait up to ``milliseconds`` for a lock."""
    if not isinstance(milliseconds, int) or isinstance(milliseconds, bool) or milliseconds < 0:
        raise ValueError(f"the SQLite busy timeout is a whole number of milliseconds >= 0, got {milliseconds!r}")
    from flwr.supercore import constant, sql_mixin

    pragmas = tuple((name, str(milliseconds) if name == "busy_timeout" else value)
                    for name, value in constant.SQLITE_PRAGMAS)
    if "busy_timeout" not in dict(pragmas):
        pragmas = (("busy_timeout", str(milliseconds)), *pragmas)
    # sql_mixin reads its own name at every connection (``_set_sqlite_pragmas``); constant's for any later importer
    for module in (constant, sql_mixin):
        setattr(module, "SQLITE_PRAGMAS", pragmas)  # noqa: B010 - a module global, read at each connection


def command(superlink_cmd: list[str], busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> list[str]:
    """The supervisor's command for ``superlink_cmd`` (``flower-superlink ARGS``): Flower's script, under this module."""
    script = superlink_cmd[0]
    if os.sep not in script:  # the script beside this interpreter (a virtual environment's bin), else on PATH
        beside = Path(sys.executable).parent / script
        script = str(beside) if beside.is_file() else (shutil.which(script) or script)
    return [sys.executable, "-m", "hospitrust.supervision.superlink_main", str(busy_timeout_ms), script,
            *superlink_cmd[1:]]


def main(argv: list[str] | None = None) -> None:
    """Set the busy timeout (the first argument, milliseconds), then run Flower's ``flower-superlink`` script (the
    second) with the rest as its arguments.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit() or not argv[1].endswith("flower-superlink"):
        print("usage: python -m hospitrust.supervision.superlink_main MILLISECONDS /path/to/flower-superlink [ARGS]",
              file=sys.stderr, flush=True)
        raise SystemExit(2)
    with_busy_timeout(int(argv[0]))
    sys.argv = list(argv[1:])
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main()

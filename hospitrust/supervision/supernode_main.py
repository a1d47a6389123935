"""Flower's ``flower-supernode``, made to exit when its main loop ends.

Flower 1.42's SuperNode pulls messages in a loop (``flwr.supernode.start_client_internal``) that catches only a run
leaving the running state around ``receive()``: any other error of a pull once connected (an HTTP 500 from a
SuperLink whose SQLite store was locked under load, issue 63; retries spent on a SuperLink gone mid-run) ends the
loop. The connection logs it (``ERROR``), deactivates the node and returns, and so does ``flower_supernode()``; the
process then does not exit: its Runtime API server (uvicorn, on ``--host:--port``) runs in a non-daemon thread that
Python's shutdown waits for. It sends no heartbeat and pulls nothing more, yet its supervisor sees it alive, so its
hospital stays offline until someone restarts it by hand (measured at N = 20 in
docs/experiments/2026-12-06-many-hospitals.md).

The supervisor (``hospitrust deploy supernode``) starts it as
``python -m hospitrust.supervision.supernode_main /path/to/flower-supernode ARGS``: Flower's own entry script, run
unchanged, after which this process exits, whatever threads are left: with Flower's exit code when Flower exits
(``flwr_exit``: a refused key, a bad certificate, a connection that never came up, a signal), and with
``MAIN_LOOP_CRASHED`` when its main loop ended (``flower_supernode()`` returned: the script's ``sys.exit`` of its
``None``) or raised. The supervisor restarts it with the same key after a backoff, as it does a SuperNode killed by a
signal.

Fault injection for the supervisor's test: ``HOSPITRUST_SUPERNODE_FAULT=raise-on-pull@N:MARKER`` makes the N-th pull
of a SuperNode raise (as an HTTP 500 does) when the file MARKER does not exist yet, and creates it: once per marker.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

#: the exit code when Flower's main loop raised (sysexits' EX_SOFTWARE; no Flower exit code uses it)
MAIN_LOOP_CRASHED = 70
FAULT_ENV = "HOSPITRUST_SUPERNODE_FAULT"


def _inject_fault(spec: str) -> None:
    """``raise-on-pull@N:MARKER``: the N-th pull raises, once per marker file (see the module's doc)."""
    kind, _, rest = spec.partition("@")
    count, _, marker = rest.partition(":")
    if kind != "raise-on-pull" or not count.isdigit() or not marker:
        raise SystemExit(f"{FAULT_ENV}={spec!r}: expected raise-on-pull@N:MARKER")
    if Path(marker).exists():
        return
    import importlib

    # the module (the package flwr.supernode exports a function of the same name)
    sci = importlib.import_module("flwr.supernode.start_client_internal")

    pull = sci._pull_and_store_message
    calls = {"n": 0}

    def faulty_pull(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == int(count):
            Path(marker).touch()
            raise RuntimeError(f"{FAULT_ENV}: pull {count} failed (as an HTTP 500 from the SuperLink would)")
        return pull(*args, **kwargs)

    setattr(sci, "_pull_and_store_message", faulty_pull)  # noqa: B010 - the loop looks the name up at each call


def main(argv: list[str] | None = None) -> None:
    """Run Flower's ``flower-supernode`` script (the first argument) with the rest as its arguments; never returns."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not argv[0].endswith("flower-supernode"):
        print("usage: python -m hospitrust.supervision.supernode_main /path/to/flower-supernode [ARGS]",
              file=sys.stderr, flush=True)
        os._exit(2)
    code = 0
    try:
        if os.environ.get(FAULT_ENV):
            _inject_fault(os.environ[FAULT_ENV])
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:  # Flower's script: sys.exit(flower_supernode()), which returned: the main loop ended
            print(f"hospitrust: flower-supernode's main loop ended (Flower's ERROR line above says why): exiting with "
                  f"{MAIN_LOOP_CRASHED} (its Runtime API thread would keep the process alive, offline)", flush=True)
            code = MAIN_LOOP_CRASHED
        else:  # Flower's exit path (flwr_exit: a refused key, a signal's graceful exit)
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the main loop raised: say so, and do not wait for Flower's threads
        traceback.print_exc()
        print(f"hospitrust: flower-supernode's main loop ended with the error above: exiting with {MAIN_LOOP_CRASHED} "
              "(its Runtime API thread would keep the process alive, offline)", flush=True)
        code = MAIN_LOOP_CRASHED
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def command(supernode_cmd: list[str]) -> list[str]:
    """The supervisor's command for ``supernode_cmd`` (``flower-supernode ARGS``): Flower's script, under this module.
    Any other command (a stand-in of the supervisor's tests) is returned as it is.
    """
    script = supernode_cmd[0]
    if os.path.basename(script) != "flower-supernode":
        return list(supernode_cmd)
    if os.sep not in script:  # the script beside this interpreter (a virtual environment's bin), else on PATH
        beside = Path(sys.executable).parent / script
        if beside.is_file():
            script = str(beside)
        else:
            import shutil

            script = shutil.which(script) or script
    return [sys.executable, "-m", "hospitrust.supervision.supernode_main", script, *supernode_cmd[1:]]


if __name__ == "__main__":
    main()

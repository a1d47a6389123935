"""The SuperLink's ServerApp launcher: Flower's SuperExec for ServerApps, forking each from a warm parent.

``flower-superlink`` (subprocess isolation, Flower's default) starts ``flower-superexec``, which starts a fresh
``flwr-serverapp`` process for every run: about 6 CPU seconds of imports (torch, numpy, scikit-learn's metrics, Flower's
runtime; ``benchmarks/serverapp_start.py``) before the run's first message, on the machine that also serves every
hospital. ``hospitrust deploy superlink`` runs the SuperLink
with ``--isolation process`` instead, and this process beside it: it imports those libraries once, then asks the
SuperLink's Runtime API for ServerApp tasks and runs each in a child ``os.fork()``-ed from it, Flower's own
``run_serverapp`` with the task's token, as ``flwr-serverapp`` would. Each run still gets its own process (a run never
sees another run's state); hospitrust itself is not preloaded: the child imports it from the run's app bundle.

The SuperLink hands a task out only to a caller holding the secret ``deploy superlink`` makes at its start
(``--superexec-auth-secret-file``, :mod:`hospitrust.supervision.runtime_secret`): with Flower's own launcher (subprocess
isolation) Flower ignores that secret, and any account on the SuperLink's machine could take a pending run's token
from the local port and act as its ServerApp.

A child ends with this process (Flower's parent check, as ``flwr-serverapp --parent-pid``); the wrapper restarts this
process when it exits, and the run supervisor (``hospitrust deploy run``) resubmits a run whose ServerApp died.

It prints one JSON line per child on stdout (``ready``, ``started``, ``exited`` with exit code or signal and seconds).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from hospitrust.supervision.launcher import emit, preload

#: Imported once by the parent and shared with every forked ServerApp.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch.utils.data", "pydantic", "sklearn.metrics",
           "flwr.app", "flwr.serverapp", "flwr.supercore.logger", "flwr.superlink.runtime.run_serverapp")
POLL_SECONDS = 0.25  # Flower's SuperExec polls every FLWR_SUPEREXEC_TASK_POLL_INTERVAL (1 s by default)


def _child(runtime_api_address: str, token: str, certificates: bytes) -> None:
    """In the forked child: run one ServerApp task with Flower's own runtime; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for name in [m for m in sys.modules if m == "hospitrust" or m.startswith("hospitrust.")]:
            del sys.modules[name]  # the launcher's own modules: the ServerApp imports hospitrust from the app bundle
        threads = os.environ.get("OMP_NUM_THREADS", "")
        import torch

        torch.set_num_threads(int(threads) if threads.isdigit() else (os.cpu_count() or 1))
        from queue import Queue

        from flwr.supercore.logger import mirror_output_to_queue, restore_output
        from flwr.superlink.runtime import run_serverapp

        log_queue: Queue[str | None] = Queue()  # what `flwr log` shows: the ServerApp's output, as flwr-serverapp sends it
        mirror_output_to_queue(log_queue)
        run_serverapp(runtime_api_address=runtime_api_address, log_queue=log_queue, token=token, insecure=False,
                      certificates=certificates, parent_pid=os.getppid(), runtime_dependency_install=False)
        restore_output()
    except SystemExit as exc:  # Flower's exit path
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it, then leave without running the parent's handlers
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(children: dict[int, tuple[int, float]]) -> None:
    """Reap the children that exited; one ``exited`` line each."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        run_id, started = children.pop(pid, (None, time.monotonic()))
        ended = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit_code": os.waitstatus_to_exitcode(status)})
        emit("exited", pid=pid, run_id=run_id, seconds=round(time.monotonic() - started, 3), **ended)


def run(runtime_api_address: str, *, root_certificates: Path, secret_file: Path | None, poll: float = POLL_SECONDS,
        parent_pid: int | None = None) -> None:
    """Ask the SuperLink for ServerApp tasks and fork one child per task, until stopped."""
    certificates = Path(root_certificates).read_bytes()
    seconds = preload(PRELOAD)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret_file is not None:  # the SuperLink hands tasks out only to the holder of this secret (runtime_secret)
        from hospitrust.supervision import runtime_secret

        interceptors.append(runtime_secret.interceptor(secret_file))
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=False, root_certificates=certificates, interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )
    emit("ready", preload_seconds=round(seconds, 3), runtime_api=runtime_api_address, pid=os.getpid(), kind="serverapp")
    children: dict[int, tuple[int, float]] = {}  # pid -> (run id, start)

    def stop(signum, frame):  # a run's ServerApp goes with its launcher, as with Flower's (its parent check)
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        client.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        _reap(children)
        res = client.AcquireTask(AcquireTaskRequest(supported_task_types={TaskType.SERVER_APP}))
        if res.HasField("task") and res.token:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(runtime_api_address, res.token, certificates)
            children[pid] = (int(res.task.run_id), time.monotonic())
            emit("started", pid=pid, task_id=int(res.task.task_id), run_id=int(res.task.run_id))
            continue  # another run may be waiting: ask again at once
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    """``python -m hospitrust.supervision.serverapp_launcher --runtime-api-address HOST:PORT --root-certificates CA``."""
    parser = argparse.ArgumentParser(description="Launch a SuperLink's ServerApps by forking a preloaded process.")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperLink's Runtime API (its --host:--port)")
    parser.add_argument("--root-certificates", required=True, type=Path, metavar="CA",
                        help="the CA certificate the SuperLink's TLS certificate is signed by")
    parser.add_argument("--superexec-auth-secret-file", type=Path, metavar="FILE",
                        help="the secret the SuperLink asks of whoever acquires a task (its own option of that name)")
    parser.add_argument("--poll", type=float, default=POLL_SECONDS, help="seconds between task polls")
    parser.add_argument("--parent-pid", type=int, help="exit when this process exits")
    args = parser.parse_args(argv)
    if not args.root_certificates.is_file():
        print(f"hospitrust serverapp launcher: --root-certificates {args.root_certificates} not found", file=sys.stderr)
        return 2
    run(args.runtime_api_address, root_certificates=args.root_certificates, secret_file=args.superexec_auth_secret_file,
        poll=args.poll, parent_pid=args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())

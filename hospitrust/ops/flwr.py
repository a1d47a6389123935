"""The one place that starts and stops Flower processes and calls the ``flwr`` CLI.

``hospitrust simulate``, ``hospitrust deploy``, the benchmark backends and the tests all
start ``flower-superlink`` / ``flower-supernode`` here. Every process is started in a
session of its own and tracked: ``stop`` ends it together with everything it started
(Flower's SuperLink detaches its SuperExec into another session, and the SuperExec starts
``flwr-serverapp`` / ``flwr-clientapp`` processes, so a process group alone is not enough),
and at interpreter exit, or on SIGTERM / SIGINT once ``stop_on_signals`` is installed,
every tracked process still alive is stopped. An interrupted test run or command leaves no
Flower process behind.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import psutil

COMPLETED = "finished:completed"
# An installed (non-editable) hospitrust carries its Flower app here: the project's pyproject.toml
# and task files, put there by the wheel build ([tool.hatch.build.targets.wheel.force-include]).
PACKAGED_APP = Path(__file__).resolve().parent.parent / "_app"
_TRACKED: dict[int, "FlowerProcess"] = {}
_LOCK = threading.Lock()


class FlowerProcessError(RuntimeError):
    """A Flower process did not start, did not become healthy, or a ``flwr`` command failed."""


def flower_env(flwr_home: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Flower processes: this interpreter's bin first on PATH (flwr starts
    ``flower-superlink`` by name), no telemetry, no update check, no runtime ``uv sync``.
    """
    env = dict(os.environ)
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    env.update(
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        RAY_DEDUP_LOGS="0",
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FlowerProcess:
    """A process started in its own session, its output in ``log_file``, stopped with its descendants."""

    def __init__(self, name: str, cmd: Sequence[str], *, env: dict[str, str], cwd: Path, log_file: Path) -> None:
        self.name, self.cmd, self.log_file = name, list(cmd), Path(log_file)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_file, "wb", buffering=0)  # noqa: SIM115 - closed by the copier at the process's end
        try:
            self.popen = subprocess.Popen(self.cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        except FileNotFoundError:
            fh.close()
            raise FlowerProcessError(f"{self.cmd[0]} not found on PATH (pip install 'flwr>=1.42,<2')") from None
        # Flower's console handler always colours its level names: the file gets the lines without the codes
        threading.Thread(target=_copy_plain, args=(self.popen.stdout, fh), daemon=True,
                         name=f"log {name}").start()
        with _LOCK:
            _TRACKED[self.popen.pid] = self

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """End the process and every process it started (also those in other sessions)."""
        stop_tree(self.popen.pid, sig=sig, timeout=timeout)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_tree(self.popen.pid, sig=signal.SIGKILL, timeout=5)
            self.popen.wait(timeout=10)
        with _LOCK:
            _TRACKED.pop(self.popen.pid, None)


_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


def _copy_plain(stream, fh) -> None:
    """Copy a process's output to its log file line by line, without ANSI colour codes."""
    try:
        for line in iter(stream.readline, b""):
            fh.write(_ANSI.sub(b"", line))
    finally:
        fh.close()


def _wait_then_kill(procs: list[psutil.Process], timeout: float) -> None:
    """Wait up to ``timeout`` for ``procs`` to end; SIGKILL whichever are still alive."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def stop_tree(pid: int, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Signal ``pid`` and all its descendants (found before any of them exits, so orphans are
    not missed), then SIGKILL whatever is still alive after ``timeout``.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    _wait_then_kill(procs, timeout)


def stop_all() -> None:
    """Stop every tracked process that is still alive (atexit, signals, test teardown)."""
    with _LOCK:
        procs = list(_TRACKED.values())
    for proc in procs:
        try:
            proc.stop(timeout=10)
        except Exception:  # keep stopping the others
            pass


atexit.register(stop_all)


def stop_descendants(timeout: float = 10.0) -> None:
    """Stop every process this one started, directly or not, tracked or not."""
    try:
        children = psutil.Process().children(recursive=False)
    except psutil.NoSuchProcess:
        return
    for child in children:
        stop_tree(child.pid, timeout=timeout)


# the descendants a signal handler signalled without waiting for them (``stop_on_signals(wait=False)``)
_SIGNALLED: list[psutil.Process] = []


def signal_descendants(sig: int = signal.SIGTERM) -> list[psutil.Process]:
    """Send ``sig`` to every process this one started, directly or not (all found before any exits); returns them."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


def reap_signalled(timeout: float = 10.0) -> None:
    """Wait up to ``timeout`` for the processes a handler signalled without waiting; SIGKILL what is left."""
    procs, _SIGNALLED[:] = list(_SIGNALLED), []
    _wait_then_kill(procs, timeout)


atexit.register(reap_signalled)


def stop_on_signals(*, wait: bool = True) -> None:
    """On SIGTERM, stop every tracked Flower process and every other process this one started,
    then raise KeyboardInterrupt so the caller's own cleanup (pytest's teardown, ``finally``
    blocks) runs too. Ctrl-C (SIGINT) already raises KeyboardInterrupt; the tracked processes
    are then stopped by their owners' ``finally`` blocks and at exit.

    ``wait=False``: the handler signals the descendants and returns at once; they are waited for (and killed
    after 10 s) by ``reap_signalled``, at exit or sooner. For a process whose children answer it while they
    stop, as pytest-xdist's workers answer their controller: a controller waiting in its handler would not
    hear them, and each worker would hang until it is killed.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup below must not be interrupted
        stop_all()
        if wait:
            stop_descendants()
        else:
            _SIGNALLED.extend(signal_descendants(signal.SIGTERM))
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def start(name: str, cmd: Sequence[str], *, env: dict[str, str], cwd: Path, log_file: Path) -> FlowerProcess:
    """Start a tracked Flower process."""
    return FlowerProcess(name, cmd, env=env, cwd=cwd, log_file=log_file)


def simulation_superlink_command(port: int) -> list[str]:
    """A SuperLink in simulation mode on 127.0.0.1 (no TLS: it is reached from this machine only)."""
    return ["flower-superlink", "--insecure", "--simulation", "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation"]


def write_local_connection(flwr_home: Path, name: str, port: int) -> Path:
    """``$FLWR_HOME/config.toml`` with one insecure connection ``name`` to 127.0.0.1:port (the default)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    return path


class Watched(Protocol):
    """What ``wait_healthy`` watches while it waits: a ``FlowerProcess``, or a plain Popen with a name."""

    name: str
    popen: subprocess.Popen

    def alive(self) -> bool: ...

    def log_tail(self, chars: int = 3000) -> str: ...


def wait_healthy(address: str, *, ca: Path | None = None, timeout: float = 60.0, proc: Watched | None = None) -> None:
    """Until ``http(s)://ADDRESS/health`` answers 200 (verified against ``ca`` when given), or raise."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    scheme = "https" if ca else "http"
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise FlowerProcessError(f"{proc.name} exited with code {proc.popen.returncode} before {address} was "
                                     f"healthy:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(f"{scheme}://{address}/health", timeout=3, context=context) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise FlowerProcessError(f"{address} did not answer /health within {timeout:.0f} s ({last})")


def flwr_cli(args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """``flwr ARGS``, output captured."""
    try:
        return subprocess.run(["flwr", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise FlowerProcessError("flwr not found on PATH (pip install 'flwr>=1.42,<2')") from None


def stage_app(app: Path, into: Path) -> Path:
    """A copy of the app's files that its ``.gitignore`` does not exclude, in ``into/<app's name>``.

    ``flwr run`` walks and resolves every file under the app directory before it applies the
    ``.gitignore``: in a clone with its ``.venv`` and ``runs/`` inside that took 3.8 s of the
    4.4 s of building the bundle (63,000 files). Walking here prunes the ignored folders; Flower
    then applies its own include rules to the copy, so the bundle holds the same files.
    """
    import pathspec  # Flower's own dependency, used for the same patterns

    app = app.resolve()
    gitignore = app / ".gitignore"
    lines = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.is_file() else []
    with warnings.catch_warnings():  # Flower builds its spec with the same (deprecated) pattern kind
        warnings.simplefilter("ignore", DeprecationWarning)
        spec = pathspec.PathSpec.from_lines("gitwildmatch", [ln.strip() for ln in lines
                                                             if ln.strip() and not ln.strip().startswith("#")])
    stage = into / app.name
    if stage.exists():
        shutil.rmtree(stage)
    for dirpath, dirnames, filenames in os.walk(app, followlinks=False):
        rel = Path(dirpath).relative_to(app)
        # prune in place: ignored folders, git's own, and symlinked folders (Flower skips those too)
        dirnames[:] = [d for d in dirnames if d != ".git" and not (Path(dirpath) / d).is_symlink()
                       and not spec.match_file((rel / d).as_posix() + "/")]
        for name in filenames:
            src = Path(dirpath) / name
            if src.is_symlink() or spec.match_file((rel / name).as_posix()):
                continue
            dst = stage / rel / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    if app == PACKAGED_APP.resolve():  # the installed package's app: the bundle needs the package's source beside it
        package = Path(__file__).resolve().parent.parent
        shutil.copytree(package, stage / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_app"))
    return stage


def submit_run(app: Path, connection: str, *, run_config: str, env: Mapping[str, str], cwd: Path,
               federation_config: str | None = None) -> int:
    """What ``flwr run APP CONNECTION --run-config RUN_CONFIG [--federation-config ...]`` does, in this process:
    the app staged in ``cwd`` (``stage_app``), then ``start_run``. The run id, or FlowerProcessError with what
    Flower or the SuperLink said.
    """
    return start_run(stage_app(app, Path(cwd) / "app-stage"), connection, run_config=run_config, env=env,
                     federation_config=federation_config)


def start_run(staged: Path, connection: str, *, run_config: str, env: Mapping[str, str] | None = None,
              federation_config: str | None = None) -> int:
    """``flwr run STAGED CONNECTION ...`` for an app folder already staged (``stage_app``), in this process: the
    bundle built by Flower's own builder, then Flower's StartRun through ``control_client`` (the same connection,
    certificates and credentials). A ``flwr run`` process costs about a CPU second on a 2-core machine; every
    simulation, grid cell and supervised attempt submits one.
    """
    import hashlib

    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.config_utils import load_and_validate
    from flwr.cli.run.run import _parse_federation_config_overrides
    from flwr.common.config import parse_config_args
    from flwr.common.serde import fab_to_proto, user_config_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.supercore.fab import Fab

    try:
        # the app's configuration as `flwr run` validates it, without importing its modules into this process (an
        # app's ServerApp names a module of its own; the ServerApp process imports it, and says so if it is wrong)
        load_and_validate(staged / "pyproject.toml", check_module=False)
        fab_bytes = build_fab_from_disk(staged)
        with control_client(connection, env) as client:
            request = StartRunRequest(
                fab=fab_to_proto(Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})),
                override_config=user_config_to_proto(parse_config_args([run_config])),
                federation=client.superlink_connection.federation or "",
                override_federation_config=_parse_federation_config_overrides(
                    [federation_config] if federation_config else None, client.superlink_connection),
                app_spec="")
            res = client.StartRun(request)
    except Exception as exc:  # a bad app or config, a refused or unreachable SuperLink: said, not raised raw
        raise FlowerProcessError(f"flwr run did not start the run: {_control_error(exc)}") from None
    if not res.HasField("run_id"):
        raise FlowerProcessError(f"flwr run did not start the run: the SuperLink gave no run id ({res})")
    return int(res.run_id)


_CONTROL_LOCK = threading.Lock()  # Flower's CLI code reads $FLWR_HOME from os.environ: one reader at a time


@contextmanager
def control_client(connection: str, env: Mapping[str, str] | None = None) -> Iterator[Any]:
    """Flower's own Control API client for ``connection``, in this process: what ``flwr ls`` and ``flwr supernode
    list`` use, read from ``$FLWR_HOME/config.toml`` (``env``'s, else this process's) with the same certificates,
    credentials and interceptors. A ``flwr`` process costs about a CPU second to start on a 2-core machine (the
    run supervisor, the grids' backends and the tests poll run statuses every few seconds); a call here costs a few
    milliseconds. Built as ``flwr.cli.utils.init_http_client_from_connection`` builds it, without its banner line.
    """
    from flwr.cli.cli_account_auth_interceptor import CliAccountAuthHttpInterceptor
    from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
    from flwr.cli.config_utils import load_certificate_in_connection
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.local_superlink import ensure_local_superlink
    from flwr.cli.utils import load_cli_auth_plugin_from_connection
    from flwr.proto.control_pb2 import RefreshAuthTokensRequest
    from flwr.supercore.auth.typing import AccountAuthCredentials
    from flwr.supercore.control import ControlHttpClient
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    home = (os.environ if env is None else env).get("FLWR_HOME")
    with _CONTROL_LOCK:
        saved = os.environ.get("FLWR_HOME")
        if home is not None:
            os.environ["FLWR_HOME"] = home
        try:
            found = ensure_local_superlink(read_superlink_connection(connection))
            auth_plugin = load_cli_auth_plugin_from_connection(str(found.address))
            auth_plugin.load_tokens()
            client: Any = None

            def refresh_tokens(refresh_token: str) -> AccountAuthCredentials:
                response = client.RefreshAuthTokens(RefreshAuthTokensRequest(refresh_token=refresh_token))
                return AccountAuthCredentials(access_token=response.access_token, refresh_token=response.refresh_token)

            client = ControlHttpClient.from_server_address(
                server_address=str(found.address), insecure=found.insecure,
                root_certificates=load_certificate_in_connection(found),
                interceptors=[CliClientHttpInterceptor(), RuntimeVersionHttpInterceptor(component_name="flwr CLI"),
                              CliAccountAuthHttpInterceptor(auth_plugin, refresh_tokens)])
            client.superlink_connection = found  # what StartRun's federation fields are read from
            try:
                yield client
            finally:
                client.close()
        finally:
            if saved is None:
                os.environ.pop("FLWR_HOME", None)
            else:
                os.environ["FLWR_HOME"] = saved


def run_status(run_id: int, connection: str, *, env: Mapping[str, str] | None = None,
               cwd: Path | None = None) -> tuple[str, str]:
    """(status, status details) of a run as ``flwr ls --run-id`` gives them (``control_client``: no ``flwr``
    process); ("unknown", why) if the SuperLink cannot say. ``cwd`` is kept for its callers; nothing reads it.
    """
    from flwr.cli.run_utils import format_runs
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    try:
        with control_client(connection, env) as client:
            res = client.ListRuns(ListRunsRequest(run_id=run_id))
        rows = format_runs([run_from_proto(proto) for proto in res.run_dict.values()], res.now)
    except Exception as exc:  # unreachable, refused, no such run, a broken config: the callers poll again
        return "unknown", _control_error(exc)
    if not rows:
        return "unknown", f"run {run_id} not found"
    return str(rows[0].status_text), str(rows[0].details)


def _control_error(exc: Exception) -> str:
    """What the SuperLink (or the connection) said, for a status the callers show."""
    response = getattr(exc, "response", None)
    text = f"{response.status_code} {response.text}" if response is not None else f"{type(exc).__name__}: {exc}"
    return text[-2000:]


def wait_for_run(run_id: int, connection: str, timeout: float, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, poll: float = 2.0) -> tuple[str, str]:
    """Poll the run's status until it has finished; ("timeout", ...) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    status, details = "unknown", ""
    while time.monotonic() < deadline:
        status, details = run_status(run_id, connection, env=env, cwd=cwd)
        if status.startswith("finished"):
            return status, details
        time.sleep(poll)
    return "timeout", f"still {status} after {timeout:.0f} s"


def stop_run(run_id: int, connection: str, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    flwr_cli(["stop", str(run_id), connection], env=env, cwd=cwd)


def online_nodes(connection: str, *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[dict]:
    """The SuperNodes the SuperLink lists as online, as ``flwr supernode list --format json`` gives them
    (``control_client``: no ``flwr`` process); none if the SuperLink cannot say.
    """
    from flwr.proto.control_pb2 import ListNodesRequest

    try:
        with control_client(connection, env) as client:
            res = client.ListNodes(ListNodesRequest())
    except Exception:  # the callers count online nodes and ask again
        return []
    return [{"node-id": str(n.node_id), "owner-name": n.owner_name, "status": n.status}
            for n in res.nodes_info if n.status == "online"]

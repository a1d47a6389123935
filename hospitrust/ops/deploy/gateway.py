"""The locked-down SuperLink: nginx in front of ``flower-superlink``, and the operator's local tunnel.

Flower 1.42's SuperLink serves the Fleet API (SuperNodes), the Control API (``flwr``: run, stop,
ls, log, supernode register) and the Runtime API (its own ServerApps) on one HTTP(S) port, and the
open-source Control API has no authentication. So the SuperLink listens on 127.0.0.1 only, and
nginx publishes what each party may reach:

- **the hospitals' listener** (``--host``/``--port``, e.g. 0.0.0.0:9093): ``POST`` to exactly the
  Fleet API paths a SuperNode calls, and ``GET /health``; everything else is refused (403);
- **the operator's listener** (``--operator-host``/``--operator-port``, loopback by default):
  the Control API (and ``GET /health``), only for a client certificate the consortium CA issued to
  an operator (mutual TLS, ``OU=hospitrust-operators``);
- **the Runtime API** is never published: the SuperLink's own ServerApp processes reach it on 127.0.0.1.

``flwr`` 1.42 cannot present a client certificate, so the operator runs a **tunnel** on their own
machine: nginx listening on 127.0.0.1 with the operator's certificate (which the consortium CA
issued for 127.0.0.1 too), forwarding to the operator's listener with the same certificate as its
client credential. ``flwr``'s connection points at the tunnel, with ``root-certificates``.

Why nginx: it is what a hospital's or a consortium's IT department most often already runs and
audits; Debian packages it; one configuration does TLS, mutual TLS, per-path and per-method rules
and streaming. (stunnel cannot filter paths; haproxy could, but is less often at hand.)
"""

from __future__ import annotations

import ctypes
import getpass
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from hospitrust.errors import DeployError
from hospitrust.pki.certificates import OPERATOR_DN_PATTERN, OPERATOR_OU

# Every path Flower 1.42's SuperNode calls (flwr/supernode/fleet_http_client.py; the SuperLink's fleet
# router has the same twelve: tests/test_gateway.py checks both against the installed flwr)
FLEET_PATHS = (
    "register-node", "activate-node", "deactivate-node", "unregister-node", "send-node-heartbeat", "pull-messages",
    "push-messages", "get-run", "get-fab", "push-object", "pull-object", "confirm-message-received",
)
DEFAULT_OPERATOR_PORT = 9095
DEFAULT_SUPERLINK_PORT = 9092  # the SuperLink's own port, on 127.0.0.1 only
DEFAULT_TUNNEL_PORT = 9096
# Flower sends arrays in 5 MB chunks and bundles up to 10 MB; nginx's default body limit (1 MB) would answer 413
MAX_BODY = "64m"
#: a request target in canonical form: "/" or "/seg/seg...", each segment letters, digits, "_", "-" and (not first) ".";
#: no "//", "/./", "/../", trailing "/", %-escape or query. Anything else is refused (400) before a location matches.
CANONICAL_TARGET = r"^(/|(/[A-Za-z0-9_-][A-Za-z0-9._-]*)+)$"
SUPERLINK_NAME = "localhost"  # the name the gateway checks the SuperLink's certificate for (server-cert adds it)


DEFAULT_CONNECTIONS = 512


@dataclass(frozen=True)
class GatewayLayout:
    """Where each listener is. ``superlink_port`` is on 127.0.0.1 and never published."""

    host: str = "0.0.0.0"
    port: int = 9093
    operator_host: str = "127.0.0.1"
    operator_port: int = DEFAULT_OPERATOR_PORT
    superlink_port: int = DEFAULT_SUPERLINK_PORT
    # nginx's worker_connections: each connected hospital holds about five (its SuperNode's connections to the
    # gateway and the gateway's to flower-superlink), so 512 serves about 100 hospitals (benchmarks/load.py)
    connections: int = DEFAULT_CONNECTIONS

    def check(self) -> None:
        if not 64 <= self.connections <= 65536:
            raise DeployError(f"--gateway-connections {self.connections}: expected 64 to 65536 (about 5 per hospital)")
        ports = {"--port": self.port, "--operator-port": self.operator_port, "--superlink-port": self.superlink_port}
        for flag, port in ports.items():
            if not 0 < port < 65536:
                raise DeployError(f"{flag} {port}: expected a TCP port between 1 and 65535")
        if len(set(ports.values())) < len(ports):
            raise DeployError(f"--port, --operator-port and --superlink-port must differ (got {ports})")


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _q(path: Path | str) -> str:
    """A path as an nginx string (quoted: nginx splits on spaces)."""
    text = str(path)
    if '"' in text or "\n" in text:
        raise DeployError(f"{text!r}: nginx cannot take a path with a double quote or a new line")
    return f'"{text}"'


def _common(state: Path, connections: int = DEFAULT_CONNECTIONS) -> str:
    """The top of an nginx.conf run in the foreground by an unprivileged service user (or root in a test)."""
    user = f"user {getpass.getuser()};\n" if os.geteuid() == 0 else ""  # as root, workers would be 'nobody'
    tmp = state / "tmp"
    temps = "\n".join(f"    {kind}_temp_path {_q(tmp / kind)};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""# generated by hospitrust deploy: edit the command's options, not this file
{user}worker_processes 1;
pid {_q(state / "nginx.pid")};
error_log stderr warn;
events {{ worker_connections {connections}; }}

http {{
    server_tokens off;
    access_log {_q(state / "access.log")};
{temps}
    client_max_body_size {MAX_BODY};
    client_body_buffer_size 1m;
    ssl_protocols TLSv1.2 TLSv1.3;
"""


def _q_regex(pattern: str) -> str:
    """A regular expression as an nginx double-quoted string (nginx reads a backslash pair as one backslash)."""
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


def _upstream_tls(ca: Path, name: str) -> str:
    return f"""            proxy_ssl_trusted_certificate {_q(ca)};
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_name {name};
            proxy_ssl_server_name on;
            proxy_http_version 1.1;
            proxy_set_header Connection "";"""


def gateway_config(layout: GatewayLayout, *, ca: Path, cert: Path, key: Path, state: Path) -> str:
    """nginx.conf of the SuperLink machine's gateway (see the module docstring)."""
    layout.check()
    ca, cert, key, state = (Path(p).expanduser().resolve() for p in (ca, cert, key, state))
    upstream = f"https://127.0.0.1:{layout.superlink_port}"
    tls = _upstream_tls(ca, SUPERLINK_NAME)
    fleet = "|".join(FLEET_PATHS)
    return _common(state, layout.connections) + f"""
    # the hospitals' listener: the Fleet API a SuperNode calls, and the health check; nothing else
    server {{
        listen {_listen(layout.host, layout.port)} ssl;
        ssl_certificate {_q(cert)};
        ssl_certificate_key {_q(key)};
        # nginx matches locations on the normalised path but forwards the request line as sent: anything but the
        # canonical form (//, /./, %-escapes, %0a, a query) is refused, so the SuperLink sees only what matched
        if ($request_uri !~ "{CANONICAL_TARGET}") {{ return 400; }}
        location ~ ^/v1/fleet/({fleet})$ {{
            limit_except POST {{ deny all; }}
            proxy_pass {upstream};
{tls}
        }}
        location = /health {{
            limit_except GET {{ deny all; }}
            proxy_pass {upstream};
{tls}
        }}
        location / {{ return 403; }}
    }}

    # the operator's listener: the Control API, for a client certificate the consortium CA issued to an operator
    server {{
        listen {_listen(layout.operator_host, layout.operator_port)} ssl;
        ssl_certificate {_q(cert)};
        ssl_certificate_key {_q(key)};
        ssl_client_certificate {_q(ca)};
        ssl_verify_client on;
        ssl_verify_depth 1;
        # the CA also signs the SuperLink's own certificate: only an operator's (OU={OPERATOR_OU}) opens the Control API;
        # the subject is matched attribute by attribute (an escaped ',' inside a CN is not a separator)
        if ($ssl_client_s_dn !~ "{_q_regex(OPERATOR_DN_PATTERN)}") {{ return 403; }}
        if ($request_uri !~ "{CANONICAL_TARGET}") {{ return 400; }}  # canonical request targets only (above)
        location /v1/control/ {{
            limit_except POST {{ deny all; }}
            proxy_pass {upstream};
{tls}
            # flwr log --stream and the run events stream: pass bytes on as they come
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
        }}
        location = /health {{
            limit_except GET {{ deny all; }}
            proxy_pass {upstream};
{tls}
        }}
        location / {{ return 403; }}
    }}
}}
"""


def tunnel_config(*, remote: str, remote_name: str, ca: Path, cert: Path, key: Path, port: int, state: Path) -> str:
    """nginx.conf of the operator's local tunnel: 127.0.0.1:PORT (TLS, the operator's certificate as the server's)
    -> the SuperLink machine's operator listener ``remote`` (mutual TLS with the same certificate).
    """
    ca, cert, key, state = (Path(p).expanduser().resolve() for p in (ca, cert, key, state))
    return _common(state) + f"""
    # flwr connects here (root-certificates = the consortium CA); only this machine can reach it
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {_q(cert)};
        ssl_certificate_key {_q(key)};
        location / {{
            proxy_pass https://{remote};
            proxy_ssl_certificate {_q(cert)};
            proxy_ssl_certificate_key {_q(key)};
{_upstream_tls(ca, remote_name)}
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if not found:
        raise DeployError("nginx not found: install it (Debian/Ubuntu: sudo apt-get install nginx), or run "
                          "`hospitrust deploy superlink --gateway none` behind your own proxy (docs/deployment.md)")
    return found


def write_nginx_config(text: str, state: Path) -> Path:
    """Write ``state/nginx.conf`` (0600: it names the key files), with the temp folders nginx needs, then
    ``nginx -t`` it so that a bad option is reported before anything starts.
    """
    state = Path(state).expanduser().resolve()
    for sub in ("", "tmp"):
        (state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    access_log = state / "access.log"  # nginx opens it 0644 when it makes it; it names hospitals' addresses
    os.close(os.open(access_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    access_log.chmod(0o600)
    conf = state / "nginx.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    res = subprocess.run([nginx_binary(), "-t", "-q", "-e", "stderr", "-p", str(state), "-c", str(conf)], capture_output=True, text=True)
    if res.returncode != 0:
        raise DeployError(f"nginx refused the generated configuration {conf}:\n{(res.stderr or res.stdout).strip()}")
    return conf


def nginx_command(conf: Path) -> list[str]:
    return [nginx_binary(), "-e", "stderr", "-p", str(Path(conf).parent), "-c", str(conf), "-g", "daemon off;"]


@dataclass
class Child:
    """One process ``run_together`` keeps running.

    ``ready``: called after it starts and before the next one does (e.g. wait for the SuperLink's health
    before nginx forwards to it); it gets the Popen and raises if it is not ready. Only on the first start.
    ``ports``: (host, port) it listens on; before each start they must be free. ``mine``: a string (a path of
    this wrapper's database or configuration) that marks a process holding one of those ports as a stale copy
    of this child, left by an earlier wrapper or a killed parent: it is stopped, not waited for.
    """

    name: str
    cmd: list[str]
    ready: Callable[[subprocess.Popen], None] | None = None
    ports: tuple[tuple[str, int], ...] = ()
    mine: str = ""
    #: asked every HEALTH_SECONDS while the child runs (from HEALTH_GRACE_SECONDS after its start): a reason to
    #: restart it, or None while it is well (flower-superlink whose ServerApp launcher has died)
    unwell: Callable[[subprocess.Popen], str | None] | None = None


#: how often a running child's ``unwell`` check runs, and how long after its start it is first asked
HEALTH_SECONDS = 2.0
HEALTH_GRACE_SECONDS = 10.0


def superexec_gone(proc: subprocess.Popen) -> str | None:
    """flower-superlink without its live ``flower-superexec`` (the process that launches every run's ServerApp):
    Flower does not restart it, and every run submitted after its death stays pending (issue 63: a SQLite
    "database is locked" HTTP 500 under load killed it). The reason to restart flower-superlink, or None.
    """
    try:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                if any("flower-superexec" in a for a in p.cmdline()[:2]) and p.status() != psutil.STATUS_ZOMBIE:
                    return None
            except psutil.Error:  # exited meanwhile, or a zombie's command line
                continue
    except psutil.Error:  # flower-superlink itself is gone: the exit path restarts it
        return None
    return "its ServerApp launcher (flower-superexec) is gone: no run would start"


#: seconds before restarting a child that exited: doubling from the first, up to the last
RESTART_BACKOFF = (1.0, 60.0)
#: a child up this long since its last start starts its backoff afresh
BACKOFF_RESET_SECONDS = 300.0
#: how long a port held by a process that is not ours may stay busy before the start fails
PORT_WAIT_SECONDS = 30.0
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Orphans of our children (a killed flower-superlink's ServerApps, a killed nginx master's workers, which keep
    its listening sockets) become this process's children instead of init's, so they can be stopped before a restart.
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _holders(host: str, port: int) -> list[psutil.Process]:
    """The processes listening on ``port`` (on ``host`` or on every address) that this user can see."""
    out: list[psutil.Process] = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return out
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid \
                and c.laddr.ip in (host, "0.0.0.0", "::", "::ffff:" + host):
            try:
                out.append(psutil.Process(c.pid))
            except psutil.Error:
                pass
    return out


def free_ports(child: Child, *, timeout: float = PORT_WAIT_SECONDS) -> None:
    """Make sure ``child``'s ports can be listened on: stop stale copies of it (their command line holds
    ``child.mine``, with their descendants), and wait up to ``timeout`` for anything else to let go.
    DeployError naming the holder when a port stays busy.
    """
    from hospitrust.ops.flwr import stop_tree
    port_in_use = __import__("importlib").import_module("hospitrust.supervision.supervisor").port_in_use  # TODO(issue 48): move below ops

    deadline = time.monotonic() + timeout
    for host, port in child.ports:
        while (busy := port_in_use(host, port)) is not None:
            for proc in _holders(host, port):
                try:
                    stale = bool(child.mine) and any(child.mine in arg for arg in proc.cmdline())
                except psutil.Error:
                    continue
                if stale:
                    # an nginx worker's command line is "nginx: worker process": its master's holds the path
                    print(f"hospitrust deploy: stopping a stale {child.name} (pid {proc.pid}) that holds port {port}",
                          file=sys.stderr, flush=True)
                    stop_tree(proc.pid, sig=signal.SIGTERM, timeout=10)
            if time.monotonic() > deadline:
                raise DeployError(f"cannot start {child.name}: {busy}")
            time.sleep(0.5)


def stop_group(pgid: int, timeout: float = 10.0, keep: frozenset[int] = frozenset()) -> None:
    """SIGTERM to process group ``pgid`` (a child started in a session of its own, whose leader may be gone), then
    SIGKILL to what is left after ``timeout``. A group id is not reused while the group has members.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            _reap_adopted(keep)  # members that became our zombies leave the group only once reaped
            time.sleep(0.1)


def _reap_adopted(keep: set[int] | frozenset[int]) -> list[psutil.Process]:
    """Children of this process that it did not start (orphans adopted as a subreaper): zombies reaped, the live
    ones returned.
    """
    alive = []
    for proc in psutil.Process().children():
        if proc.pid in keep:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(proc.pid, os.WNOHANG)
            else:
                alive.append(proc)
        except (psutil.Error, ChildProcessError):
            pass
    return alive


def rotate_log(path: Path, *, max_bytes: int, keep: int, reopen: Callable[[], None]) -> bool:
    """When ``path`` is at least ``max_bytes``: shift ``path.1`` .. ``path.KEEP-1`` up one (the oldest dropped),
    rename ``path`` to ``path.1``, create a new empty ``path`` (mode 0600) and call ``reopen`` (SIGUSR1 to the nginx
    master, which then appends to the new file). Returns whether it rotated.
    """
    try:
        if path.stat().st_size < max_bytes:
            return False
    except FileNotFoundError:
        return False
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
    if keep >= 1:
        os.replace(path, path.with_name(f"{path.name}.1"))
    else:
        path.unlink()
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    reopen()
    return True


def run_together(commands: Sequence[Child | tuple[str, list[str]]], *, restart: bool = False,
                 tick: Callable[[dict[str, subprocess.Popen]], None] | None = None) -> int:
    """Start each command (in a session of its own, output to this process's, with the parent-death signal so a
    SIGKILLed wrapper leaves none of them running) and stay until a signal comes: then stop them all (with their
    descendants, and any orphans they left) and return 0.

    ``restart=False``: when one exits, stop the others and return its exit code. ``restart=True``: a child that
    exits is restarted (what it left running stopped, its ports freed) after a backoff doubling from
    ``RESTART_BACKOFF[0]`` to ``[1]``. Either way a first start that fails (its ``ready`` raises, a port held by
    another program) ends the wrapper with that error: a bad certificate is said once, not retried in a loop.
    ``tick``, when given, is called with the running processes by name twice a second (log rotation).
    """
    from hospitrust.ops.flwr import stop_tree
    die_with_parent = __import__("importlib").import_module("hospitrust.supervision.supervisor").die_with_parent  # TODO(issue 48)

    children = [c if isinstance(c, Child) else Child(c[0], list(c[1])) for c in commands]
    procs: dict[str, subprocess.Popen] = {}
    stopping: list[int] = []
    _become_subreaper()

    def on_signal(signum, frame):
        stopping.append(signum)

    def start(child: Child) -> subprocess.Popen:
        free_ports(child)
        print(f"$ {' '.join(child.cmd)}", flush=True)
        procs[child.name] = subprocess.Popen(child.cmd, start_new_session=True, preexec_fn=die_with_parent)
        return procs[child.name]

    def stop_adopted() -> None:
        for orphan in _reap_adopted({p.pid for p in procs.values()}):
            print(f"hospitrust deploy: stopping an orphan left by a child (pid {orphan.pid})", file=sys.stderr, flush=True)
            stop_tree(orphan.pid, sig=signal.SIGTERM, timeout=10)
            _reap_adopted({p.pid for p in procs.values()})

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    started: dict[str, float] = {}
    backoff: dict[str, float] = {}
    try:
        for child in children:
            if stopping:
                return 0
            proc = start(child)
            if child.ready is not None:
                child.ready(proc)
            started[child.name] = time.monotonic()
        checked = time.monotonic()
        while not stopping:
            check = time.monotonic() - checked >= HEALTH_SECONDS
            if check:
                checked = time.monotonic()
            for child in children:
                proc = procs[child.name]
                if proc.poll() is None:
                    reason = (child.unwell(proc) if check and restart and child.unwell is not None
                              and time.monotonic() - started[child.name] >= HEALTH_GRACE_SECONDS else None)
                    if reason is None:
                        continue
                    print(f"hospitrust deploy: {child.name}: {reason}; restarting it", file=sys.stderr, flush=True)
                    stop_tree(proc.pid, sig=signal.SIGTERM, timeout=15)
                    proc.wait()
                if not restart:
                    print(f"hospitrust deploy: {child.name} exited with code {proc.returncode}; stopping the others",
                          file=sys.stderr, flush=True)
                    return proc.returncode or 1
                up = time.monotonic() - started[child.name]
                delay = RESTART_BACKOFF[0] if up > BACKOFF_RESET_SECONDS else backoff.get(child.name, RESTART_BACKOFF[0])
                backoff[child.name] = min(delay * 2, RESTART_BACKOFF[1])
                print(f"hospitrust deploy: {child.name} exited with code {proc.returncode} after {up:.0f} s; "
                      f"restarting it in {delay:.0f} s", file=sys.stderr, flush=True)
                # its session: the leader is gone, what it started may be left (nginx's workers hold its ports)
                stop_group(proc.pid, keep=frozenset(p.pid for p in procs.values()))
                stop_adopted()
                until = time.monotonic() + delay
                while not stopping and time.monotonic() < until:
                    time.sleep(0.2)
                if stopping:
                    break
                try:
                    start(child)
                except DeployError as exc:  # a port still busy: the exited process stays, tried after the next backoff
                    print(f"hospitrust deploy: {exc}", file=sys.stderr, flush=True)
                started[child.name] = time.monotonic()
            else:
                stop_adopted()
                if tick is not None:
                    tick(procs)
                time.sleep(0.5)
        return 0
    finally:
        for proc in reversed(list(procs.values())):
            if proc.poll() is None:
                stop_tree(proc.pid, sig=signal.SIGTERM, timeout=15)
        for orphan in _reap_adopted(set()):
            stop_tree(orphan.pid, sig=signal.SIGTERM, timeout=15)
        _reap_adopted(set())
        for s, handler in previous.items():
            signal.signal(s, handler)

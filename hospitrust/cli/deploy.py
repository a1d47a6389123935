"""``hospitrust deploy ...`` and ``hospitrust data check``: the command-line handlers and parsers."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

from hospitrust.errors import DeployError
from hospitrust.ops.deploy.superlink import (DEFAULT_PORT, private_database, serverapp_launcher_command, superlink_command,
                                             write_connection)
from hospitrust.ops.deploy.supernode import supernode_command
from hospitrust.cli.data import share_of_files
from hospitrust.tasks.cli import add_task_arguments, task_from_args

# the layouts datasets.local reads (repeated here so that building the parser imports no numpy)
FORMATS = ("auto", "folder", "csv", "npz")


def _exec(cmd: list[str], dry_run: bool) -> int:
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    try:
        os.execvp(cmd[0], cmd)  # the Flower process replaces this one: signals and exit code are its own
    except FileNotFoundError:
        raise DeployError(f"{cmd[0]} not found on PATH (pip install 'flwr>=1.42,<2')") from None
    return 0  # pragma: no cover


#: Flower 1.42's exit code when flower-supernode could not connect to the SuperLink (ExitCode
#: SUPERNODE_CONNECTION_ERROR), among them the SuperLink refusing its activation: right after a SuperNode was killed,
#: its session counts as online until two heartbeat intervals lapse (60 s), and a new one with the same key is refused.
#: Flower logs it (``Exit Code: 305``) and the process exits with 1, like any of its errors: the line is what tells.
SUPERNODE_CONNECTION_ERROR = 305
CONNECTION_ERROR_LINE = f"Exit Code: {SUPERNODE_CONNECTION_ERROR}"
REFUSED_RETRY_SECONDS = 90.0  # as the warm launcher's supervisor (ACTIVATION_RETRY_SECONDS)
REFUSED_PAUSE_SECONDS = 5.0


def run_flower_supernode(cmd: list[str], dry_run: bool) -> int:
    """``deploy supernode --launcher flower``: Flower's SuperNode as this command's child (its output passed through),
    started again while it cannot connect (Flower's exit code 305, a refused activation among the causes), for up to
    ``REFUSED_RETRY_SECONDS``; any other exit is returned as it is. It stays in this command's process group and gets SIGTERM if this command
    dies (so a service manager's or an operator's kill of the group ends it, as when it replaced the command); SIGTERM
    to this command is passed on; what it leaves behind when it exits (its flower-superexec, which would keep trying
    a Runtime API that is gone) is reparented here (a child subreaper) and ended.
    """
    import shutil
    import subprocess
    import threading
    import time

    import psutil

    from hospitrust.supervision.supervisor import die_with_parent
    from hospitrust.supervision.tree import become_subreaper

    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    if shutil.which(cmd[0]) is None:
        raise DeployError(f"{cmd[0]} not found on PATH (pip install 'flwr>=1.42,<2')")
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum, frame):
        stopping.append(signum)
        if proc is not None and proc.poll() is None and signum != signal.SIGINT:  # a Ctrl-C reached the group
            proc.send_signal(signum)

    def end_leftovers(before: set[int]) -> None:
        left = [p for p in psutil.Process().children() if p.pid not in before]
        left += [d for p in left for d in p.children(recursive=True)]
        for p in left:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(left, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass

    try:
        become_subreaper()
    except OSError:
        pass  # not Linux: what the SuperNode leaves behind is the init system's
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    first_refusal: float | None = None
    try:
        while True:
            before = {p.pid for p in psutil.Process().children()}
            proc = subprocess.Popen(cmd, preexec_fn=die_with_parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace")
            refused = threading.Event()

            def pump(stream) -> None:
                for line in stream:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    if CONNECTION_ERROR_LINE in line:
                        refused.set()

            # a thread: what the SuperNode leaves behind holds the pipe open until it is ended
            reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
            reader.start()
            rc = proc.wait()
            end_leftovers(before)
            reader.join(timeout=5)
            if not refused.is_set() or stopping:
                return rc
            now = time.monotonic()
            first_refusal = now if first_refusal is None else first_refusal
            left = REFUSED_RETRY_SECONDS - (now - first_refusal)
            if left <= 0:
                print(f"hospitrust deploy supernode: flower-supernode could not connect for {REFUSED_RETRY_SECONDS:g} s "
                      f"(Flower's exit code {SUPERNODE_CONNECTION_ERROR}): giving up", flush=True)
                return rc
            print(f"hospitrust deploy supernode: flower-supernode could not connect (Flower's exit code "
                  f"{SUPERNODE_CONNECTION_ERROR}; right after a "
                  "SuperNode of this key was killed, the SuperLink refuses it until its old session's heartbeats "
                  f"lapse): starting it again in {REFUSED_PAUSE_SECONDS:g} s, for up to {left:.0f} s more", flush=True)
            deadline = time.monotonic() + REFUSED_PAUSE_SECONDS
            while time.monotonic() < deadline and not stopping:
                time.sleep(0.1)
            if stopping:
                return 128 + stopping[0]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def cmd_ca(args) -> int:
    from hospitrust.pki.certificates import create_ca

    cert, key = create_ca(Path(args.out), name=args.name, days=args.days, force=args.force)
    print(f"CA certificate: {cert}   (give it to the hospitals and to whoever runs `flwr`)\n"
          f"CA private key: {key}   (mode 0600; keep it offline, it signs the SuperLink's certificate)")
    return 0


def cmd_server_cert(args) -> int:
    from hospitrust.pki.certificates import create_server_cert

    ca_dir = Path(args.ca_dir)
    cert, key = create_server_cert(Path(args.ca_cert or ca_dir / "ca.crt"), Path(args.ca_key or ca_dir / "ca.key"),
                                   Path(args.out or ca_dir), args.san, days=args.days, force=args.force)
    print(f"SuperLink certificate: {cert} (SANs: {', '.join(s for x in args.san for s in x.split(',') if s)})\n"
          f"SuperLink private key: {key} (mode 0600)")
    return 0


def cmd_keygen(args) -> int:
    from hospitrust.pki.certificates import create_supernode_keys

    key, pub = create_supernode_keys(Path(args.out), args.name, force=args.force)
    print(f"private key: {key}   (mode 0600; stays on the SuperNode machine)\n"
          f"public key:  {pub}   (send this file to the federation operator to register)")
    return 0


def cmd_operator_cert(args) -> int:
    from hospitrust.pki.certificates import create_operator_cert

    ca_dir = Path(args.ca_dir)
    cert, key = create_operator_cert(Path(args.ca_cert or ca_dir / "ca.crt"), Path(args.ca_key or ca_dir / "ca.key"),
                                     Path(args.out), args.name, days=args.days, force=args.force)
    print(f"operator certificate: {cert}\noperator private key: {key} (mode 0600; give both to {args.name} only)\n"
          f"on the operator's machine: hospitrust deploy connection NAME --address SUPERLINK_HOST:OPERATOR_PORT "
          f"--ca ca.crt --operator-cert {cert.name} --operator-key {key.name}")
    return 0


def cmd_superlink(args) -> int:
    from hospitrust.ops.deploy import gateway
    from hospitrust.supervision import runtime_secret

    certs = Path(args.certs)
    ca, cert, key = (Path(p or certs / d) for p, d in ((args.ca, "ca.crt"), (args.cert, "server.pem"), (args.key, "server.key")))
    for flag, p in (("--ca", ca), ("--cert", cert), ("--key", key)):
        if not p.expanduser().is_file():
            raise DeployError(f"{flag} {p} not found (hospitrust deploy ca / server-cert make them)")
    database = Path(args.database).expanduser().resolve()
    database.parent.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        private_database(database)  # 0600, and so its -wal and -shm
    layout = gateway.GatewayLayout(host=args.host, port=args.port, operator_host=args.operator_host,
                                   operator_port=args.operator_port, superlink_port=args.superlink_port,
                                   connections=args.gateway_connections)
    layout.check()
    if args.access_log_max_mb < 0 or args.access_log_keep < 0:
        raise DeployError(f"--access-log-max-mb {args.access_log_max_mb:g} --access-log-keep {args.access_log_keep}: "
                          f"expected 0 or more")
    state = Path(args.state_dir).expanduser().resolve() if args.state_dir else database.parent / "gateway"
    conf_text = gateway.gateway_config(layout, ca=ca, cert=cert, key=key, state=state)
    warm = args.serverapp_launcher == "warm"
    # with the warm launcher, only the holder of this secret (the launcher) is handed a run's token by the SuperLink's
    # Runtime API on 127.0.0.1: not another account of this machine (a fresh secret at each start, gone at the stop)
    secret = None
    if warm:
        secret = Path("$RUNTIME_DIRECTORY/hospitrust-runtime-XXXX/superexec-secret") if args.dry_run else runtime_secret.create()
    try:
        return _run_superlink(args, ca=ca, cert=cert, key=key, database=database, state=state, conf_text=conf_text,
                              warm=warm, secret=secret)
    finally:
        if secret is not None and not args.dry_run:
            runtime_secret.remove(secret)


def _run_superlink(args, *, ca: Path, cert: Path, key: Path, database: Path, state: Path, conf_text: str, warm: bool,
                   secret: Path | None) -> int:
    from hospitrust.ops.deploy import gateway

    from hospitrust.supervision import superlink_main

    if not 0 <= args.database_busy_timeout <= 3600:
        raise DeployError(f"--database-busy-timeout {args.database_busy_timeout:g}: expected seconds from 0 to 3600")
    # Flower's flower-superlink, run under a module that gives its SQLite store the busy timeout first
    superlink = superlink_main.command(
        superlink_command(ca=ca, cert=cert, key=key, database=database, host="127.0.0.1", port=args.superlink_port,
                          log_file=Path(args.log_file) if args.log_file else None,
                          isolation="process" if warm else "subprocess", superexec_secret=secret),
        busy_timeout_ms=round(args.database_busy_timeout * 1000))
    launcher = serverapp_launcher_command(ca=ca, port=args.superlink_port, superexec_secret=secret) if warm else None
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

    def healthy(proc) -> None:  # nginx forwards, and the launcher asks for runs, only once the SuperLink answers
        from hospitrust.ops.flwr import FlowerProcessError, wait_healthy

        try:
            wait_healthy(f"127.0.0.1:{args.superlink_port}", ca=ca, timeout=120, proc=_Popened("flower-superlink", proc))
        except FlowerProcessError as exc:
            raise DeployError(str(exc)) from None

    # the wrapper restarts each child when it dies (with backoff; a stale copy holding its port is stopped first): the
    # warm ServerApp launcher on its own, flower-superlink also when Flower's own launcher (flower-superexec) has died;
    # what restarts the wrapper itself is the service manager (deploy/systemd/hospitrust-superlink.service)
    children = [gateway.Child("flower-superlink", superlink, ready=healthy, ports=(("127.0.0.1", args.superlink_port),),
                              mine=str(database), unwell=None if warm else gateway.superexec_gone)]
    if launcher is not None:
        children.append(gateway.Child("serverapp-launcher", launcher))
    if args.gateway == "none":  # the operator's own proxy: it gets the same configuration to start from
        conf = state / "nginx.conf"
        if not args.dry_run:
            state.mkdir(mode=0o700, parents=True, exist_ok=True)
            conf.write_text(conf_text)
            conf.chmod(0o600)
        print(f"the SuperLink listens on 127.0.0.1:{args.superlink_port} only; publish it with your own proxy, "
              f"as {conf} does (docs/deployment.md#your-own-proxy)", flush=True)
        if launcher is None:
            return _exec(superlink, args.dry_run)
        if args.dry_run:
            print("$ " + shlex.join(superlink))
            print("$ " + shlex.join(launcher))
            return 0
        return gateway.run_together(children, restart=True)
    if args.dry_run:
        print("$ " + shlex.join(superlink))
        if launcher is not None:
            print("$ " + shlex.join(launcher))
        print("$ " + shlex.join(gateway.nginx_command(state / "nginx.conf")))
        print(conf_text)
        return 0
    conf = gateway.write_nginx_config(conf_text, state)
    print(f"hospitals reach {args.host}:{args.port} (Fleet API and /health only); operators "
          f"{args.operator_host}:{args.operator_port} (Control API, with an operator certificate); the SuperLink "
          f"itself 127.0.0.1:{args.superlink_port}; gateway configuration {conf}", flush=True)

    def rotate(procs) -> None:  # the access log, past --access-log-max-mb: nginx reopens it on SIGUSR1
        nginx = procs.get("nginx")
        if args.access_log_max_mb > 0 and nginx is not None and nginx.poll() is None:
            gateway.rotate_log(state / "access.log", max_bytes=int(args.access_log_max_mb * 1024 * 1024),
                               keep=args.access_log_keep, reopen=lambda: os.kill(nginx.pid, signal.SIGUSR1))

    children.append(gateway.Child("nginx", gateway.nginx_command(conf),
                                  ports=((args.host, args.port), (args.operator_host, args.operator_port)), mine=str(conf)))
    return gateway.run_together(children, restart=True, tick=rotate)


class _Popened:
    """The little of ``flwr.FlowerProcess`` that ``wait_healthy`` uses, over a plain Popen."""

    def __init__(self, name, popen) -> None:
        self.name, self.popen = name, popen

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return "(its output is above)"


def cmd_connection(args) -> int:
    if bool(args.operator_cert) != bool(args.operator_key):
        raise DeployError("give both --operator-cert and --operator-key (hospitrust deploy operator-cert makes them)")
    if not args.operator_cert:
        path = write_connection(args.name, args.address, Path(args.ca), make_default=args.default)
        print(f"wrote [superlink.{args.name}] (address {args.address}, root-certificates {Path(args.ca).resolve()}) to {path}\n"
              f"note: a locked-down SuperLink answers flwr only through an operator's tunnel (--operator-cert)")
        return 0
    from hospitrust.ops.deploy.tunnel import write_tunnel

    conf, path = write_tunnel(args.name, args.address, ca=Path(args.ca), cert=Path(args.operator_cert),
                              key=Path(args.operator_key), port=args.tunnel_port, make_default=args.default,
                              expected_name=args.server_name)
    print(f"wrote the tunnel {conf} (127.0.0.1:{args.tunnel_port} -> {args.address}, with your operator certificate)\n"
          f"wrote [superlink.{args.name}] (address 127.0.0.1:{args.tunnel_port}, root-certificates "
          f"{Path(args.ca).resolve()}) to {path}\n"
          f"start the tunnel before using flwr: hospitrust deploy tunnel {args.name}")
    return 0


def cmd_tunnel(args) -> int:
    from hospitrust.ops.deploy import gateway
    from hospitrust.ops.deploy.tunnel import tunnel_dir

    conf = tunnel_dir(args.name) / "nginx.conf"
    if not conf.is_file():
        raise DeployError(f"no tunnel {args.name!r} ({conf} not found): hospitrust deploy connection {args.name} "
                          f"--address HOST:PORT --ca ca.crt --operator-cert NAME.crt --operator-key NAME.key")
    cmd = gateway.nginx_command(conf)
    if args.dry_run:
        print("$ " + shlex.join(cmd))
        return 0
    return gateway.run_together([("nginx (tunnel)", cmd)])


def cmd_register(args) -> int:
    from hospitrust.ops import flwr

    rc = 0
    for key in args.public_keys:
        key = Path(key).expanduser().resolve()
        text = key.read_text().strip() if key.is_file() else ""
        if not text.startswith("ecdsa-sha2-nistp384 "):
            print(f"{key}: not an OpenSSH ecdsa-sha2-nistp384 public key (hospitrust deploy keygen makes one)",
                  file=sys.stderr)
            rc = 1
            continue
        res = flwr.flwr_cli(["supernode", "register", str(key), args.connection])
        out = (res.stdout + res.stderr).strip()
        print(f"{key.name}: {out.splitlines()[-1] if out else 'rc ' + str(res.returncode)}")
        if res.returncode != 0:
            rc = 1
    return rc


def cmd_status(args) -> int:
    from hospitrust.ops import flwr
    from hospitrust.ops.flwr import COMPLETED

    status, details = (flwr.wait_for_run(args.run_id, args.connection, args.timeout) if args.wait
                       else flwr.run_status(args.run_id, args.connection))
    print(f"run {args.run_id}: {status}" + (f"\n{details}" if details and status != COMPLETED else ""))
    return 0 if status == COMPLETED else 1


def cmd_run(args) -> int:
    import tempfile

    from hospitrust.ops.deploy.runner import RunSupervisor

    with tempfile.TemporaryDirectory(prefix="hospitrust-run-") as work:
        supervisor = RunSupervisor(Path(args.app), args.connection, args.run_config, work=Path(work),
                                   record=Path(args.record) if args.record else Path.cwd() / "attempts.jsonl",
                                   attempts=args.attempts, poll=args.poll, unreachable_timeout=args.unreachable_timeout,
                                   say=lambda line: print(line, flush=True))
        if not args.record:
            supervisor.record = Path.cwd() / f"{supervisor.name}.attempts.jsonl"
        return supervisor.run()


def cmd_hospitals(args) -> int:
    import json

    from hospitrust.ops.deploy import hospitals

    records = hospitals.read_runs(Path(args.runs_dir).expanduser().resolve()) if args.runs_dir else {}
    rows = hospitals.federation_hospitals(hospitals.list_nodes(args.connection), records)
    if args.format == "json":
        print(json.dumps({"hospitals": rows}, indent=1))
    else:
        print(hospitals.format_table(rows))
        if not args.runs_dir:
            print("(names, data and runs come from the runs' records: pass --runs-dir, the runs' output-dir on the "
                  "SuperLink machine)")
    return 0


def cmd_supernode(args) -> int:
    if (args.data_path is None) == (args.partition is None):
        raise DeployError("give either --data-path (this hospital's images) or --partition I/N (a rehearsal hospital "
                          "simulated from the run's dataset)")
    if args.partition is not None:
        return _start_supernode(args, _partition_config(args.partition))
    if not args.hospital:
        raise DeployError("--hospital is required with --data-path (the name the federation records for you)")
    data_path = Path(args.data_path).expanduser().resolve()
    if not args.skip_data_check:
        from hospitrust.datacheck import check as data_check

        report = data_check.check_path(data_path, task_from_args(args), data_format=args.data_format,
                                       allow_odd_sizes=args.allow_odd_sizes, skip_unreadable=args.skip_unreadable)
        print(report.format(), flush=True)
        args.hospital_images = sum(r.images for r in report.rows)  # the site policy's images-per-round rule
        if not report.ok:
            print("\nhospitrust deploy supernode: not starting the SuperNode: fix the problems above "
                  "(or pass --skip-data-check to start anyway)", file=sys.stderr)
            return 3
    node_config: dict[str, object] = {"data-path": str(data_path), "data-format": args.data_format,
                                      "hospital": args.hospital}
    if args.cache_dir:
        node_config["cache-dir"] = str(Path(args.cache_dir).expanduser().resolve())
    if args.skip_unreadable:
        node_config["skip-unreadable"] = args.skip_unreadable
    return _start_supernode(args, node_config)


def _partition_config(text: str) -> dict[str, object]:
    index, _, total = text.partition("/")
    if not (index.isdigit() and total.isdigit() and int(index) < int(total)):
        raise DeployError(f"--partition {text!r}: expected I/N with 0 <= I < N, e.g. 0/3")
    return {"partition-id": int(index), "num-partitions": int(total)}


def _start_supernode(args, node_config: dict[str, object]) -> int:
    """Start the SuperNode (data checked): warm launcher and watchdog, or Flower's own SuperExec."""
    for label, p in (("--ca", Path(args.ca)), ("--key", Path(args.key))):
        if not p.expanduser().is_file():
            raise DeployError(f"{label} {p} not found")
    key_mode = Path(args.key).expanduser().stat().st_mode & 0o777
    if key_mode & 0o077:
        print(f"warning: {args.key} is readable by others (mode {key_mode:o}); chmod 600 it", file=sys.stderr)
    if args.hospital and "hospital" not in node_config:
        node_config["hospital"] = args.hospital
    if args.malicious:
        node_config["malicious"] = True
    warm = args.launcher == "warm"
    gate_env = _gate_env(args)
    if gate_env and not warm:
        raise DeployError("--approved-apps, --trusted-signers, --policy, --audit-log and --clientapp-user need --launcher "
                          "warm: Flower's own launcher has no hook to check a bundle before it runs")
    if args.log_file and not warm:
        raise DeployError("--log-file needs --launcher warm (with --launcher flower, Flower's SuperNode writes to this "
                          "command's output: redirect it instead)")
    from hospitrust.supervision import runtime_secret

    # with the warm launcher, only the holder of this secret (the launcher) is handed the hospital's messages by the
    # SuperNode's local Runtime API; another account on this machine is refused (issue 61, finding 1)
    secret = runtime_secret.create() if warm and not args.dry_run else None
    try:
        return _supervise(args, node_config, warm, gate_env, secret)
    finally:
        if secret is not None:
            runtime_secret.remove(secret)


def _supervise(args, node_config: dict[str, object], warm: bool, gate_env: dict[str, str], secret: Path | None) -> int:
    cmd = supernode_command(superlink=args.superlink, ca=Path(args.ca), key=Path(args.key), node_config=node_config,
                            port=args.port, host=args.host, max_retries=args.max_retries,
                            max_wait_time=args.max_wait_time, isolation="process" if warm else "subprocess",
                            superexec_secret=secret)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from hospitrust.supervision.supervisor import port_in_use

    if (held := port_in_use(args.host, args.port)) is not None:  # instead of Flower's "[Errno 98] address already in use"
        message = (f"{held}. The SuperNode's Runtime API needs it: stop that process (an earlier SuperNode of this "
                   f"hospital?) or pass another --port")
        if not args.dry_run:
            raise DeployError(message)
        print(f"warning: {message}", file=sys.stderr)
    if not warm:
        return run_flower_supernode(cmd, args.dry_run)
    print("$ " + shlex.join(cmd), flush=True)
    print(f"  with ClientApps forked by hospitrust's warm launcher from 127.0.0.1:{args.port}; watchdog bound "
          f"{args.message_timeout:g} s per message, {args.send_timeout:g} s per reply sent", flush=True)
    from hospitrust.supervision.supervisor import Supervisor, console_and_file

    if args.dry_run:
        return 0
    runtime = f"{'127.0.0.1' if args.host in ('0.0.0.0', '') else args.host}:{args.port}"
    if gate_env:
        print("  the hospital's gate: " + ", ".join(f"{k}={v}" for k, v in gate_env.items()), flush=True)
    log_file = None
    if args.log_file:
        log_file = Path(args.log_file).expanduser().resolve()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        print(f"  logging to {log_file} too (without colour codes)", flush=True)
    return Supervisor(cmd, runtime, message_timeout=args.message_timeout, send_timeout=args.send_timeout,
                      env={**os.environ, **gate_env},
                      out=console_and_file(log_file)).run()


def _gate_env(args) -> dict[str, str]:
    """The hospital's gate (approvals, signers, site policy, audit log) for the launcher's children, checked now."""
    from hospitrust.ops.deploy import gate

    if args.trusted_signers and not args.approved_apps:
        raise DeployError("--trusted-signers needs --approved-apps too: that file holds this hospital's revocation list "
                          "(hospitrust app revoke), which the gate reads before it accepts a signature; a file not yet "
                          "made is fine")
    paths = {gate.APPROVALS_ENV: args.approved_apps, gate.TRUSTED_ENV: args.trusted_signers,
             gate.POLICY_ENV: args.policy, gate.AUDIT_ENV: args.audit_log,
             gate.AUDIT_KEY_ENV: getattr(args, "audit_key", None)}
    env = {k: str(Path(v).expanduser().resolve()) for k, v in paths.items() if v}
    if gate.AUDIT_KEY_ENV in env and gate.AUDIT_ENV not in env:
        raise DeployError("--audit-key needs --audit-log (the key signs that log's entries)")
    if getattr(args, "hospital_images", None) is not None:
        env[gate.IMAGES_ENV] = str(args.hospital_images)
    user_spec = getattr(args, "clientapp_user", None)
    if not env.keys() - {gate.IMAGES_ENV} and not user_spec:
        return {}
    from hospitrust.supervision.launcher import check_start

    # a bad policy or signers file, an unknown --clientapp-user, gate files it could read: a clear error before
    # anything starts (the launcher checks the same at its start)
    check_start(gate.GateConfig.from_env(env), user_spec or "")
    if user_spec:
        from hospitrust.supervision.confine import CLIENTAPP_USER_ENV

        env[CLIENTAPP_USER_ENV] = user_spec
    return env


def add_deploy_parser(sub) -> None:
    dep = sub.add_parser("deploy", help="certificates, keys, SuperLink and SuperNode for a real federation",
                         description="Operator and hospital commands for a TLS-secured, authenticated Flower deployment "
                                     "(see docs/deployment.md).")
    dsub = dep.add_subparsers(dest="deploy_command", required=True)

    p = dsub.add_parser("ca", help="operator: create the federation's certificate authority")
    p.add_argument("--out", required=True, help="folder for ca.crt and ca.key")
    p.add_argument("--name", default="hospitrust federation CA", help="CA common name")
    p.add_argument("--days", type=int, default=3650)
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_ca)

    p = dsub.add_parser("server-cert", help="operator: the SuperLink's TLS certificate, signed by the CA")
    p.add_argument("--ca-dir", required=True, help="folder with ca.crt and ca.key (also the default --out)")
    p.add_argument("--ca-cert", help="CA certificate (default CA_DIR/ca.crt)")
    p.add_argument("--ca-key", help="CA private key (default CA_DIR/ca.key)")
    p.add_argument("--out", help="folder for server.pem and server.key (default: --ca-dir)")
    p.add_argument("--san", action="append", required=True, metavar="HOST_OR_IP",
                   help="host name or IP address the SuperLink is reached by; repeat or comma-separate "
                        "(e.g. --san superlink.example.org --san 10.0.0.5 --san localhost --san 127.0.0.1)")
    p.add_argument("--days", type=int, default=825)
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_server_cert)

    p = dsub.add_parser("keygen", help="hospital: the SuperNode's key pair (send NAME.pub to the operator)")
    p.add_argument("--out", required=True, help="folder for NAME.key and NAME.pub")
    p.add_argument("--name", required=True, help="the hospital's short name, e.g. st-mary")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_keygen)

    p = dsub.add_parser("operator-cert", help="operator: an operator's client certificate, signed by the CA "
                                             "(opens the Control API through the gateway)")
    p.add_argument("--ca-dir", required=True, help="folder with ca.crt and ca.key")
    p.add_argument("--ca-cert", help="CA certificate (default CA_DIR/ca.crt)")
    p.add_argument("--ca-key", help="CA private key (default CA_DIR/ca.key)")
    p.add_argument("--name", required=True, help="the operator's name, e.g. alice (the certificate's common name)")
    p.add_argument("--out", required=True, help="folder for NAME.crt and NAME.key")
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_operator_cert)

    p = dsub.add_parser("superlink", help="operator: start flower-superlink on 127.0.0.1 (TLS, SuperNode auth, persistent "
                                         "database) behind an nginx gateway that publishes only what each party may reach",
                        description="The SuperLink listens on 127.0.0.1:SUPERLINK_PORT only. nginx publishes the Fleet "
                                    "API (and /health) on HOST:PORT for the hospitals, and the Control API on "
                                    "OPERATOR_HOST:OPERATOR_PORT for operators holding a certificate from "
                                    "`deploy operator-cert` (mutual TLS). The Runtime API is never published. "
                                    "flower-superlink and nginx are restarted when either dies (with backoff); this "
                                    "command itself is restarted by its service manager (deploy/systemd/).")
    p.add_argument("--certs", default=".", help="folder with ca.crt, server.pem, server.key (default .)")
    p.add_argument("--ca", help="CA certificate (default CERTS/ca.crt)")
    p.add_argument("--cert", help="server certificate (default CERTS/server.pem)")
    p.add_argument("--key", help="server private key (default CERTS/server.key)")
    p.add_argument("--database", required=True, help="SQLite state file (keeps registered SuperNodes and runs across restarts)")
    p.add_argument("--database-busy-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long the SuperLink waits for its SQLite store's lock before a request fails (default 30; "
                        "Flower's own 5 s fails requests on a loaded machine: docs/operators.md)")
    p.add_argument("--host", default="0.0.0.0", help="the hospitals' listener address (default 0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the hospitals' listener port (default {DEFAULT_PORT})")
    p.add_argument("--operator-host", default="127.0.0.1",
                   help="the operators' listener address (default 127.0.0.1; an operator network's address to reach it "
                        "from elsewhere)")
    p.add_argument("--operator-port", type=int, default=9095, help="the operators' listener port (default 9095)")
    p.add_argument("--superlink-port", type=int, default=9092, help="the SuperLink's own port on 127.0.0.1 (default 9092)")
    p.add_argument("--gateway", choices=("nginx", "none"), default="nginx",
                   help="nginx (default): start the gateway too; none: the SuperLink alone on 127.0.0.1, behind your own "
                        "proxy (the nginx configuration to start from is written to STATE_DIR/nginx.conf)")
    p.add_argument("--gateway-connections", type=int, default=512, metavar="N",
                   help="the gateway's connections at most (nginx worker_connections; default 512: each connected "
                        "hospital holds about 5, so about 100 hospitals)")
    p.add_argument("--state-dir", help="the gateway's configuration, pid and logs (default: DATABASE's folder/gateway)")
    p.add_argument("--serverapp-launcher", choices=("warm", "flower"), default="warm",
                   help="warm (default): hospitrust forks each run's ServerApp from a process with torch already "
                        "imported, and the SuperLink hands a run's token only to it (a secret made at each start); "
                        "flower: Flower's own flower-superexec starts a fresh flwr-serverapp per run, and any local "
                        "account that asks the SuperLink's Runtime API on 127.0.0.1 first is handed it")
    p.add_argument("--log-file", help="also log the SuperLink to this file")
    p.add_argument("--access-log-max-mb", type=float, default=10.0,
                   help="rotate the gateway's access log (STATE_DIR/access.log) past this size (default 10; 0: never, "
                        "e.g. when logrotate does it)")
    p.add_argument("--access-log-keep", type=int, default=5,
                   help="rotated access logs kept: access.log.1 (newest) .. access.log.N (default 5)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and the gateway configuration, start nothing")
    p.set_defaults(func=cmd_superlink)

    p = dsub.add_parser("connection", help="operator/researcher: write the flwr connection to $FLWR_HOME/config.toml "
                                          "(and, with an operator certificate, the local tunnel it goes through)")
    p.add_argument("name", help="connection name used as `flwr run . NAME`")
    p.add_argument("--address", required=True,
                   help="with --operator-cert: the SuperLink machine's operator listener HOST:PORT; without: the "
                        "address flwr connects to directly (a host name or IP in the certificate's SANs)")
    p.add_argument("--ca", required=True, help="the federation's CA certificate (stored as an absolute path)")
    p.add_argument("--operator-cert", help="your operator certificate (deploy operator-cert): flwr goes through a tunnel "
                                          "on 127.0.0.1 that presents it")
    p.add_argument("--operator-key", help="its private key")
    p.add_argument("--tunnel-port", type=int, default=9096, help="the tunnel's port on 127.0.0.1 (default 9096)")
    p.add_argument("--server-name", help="with --operator-cert and an IP --address: a host name in the SuperLink's "
                                        "certificate to verify it by (default: the --address host; localhost for a "
                                        "loopback IP)")
    p.add_argument("--default", action="store_true", help="make it the default connection")
    p.set_defaults(func=cmd_connection)

    p = dsub.add_parser("tunnel", help="operator: run the local tunnel of a connection (nginx on 127.0.0.1 presenting "
                                      "your operator certificate to the SuperLink's operator listener)")
    p.add_argument("name", help="the connection name given to `deploy connection`")
    p.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    p.set_defaults(func=cmd_tunnel)

    p = dsub.add_parser("audit", help="hospital: print a SuperNode's audit log and verify it (keyed chain and head)")
    p.add_argument("path", help="the --audit-log file")
    p.add_argument("--key", help="the log's key file, when the SuperNode had --audit-key (default: PATH.key)")
    p.add_argument("--quiet", action="store_true", help="only verify")
    p.add_argument("--against", metavar="RUN_DIR",
                   help="also check it against the heads the federation recorded in a run (its folder or rounds.jsonl, "
                        "from the operator): a log rolled back to an older copy no longer matches")
    p.add_argument("--hospital", help="with --against: this log's hospital in that run (needed when it holds several)")
    p.set_defaults(func=cmd_audit)

    p = dsub.add_parser("register", help="operator: register hospitals' SuperNode public keys")
    p.add_argument("public_keys", nargs="+", metavar="KEY.pub")
    p.add_argument("--connection", required=True, help="flwr connection name (see `deploy connection`)")
    p.set_defaults(func=cmd_register)

    p = dsub.add_parser("status", help="a run's status; exit 0 only if it ended finished:completed")
    p.add_argument("run_id", type=int)
    p.add_argument("--connection", required=True)
    p.add_argument("--wait", action="store_true", help="wait until the run has finished")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)")
    p.set_defaults(func=cmd_status)

    p = dsub.add_parser("run", help="operator: submit a run and resume it by itself after a SuperLink or ServerApp crash",
                        description="Submits APP with --run-config through the connection, watches its status, and when "
                                    "it ends finished:failed (a crash) resubmits it with resume-from set to its run "
                                    "directory (output-dir/run-name, both required in --run-config). Exit 0 only when "
                                    "the run completed. Every attempt is appended to --record.")
    p.add_argument("app", nargs="?", default=".", help="the Flower app folder (default .)")
    p.add_argument("--connection", required=True, help="flwr connection name (see `deploy connection`)")
    p.add_argument("--run-config", required=True, help="the run config; must set run-name and an absolute output-dir")
    p.add_argument("--attempts", type=int, default=5, help="submissions at most, the first included (default 5)")
    p.add_argument("--record", help="the attempts' record, JSON lines (default ./RUN-NAME.attempts.jsonl)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between status checks (default 5)")
    p.add_argument("--unreachable-timeout", type=float, default=3600.0,
                   help="seconds to wait for a SuperLink that does not answer before giving up (default 3600)")
    p.set_defaults(func=cmd_run)

    p = dsub.add_parser("hospitals", help="operator: the federation's hospitals by name, online or offline, their data "
                                         "and runs",
                        description="Every SuperNode the SuperLink lists (flwr supernode list, through the operator's "
                                    "connection), named from the runs' records (config.json in --runs-dir), with its "
                                    "status, when it was last seen, its data format and counts from the newest query "
                                    "round it answered, the runs it took part in and the runs that left it out.")
    p.add_argument("--connection", required=True, help="flwr connection name (see `deploy connection`)")
    p.add_argument("--runs-dir", help="the runs' output-dir on the SuperLink machine (names, data and runs come from there)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_hospitals)

    p = dsub.add_parser("supernode", help="hospital: check the data, then start flower-supernode")
    p.add_argument("--superlink", required=True, metavar="HOST:PORT")
    p.add_argument("--ca", required=True, help="the federation's CA certificate")
    p.add_argument("--key", required=True, help="this hospital's SuperNode private key (deploy keygen)")
    p.add_argument("--data-path",
                   help="this hospital's images: a folder of class folders (images or DICOM), a CSV manifest or a .npz")
    p.add_argument("--partition", metavar="I/N",
                   help="instead of --data-path: a rehearsal hospital, partition I of N of the run's dataset (as in "
                        "simulation; for trying a deployment and benchmarks)")
    p.add_argument("--data-format", default="auto", choices=FORMATS, help="how --data-path is laid out (default: detected)")
    p.add_argument("--cache-dir", help="where decoded images are cached (default ~/.cache/hospitrust/images)")
    p.add_argument("--hospital", help="this hospital's name, as the federation records it (required with --data-path; "
                                      "default with --partition: hospital-I)")
    p.add_argument("--port", type=int, default=9094, help="the SuperNode's local Runtime API port (default 9094)")
    p.add_argument("--host", default="127.0.0.1", help="the SuperNode's local Runtime API address (default 127.0.0.1)")
    add_task_arguments(p)
    p.add_argument("--allow-odd-sizes", action="store_true", help="non-square or small images are warnings, not problems")
    p.add_argument("--skip-unreadable", type=share_of_files, default=0.0, metavar="SHARE",
                   help="node config skip-unreadable: up to this share of the files may be unreadable or missing and "
                        "is skipped (counted, never named, in what the hospital sends); default 0: any such file is a "
                        "problem")
    p.add_argument("--skip-data-check", action="store_true", help="start even if the data check finds problems")
    p.add_argument("--launcher", choices=("warm", "flower"), default="warm",
                   help="warm (default): hospitrust forks each ClientApp from a process with torch already imported, "
                        "and a watchdog restarts a SuperNode whose ClientApp died mid-message; flower: Flower's own "
                        "SuperExec (a fresh process per message), the SuperNode started again for 90 s while the "
                        "SuperLink refuses it (a killed session of its key still counted as online)")
    p.add_argument("--malicious", action="store_true",
                   help="red team only: this node carries out the run's attack (runs with an attack configured)")
    p.add_argument("--approved-apps", metavar="PATH",
                   help="this hospital's approvals file (hospitrust app approve): only approved bundles, or bundles a "
                        "trusted signer signed, run here (needs --launcher warm; without it any bundle the SuperLink "
                        "sends runs)")
    p.add_argument("--trusted-signers", metavar="FILE", help="public keys whose signed bundles count as approved (Flower's "
                                                            "trusted-entities format: fpk_<id>: \"ssh-ed25519 ...\"); "
                                                            "needs --approved-apps, whose file holds the revocation list")
    p.add_argument("--policy", metavar="PATH", help="this hospital's site policy (TOML): what it accepts whatever a run "
                                                   "config asks (docs/security.md#site-policy)")
    p.add_argument("--audit-log", metavar="PATH", help="append every message (what ran, what went back) to this "
                                                      "keyed (HMAC) log, anchored by PATH.head; verify it with "
                                                      "hospitrust deploy audit PATH")
    p.add_argument("--audit-key", metavar="FILE", help="the audit log's HMAC key (64+ hex digits, mode 0600); default "
                                                      "PATH.key, created at the first start")
    p.add_argument("--clientapp-user", metavar="NAME|UID[:GID]",
                   help="run each ClientApp as this user once the gate accepted its bundle, before any of it is "
                        "imported: the approvals, policy and audit log (0600, the service user's) are then out of its "
                        "reach; it needs its data readable and its --cache-dir and privacy ledger writable "
                        "(docs/security.md#the-clientapps-own-user; needs CAP_SETUID, CAP_SETGID, CAP_KILL)")
    p.add_argument("--message-timeout", type=float, default=1800.0,
                   help="watchdog: seconds a message may be in flight before the SuperNode is restarted (default 1800)")
    p.add_argument("--send-timeout", type=float, default=30.0,
                   help="watchdog: seconds a reply may stay in Flower's 'Sending:' before the SuperNode is restarted "
                        "(default 30)")
    p.add_argument("--max-retries", type=int, help="reconnection attempts before giving up (default: unlimited)")
    p.add_argument("--max-wait-time", type=float, help="seconds of reconnecting before giving up (default: unlimited)")
    p.add_argument("--log-file", help="also write the SuperNode's, the launcher's and the watchdog's log to this file "
                                      "(appended, without colour codes)")
    p.add_argument("--dry-run", action="store_true", help="check and print the command, do not start it")
    p.set_defaults(func=cmd_supernode)


def cmd_audit(args) -> int:
    from hospitrust.ops.deploy import audit

    path = Path(args.path).expanduser()
    if not path.is_file():
        wiped = audit.wiped(path)  # its state, outside its folder, records entries: not a mistyped path
        if wiped is not None:
            print(f"hospitrust deploy audit: does not verify: {wiped}", file=sys.stderr)
            return 1
        raise DeployError(f"audit log {path} not found")
    entries, problem = audit.verify(path, Path(args.key).expanduser() if args.key else None)
    if not args.quiet:
        for n, e in enumerate(entries, 1):
            reply = e.get("reply_claimed_by_app", e.get("reply", {}))
            sent = ", ".join(f"{k} {v['shape']}" for k, v in reply.get("arrays", {}).items()) or reply.get("error", "")[:80]
            print(f"{n:>5}  {e.get('time', 0):.0f}  run {e.get('run')}  {e.get('message', '?'):<12} round {e.get('round')}  "
                  f"app {str(e.get('app_sha256', ''))[:8]}  {e.get('decision')}"
                  + (f" ({e['reason']})" if e.get("reason") else "") + (f"  exit {e['exit']}" if e.get("exit") not in (None, 0) else "")
                  + (f"  -> {'app says: ' if 'reply_claimed_by_app' in e else ''}{sent}" if sent else ""))
    if problem:
        print(f"hospitrust deploy audit: does not verify: {problem}", file=sys.stderr)
        return 1
    last = f" (last MAC {entries[-1]['mac'][:16]}, as the launcher's last 'audited' line says)" if entries else ""
    print(f"{len(entries)} entries; every entry's MAC and the head verify{last}")
    if args.against:
        return _audit_against(entries, Path(args.against).expanduser(), args.hospital)
    return 0


def _audit_against(entries: list[dict], run: Path, hospital: str | None) -> int:
    """The log against the heads a run's records hold for this hospital (issue 61: a rollback shows)."""
    from hospitrust.ops.deploy import audit

    rounds = run / "rounds.jsonl" if run.is_dir() else run
    if not rounds.is_file():
        raise DeployError(f"--against {run}: no rounds.jsonl there; expected a run's folder (or its rounds.jsonl) as "
                          f"the operator's ServerApp wrote it")
    from hospitrust.records import RoundRecord

    heads: dict[str, list[dict]] = {}
    for n, line in enumerate(rounds.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = RoundRecord.from_json(line)
        except (ValueError, TypeError, AttributeError):  # not JSON, or JSON that is no round's line
            raise DeployError(f"--against {rounds}: line {n} is not a round's record") from None
        for name, head in (record.entries.get("audit_heads") or {}).items():
            if isinstance(head, dict) and "mac" in head:  # a malformed head the server recorded as such is skipped
                heads.setdefault(name, []).append({"run": rounds.parent.name, "round": record.number, **head})
    if not heads:
        raise DeployError(f"--against {rounds}: it records no audit heads (the hospitals ran without --audit-log, or "
                          f"with a version that did not send them)")
    if hospital is None:
        if len(heads) > 1:
            raise DeployError(f"--against {rounds} holds heads of {', '.join(sorted(heads))}: say which is this log's "
                              f"with --hospital NAME")
        hospital = next(iter(heads))
    if hospital not in heads:
        raise DeployError(f"--against {rounds}: no head of {hospital!r}; it holds {', '.join(sorted(heads))}")
    anchors = heads[hospital]
    problems = audit.against(entries, anchors)
    for problem in problems:
        print(f"hospitrust deploy audit: does not match the federation's records: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{len(anchors)} heads the federation recorded for {hospital} in {rounds.parent.name} (up to entry "
          f"{max(int(a['entries']) for a in anchors)}): every one is in this log")
    return 0


def cmd_app(args) -> int:
    from hospitrust.ops.deploy import approval

    if args.app_command == "keygen":
        key, pub, key_id = approval.create_signing_key(Path(args.out), args.name, force=args.force)
        print(f"signing key: {key} (mode 0600; keep it with the release manager)\npublic key:  {pub}\n"
              f"hospitals add this line to their trusted signers file:\n  {pub.read_text().strip()}")
        return 0
    if args.app_command == "build":
        content = approval.build_fab(Path(args.app))
        sha = approval.fab_sha256(content)
        out = Path(args.out or f"{Path(args.app).resolve().name}.{approval.short(sha)}.fab")
        out.write_bytes(content)
        print(f"{out}  sha256 {sha}  (flwr run of the same folder sends this bundle: flwr shows {approval.short(sha)})")
        return 0
    if args.app_command == "revoke":
        store = approval.Approvals(Path(args.approvals))
        if bool(args.sha256) == bool(args.key_id):
            raise DeployError("give a bundle's SHA-256 or --key-id fpk_... (a signer's key), one of them")
        if args.key_id:
            gone = store.revoke_key(args.key_id, by=args.by, comment=args.comment)
            print(f"revoked signer key {gone.key} in {store.path}: bundles it signed run here only if approved by hash")
            return 0
        entry, was = store.revoke(args.sha256, by=args.by, comment=args.comment)
        print(f"revoked {entry.sha256} in {store.path}"
              + (f" (approved by {was.by}, {was.at}; approval removed)" if was else " (it was not approved here)")
              + ": refused from the next message, even when signed; its installed copy is removed then")
        return 0
    content = approval.read_fab(Path(args.bundle))
    if args.app_command == "review":
        print(approval.review(content, approval.Approvals(Path(args.approvals)) if args.approvals else None))
        return 0
    if args.app_command == "approve":
        done = approval.Approvals(Path(args.approvals)).approve(content, by=args.by, comment=args.comment)
        print(f"approved {done.sha256} (flwr shows {approval.short(done.sha256)}) by {done.by} at {done.at} in {args.approvals}")
        return 0
    # sign
    expires = approval.parse_expires(args.expires) if args.expires else None
    value = approval.sign(content, Path(args.key), args.key_id or _key_id(Path(args.key)), expires=expires)
    print(f"pass it with the run: flwr run ... --run-config '{approval.SIGNATURE_KEY}=\"{value}\"'\n{value}")
    return 0


def _key_id(key: Path) -> str:
    pub = key.with_suffix(".pub")
    if not pub.is_file():
        raise DeployError(f"give --key-id (the fpk_... id in {pub.name}): {pub} not found")
    return pub.read_text().split(":", 1)[0].strip()


def add_app_parser(sub) -> None:
    from hospitrust.ops.deploy.approval import default_approvals_path

    app = sub.add_parser("app", help="review, approve, sign and build app bundles (which code a hospital runs)",
                         description="A hospital runs only app bundles it approved, or that a signer it trusts signed "
                                     "(hospitrust deploy supernode --approved-apps / --trusted-signers). See docs/security.md.")
    asub = app.add_subparsers(dest="app_command", required=True)
    default = str(default_approvals_path())
    p = asub.add_parser("review", help="a bundle's hash, files (code marked) and diff against the last approved bundle")
    p.add_argument("bundle", help="a .fab file, or an app folder (built as flwr run builds it)")
    p.add_argument("--approvals", default=default, help=f"the approvals file to compare with (default {default})")
    p = asub.add_parser("approve", help="approve a bundle: its full SHA-256, who, when, a comment")
    p.add_argument("bundle", help="a .fab file, or an app folder")
    p.add_argument("--approvals", default=default, help=f"the approvals file (default {default})")
    p.add_argument("--by", help="who approves (default: this user)")
    p.add_argument("--comment", default="", help="why, e.g. the review ticket")
    p = asub.add_parser("revoke", help="revoke a bundle (its approval goes, and signatures of it no longer count) or a "
                                       "signer's key (--key-id): the revocation list in the approvals file")
    p.add_argument("sha256", nargs="?", help="the bundle's SHA-256 (all 64 hex digits, or a unique prefix of 8 or more "
                                             "of an approved bundle's)")
    p.add_argument("--key-id", help="revoke a signer's key instead: its fpk_... id (the part before ':' in its .pub line)")
    p.add_argument("--approvals", default=default, help=f"the approvals file (default {default})")
    p.add_argument("--by", help="who revokes (default: this user)")
    p.add_argument("--comment", default="", help="why, e.g. the incident ticket")
    p = asub.add_parser("build", help="the exact bundle flwr run of an app folder sends (to hand to hospitals for review)")
    p.add_argument("app", nargs="?", default=".", help="the app folder (default .)")
    p.add_argument("--out", help="the .fab file (default NAME.HASH8.fab here)")
    p = asub.add_parser("keygen", help="release manager: an Ed25519 signing key pair")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--force", action="store_true")
    p = asub.add_parser("sign", help="release manager: sign a bundle's hash; prints the run-config value that carries it")
    p.add_argument("bundle", help="a .fab file, or an app folder")
    p.add_argument("--key", required=True, help="the Ed25519 private key (hospitrust app keygen)")
    p.add_argument("--key-id", help="its fpk_... id (default: read from KEY's .pub beside it)")
    p.add_argument("--expires", help="the end of the signature's validity: days (90d), a date (2027-06-30, its end, "
                                     "UTC) or a UTC date-time; hospitals refuse it after that (default: no end of its own)")
    app.set_defaults(func=cmd_app)

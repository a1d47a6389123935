"""The operator's side: ``flower-superlink`` with TLS and SuperNode authentication (on 127.0.0.1, behind
the gateway of ``hospitrust.ops.deploy.gateway``), and the ``[superlink.NAME]`` connection in
``$FLWR_HOME/config.toml`` that ``flwr`` uses to reach it (through the operator's tunnel).
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

from hospitrust.errors import DeployError

DEFAULT_PORT = 9093  # hospitrust's suggested SuperLink port (Flower's own default is 8000)


def superlink_command(*, ca: Path, cert: Path, key: Path, database: Path, host: str = "127.0.0.1",
                      port: int = DEFAULT_PORT, log_file: Path | None = None, isolation: str = "subprocess",
                      superexec_secret: Path | None = None) -> list[str]:
    """The ``flower-superlink`` command; ``isolation = "process"``: its ServerApps are launched by hospitrust's warm
    launcher (:func:`serverapp_launcher_command`), not by the ``flower-superexec`` Flower starts itself;
    ``superexec_secret``: with it, only the holder of that secret is handed a run's token (process isolation only).
    """
    cmd = [
        "flower-superlink",
        "--ssl-ca-certfile", str(Path(ca).expanduser().resolve()),
        "--ssl-certfile", str(Path(cert).expanduser().resolve()),
        "--ssl-keyfile", str(Path(key).expanduser().resolve()),
        "--enable-supernode-auth",
        "--database", str(Path(database).expanduser().resolve()),
        "--disable-runtime-dependency-installation",
        "--host", host,
        "--port", str(port),
    ]
    if log_file is not None:
        cmd += ["--log-file", str(Path(log_file).expanduser().resolve())]
    if isolation != "subprocess":
        cmd += ["--isolation", isolation]
        if superexec_secret is not None:
            cmd += ["--superexec-auth-secret-file", str(superexec_secret)]
    return cmd


def serverapp_launcher_command(*, ca: Path, port: int = DEFAULT_PORT, superexec_secret: Path | None = None,
                               parent_pid: int | None = None) -> list[str]:
    """The warm ServerApp launcher's command (:mod:`hospitrust.supervision.serverapp_launcher`) for the SuperLink on
    127.0.0.1:``port`` (its Runtime API shares the SuperLink's TLS port).
    """
    cmd = [sys.executable, "-m", "hospitrust.supervision.serverapp_launcher", "--runtime-api-address", f"127.0.0.1:{port}",
           "--root-certificates", str(Path(ca).expanduser().resolve())]
    if superexec_secret is not None:
        cmd += ["--superexec-auth-secret-file", str(superexec_secret)]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    return cmd


def private_database(database: Path) -> None:
    """The SuperLink's SQLite state (runs, registered SuperNodes, messages) for its service user only: created
    empty with mode 0600 when absent (SQLite gives its ``-wal`` and ``-shm`` files the database's mode), and an
    existing database with its ``-wal`` and ``-shm`` set to 0600.
    """
    database = Path(database)
    os.close(os.open(database, os.O_WRONLY | os.O_CREAT, 0o600))
    for path in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        if path.exists():
            path.chmod(0o600)


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


FLWR_DEFAULT_CONFIG = {"superlink": {"default": "local", "supergrid": {"address": "api.flower.ai"},
                                     "local": {"address": ":local:"}}}


def check_connection_name(name: str) -> None:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name) or name in ("default",):
        raise DeployError(f"bad connection name {name!r}: letters, digits, '-' and '_' only")


def write_connection(name: str, address: str, ca: Path, *, make_default: bool = False, home: Path | None = None) -> Path:
    """Add or replace ``[superlink.NAME]`` (address, absolute root-certificates) in ``$FLWR_HOME/config.toml``,
    keeping every other entry.
    """
    import tomli_w

    check_connection_name(name)
    ca = Path(ca).expanduser().resolve()
    if not ca.is_file():
        raise DeployError(f"CA certificate {ca} not found")
    home = Path(home).expanduser().resolve() if home else flwr_home()
    path = home / "config.toml"
    data = tomllib.loads(path.read_text()) if path.is_file() else json.loads(json.dumps(FLWR_DEFAULT_CONFIG))
    links = data.setdefault("superlink", {})
    links[name] = {"address": address, "root-certificates": str(ca)}
    if make_default or "default" not in links:
        links["default"] = name
    # scalars first, so tomli_w writes `default = ...` under [superlink] before the sub-tables
    data["superlink"] = {k: v for k, v in links.items() if not isinstance(v, dict)} | {
        k: v for k, v in links.items() if isinstance(v, dict)}
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return path

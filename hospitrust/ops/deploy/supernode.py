"""A hospital's side: the ``flower-supernode`` command with TLS, its key and its node config."""

from __future__ import annotations

from pathlib import Path

from hospitrust.errors import DeployError


def toml_string(value: str) -> str:
    """A TOML string that flwr's ``--node-config`` parser keeps whole (it splits on unquoted spaces)."""
    value = str(value)
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    if "'" not in value and "\n" not in value:
        return f"'{value}'"
    raise DeployError(f"cannot pass {value!r} in --node-config: it holds both kinds of quote")


def node_config_string(values: dict[str, object]) -> str:
    parts = []
    for k, v in values.items():
        if isinstance(v, bool):
            parts.append(f"{k}={'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            parts.append(f"{k}={v!r}")
        else:
            parts.append(f"{k}={toml_string(str(v))}")
    return " ".join(parts)


def supernode_command(*, superlink: str, ca: Path, key: Path, node_config: dict[str, object], port: int = 9094,
                      host: str = "127.0.0.1", max_retries: int | None = None, max_wait_time: float | None = None,
                      isolation: str = "subprocess", superexec_secret: Path | None = None) -> list[str]:
    """The ``flower-supernode`` command; ``isolation = "process"``: ClientApps are launched by
    hospitrust's warm launcher (``hospitrust.supervision.launcher``), not Flower's SuperExec; ``superexec_secret``:
    the file whose secret the SuperNode asks of whoever acquires a task (``hospitrust.supervision.runtime_secret``).
    """
    cmd = [
        "flower-supernode",
        "--root-certificates", str(Path(ca).expanduser().resolve()),
        "--superlink", superlink,
        "--auth-supernode-private-key", str(Path(key).expanduser().resolve()),
        "--node-config", node_config_string(node_config),
        "--host", host,
        "--port", str(port),
    ]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", f"{max_wait_time:g}"]
    if isolation != "subprocess":
        cmd += ["--isolation", isolation]
    if superexec_secret is not None:
        cmd += ["--superexec-auth-secret-file", str(superexec_secret)]
    return cmd

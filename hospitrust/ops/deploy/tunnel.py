"""The operator's side of the locked-down SuperLink: a local tunnel that holds the operator's certificate.

``flwr`` 1.42 cannot present a client certificate (a ``[superlink.NAME]`` connection has only
``address``, ``root-certificates``, ``insecure`` and ``federation``). So ``flwr`` talks TLS to nginx on
127.0.0.1 of the operator's own machine, and nginx presents the operator's certificate to the SuperLink
machine's operator listener. Its configuration lives in ``$FLWR_HOME/hospitrust/tunnels/NAME/``.
"""

from __future__ import annotations

from pathlib import Path

from hospitrust.errors import DeployError
from hospitrust.ops.deploy.superlink import check_connection_name, flwr_home, write_connection


def tunnel_dir(name: str, home: Path | None = None) -> Path:
    check_connection_name(name)
    return (Path(home).expanduser().resolve() if home else flwr_home()) / "hospitrust" / "tunnels" / name


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DeployError(f"--address {address!r}: expected HOST:PORT, e.g. superlink.example.org:9095")
    return host.strip("[]"), int(port)


def server_name(host: str, given: str | None) -> str:
    """The name the tunnel checks the SuperLink's certificate for: nginx 1.22 matches host names, not IP
    addresses, so an IP address needs a DNS name from the certificate (``localhost`` for a loopback one).
    """
    import ipaddress

    if given:
        return given
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.is_loopback:
        return "localhost"
    raise DeployError(f"--address {host} is an IP address: give --server-name, a host name in the SuperLink's "
                      f"certificate (its --san), for the tunnel to verify it by")


def write_tunnel(name: str, address: str, *, ca: Path, cert: Path, key: Path, port: int, make_default: bool = False,
                 home: Path | None = None, expected_name: str | None = None) -> tuple[Path, Path]:
    """Write the tunnel's nginx.conf (checked with ``nginx -t``) and the ``[superlink.NAME]`` connection that
    points ``flwr`` at it (``127.0.0.1:PORT``, ``root-certificates`` = the CA). Returns both paths.
    """
    from hospitrust.ops.deploy import gateway

    host, _ = split_address(address)
    remote_name = server_name(host, expected_name)
    for flag, p in (("--ca", ca), ("--operator-cert", cert), ("--operator-key", key)):
        if not Path(p).expanduser().is_file():
            raise DeployError(f"{flag} {p} not found")
    if not 0 < port < 65536:
        raise DeployError(f"--tunnel-port {port}: expected a TCP port between 1 and 65535")
    state = tunnel_dir(name, home)
    text = gateway.tunnel_config(remote=address, remote_name=remote_name, ca=ca, cert=cert, key=key, port=port, state=state)
    conf = gateway.write_nginx_config(text, state)
    return conf, write_connection(name, f"127.0.0.1:{port}", Path(ca), make_default=make_default, home=home)

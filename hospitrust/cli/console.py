"""``hospitrust console``: a live, read-only web page of runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _console(args: argparse.Namespace) -> int:
    from hospitrust.console.app import serve

    path = Path(args.path)
    if not path.is_dir():
        print(f"hospitrust console: {path} is not a folder (give a run directory or an output directory of runs)",
              file=sys.stderr)
        return 2
    if bool(args.certfile) != bool(args.keyfile):
        print("hospitrust console: give both --certfile and --keyfile for TLS, or neither", file=sys.stderr)
        return 2
    try:
        serve(path, host=args.host, port=args.port, token=args.token, certfile=args.certfile, keyfile=args.keyfile,
              connection=args.connection)
    except KeyboardInterrupt:
        pass
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    con = sub.add_parser("console", help="a live web page of runs: hospitals, trust decisions and why, round by round",
                         description="Serve a read-only page that follows a run directory (or an output directory of "
                                     "runs) from its files, live. Loopback by default; on another address every "
                                     "request needs the token printed at start.")
    con.add_argument("path", help="a run directory, or an output directory holding runs")
    con.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    con.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    con.add_argument("--token", help="the access token off loopback (default: a new one, printed)")
    con.add_argument("--certfile", help="TLS certificate (e.g. the deployment's server.pem)")
    con.add_argument("--keyfile", help="TLS private key (e.g. the deployment's server.key)")
    con.add_argument("--connection", help="the operator's flwr connection: a run whose records end without a summary "
                                          "shows Flower's own status (stopped, failed and why)")
    con.set_defaults(func=_console)

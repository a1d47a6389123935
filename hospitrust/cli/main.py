"""The ``hospitrust`` command: its parser from the registry (:mod:`hospitrust.cli.registry`), and
the one place a command's expected failures become a message and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from hospitrust.cli.registry import add_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hospitrust", description="Trust-aware federated learning across hospitals.")
    sub = parser.add_subparsers(dest="command", required=True)

    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("deploy", "data"):
        from hospitrust.ops.deploy import DeployError

        try:
            return int(args.func(args))
        except (DeployError, ValueError, OSError) as exc:
            print(f"hospitrust {args.command}: {exc}", file=sys.stderr)
            return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""The ``hospitrust`` command: the parser built from the registry (:mod:`hospitrust.cli.registry`)
and the call of the chosen command's handler (``deploy``, ``data`` and ``app`` failures as one line, exit 2).
"""

from __future__ import annotations

import argparse
import sys

from hospitrust.cli.registry import add_commands


def build_parser() -> argparse.ArgumentParser:
    """The ``hospitrust`` parser, every registered command in it."""
    parser = argparse.ArgumentParser(prog="hospitrust", description="Trust-aware federated learning across hospitals.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``hospitrust ARGV``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command in ("deploy", "data", "app"):
        from hospitrust.ops.deploy import DeployError

        try:
            return int(args.func(args))
        except (DeployError, ValueError, OSError) as exc:
            print(f"hospitrust {args.command}: {exc}", file=sys.stderr)
            return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

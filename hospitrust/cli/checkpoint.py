"""``hospitrust checkpoint upgrade``: an earlier hospitrust's checkpoint converted."""

from __future__ import annotations

import argparse
import sys


def _checkpoint(args: argparse.Namespace) -> int:
    from hospitrust.server_app.checkpoint import CheckpointError, upgrade_checkpoint

    print(f"{args.file}: an earlier hospitrust's checkpoint is a pickle; converting it loads it with pickle, which runs "
          "any code a crafted file holds. Convert only a checkpoint your own runs wrote.", file=sys.stderr)
    if not args.yes:
        answer = input("Do you trust this file? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("hospitrust checkpoint upgrade: not converted", file=sys.stderr)
            return 1
    try:
        path = upgrade_checkpoint(args.file)
    except (CheckpointError, OSError) as exc:
        print(f"hospitrust checkpoint upgrade: {exc}", file=sys.stderr)
        return 2
    print(f"converted {path} (the original is kept beside it as {path.name}.v1)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("checkpoint", help="convert a checkpoint written by an earlier hospitrust",
                        description="Checkpoints are read with torch.load(weights_only=True); one written before "
                                    "format 2 is refused until converted (after you confirm you trust it).")
    ck.add_argument("checkpoint_command", choices=("upgrade",))
    ck.add_argument("file", help="a checkpoint.pt, or the run directory holding it")
    ck.add_argument("--yes", action="store_true", help="do not ask: you trust the file")
    ck.set_defaults(func=_checkpoint)

"""``hospitrust config generate|check``: pyproject's run config and the config reference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _config(args: argparse.Namespace) -> int:
    from hospitrust.config import reference
    from hospitrust.ops.simulate import find_app_dir

    root = Path(args.app).resolve() if args.app else find_app_dir(packaged=False)  # never an installed copy
    if args.config_command == "generate":
        changed = reference.generate(root)
        print("\n".join(f"wrote {p.relative_to(root)}" for p in changed) or "everything was current")
        return 0
    stale = reference.stale(root)
    for path in stale:
        print(f"{path.relative_to(root)} is stale: run `hospitrust config generate`", file=sys.stderr)
    return 1 if stale else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    cfg = sub.add_parser("config", help="generate or check pyproject's run config and the config reference",
                         description="The run config's tables in pyproject.toml, docs/config.md and the rules' option "
                                     "tables come from the components' Options: `generate` writes them, `check` exits 1 "
                                     "when one is stale.")
    cfg.add_argument("config_command", choices=("generate", "check"))
    cfg.add_argument("--app", help="the project folder (default: found from the current folder)")
    cfg.set_defaults(func=_config)

"""``hospitrust data check``: the command line of :mod:`hospitrust.datacheck.check`.

It runs on the hospital's own machine and prints to its own terminal, so its report names files
and folders; nothing it prints is sent anywhere. It writes nothing unless asked: the decoded
image cache only with ``--warm-cache`` (0600 files in a 0700 folder, where the ClientApp will
read it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the layouts datasets.local reads (repeated so that building the parser imports no numpy; a test compares them)
FORMATS = ("auto", "folder", "csv", "npz")


def share_of_files(text: str) -> float:
    """A share of the files, 0 <= x < 1: the argparse type of ``--skip-unreadable``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share of the files, 0 <= x < 1 (e.g. 0.05), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a share of the files, 0 <= x < 1 (e.g. 0.05), got {value:g}")
    return value


def cmd_data_check(args) -> int:
    """Print the data report, then (data ready) the privacy budget; exit 0 ready, 1 problems, 2 bad task option."""
    from hospitrust.errors import ConfigError
    from hospitrust.tasks.cli import task_from_args

    try:
        task = task_from_args(args)
    except ConfigError as exc:  # a bad task option: one line, exit 2 (problems in the data are exit 1)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = "; ".join(line.lstrip("- ") for line in lines[1:])
        print(f"hospitrust data check: {lines[0] if lines else exc}{' ' + detail if detail else ''}", file=sys.stderr)
        return 2
    from hospitrust.datacheck import check as data_check

    code = data_check.main(args.path, task, args.data_format, args.allow_odd_sizes, skip_unreadable=args.skip_unreadable)
    if code == 0:  # the data reads as the ClientApp reads it: its privacy budget, from the hospital's ledger
        from hospitrust.privacy.ledger import budget_report

        print("\n" + budget_report(args.path, args.data_format, task, cache_dir=args.cache_dir, ledger=args.privacy_ledger,
                                    max_epsilon=args.privacy_max_epsilon, warm_cache=args.warm_cache,
                                    skip_unreadable=args.skip_unreadable), flush=True)
    if args.policy:
        from hospitrust.ops.deploy.policy import describe, load_policy

        print(f"\nsite policy {args.policy}:\n" + describe(load_policy(Path(args.policy))), flush=True)
    return code


def add_data_parser(sub) -> None:
    """``hospitrust data check``."""
    from hospitrust.tasks.cli import add_task_arguments

    data = sub.add_parser("data", help="check a hospital's own data before joining")
    dsub = data.add_subparsers(dest="data_command", required=True)
    p = dsub.add_parser("check", help="check a hospital's data (class folders, CSV manifest or .npz) against the task",
                        description="Read the data as the ClientApp will (every file decoded) and report every problem: "
                                    "class folders or labels that are not the task's, unreadable images and DICOM files, "
                                    "empty classes, the same image under two classes, patients on both sides of a given "
                                    "split, image sizes. The report is for this machine's terminal (it names files); "
                                    "nothing is sent and nothing is written unless --warm-cache. Exit 0 when the data is "
                                    "ready, 1 when it has problems, 2 when a task option is wrong.")
    p.add_argument("path", help="a folder with one sub-folder per class, a CSV manifest (path,label[,patient_id][,split]) "
                                "or a .npz archive (images, labels[, patient_ids][, split])")
    p.add_argument("--format", "--data-format", dest="data_format", default="auto", choices=FORMATS,
                   help="how PATH is laid out (default: detected from the path)")
    add_task_arguments(p)
    p.add_argument("--allow-odd-sizes", action="store_true", help="non-square or small images are warnings, not problems")
    p.add_argument("--skip-unreadable", type=share_of_files, default=0.0, metavar="SHARE",
                   help="the node config's skip-unreadable: up to this share of the files may be unreadable or missing "
                        "(the ClientApp skips them; warnings here); default 0: any such file is a problem")
    p.add_argument("--cache-dir", default=None, help="the node config's cache-dir (where the decoded images are cached)")
    p.add_argument("--warm-cache", action="store_true",
                   help="also write the decoded image cache (0600 files in a 0700 folder under --cache-dir, default "
                        "~/.cache/hospitrust/images), so the first round does not decode; without it nothing is written")
    p.add_argument("--privacy-ledger", default=None, help="the node config's privacy-ledger (default: "
                   "$HOSPITRUST_PRIVACY_LEDGER, else ~/.local/share/hospitrust/privacy-ledger.json)")
    p.add_argument("--privacy-max-epsilon", type=float, default=None, help="the node config's privacy-max-epsilon: "
                   "also print what is left of it")
    p.add_argument("--policy", metavar="PATH", help="also print what this site policy allows (deploy supernode --policy)")
    p.set_defaults(func=cmd_data_check)


__all__ = ["add_data_parser", "cmd_data_check", "share_of_files"]

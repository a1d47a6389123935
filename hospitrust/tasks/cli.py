"""Command-line options that name a task (``--task FILE``, ``--classes``, ``--dataset``), shared by
``hospitrust data check``, ``hospitrust deploy supernode`` and ``hospitrust task export``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hospitrust.tasks.task import Task


def add_task_arguments(parser: argparse.ArgumentParser, *, dataset_default: str = "pneumoniamnist") -> None:
    """Add the options that say which task a command checks or writes for.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    dataset_default : str
        The built-in task used when neither ``--task`` nor ``--classes`` is given.
    """
    group = parser.add_argument_group("task (what the federation learns; the consortium tells you)")
    group.add_argument("--task", metavar="FILE", help="the federation's task file (TOML), as the consortium ships it")
    group.add_argument("--classes", help="the task's class names in label order, comma-separated (instead of --task)")
    group.add_argument("--channels", type=int, default=0, help="with --classes: 1 (grey, default) or 3 (RGB)")
    group.add_argument("--dataset", default=dataset_default,
                       help=f"a built-in task by dataset flag (default {dataset_default}), when neither --task nor "
                            "--classes is given")
    group.add_argument("--image-size", type=int, default=None,
                       help="the task's image size (default: the task file's, else 28)")


def task_from_args(args: argparse.Namespace) -> Task:
    """The task the options name, resolved as a run would resolve it (ConfigError naming what is wrong).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options of :func:`add_task_arguments`.

    Returns
    -------
    Task
        The resolved task.
    """
    from types import SimpleNamespace

    from hospitrust.errors import ConfigError
    from hospitrust.options import OptionsError
    from hospitrust.tasks.task import RUN_DEFAULTS, TaskOptions, resolve_task

    if args.task and args.classes:
        raise ConfigError("give either --task or --classes, not both")
    section: dict[str, object] = {}
    if args.task:
        section["file"] = str(Path(args.task).expanduser().resolve())
    elif args.classes:
        section["classes"] = args.classes
        if args.channels:
            section["channels"] = args.channels
    try:
        options = TaskOptions.from_flat(section)
    except OptionsError as err:
        raise ConfigError(f"invalid task options: {err}") from None
    if args.image_size is not None and not 8 <= args.image_size <= 1024:  # as the run config's image-size
        raise ConfigError(f"image-size {args.image_size}: expected 8 to 1024 pixels")
    # a task alone, without a run's strategy or attack: resolved as a run would, without the run config
    cfg = SimpleNamespace(task=options, dataset=args.dataset, model=RUN_DEFAULTS["model"],
                          image_size=args.image_size if args.image_size is not None else RUN_DEFAULTS["image-size"])
    return resolve_task(cfg)

"""Every ``hospitrust`` command, registered here and nowhere else.

A command is a module with a function that adds its parser (or its group of parsers) to the
``hospitrust`` subparsers. Building the parser imports every command module, so a command module
imports only the standard library and argparse helpers at module level; what a command runs
(torch, Flower, the run config) it imports inside its handler. ``hospitrust --help`` therefore
loads neither torch nor Flower (``tests/test_cli.py`` checks it through ``sys.modules``).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A top-level command (or a group, such as ``deploy``) and where its parser is built."""

    names: tuple[str, ...]  # the subcommands the adder registers, in the order of `hospitrust --help`
    module: str  # the command module, imported when the parser is built
    adder: str = "add_parser"  # its function that adds the parser(s) to the subparsers


COMMANDS: tuple[Command, ...] = (
    Command(("simulate",), "hospitrust.cli.simulate"),
    Command(("reference",), "hospitrust.cli.reference", "add_reference_parser"),
    Command(("doctor",), "hospitrust.cli.doctor"),
    Command(("console",), "hospitrust.cli.console"),
    Command(("config",), "hospitrust.cli.config"),
    Command(("checkpoint",), "hospitrust.cli.checkpoint"),
    Command(("deploy",), "hospitrust.cli.deploy", "add_deploy_parser"),
    Command(("app",), "hospitrust.cli.deploy", "add_app_parser"),
    Command(("data",), "hospitrust.cli.data", "add_data_parser"),
    Command(("task",), "hospitrust.cli.export", "add_task_parser"),
    Command(("unlearn",), "hospitrust.cli.fbd", "add_unlearn_parser"),
    Command(("bench", "report", "bench-archive"), "hospitrust.cli.bench", "add_bench_parsers"),
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add every registered command's parser to ``sub``."""
    for command in COMMANDS:
        getattr(importlib.import_module(command.module), command.adder)(sub)

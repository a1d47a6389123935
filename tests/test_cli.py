"""The ``hospitrust`` command: every command registered once in ``hospitrust.cli.registry``, and
the help of every command built without torch or Flower (a command imports what it runs when it runs)."""

from __future__ import annotations

import subprocess
import sys

from hospitrust.cli.main import build_parser
from hospitrust.cli.registry import COMMANDS

HEAVY = ("torch", "torchvision", "flwr")


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)


def test_every_command_comes_from_the_registry_once():
    registered = [name for command in COMMANDS for name in command.names]
    assert len(registered) == len(set(registered))
    assert _subcommands() == registered


def test_help_of_every_command_imports_neither_torch_nor_flower():
    """``hospitrust --help`` and ``hospitrust COMMAND --help`` for every command, in one fresh
    interpreter: after all of them, none of torch, torchvision or flwr is in ``sys.modules``."""
    code = (
        "import contextlib, io, sys\n"
        "from hospitrust.cli.main import main\n"
        "from hospitrust.cli.registry import COMMANDS\n"
        "for argv in (['--help'], *[[name, '--help'] for c in COMMANDS for name in c.names]):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as exc:\n"
        "            assert exc.code == 0, (argv, exc.code)\n"
        "    assert 'usage: hospitrust' in out.getvalue(), argv\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_the_command_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert all(name in res.stdout for c in COMMANDS for name in c.names)

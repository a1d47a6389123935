"""``deploy supernode --launcher flower``: Flower's SuperNode as a child, started again while it cannot connect.

The real case (a SuperNode restarted 20 s after a kill -9, refused by the SuperLink with exit code 305 until its
old session's heartbeats lapse) is the load benchmark's churn mode (docs/experiments/2026-12-06-many-hospitals.md);
here a stand-in command plays the exit codes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hospitrust.cli import deploy


def _stand_in(tmp_path: Path, codes: list[int]) -> list[str]:
    """A command that exits with the next of ``codes`` each time it is started (its starts counted in a file); as
    with Flower's ``sys.exit(305)``, the parent sees the low 8 bits (49)."""
    script = tmp_path / "supernode.py"
    script.write_text(
        "import pathlib, sys\n"
        f"count = pathlib.Path({str(tmp_path / 'starts')!r})\n"
        "n = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(n + 1))\n"
        f"sys.exit({codes!r}[min(n, {len(codes) - 1})])\n")
    return [sys.executable, str(script)]


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(deploy, "REFUSED_PAUSE_SECONDS", 0.05)


def test_a_refused_supernode_is_started_again_until_it_connects(tmp_path, quick, capsys):
    cmd = _stand_in(tmp_path, [305, 305, 0])
    assert deploy.run_flower_supernode(cmd, dry_run=False) == 0
    assert (tmp_path / "starts").read_text() == "3"
    err = capsys.readouterr().err
    assert err.count("could not connect (Flower's exit code 305") == 2 and "starting it again in 0.05 s" in err


def test_another_exit_code_is_its_own_and_not_retried(tmp_path, quick):
    assert deploy.run_flower_supernode(_stand_in(tmp_path, [3]), dry_run=False) == 3
    assert (tmp_path / "starts").read_text() == "1"


def test_it_gives_up_after_the_retry_window(tmp_path, quick, monkeypatch, capsys):
    monkeypatch.setattr(deploy, "REFUSED_RETRY_SECONDS", 0.3)
    assert deploy.run_flower_supernode(_stand_in(tmp_path, [305]), dry_run=False) == 305 % 256
    assert int((tmp_path / "starts").read_text()) >= 2
    assert "could not connect for 0.3 s (Flower's exit code 305): giving up" in capsys.readouterr().err


def test_a_missing_flower_is_named_and_a_dry_run_starts_nothing(tmp_path, capsys):
    from hospitrust.errors import DeployError

    with pytest.raises(DeployError, match="no-such-flower-supernode not found on PATH"):
        deploy.run_flower_supernode(["no-such-flower-supernode"], dry_run=False)
    assert deploy.run_flower_supernode(_stand_in(tmp_path, [0]), dry_run=True) == 0
    assert not (tmp_path / "starts").exists() and "$ " in capsys.readouterr().out

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
    """A command that plays the next of ``codes`` each time it is started (its starts counted in a file): 305 as
    Flower 1.42's flower-supernode does when it cannot connect (it logs ``Exit Code: 305`` and exits with 1), any
    other code as its exit status."""
    script = tmp_path / "supernode.py"
    script.write_text(
        "import pathlib, sys\n"
        f"count = pathlib.Path({str(tmp_path / 'starts')!r})\n"
        "n = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(n + 1))\n"
        f"code = {codes!r}[min(n, {len(codes) - 1})]\n"
        "if code == 305:\n"
        "    print('ERROR :     Exit Code: 305\\nFailed to initialize the connection to the SuperLink.\\n"
        "[code: 2004] Failed to activate SuperNode.', flush=True)\n"
        "    sys.exit(1)\n"
        "sys.exit(code)\n")
    return [sys.executable, str(script)]


def _run(cmd: list[str], retry_seconds: float = 90.0) -> tuple[int, str, str]:
    """``run_flower_supernode`` in a process of its own (it makes its process a child subreaper and ends what the
    SuperNode leaves behind: not a pytest worker's business), with a 0.05 s pause between starts."""
    import subprocess

    code = ("import sys; from hospitrust.cli import deploy; deploy.REFUSED_PAUSE_SECONDS = 0.05; "
            f"deploy.REFUSED_RETRY_SECONDS = {retry_seconds!r}; "
            f"sys.exit(deploy.run_flower_supernode({cmd!r}, dry_run=False))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return res.returncode, res.stdout, res.stderr


def test_a_refused_supernode_is_started_again_until_it_connects(tmp_path):
    rc, out, err = _run(_stand_in(tmp_path, [305, 305, 0]))
    assert rc == 0, out + err
    assert (tmp_path / "starts").read_text() == "3"
    assert out.count("Failed to activate SuperNode") == 2  # its output passed through
    assert out.count("could not connect (Flower's exit code 305") == 2 and "starting it again in 0.05 s" in out


def test_another_exit_code_is_its_own_and_not_retried(tmp_path):
    assert _run(_stand_in(tmp_path, [3]))[0] == 3 and (tmp_path / "starts").read_text() == "1"
    # exit status 1 without Flower's "Exit Code: 305" line: another error, returned at once
    assert _run(_stand_in(tmp_path, [1]))[0] == 1 and (tmp_path / "starts").read_text() == "2"


def test_it_gives_up_after_the_retry_window(tmp_path):
    rc, out, err = _run(_stand_in(tmp_path, [305]), retry_seconds=0.3)
    assert rc == 1
    assert int((tmp_path / "starts").read_text()) >= 2
    assert "could not connect for 0.3 s (Flower's exit code 305): giving up" in out


def test_a_missing_flower_is_named_and_a_dry_run_starts_nothing(tmp_path, capsys):
    from hospitrust.errors import DeployError

    with pytest.raises(DeployError, match="no-such-flower-supernode not found on PATH"):
        deploy.run_flower_supernode(["no-such-flower-supernode"], dry_run=False)
    assert deploy.run_flower_supernode(_stand_in(tmp_path, [0]), dry_run=True) == 0
    assert not (tmp_path / "starts").exists() and "$ " in capsys.readouterr().out


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_the_supernode_dies_with_the_command_and_leaves_nothing_behind(tmp_path):
    """A kill -9 of ``deploy supernode`` ends its SuperNode (the churn runs killed the command's process group and
    expect the SuperNode gone); a process the SuperNode leaves behind when it exits (Flower's superexec) is ended."""
    import os
    import signal
    import subprocess

    # a stand-in SuperNode that starts a child of its own (its "superexec") and then waits forever
    sn = tmp_path / "sn.py"
    sn.write_text(
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(tmp_path / 'pids')!r}).write_text(f'{{__import__(\"os\").getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n")
    wrapper = subprocess.Popen([sys.executable, "-c", "import sys; from hospitrust.cli import deploy; "
                                f"sys.exit(deploy.run_flower_supernode([sys.executable, {str(sn)!r}], dry_run=False))"],
                               start_new_session=True)
    try:
        assert _wait_for(lambda: (tmp_path / "pids").exists() and " " in (tmp_path / "pids").read_text())
        supernode, superexec = map(int, (tmp_path / "pids").read_text().split())
        os.kill(wrapper.pid, signal.SIGKILL)  # the command alone, not its group
        assert _wait_for(lambda: not _alive(supernode)), "the SuperNode outlived its command"
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL) if _alive(wrapper.pid) else None
    # its own child: with the SuperNode gone it is an orphan of the init system here (the command that would have
    # reaped it was killed first); ended by hand so the test leaves nothing
    if _alive(superexec):
        os.kill(superexec, signal.SIGKILL)

    # the SuperNode exits by itself: what it left behind is ended by the command
    (tmp_path / "pids").unlink()
    sn.write_text(
        "import pathlib, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(tmp_path / 'pids')!r}).write_text(str(child.pid))\n"
        "sys.exit(0)\n")
    assert _run([sys.executable, str(sn)])[0] == 0
    leftover = int((tmp_path / "pids").read_text())
    assert _wait_for(lambda: not _alive(leftover), timeout=15), "the SuperNode's leftover process was not ended"

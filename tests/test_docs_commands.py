"""Every command the manual shows (README.md, docs/*.md, docs/rules/*.md) runs, at a tiny budget, as the reader copies it.

The commands come from the pages' ```bash fences and the docs-test markers above them
(tests/docs_commands.py says the syntax). Each page runs in a temporary copy of the repository, its commands
in the page's order (a later command may use what an earlier one made, as the reader's would), with the
README's environment: HOSPITRUST_DATA_DIR as the tests have it, FLWR_HOME, HOME and the XDG folders in the
temporary folder. The commands and the exemptions are printed at the end of the pytest run.

Marker ``docs`` (left out of the default run; `python -m pytest -q -m docs` runs it, .ci/run does after the
suite). The marker check (test_docs_markers_are_well_formed) is cheap and runs in the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import DATA_DIR, REPO
from docs_commands import RUN_CONFIG_FLAGS, SHELL_LANGS, Command, commands, fences, scope, unmarked_problems
from hospitrust.ops import flwr

COMMAND_LIMIT = 300.0  # s per command: the exemption's 60 s on an idle machine, with room for a loaded one (load 15: 170 s)
READY_LIMIT = 120.0
# (where, "ran" / "exempt", seconds, the command, the exemption): the page's, handed to conftest.py in its report
Records = list[tuple[str, str, float, str, str]]
_IGNORE = shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                                 "*.egg-info", "shared", "node_modules")


def test_docs_markers_are_well_formed():
    """Every marker parses, every exemption has a reason of the fixed list, no command hides outside a shell fence."""
    problems = []
    for page in scope():
        problems += unmarked_problems(page)
        commands(page)  # raises MarkerError naming the page, the line and what is wrong
    assert not problems, "\n".join(problems)


README_LIMIT = 250  # lines: the README is the manual's front page (install, the two commands, the roles, links)


def test_readme_is_a_short_manual():
    """README.md keeps to README_LIMIT lines; the details live on docs/ pages it links to."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_LIMIT, (f"README.md has {len(lines)} lines, at most {README_LIMIT}: move a section to a "
                                        "page under docs/ (keep its commands and their docs-test markers) and link it")
    links = {m for m in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines))}
    missing = sorted(link for link in links if not (REPO / link).exists())
    assert not missing, f"README.md links to pages that are not there: {missing}"


def _environment(work: Path) -> dict[str, str]:
    home = work / ".home"
    env = {**os.environ, "HOSPITRUST_DATA_DIR": str(DATA_DIR), "FLWR_HOME": str(home / ".flwr"), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local" / "share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PYTHONUNBUFFERED": "1"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if sys.prefix != sys.base_prefix:  # the reader's venv is active (deployment.md's service file uses $VIRTUAL_ENV)
        env["VIRTUAL_ENV"] = sys.prefix
    for n in range(1, 5):  # free ports a marker's values may use ($PORT1 ...)
        env[f"PORT{n}"] = str(flwr.free_port())
    return env


def _ready(check: str, log: Path) -> bool:
    kind, _, what = check.partition(":")
    if kind == "port":
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", int(what))) == 0
    if kind == "url":
        try:
            urllib.request.urlopen(what, timeout=3)
            return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False
    return what in log.read_text(errors="replace")


def _run(cmd: Command, work: Path, env: dict[str, str], kept: list, records: Records) -> None:
    for setup in cmd.setup:
        res = subprocess.run(["bash", "-o", "pipefail", "-c", setup], cwd=work, env=env, capture_output=True, text=True,
                             timeout=COMMAND_LIMIT)
        assert res.returncode == 0, f"{cmd.where}: setup `{setup}` failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    text = cmd.runnable()
    log = work / ".logs" / f"{cmd.line}-{cmd.index}.log"
    started = time.monotonic()
    if cmd.server:
        proc = flwr.start(cmd.where, ["bash", "-c", text], env=env, cwd=work, log_file=log)
        checks = list(cmd.server)
        for n in range(4, 0, -1):
            checks = [c.replace(f"$PORT{n}", env[f"PORT{n}"]) for c in checks]
        deadline = started + READY_LIMIT
        while not all(_ready(c, log) for c in checks):
            assert proc.popen.poll() is None, f"{cmd.where}: `{text}` exited with {proc.popen.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{cmd.where}: `{text}` not ready ({cmd.server}) in {READY_LIMIT:.0f} s:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
        records.append((cmd.where, "ran", time.monotonic() - started, text + f"   [server: ready, {'kept to the page end' if cmd.keep else 'stopped'}]", ""))
        if cmd.keep:
            kept.append(proc)
        else:
            proc.stop()
        return
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", text], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=COMMAND_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(f"{cmd.where}: `{text}` still running after {COMMAND_LIMIT:.0f} s:\n{log.read_text()[-4000:]}", pytrace=False)
    seconds = time.monotonic() - started
    records.append((cmd.where, "ran", seconds, text, ""))
    assert rc == 0, f"{cmd.where}: `{text}` exited with {rc} after {seconds:.0f} s:\n{log.read_text()[-6000:]}"


def _pages() -> list[str]:
    """The pages with shell fences, those with the most simulations and grids first (two workers then finish
    close together; tests/conftest.py runs the pages that share a fixed port on one worker)."""
    pages = []
    for path in scope():
        if any(f.lang in SHELL_LANGS for f in fences(path)):
            runs = sum(1 for c in commands(path) if not c.exempt
                       and (c.program() in RUN_CONFIG_FLAGS or c.program() == ("hospitrust", "bench")))
            pages.append((-runs, str(path.relative_to(REPO))))
    return [page for _, page in sorted(pages)]


@pytest.mark.docs
@pytest.mark.parametrize("page", _pages())
def test_docs_commands(page, tmp_path, data_dir, request):
    cmds = commands(REPO / page)
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=_IGNORE, symlinks=True)
    env = _environment(tmp_path)
    kept: list = []
    records: Records = []
    request.node.user_properties.append(("docs-records", records))  # filled as the page runs; read from its report
    try:
        for cmd in cmds:
            if cmd.exempt:
                records.append((cmd.where, "exempt", 0.0, cmd.text, cmd.exempt))
                continue
            _run(cmd, work, env, kept, records)
    finally:
        for proc in reversed(kept):
            proc.stop()

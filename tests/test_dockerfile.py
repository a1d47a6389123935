"""The Docker images build from their context, checked without a Docker daemon: the wheel that the Dockerfile's
`pip install .` builds is built here from exactly the files its COPY lines take from the build context, after
Dockerfile.dockerignore (the image once failed with `Forced include not found: .../tasks`: pyproject.toml
force-includes tasks/, which was not copied). The SuperNode target and the compose service pass `--task`.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "deploy" / "docker"


def _segments(pattern: str) -> str:
    """A .dockerignore pattern (Go filepath.Match, plus ``**`` for any number of folders) as a regex."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):  # any number of folders, none included
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        ch = pattern[i]
        out += "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch)
        i += 1
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders decides; ``!`` keeps."""
    parts = path.split("/")
    result = False
    for raw in patterns:
        keep = raw.startswith("!")
        pattern = raw[1:] if keep else raw
        regex = re.compile(_segments(pattern.strip("/")) + r"\Z")
        if any(regex.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            result = not keep
    return result


def _dockerignore() -> list[str]:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


def _context_files() -> list[str]:
    """The files Docker would send as the build context (the repository root, after the ignore file)."""
    patterns = _dockerignore()
    files = []
    for f in REPO.rglob("*"):
        rel = f.relative_to(REPO).as_posix()
        if f.is_file() and not rel.startswith(".git/") and not ignored(rel, patterns):
            files.append(rel)
    return sorted(files)


def _copies(stage: str = "base") -> list[tuple[list[str], str]]:
    """The COPY lines of ``stage`` that take files from the build context: (sources, destination)."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    current, out = None, []
    for line in text.splitlines():
        words = shlex.split(line, comments=True) if line.strip() and not line.lstrip().startswith("#") else []
        if not words:
            continue
        if words[0].upper() == "FROM":
            current = words[-1] if len(words) >= 4 and words[-2].upper() == "AS" else None
        elif words[0].upper() == "COPY" and current == stage:
            args = [w for w in words[1:] if not w.startswith("--")]
            assert not any(w.startswith("--from") for w in words), line
            out.append((args[:-1], args[-1]))
    return out


def stage_context(into: Path) -> Path:
    """WORKDIR /app as the Dockerfile's COPY lines fill it from the context."""
    context = set(_context_files())
    app = into / "app"
    app.mkdir(parents=True)
    copies = _copies()
    assert copies, "no COPY in the base stage"
    for sources, dest in copies:
        for src in sources:
            if src in context:  # a file
                target = app / dest / Path(src).name if dest.endswith("/") or dest == "." else app / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / src, target)
                continue
            below = [f for f in context if f.startswith(src.rstrip("/") + "/")]
            assert below, f"COPY {src}: nothing in the build context (Dockerfile.dockerignore leaves it out?)"
            for f in below:  # a folder: its contents go to dest
                target = app / dest / Path(f).relative_to(src.rstrip("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / f, target)
    return app


def test_the_ignore_rules_read_as_docker_reads_them():
    patterns = ["**", "!pyproject.toml", "!hospitrust/**", "**/__pycache__", "**/*.pyc"]
    assert not ignored("pyproject.toml", patterns) and not ignored("hospitrust/cli/main.py", patterns)
    assert ignored("tests/test_x.py", patterns) and ignored("tasks/chest-xray.toml", patterns)
    assert ignored("hospitrust/__pycache__/x.cpython-311.pyc", patterns) and ignored("hospitrust/a.pyc", patterns)


@pytest.mark.slow
def test_the_wheel_builds_from_exactly_what_the_dockerfile_copies(tmp_path):
    app = stage_context(tmp_path)
    assert (app / "pyproject.toml").is_file() and (app / "hospitrust" / "cli" / "main.py").is_file()
    assert not (app / "tests").exists() and not list(app.rglob("__pycache__"))
    # what `RUN pip install .` does first: build the wheel (its build backend from PyPI, as in the image)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path / "dist"), str(app)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hospitrust-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # the packaged Flower app: its pyproject.toml and the task files the bundle carries
    assert {"hospitrust/_app/pyproject.toml", "hospitrust/_app/tasks/chest-xray.toml", "hospitrust/cli/main.py"} <= names
    tasks = {f"hospitrust/_app/tasks/{p.name}" for p in (REPO / "tasks").glob("*.toml")}
    assert tasks <= names, tasks - names


def test_the_supernode_image_and_compose_pass_the_task():
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    supernode = text.split("FROM base AS supernode", 1)[1].split("FROM ", 1)[0]
    entry = re.search(r"ENTRYPOINT (\[.*?\])", supernode).group(1)
    import json

    words = json.loads(entry)
    assert words[words.index("--task") + 1] == "/etc/hospitrust/task.toml", words
    compose = (DOCKER / "compose.yaml").read_text()
    assert re.search(r"^\s+- \$\{HOSPITAL_TASK:\?[^}]*\}:/etc/hospitrust/task.toml:ro", compose, flags=re.M), compose
    assert "restart: on-failure:5" in compose  # a failed data check (exit 3) is not restarted forever

"""``hospitrust bench-archive``: a grid folder's finished cells packed into one .tar.xz and unpacked
into a new folder that the results store, the leaderboard and the resume check read as the original."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from hospitrust.bench.archive import MARKER, pack, slim_round, unpack
from hospitrust.bench.grid import parse_grid
from hospitrust.bench.runner import run_grid
from hospitrust.cli.main import main
from hospitrust.bench.store import collect

REPO = Path(__file__).resolve().parent.parent
GRID = """
[grid]
name = "archive-tiny"
backend = "inprocess"
workers = 2
hospitals = 3
aggregation-backend = "eager"

[base]
dataset = "pneumoniamnist"
num-server-rounds = 2
local-epochs = 1
train-subsample = 0.02
reference-cohort-per-class = 5
checkpoint = false

[axes]
strategy = ["fedavg", "median"]
attack = ["none"]
seed = [1]
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "hospitrust.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def grid(tmp_path_factory, _medmnist_problem) -> tuple[Path, Path]:
    """A tiny grid file and its finished grid folder (two cells)."""
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    root = tmp_path_factory.mktemp("archive")
    grid_file = root / "tiny.toml"
    grid_file.write_text(GRID)
    res = _cli("bench", str(grid_file), "--out", str(root / "grid"), cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
    return grid_file, root / "grid"


def _frames_equal(a: Path, b: Path) -> None:
    rounds_a, cells_a, clients_a = collect(a)
    rounds_b, cells_b, clients_b = collect(b)
    assert len(cells_a) == 2 and len(rounds_a) == 4 and len(clients_a) == 12
    pd.testing.assert_frame_equal(cells_a, cells_b)
    pd.testing.assert_frame_equal(rounds_a, rounds_b)
    pd.testing.assert_frame_equal(clients_a, clients_b)


def test_pack_unpack_keeps_the_store_leaderboard_and_resume(grid, tmp_path):
    grid_file, out = grid
    archive = tmp_path / "part.tar.xz"
    cells, size = pack(out, archive)
    assert cells == 2 and size == archive.stat().st_size
    # deterministic: the same folder packs to the same bytes
    first = archive.read_bytes()
    pack(out, tmp_path / "again.tar.xz")
    assert (tmp_path / "again.tar.xz").read_bytes() == first
    # only what is read: no server.log, progress.jsonl, logs/, per-client timing
    with tarfile.open(archive, "r:xz") as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert {n.split("/")[-1] for n in names} == {MARKER, "grid.json", "grid.toml", "bench.jsonl", "config.json",
                                                  "summary.json", "rounds.jsonl"}
    assert size < sum(p.stat().st_size for p in (out / "cells").rglob("*") if p.is_file())

    new = tmp_path / "unpacked"
    assert unpack(archive, new) == 2
    _frames_equal(out, new)

    assert main(["report", "--leaderboard", str(new), "--resamples", "200"]) == 0
    assert "| fedavg |" in (new / "leaderboard" / "leaderboard.md").read_text()

    lines: list[str] = []
    again = run_grid(parse_grid(grid_file), new, progress=lines.append, build_store=False)
    assert (again.ran, again.skipped_done, again.done) == (0, 2, 2), lines


def test_a_cell_left_out_of_the_archive_is_run_on_resume(grid, tmp_path):
    grid_file, out = grid
    archive = tmp_path / "part.tar.xz"
    pack(out, archive)
    dropped = "strategy=median__attack=none__seed=1"
    with tarfile.open(archive, "r:xz") as src, tarfile.open(tmp_path / "less.tar.xz", "w:xz") as dst:
        for info in src.getmembers():
            if f"cells/{dropped}/" not in info.name:
                dst.addfile(info, src.extractfile(info))
    new = tmp_path / "resumed"
    unpack(tmp_path / "less.tar.xz", new)
    assert sorted(p.name for p in (new / "cells").iterdir()) == ["strategy=fedavg__attack=none__seed=1"]
    lines: list[str] = []
    res = run_grid(parse_grid(grid_file), new, progress=lines.append, build_store=False)
    assert (res.ran, res.skipped_done, res.done, res.failed) == (1, 1, 2, 0), lines
    assert (new / "cells" / dropped / "summary.json").is_file()
    _, cells, _ = collect(new)
    assert list(cells["status"]) == ["done", "done"]


def test_slim_round_keeps_what_collect_reads():
    rec = {"round": 3, "central": {"accuracy": 0.5}, "detection": {"tpr": 1.0}, "fairness": {"min": 0.1},
           "round_seconds": 2.0, "aggregation_seconds": 0.1, "kept_previous_model": True,
           "hospital_accuracy": {"h0": 0.7}, "timing": {"finished_at": 10.0, "fit_seconds": 1.0},
           "parameters_digest": "x", "clients": [{"hospital": "h0", "malicious": True, "trust": 0.2,
                                                  "timing": {"fit": 1.0}, "num_examples": 5}]}
    assert slim_round(rec) == {"round": 3, "central": {"accuracy": 0.5}, "detection": {"tpr": 1.0},
                               "fairness": {"min": 0.1}, "round_seconds": 2.0, "aggregation_seconds": 0.1,
                               "kept_previous_model": True, "hospital_accuracy": {"h0": 0.7},
                               "timing": {"finished_at": 10.0},
                               "clients": [{"hospital": "h0", "malicious": True, "trust": 0.2}]}


def test_errors_name_what_is_wrong(tmp_path):
    (tmp_path / "plain").mkdir()
    res = _cli("bench-archive", "pack", str(tmp_path / "plain"), str(tmp_path / "a.tar.xz"), cwd=tmp_path)
    assert res.returncode == 2 and "is not a grid folder: it has no grid.json" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    (tmp_path / "not.tar.xz").write_text("hello")
    res = _cli("bench-archive", "unpack", str(tmp_path / "not.tar.xz"), str(tmp_path / "x"), cwd=tmp_path)
    assert res.returncode == 2 and "is not a grid archive" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # a .tar.xz of something else
    with tarfile.open(tmp_path / "other.tar.xz", "w:xz") as tar:
        info = tarfile.TarInfo("notes.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    res = _cli("bench-archive", "unpack", str(tmp_path / "other.tar.xz"), str(tmp_path / "x"), cwd=tmp_path)
    assert res.returncode == 2 and f"it has no {MARKER}" in res.stderr
    # a member that would land outside the folder
    with tarfile.open(tmp_path / "evil.tar.xz", "w:xz") as tar:
        for name in ("../escape.json", MARKER, "grid.json"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    res = _cli("bench-archive", "unpack", str(tmp_path / "evil.tar.xz"), str(tmp_path / "x"), cwd=tmp_path)
    assert res.returncode == 2 and "'../escape.json' is not a plain file inside the grid folder" in res.stderr
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "x").exists()
    # never over an existing folder's files
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    meta = json.dumps({"format": 1, "finished_cells": []}).encode()
    with tarfile.open(tmp_path / "ok.tar.xz", "w:xz") as tar:
        for name, data in ((MARKER, meta), ("grid.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    res = _cli("bench-archive", "unpack", str(tmp_path / "ok.tar.xz"), str(tmp_path / "full"), cwd=tmp_path)
    assert res.returncode == 2 and "is not a new or empty folder" in res.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"

"""A grid folder's finished cells in one small, deterministic ``.tar.xz`` (grids across sessions).

A grid folder (``hospitrust bench --out``) is git-ignored and about 370 KB per cell; a session that
ends loses it. ``pack`` keeps what the results store, the report, the leaderboard and the resume
check read, and nothing else:

- ``grid.json``, ``grid.toml``, ``bench.jsonl`` (cell events) and ``failed/*.json``;
- per finished cell (``cells/<cell>/summary.json`` there): ``config.json``, ``summary.json`` and
  ``rounds.jsonl`` slimmed to the fields :func:`hospitrust.bench.store.collect` reads (see ``ROUND_KEYS``,
  ``CLIENT_KEYS``, ``SIGNAL_KEYS``; of ``timing`` only ``finished_at``, which the rounds' periods are computed from).

Unfinished cells are left out: ``hospitrust bench`` runs them again after ``unpack``. Members are sorted,
with fixed times, owners and modes, so packing an unchanged folder gives the same bytes (git stores it once).
"""

from __future__ import annotations

import io
import json
import lzma
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

MARKER = "hospitrust-grid-archive.json"
FORMAT = 1
# the fields of a rounds.jsonl record that collect (and so the report and the leaderboard) reads
ROUND_KEYS = ("round", "central", "detection", "fairness", "round_seconds", "aggregation_seconds",
              "kept_previous_model", "hospital_accuracy")
CLIENT_KEYS = ("hospital", "malicious", "selected", "rejected", "flagged", "weight", "trust", "reputation",
               "update_norm", "reason")
# the rule signals of a hospital record (schema 2: under ``signals``) that collect reads
SIGNAL_KEYS = ("reputation",)
TOP_FILES = ("grid.json", "grid.toml", "bench.jsonl")
CELL_FILES = ("config.json", "summary.json")


class ArchiveError(ValueError):
    """A folder that is not a grid folder, or a file that is not a grid archive."""


def slim_round(rec: dict[str, Any]) -> dict[str, Any]:
    """One rounds.jsonl record with only what collect reads."""
    out = {k: rec[k] for k in ("schema", *ROUND_KEYS) if k in rec}
    finished_at = (rec.get("timing") or {}).get("finished_at")
    if finished_at is not None:
        out["timing"] = {"finished_at": finished_at}
    if "clients" in rec:
        out["clients"] = [_slim_client(c) for c in rec.get("clients") or []]
    return out


def _slim_client(entry: dict[str, Any]) -> dict[str, Any]:
    """A hospital record with only what collect reads (schema 2: its signals kept where collect reads one)."""
    out = {k: entry[k] for k in CLIENT_KEYS if k in entry}
    if "signals" in entry:
        signals = {source: {k: v for k, v in values.items() if k in SIGNAL_KEYS} for source, values in entry["signals"].items()}
        out["signals"] = {source: values for source, values in signals.items() if values}
    return out


def _slim_rounds(cell: Path) -> bytes:
    """The cell's rounds.jsonl, each line slimmed as written (its keys as on disk: the raw schema view)."""
    from hospitrust.server_app.results import read_round_lines

    lines = [json.dumps(slim_round(line), separators=(",", ":")) for line in read_round_lines(cell)]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def members(grid_dir: str | Path) -> dict[str, bytes]:
    """Archive member name -> its bytes, for a grid folder (``ArchiveError`` if it is not one)."""
    grid_dir = Path(grid_dir)
    if not grid_dir.is_dir():
        raise ArchiveError(f"{grid_dir} is not a folder (give a grid folder: the --out folder of `hospitrust bench`)")
    if not (grid_dir / "grid.json").is_file():
        raise ArchiveError(f"{grid_dir} is not a grid folder: it has no grid.json (give the --out folder of `hospitrust bench`)")
    files: dict[str, bytes] = {}
    for name in TOP_FILES:
        if (grid_dir / name).is_file():
            files[name] = (grid_dir / name).read_bytes()
    if (grid_dir / "failed").is_dir():
        for p in sorted((grid_dir / "failed").glob("*.json")):
            files[f"failed/{p.name}"] = p.read_bytes()
    cells = sorted(p for p in (grid_dir / "cells").glob("*") if p.is_dir() and (p / "summary.json").is_file()) \
        if (grid_dir / "cells").is_dir() else []
    for cell in cells:
        for name in CELL_FILES:
            if (cell / name).is_file():
                files[f"cells/{cell.name}/{name}"] = (cell / name).read_bytes()
        if (cell / "rounds.jsonl").is_file():
            files[f"cells/{cell.name}/rounds.jsonl"] = _slim_rounds(cell)
    files[MARKER] = (json.dumps({"format": FORMAT, "finished_cells": [c.name for c in cells]}, indent=1) + "\n").encode()
    return files


def pack(grid_dir: str | Path, archive: str | Path) -> tuple[int, int]:
    """Write ``archive`` (.tar.xz) from ``grid_dir``; returns (finished cells, archive bytes)."""
    files = members(grid_dir)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    data = lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, archive)
    cells = len(json.loads(files[MARKER])["finished_cells"])
    return cells, len(data)


def _read(archive: Path) -> dict[str, bytes]:
    if not archive.is_file():
        raise ArchiveError(f"{archive} is not a file (give a .tar.xz written by `hospitrust bench-archive pack`)")
    try:
        with tarfile.open(archive, mode="r:xz") as tar:
            files: dict[str, bytes] = {}
            for info in tar.getmembers():
                path = PurePosixPath(info.name)
                if not info.isfile() or path.is_absolute() or ".." in path.parts:
                    raise ArchiveError(f"{archive} is not a grid archive: member {info.name!r} is not a plain file "
                                       "inside the grid folder")
                f = tar.extractfile(info)
                assert f is not None  # a regular file
                files[info.name] = f.read()
    except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
        raise ArchiveError(f"{archive} is not a grid archive (a .tar.xz written by `hospitrust bench-archive pack`): "
                           f"{exc}") from None
    if MARKER not in files or "grid.json" not in files:
        raise ArchiveError(f"{archive} is not a grid archive: it has no {MARKER} and grid.json "
                           "(write one with `hospitrust bench-archive pack`)")
    return files


def unpack(archive: str | Path, grid_dir: str | Path) -> int:
    """Write the archive's grid folder into ``grid_dir`` (new or empty); returns its finished cells."""
    archive, grid_dir = Path(archive), Path(grid_dir)
    files = _read(archive)
    if grid_dir.exists() and (not grid_dir.is_dir() or any(grid_dir.iterdir())):
        raise ArchiveError(f"{grid_dir} is not a new or empty folder: unpack a grid archive into a new folder")
    meta = json.loads(files.pop(MARKER))
    if meta.get("format") != FORMAT:
        raise ArchiveError(f"{archive}: grid archive format {meta.get('format')!r}, this hospitrust reads format {FORMAT}")
    for sub in ("cells", "failed"):
        (grid_dir / sub).mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        path = grid_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return len(meta.get("finished_cells", []))

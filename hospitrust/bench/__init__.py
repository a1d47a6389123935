"""The benchmark grid: ``hospitrust bench GRID.toml`` and ``hospitrust report GRID_DIR``.

- ``grid.py``      the grid file: axes, conditional settings, cell names, validation of every cell
- ``runner.py``    resumable, parallel execution with progress; failures on the record
- ``backends.py``  one cell in process (no Ray) or as a real Flower simulation (optionally on a Ray cluster)
- ``store.py``     results.csv / cells.csv / results.sqlite: a row per cell and round, with config columns
- ``report.py``    HTML (base64-embedded PNGs) and Markdown report with matplotlib figures
- ``stats.py``     the leaderboard's statistics: bootstrap CIs over seeds, paired differences, per-seed
  worst case, ranks, Friedman and Wilcoxon-Holm tests (pure functions on small tables)
- ``leaderboard.py`` ``hospitrust report --leaderboard``: one or several grid folders -> leaderboard.md + PNGs
"""

from __future__ import annotations

import importlib
from typing import Any

# loaded on first use: `hospitrust --help` builds the bench parsers without the run config and torch
_EXPORTS = {"Cell": "grid", "Grid": "grid", "GridError": "grid", "cell_name": "grid", "parse_grid": "grid",
            "BenchOutcome": "runner", "GridLocked": "runner", "cell_state": "runner", "run_grid": "runner"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"hospitrust.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'hospitrust.bench' has no attribute {name!r}")


__all__ = ["BenchOutcome", "Cell", "Grid", "GridError", "GridLocked", "cell_name", "cell_state", "parse_grid", "run_grid"]

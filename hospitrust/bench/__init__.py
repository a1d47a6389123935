"""The benchmark grid: ``hospitrust bench GRID.toml`` and ``hospitrust report GRID_DIR``.

- ``grid.py``      the grid file: axes, conditional settings, cell names, validation of every cell
- ``runner.py``    resumable, parallel execution with progress; failures on the record
- ``backends.py``  one cell in process (no Ray) or as a real Flower simulation (optionally on a Ray cluster)
- ``store.py``     results.csv / cells.csv / results.sqlite: a row per cell and round, with config columns
- ``report.py``    HTML (base64-embedded PNGs) and Markdown report with matplotlib figures
"""

from hospitrust.bench.grid import Cell, Grid, GridError, cell_name, parse_grid
from hospitrust.bench.runner import BenchOutcome, GridLocked, cell_state, run_grid

__all__ = ["BenchOutcome", "Cell", "Grid", "GridError", "GridLocked", "cell_name", "cell_state", "parse_grid", "run_grid"]

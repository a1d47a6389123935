"""The ServerApp Flower runs (``hospitrust.server_app:app``): the whole run is ``run_federation``."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from hospitrust.server_app.loop import run_federation

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_federation(grid, context)

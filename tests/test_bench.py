"""The benchmark grid: expansion and validation, the resumable runner (killed and restarted),
failures and --retry-failed, the results store and the report; the simulation backend on a
locally started Ray head (slow)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from hospitrust.bench import Cell, GridError, cell_state, parse_grid, run_grid
from hospitrust.bench.grid import validate_cells

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "benchmarks" / "smoke.toml"


def _grid(**tables) -> dict:
    base = {"grid": {"name": "t", "hospitals": 4}, "base": {"num-server-rounds": 1}}
    base.update(tables)
    return base


# ---- grid files ---------------------------------------------------------------------------------
def test_axes_tables_and_when_rules_expand_into_named_cells():
    grid = parse_grid(_grid(
        base={"assumed-malicious": "auto", "malicious-fraction": 0.25},
        axes={"strategy": ["fedavg", "krum"], "attack": ["none", "sign-flip"],
              "heterogeneity": [{"label": "iid", "partitioner": "iid"},
                                {"label": "dir0.1", "partitioner": "dirichlet", "dirichlet.alpha": 0.1}],
              "hospitals": [4, 8]},
        when=[{"if": {"attack": "none"}, "set": {"malicious-fraction": 0.0}},
              {"if": {"strategy": "krum", "hospitals": 4}, "skip": True}],
    ))
    # 2 x 2 x 2 x 2 = 16 combinations, 4 krum cells at 4 hospitals skipped
    assert len(grid.cells) == 12 and grid.skipped == 4
    by_name = {c.name: c for c in grid.cells}
    cell = by_name["strategy=krum__attack=sign-flip__heterogeneity=dir0.1__hospitals=8"]
    assert cell.run_config["partitioner"] == "dirichlet" and cell.run_config["dirichlet.alpha"] == 0.1
    assert cell.hospitals == 8 and cell.run_config["assumed-malicious"] == 2  # round(0.25 x 8)
    assert cell.run_config["run-name"] == cell.name
    clean = by_name["strategy=fedavg__attack=none__heterogeneity=iid__hospitals=4"]
    assert clean.run_config["malicious-fraction"] == 0.0 and clean.run_config["partitioner"] == "iid"
    assert clean.run_config["assumed-malicious"] == 1  # at least one
    assert clean.columns()["heterogeneity"] == "iid"


def test_cells_that_resolve_alike_run_once():
    grid = parse_grid(_grid(axes={"attack": ["none", "sign-flip"], "malicious-fraction": [0.25, 0.5]},
                            when=[{"if": {"attack": "none"}, "set": {"malicious-fraction": 0.0}}]))
    names = [c.name for c in grid.cells]
    assert names == ["attack=none__malicious-fraction=0.0", "attack=sign-flip__malicious-fraction=0.25",
                     "attack=sign-flip__malicious-fraction=0.5"]
    assert grid.duplicates == 1


@pytest.mark.parametrize("tables, expected", [
    ({"axes": {"strategy": ["fedavg", "no-such-rule"]}}, r"cell strategy=no-such-rule: .*unknown strategy 'no-such-rule'; allowed: .*krum"),
    ({"axes": {"learning-rte": [0.1]}}, r"unknown run config key 'learning-rte'; did you mean 'learning-rate'"),
    ({"axes": {"min-hospitals": [2, 6]}}, r"cell min-hospitals=6: min-hospitals = 6 but hospitals = 4"),
    ({"axes": {"het": [{"partitioner": "iid"}]}}, r"needs a `label`"),
    ({"axes": {"local-epochs": [1, 0]}}, r"cell local-epochs=0: .*local-epochs = 0"),
    ({"grid": {"name": "t", "backend": "ray"}}, r"backend = 'ray'; allowed: inprocess, simulation"),
    ({"when": [{"if": {"attack": "none"}}]}, r"needs `if` and `set` or `skip`"),
])
def test_bad_grids_fail_before_anything_runs(tables, expected):
    with pytest.raises(GridError, match="(?s)" + expected):
        parse_grid(_grid(**tables))


def test_shipped_grids_are_valid():
    smoke = parse_grid(SMOKE)
    assert len(smoke.cells) == 8 and smoke.backend == "inprocess"
    paper = parse_grid(REPO / "benchmarks" / "hta-paper.toml", validate=False)
    # 2 datasets x 5 heterogeneity regimes x 10 rules x (clean + 6 attacks x 3 fractions) x 3 seeds
    assert len(paper.cells) == 2 * 5 * 10 * 19 * 3
    assert {c.run_config["strategy"] for c in paper.cells} >= {"hta", "multi-krum", "fltrust", "fedagain", "earn", "fedprox"}
    assert validate_cells(paper.cells[::97]) == []  # a spread of cells, through parse_run_config
    data = tomllib.loads((REPO / "benchmarks" / "full.toml").read_text())
    assert data["axes"]["hospitals"] == [5, 10, 20]


# ---- running a grid -----------------------------------------------------------------------------
def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]


def _png_ok(data: bytes) -> tuple[int, int]:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.verify()
    assert img.format == "PNG"
    return img.size


def test_a_cell_that_finished_as_the_bench_was_killed_is_logged_on_the_next_start(tmp_path):
    """The worker wrote the cell's summary, the parent was killed before logging it: the next
    start logs it (late, without timing), so the event log still has every finished cell."""
    grid = parse_grid(SMOKE)
    out = tmp_path / "smoke"
    for cell in grid.cells:  # every cell finished; only the first one's event made it
        (out / "cells" / cell.name).mkdir(parents=True)
        (out / "cells" / cell.name / "summary.json").write_text("{}")
    (out / "bench.jsonl").write_text(json.dumps({"event": "cell", "cell": grid.cells[0].name, "status": "done",
                                                 "seconds": 3.0}) + "\n")
    outcome = run_grid(grid, out, progress=lambda line: None, build_store=False)
    assert outcome.ran == 0 and outcome.done == len(grid.cells)
    done = [e for e in _events(out) if e["event"] == "cell" and e["status"] == "done"]
    assert sorted(e["cell"] for e in done) == sorted(c.name for c in grid.cells)
    late = [e for e in done if e.get("recorded_late")]
    assert len(late) == len(grid.cells) - 1 and all(e["seconds"] is None for e in late)
    run_grid(grid, out, progress=lambda line: None, build_store=False)  # and only once
    assert len([e for e in _events(out) if e["event"] == "cell"]) == len(grid.cells)


def test_smoke_grid_killed_resumed_failed_retried_stored_and_reported(tmp_path, data_dir):
    out = tmp_path / "smoke"
    env = {**os.environ, "HOSPITRUST_DATA_DIR": str(data_dir)}
    # 1. start the smoke grid and kill it once a cell has finished
    proc = subprocess.Popen([sys.executable, "-m", "hospitrust.cli.main", "bench", str(SMOKE), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines, deadline = [], time.monotonic() + 300
    for line in proc.stdout:
        lines.append(line)
        if re.search(r"\] [1-9]\d*/8 done", line) or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    text = "".join(lines) + rest
    assert proc.returncode == 130, text
    assert "interrupted" in text
    grid = parse_grid(SMOKE)
    finished_first = {c.name for c in grid.cells if cell_state(out, c) == "done"}
    assert 1 <= len(finished_first) < 8

    # 2. start again, with one extra cell that fails (its resume-from checkpoint does not exist)
    bad_cfg = {**grid.cells[0].run_config, "resume-from": str(tmp_path / "missing"), "run-name": "broken"}
    grid.cells.append(Cell("broken", {"strategy": "fedavg", "attack": "none", "seed": 9}, bad_cfg, 4))
    said = []
    outcome = run_grid(grid, out, progress=said.append)
    assert outcome.done == 8 and outcome.failed == 1 and not outcome.interrupted
    assert outcome.ran == 8 - len(finished_first) + 1  # finished cells were not run again
    failure = json.loads((out / "failed" / "broken.json").read_text())
    assert "CheckpointError" in failure["error"] and "no checkpoint" in failure["error"]
    assert any("broken FAILED" in s for s in said)
    assert re.search(r"\d+/9 done, \d running, \d failed, \d+ queued; elapsed \S+, about \S+ left", "\n".join(said))

    # 3. without --retry-failed the failed cell stays failed; with it, the fixed cell runs
    assert run_grid(grid, out, progress=said.append).ran == 0
    grid.cells[-1] = Cell("broken", grid.cells[-1].axes, {**bad_cfg, "resume-from": ""}, 4)
    again = run_grid(grid, out, retry_failed=True, progress=said.append)
    assert again.ran == 1 and again.failed == 0 and again.done == 9
    assert not (out / "failed" / "broken.json").exists()

    # every cell finished exactly once: nothing lost, nothing repeated
    done_events = [e["cell"] for e in _events(out) if e["event"] == "cell" and e["status"] == "done"]
    assert sorted(done_events) == sorted(c.name for c in grid.cells)
    assert any(e["event"] == "interrupted" for e in _events(out))
    assert not (out / "cells" / grid.cells[0].name / "model.pt").exists()  # keep-models = false

    # 4. the store: a row per cell and round, with config columns
    rounds = pd.read_csv(out / "results.csv")
    assert len(rounds) == 9 * 2 and set(rounds["round"]) == {1, 2}
    for column in ("cell", "strategy", "attack", "seed", "malicious-fraction", "hospitals", "balanced_accuracy",
                   "detection_tpr", "hospital_acc_spread", "round_seconds"):
        assert column in rounds.columns, column
    hta = rounds[(rounds["strategy"] == "hta") & (rounds["attack"] == "sign-flip")]
    assert hta["trust_malicious"].notna().all() and hta["trust_honest"].notna().all()
    with sqlite3.connect(out / "results.sqlite") as con:
        assert con.execute("select count(*) from rounds").fetchone()[0] == 18
        assert con.execute("select count(*) from cells where status = 'done'").fetchone()[0] == 9
        n_clients = con.execute("select count(*) from clients").fetchone()[0]
        assert n_clients == 9 * 2 * 4
        assert con.execute("select count(*) from clients where malicious = 1 and cell like '%sign-flip%'").fetchone()[0] == 4 * 2
    cells = pd.read_csv(out / "cells.csv")
    done = cells[cells["status"] == "done"]
    assert (done["cell_seconds"] >= done["round_seconds_total"]).all()
    assert (done["overhead_seconds"] > 0).all()

    # 5. the report: self-contained HTML with PNGs that decode, and Markdown with the same figures
    from hospitrust.cli.main import main

    assert main(["report", str(out)]) == 0
    page = (out / "report" / "report.html").read_text()
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 6
    for b64 in images:
        w, h = _png_ok(base64.b64decode(b64))
        assert w > 200 and h > 100
    md = (out / "report" / "report.md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert len(linked) == len(images)
    for rel in linked:
        _png_ok((out / "report" / rel).read_bytes())
    assert "trust.png" in md  # HTA's reputations
    assert "Paired differences against fedavg" in md and "(n=2)" in md  # two seeds paired
    assert "Worst case over attacks" in md and "overhead_share" in md


@pytest.mark.slow
def test_simulation_backend_on_a_local_ray_head(tmp_path, data_dir):
    """One cell as a real Flower simulation through the grid's shared SuperLink, on a Ray head we started."""
    from hospitrust.bench.backends import LocalRayHead

    grid = parse_grid(_grid(grid={"name": "ray", "hospitals": 2, "backend": "simulation", "workers": 1, "timeout": 400},
                            base={"num-server-rounds": 1, "local-epochs": 1, "train-subsample": 0.02,
                                  "reference-cohort-per-class": 5, "checkpoint": False},
                            axes={"strategy": ["fedavg"]}))
    with LocalRayHead(num_cpus=2) as head:
        said = []
        outcome = run_grid(grid, tmp_path / "g", ray_address=head.address, progress=said.append)
        log = (tmp_path / "g" / "logs" / "strategy=fedavg.log").read_text()
        assert outcome.done == 1, "\n".join(said) + log[-3000:]
        assert "finished:completed" in log
        # flwr-simulation joined *our* Ray head: its session holds that driver's log and the ClientApp actors' logs
        logs = [p for p in Path(head.temp_dir).glob("session_*/logs/*") if p.is_file()]
        assert any(p.name.startswith("python-core-driver-") for p in logs), sorted(p.name for p in logs)
        assert any("ClientAppActor" in p.read_text(errors="replace") for p in logs if p.name.startswith("worker-"))
    summary = json.loads((tmp_path / "g" / "cells" / "strategy=fedavg" / "summary.json").read_text())
    assert summary["rounds"] == 1

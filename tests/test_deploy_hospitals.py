"""`hospitrust deploy hospitals` on a hand-made runs folder and a stand-in `flwr` (no Flower processes)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import pytest

from hospitrust.cli.main import main as cli_main
from hospitrust.ops.deploy import DeployError
from hospitrust.ops.deploy import hospitals as hs

NODES = [
    {"node-id": "111", "owner-name": "none", "status": "online", "online-at": "2026-12-01T10:00:00Z", "offline-at": ""},
    {"node-id": "222", "owner-name": "none", "status": "offline", "online-at": "2026-12-01T09:00:00Z",
     "offline-at": "2026-12-01T11:30:00Z"},
    {"node-id": "333", "owner-name": "none", "status": "registered", "online-at": "", "offline-at": ""},
]


def _run(runs: Path, name: str, hospitals: dict[str, str], data: dict[str, dict], failed: list[dict], age: float) -> None:
    d = runs / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"hospitals": hospitals, "hospital-data": data, "failed-hospitals": failed}))
    t = time.time() - age
    os.utime(d / "config.json", (t, t))


@pytest.fixture
def runs(tmp_path) -> Path:
    runs = tmp_path / "runs"
    _run(runs, "first", {"111": "st-mary", "222": "city"},
         {"st-mary": {"format": "folder (png)", "images": 10, "train-class-counts": [4, 4], "val-class-counts": [1, 1]},
          "city": {"format": "csv (png)", "images": 20, "train-class-counts": [8, 8], "val-class-counts": [2, 2]}},
         [], age=200)
    # the newer run: st-mary has more images now, city was left out for bad data
    _run(runs, "second", {"111": "st-mary"},
         {"st-mary": {"format": "folder (dicom)", "images": 12, "train-class-counts": [5, 5], "val-class-counts": [1, 1]}},
         [{"hospital": "city", "node_id": 222, "reason": "1 of 20 images cannot be used: file not found (row 3)"}],
         age=100)
    # a card without counts (what a deployed query round gives): the counts come from the run's class_counts.csv
    _run(runs, "third", {"111": "st-mary"}, {"st-mary": {"format": "folder (dicom)", "images": 14}}, [], age=50)
    (runs / "third" / "class_counts.csv").write_text(
        "hospital,split,benign,malignant,total\nst-mary,train,6,6,12\nst-mary,val,1,1,2\n")
    (runs / "not-a-run").mkdir()  # no config.json: ignored
    return runs


def test_hospitals_are_named_from_the_newest_runs_with_their_last_query_data_and_runs(runs):
    records = hs.read_runs(runs)
    assert set(records) == {"st-mary", "city"}
    assert records["st-mary"].runs == ["first", "second", "third"] and records["st-mary"].data_run == "third"
    assert records["st-mary"].data["format"] == "folder (dicom)" and records["st-mary"].data["images"] == 14
    assert records["st-mary"].data["train-class-counts"] == [6, 6] and records["st-mary"].data["val-class-counts"] == [1, 1]
    # city answered the first run's query; the second left it out: its data is still the first run's
    assert records["city"].runs == ["first"] and records["city"].data_run == "first"
    assert records["city"].left_out == ["second: 1 of 20 images cannot be used: file not found (row 3)"]

    rows = {r["node-id"]: r for r in hs.federation_hospitals(NODES, records)}
    assert rows["111"]["hospital"] == "st-mary" and rows["111"]["status"] == "online"
    assert rows["111"]["last-seen"] == "now (online since 2026-12-01T10:00:00Z)"
    assert rows["111"]["train-class-counts"] == [6, 6] and rows["111"]["runs"] == ["first", "second", "third"]
    assert rows["222"]["hospital"] == "city" and rows["222"]["last-seen"] == "2026-12-01T11:30:00Z"
    assert rows["333"]["hospital"] == "" and rows["333"]["last-seen"] == "never connected"
    table = hs.format_table(list(rows.values()))
    assert "(no run yet)" in table and "folder (dicom): 14 images, train [6, 6] val [1, 1]" in table
    assert "city: left out of second: 1 of 20 images" in table


def test_a_hospital_whose_node_the_superlink_no_longer_lists_is_shown_as_such(runs):
    rows = hs.federation_hospitals(NODES[:1], hs.read_runs(runs))
    assert [(r["hospital"], r["status"]) for r in rows] == [("st-mary", "online"), ("city", "not listed")]


def test_a_runs_dir_that_is_not_a_folder_is_named(tmp_path):
    with pytest.raises(DeployError, match="--runs-dir .* is not a folder"):
        hs.read_runs(tmp_path / "nope")


def _fake_flwr(tmp_path: Path, monkeypatch, answer: dict) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flwr = bin_dir / "flwr"
    flwr.write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = 'supernode list consortium' ] || exit 9\ncat <<'EOF'\n{json.dumps(answer)}\nEOF\n")
    flwr.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_the_command_prints_the_table_and_json(tmp_path, runs, monkeypatch):
    _fake_flwr(tmp_path, monkeypatch, {"success": True, "nodes": NODES})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["deploy", "hospitals", "--connection", "consortium", "--runs-dir", str(runs)]) == 0
    assert out.getvalue().splitlines()[0].split() == ["hospital", "node", "id", "status", "last", "seen", "data",
                                                        "(last", "query)", "runs"]
    assert "st-mary: took part in first, second, third" in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["deploy", "hospitals", "--connection", "consortium", "--runs-dir", str(runs),
                         "--format", "json"]) == 0
    assert [r["hospital"] for r in json.loads(out.getvalue())["hospitals"]] == ["st-mary", "city", ""]


def test_a_failed_supernode_list_names_the_tunnel(tmp_path, monkeypatch):
    _fake_flwr(tmp_path, monkeypatch, {"success": False, "error-message": "connection refused"})
    with pytest.raises(DeployError, match="connection refused.*hospitrust deploy tunnel consortium"):
        hs.list_nodes("consortium")


def test_a_hospital_left_out_as_a_node_id_keeps_its_name(runs):
    """A later run's query found hospital 222 silent (`node 222`, unresponsive): its name (city, learnt in the first
    run) is kept, the reason is city's, and no `node 222` row replaces it (before, the placeholder's node id won)."""
    _run(runs, "fourth", {"111": "st-mary"}, {}, [{"hospital": "node 222", "node_id": 222, "reason": (
        "unresponsive: online at the SuperLink but did not answer the query within reply-timeout (25 s)")}], age=10)
    records = hs.read_runs(runs)
    assert set(records) == {"st-mary", "city"}
    assert records["city"].left_out[-1].startswith("fourth: unresponsive: online at the SuperLink")
    rows = {r["node-id"]: r for r in hs.federation_hospitals(NODES, records)}
    assert rows["222"]["hospital"] == "city"
    assert [r["hospital"] for r in hs.federation_hospitals(NODES[:1], records)] == ["st-mary", "city"]

"""trust.png: each hospital's trust over rounds from rounds.jsonl, malicious ones marked."""

from __future__ import annotations

import json

import pytest

from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app.plots import client_signal, plot_trust, trust_series


def _rounds():
    return [
        {"round": r, "clients": [
            {"hospital": "h0", "reputation": 0.9 - 0.01 * r, "trust": 5.0, "weight": 0.5, "malicious": False},
            {"hospital": "h1", "reputation": 0.8 - 0.2 * r, "weight": 0.5, "malicious": True,
             "flagged": r >= 2, "selected": r < 3},
        ]}
        for r in (1, 2, 3)
    ]


def _record(**entry):
    return HospitalRecord.from_json({"hospital": "x", **entry})


def test_signal_precedence_and_earn_mean():
    assert client_signal(_record(reputation=0.4, trust=9.0, weight=0.1)) == ("reputation", 0.4)
    assert client_signal(_record(trust=2.0, weight=0.1)) == ("trust", 2.0)
    assert client_signal(_record(earn_trust={"0": 0.2, "3": 0.6}, weight=0.1)) == ("earn_trust", pytest.approx(0.4))
    assert client_signal(_record(weight=0.25)) == ("weight", 0.25)
    # schema 2: a rule's signals under its name, trust a field of its own
    assert client_signal(_record(trust=2.0, signals={"hta": {"reputation": 0.3}})) == ("reputation", 0.3)
    assert client_signal(_record(trust=2.0, signals={})) == ("trust", 2.0)


def test_series_marks_malicious_and_flagged_rounds():
    signal, series, malicious = trust_series([RoundRecord.from_json(r) for r in _rounds()])
    assert signal == "reputation" and malicious == {"h1"}
    assert [p[0] for p in series["h1"]] == [1, 2, 3]
    assert [p[2] for p in series["h1"]] == [False, True, True]
    assert series["h0"][2][1] == pytest.approx(0.87)


def test_plot_written_as_png(tmp_path):
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rounds()))
    path = plot_trust(tmp_path)
    assert path == tmp_path / "trust.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "rounds.jsonl").write_text("")
    with pytest.raises(ValueError, match="no rounds"):
        plot_trust(tmp_path / "empty")


def test_hospitrust_report_on_a_run_directory_draws_its_trust(tmp_path):
    from hospitrust.cli.main import main

    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rounds()))
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report" / "trust.png").read_bytes()[:4] == b"\x89PNG"  # beside report.html

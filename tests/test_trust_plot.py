"""trust.png: each hospital's trust over rounds from rounds.jsonl, malicious ones marked."""

from __future__ import annotations

import json

import pytest

from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app.plots import plot_trust, trust_series


def _rounds():
    return [
        {"round": r, "clients": [
            {"hospital": "h0", "reputation": 0.9 - 0.01 * r, "trust": 5.0, "weight": 0.5, "malicious": False},
            {"hospital": "h1", "reputation": 0.8 - 0.2 * r, "weight": 0.5, "malicious": True,
             "flagged": r >= 2, "selected": r < 3},
        ]}
        for r in (1, 2, 3)
    ]


def _legacy(**entry):
    schema = {"schema": 2} if "signals" in entry else {}  # schema 1 lines have no key of their own
    return RoundRecord.from_json({**schema, "round": 1, "clients": [{"hospital": "x", **entry}]})


def test_a_line_names_its_rules_trust_signal_and_an_older_line_is_read_as_its_readers_did():
    # written now: the rule names its signal, each record's trust holds its value; without one, the weight
    named = RoundRecord(number=1, clients=[HospitalRecord("a", weight=0.1, trust=0.4)], trust_signal="reputation")
    back = RoundRecord.from_json(json.dumps(named.to_json()))
    assert back.trust_signal == "reputation" and back.trust_of(back.clients[0]) == 0.4
    plain = RoundRecord.from_json(RoundRecord(number=1, clients=[HospitalRecord("a", weight=0.25)]).to_json())
    assert plain.trust_signal == "weight" and plain.trust_of(plain.clients[0]) == 0.25
    # a line written before rules named theirs: reputation first, then trust, then EARN's per-class mean, else weight
    for entry, expected in (({"reputation": 0.4, "trust": 9.0, "weight": 0.1}, ("reputation", 0.4)),
                            ({"trust": 2.0, "weight": 0.1}, ("trust", 2.0)),
                            ({"earn_trust": {"0": 0.2, "3": 0.6}, "weight": 0.1}, ("earn_trust", pytest.approx(0.4))),
                            ({"weight": 0.25}, ("weight", 0.25)),
                            # schema 2: a rule's signals under its name, trust a field of its own
                            ({"trust": 2.0, "signals": {"hta": {"reputation": 0.3}}}, ("reputation", 0.3)),
                            ({"trust": 2.0, "signals": {}}, ("trust", 2.0))):
        line = _legacy(**entry)
        assert (line.trust_signal, line.trust_of(line.clients[0])) == expected, entry


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

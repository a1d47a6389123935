"""The typed round records (``hospitrust.records``): to_json / from_json round trips, the schema on
every rounds.jsonl line, schema 1 lines written by hospitrust before the records were typed
(``tests/data/rounds_v1``, made by ``tests/data/rounds_v1/make.py``) loading through ``from_json``,
and the strategy's result holding typed records.
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest
import torch

from hospitrust.records import SCHEMA_VERSION, UNNAMED_SOURCE, HospitalRecord, RoundRecord
from hospitrust.server_app.results import jsonable, read_round_lines

V1 = Path(__file__).parent / "data" / "rounds_v1"


def _through_file(line: dict) -> dict:
    """A line as the run directory writes it and a reader parses it back (NaN -> null)."""
    return json.loads(json.dumps(jsonable(line), allow_nan=False))


def _v1(name: str) -> list[dict]:
    """A schema 1 file's lines as written (the raw schema view: these tests check the conversion field by field)."""
    return read_round_lines(V1 / f"{name}.jsonl")


def _full_record() -> HospitalRecord:
    return HospitalRecord(
        hospital="hospital-3", node_id=7, num_examples=42, weight=0.25, selected=True, rejected=False, reason="",
        train_loss=0.5, benchmark_error=0.125, update_norm=1.5, trust=0.75, flagged=False, malicious=True,
        timing={"step": 0.5, "setup": 0.01}, privacy={"epsilon": 2.0, "delta": 1e-3},
        signals={"hta": {"reputation": 0.9, "s": 0.8, "duplicates_of": []},
                 "pre-aggregation": {"steps": [{"step": "clipping", "factor": 1.0, "clipped": False}]}})


def test_a_hospital_record_round_trips_with_every_field():
    record = _full_record()
    data = record.to_json()
    assert HospitalRecord.from_json(data) == record
    assert HospitalRecord.from_json(_through_file(data)) == record
    # the common fields under the names schema 1 gave them, the signals under their sources
    assert {"hospital", "node_id", "num_examples", "weight", "train_loss", "benchmark_error", "selected", "rejected",
            "reason", "update_norm", "trust", "flagged", "malicious", "timing", "privacy"} <= set(data)
    assert data["signals"]["hta"]["reputation"] == 0.9


def test_a_rejected_record_round_trips_its_nan_losses_as_null():
    record = HospitalRecord("hospital-1", 3, rejected=True, reason="arrays contain NaN or Inf: ['w']")
    line = _through_file(record.to_json())
    assert line["train_loss"] is None and line["benchmark_error"] is None
    assert line["signals"] == {} and "update_norm" not in line and "trust" not in line
    back = HospitalRecord.from_json(line)
    assert math.isnan(back.train_loss) and math.isnan(back.benchmark_error)
    assert back.to_json().keys() == record.to_json().keys() and back.reason == record.reason and back.rejected


def test_a_round_record_round_trips_and_carries_the_schema():
    record = RoundRecord(number=3, clients=[_full_record(), HospitalRecord("hospital-0", 1, rejected=True, reason="x")],
                         central={"balanced_accuracy": 0.7, "auc": float("nan")}, evaluation="central",
                         hospitals_evaluated=True, aggregation_seconds=0.1, update_norm=0.4, round_seconds=2.0,
                         timing={"finished_at": 10.0}, asked=3, missing=["hospital-2"], unresponsive=["hospital-2"],
                         kept_previous_model=False, note="", hospital_accuracy={"hospital-3": 0.5},
                         fairness={"min": 0.5, "max": 0.5}, entries={"detection": {"tpr": 1.0}, "budget_spent": []})
    line = _through_file(record.to_json())
    assert line["schema"] == SCHEMA_VERSION == 2
    assert line["round"] == 3 and line["detection"] == {"tpr": 1.0}  # the features' entries at the top level
    back = RoundRecord.from_json(line)
    assert back.schema == SCHEMA_VERSION and back.entries == {"detection": {"tpr": 1.0}, "budget_spent": []}
    assert _through_file(back.to_json()) == line
    assert RoundRecord.from_json(json.dumps(line)) == back  # from the text of the line too
    assert back.client("hospital-3") == record.clients[0] and back.client("nobody") is None


def test_a_feature_entry_may_not_overwrite_the_rounds_own_fields():
    with pytest.raises(ValueError, match="clients"):
        RoundRecord(number=1, entries={"clients": []}).to_json()


def test_a_later_schema_is_refused_with_what_this_version_reads():
    with pytest.raises(ValueError, match="schema 3"):
        RoundRecord.from_json({"schema": 3, "round": 1, "clients": []})
    with pytest.raises(ValueError, match="schema 3"):
        HospitalRecord.from_json({"hospital": "h0", "signals": {}}, schema=3)
    with pytest.raises(ValueError, match="without 'hospital'"):
        HospitalRecord.from_json({"node_id": 1})


def test_signals_exclusion_and_lookup_by_hand():
    record = HospitalRecord("h0", 1, weight=0.5, selected=True)
    record.add_signals("krum", {"krum_score": 2.0})
    record.add_signals("krum", {"note": "kept"})
    assert record.signals == {"krum": {"krum_score": 2.0, "note": "kept"}}
    assert record.signal("krum_score") == 2.0 and record.signal("absent", 7) == 7
    assert not record.excluded and record.exclusion_reason() == ""
    record.exclude("central DP: nothing released", by="privacy")
    assert (record.selected, record.weight, record.rejected) == (False, 0.0, False)
    assert record.excluded and record.exclusion_reason() == "central DP: nothing released"
    assert record.signals["privacy"] == {"excluded": True, "exclusion_reason": "central DP: nothing released"}
    with pytest.raises(ValueError, match="name"):
        record.add_signals("", {"x": 1})


def test_from_reply_reads_the_reply_metrics():
    record = HospitalRecord.from_reply("h2", 9, 30, {"train-loss": 0.25, "timing-step": 1.5, "privacy-epsilon": 2.0,
                                                     "privacy-delta": 1e-3, "privacy-steps": True}, weight=0.5, selected=True)
    assert (record.num_examples, record.train_loss, record.weight, record.selected) == (30, 0.25, 0.5, True)
    assert math.isnan(record.benchmark_error)
    assert record.timing == {"step": 1.5}
    assert record.privacy == {"epsilon": 2.0, "delta": 1e-3}  # a bool is no number


# ---- schema 1: rounds.jsonl as hospitrust wrote it before the records were typed ----------------------
@pytest.mark.parametrize("name", ["hta-attack-rejected", "multi-krum-local-dp", "fbd"])
def test_every_v1_file_loads_and_converts_to_the_current_schema(name):
    lines = _v1(name)
    assert lines and all("schema" not in line for line in lines)  # really schema 1
    for line in lines:
        record = RoundRecord.from_json(line)
        assert record.schema == 1 and record.number == line["round"]
        assert [c.hospital for c in record.clients] == [c["hospital"] for c in line["clients"]]
        for c, raw in zip(record.clients, line["clients"]):
            assert (c.node_id, c.num_examples, c.weight, c.selected, c.rejected, c.reason, c.malicious) == (
                raw["node_id"], raw["num_examples"], raw["weight"], raw["selected"], raw["rejected"], raw["reason"],
                raw["malicious"])
        assert record.central == line["central"] and record.kept_previous_model == line["kept_previous_model"]
        # converted: the same record read back from the current schema
        current = _through_file(record.to_json())
        assert current["schema"] == SCHEMA_VERSION
        again = RoundRecord.from_json(current)
        assert _through_file(again.to_json()) == current


def test_v1_hta_signals_rejection_and_pre_aggregation():
    first, second = (RoundRecord.from_json(line) for line in _v1("hta-attack-rejected"))
    h0 = first.client("hospital-0")
    assert h0 is not None and h0.malicious and h0.flagged is False
    assert h0.signal("reputation") == h0.signals[UNNAMED_SOURCE]["reputation"]  # the rule's, unnamed in schema 1
    assert h0.signals["pre-aggregation"]["steps"][0]["step"] == "clipping"  # a feature's, under its name
    assert h0.update_norm is not None and h0.timing["step"] > 0
    h1 = first.client("hospital-1")
    assert h1 is not None and h1.excluded and h1.exclusion_reason()  # HTA left it out, and said why
    rejected = second.client("hospital-1")
    assert rejected is not None and rejected.rejected and "NaN" in rejected.reason
    assert math.isnan(rejected.train_loss) and rejected.signals == {}
    assert first.entries["detection"]["fp"] == 1 and first.entries["pre_aggregation"]["chain"] == ["clipping"]


def test_v1_local_privacy_and_rule_scores():
    record = RoundRecord.from_json(_v1("multi-krum-local-dp")[0])
    assert all(c.privacy and c.privacy["epsilon"] > 0 for c in record.clients)
    assert all(isinstance(c.signal("krum_score"), float) for c in record.clients)
    assert [c.hospital for c in record.clients if c.excluded] == ["hospital-2"]
    assert record.entries["privacy"]["mode"] == "local"


def test_v1_fbd_blocks():
    record = RoundRecord.from_json(_v1("fbd")[0])
    assert all(c.signal("accepted_blocks") == ["stem", "conv2", "neck", "head"] for c in record.clients)
    assert record.entries["fbd"] and record.hospital_accuracy == {} and record.fairness is None


def test_the_readers_read_v1_files(tmp_path):
    """The console, the plots, participation and the story take a schema 1 run as they take a current one."""
    from hospitrust.console import views
    from hospitrust.console.runs import RunReader
    from hospitrust.server_app.plots import trust_series
    from hospitrust.server_app.records import near_duplicates, participation
    from hospitrust.server_app.story import rule_actions

    run = tmp_path / "run"
    run.mkdir()
    (run / "rounds.jsonl").write_text((V1 / "hta-attack-rejected.jsonl").read_text())
    reader = RunReader(run, "run")
    assert reader.refresh() == 2 and all(isinstance(r, RoundRecord) for r in reader.rounds)
    rows = {r["hospital"]: r for r in views.hospital_rows(reader.rounds[1], ["hospital-0", "hospital-1"], True)}
    assert rows["hospital-1"]["status"] == "rejected" and "NaN" in rows["hospital-1"]["reason"]
    labels = [label for label, _ in rows["hospital-0"]["signals"]]
    assert {"reputation", "pre-aggregation"} <= set(labels)  # the rule's signal, the feature's
    kinds = {a["kind"] for a in views.all_alerts(reader.rounds, ground_truth=True, rare=set())}
    assert {"non-finite", "excluded"} <= kinds
    signal, series, malicious = trust_series(reader.rounds)
    assert signal == "reputation" and malicious == {"hospital-0"} and len(series["hospital-0"]) == 2
    lines = [RoundRecord.from_json(line) for line in _v1("hta-attack-rejected")]
    assert participation(lines)["hospital-1"] == {"asked": 2, "valid": 1, "rejected": 1, "missing": 0,
                                                  "unresponsive": 0, "offline": 0}
    assert near_duplicates(lines) == {}
    assert rule_actions(reader.rounds[1].clients)["rejected"] == ["hospital-1"]


# ---- the strategy's result ------------------------------------------------------------------------------
def test_round_result_clients_are_typed_hospital_records():
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hospitrust.strategies import build_strategy
    from hospitrust.strategies.base import RoundResult

    assert typing.get_type_hints(RoundResult)["clients"] == list[HospitalRecord]
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    strategy = build_strategy("fltrust", {100: "h0", 101: "h1", 102: "h2"}, server_update=lambda state, rnd: torch.ones(4))

    class _Grid:
        def get_node_ids(self):
            return list(strategy.hospitals)

    messages = list(strategy.configure_train(1, ArrayRecord({"w": torch.zeros(4)}), ConfigRecord(), _Grid()))
    replies = []
    for i, msg in enumerate(sorted(messages, key=lambda m: m.metadata.dst_node_id)):
        w = torch.full((4,), [1.0, float("nan"), -1.0][i])
        replies.append(Message(RecordDict({"arrays": ArrayRecord({"w": w}), "metrics": MetricRecord(
            {"num-examples": 10, "train-loss": 0.5, "timing-step": 0.1})}), reply_to=msg))
    result = strategy.aggregate_round(1, replies)
    assert all(type(c) is HospitalRecord for c in result.clients)
    by = {c.hospital: c for c in result.clients}
    assert by["h1"].rejected and "NaN" in by["h1"].reason and by["h1"].trust is None
    assert by["h0"].trust == pytest.approx(1.0) and by["h2"].trust == 0.0  # the rule's trust: a typed field
    assert by["h0"].timing == {"step": pytest.approx(0.1)} and by["h0"].update_norm == pytest.approx(2.0)
    assert "trust" not in by["h0"].signals.get("fltrust", {})


def test_a_real_run_writes_the_schema_on_every_line_and_reads_back(tmp_path, data_dir):
    from flwr.app import Context, RecordDict

    from conftest import small_run_config
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, strategy="hta", **{"num-server-rounds": 1})
    server_app(InProcessGrid(client_app, 3, cfg), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                          run_config=cfg))
    run = tmp_path / "runs" / cfg["run-name"]
    lines, records = read_round_lines(run), read_round_records(run)  # as written, and as read
    assert [line["schema"] for line in lines] == [SCHEMA_VERSION]
    for line, record in zip(lines, records):
        assert _through_file(record.to_json()) == line
        for c in record.clients:
            assert c.malicious is False  # the detection feature's ground truth
            assert set(c.signals) == {"hta"} and "reputation" in c.signals["hta"]
            # HTA names its trust signal: the line says which, each record's trust holds it
            assert record.trust_signal == "reputation" and c.trust == c.signal("reputation")

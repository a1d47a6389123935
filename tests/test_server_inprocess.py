"""ServerApp + ClientApp in one process (no Ray): the whole run, results files, bad replies.

Each malformed reply is injected between the ClientApp and the server; the run must
complete, and the hospital must be recorded as rejected with the right reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord, RecordDict

from conftest import small_run_config
from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.client_app import app as client_app
from hospitrust.server_app.results import (CENTRAL_METRICS, CLIENT_FIELDS, ROUND_FIELDS, SUMMARY_FIELDS, read_round_lines,
                                         read_round_records, read_summary)
from hospitrust.server_app.records import FederationFailure
from hospitrust.server_app import app as server_app


def _run(tmp_path, num_nodes=3, reply_filter=None, **overrides):
    cfg = small_run_config(tmp_path, **overrides)
    grid = InProcessGrid(client_app, num_nodes, cfg, reply_filter=reply_filter)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return tmp_path / "runs" / cfg["run-name"], grid


def test_full_run_writes_every_result_file(tmp_path, data_dir):
    run_dir, grid = _run(tmp_path)
    for name in ("config.json", "rounds.jsonl", "summary.json", "model.pt", "class_counts.csv"):
        assert (run_dir / name).is_file(), name
    for line in read_round_lines(run_dir):  # the written schema: every round's fields, every client's
        assert set(ROUND_FIELDS) <= set(line)
        assert all(set(CLIENT_FIELDS) <= set(c) for c in line["clients"])
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == [1, 2]
    for r in rounds:
        assert set(CENTRAL_METRICS) <= set(r.central)
        assert len(r.clients) == 3
        for c in r.clients:
            assert not c.rejected and c.selected
        # FedAvg weights are the example shares
        n = np.array([c.num_examples for c in r.clients], dtype=float)
        assert np.allclose([c.weight for c in r.clients], n / n.sum())
        assert r.fairness is not None and r.fairness["spread"] >= 0
    summary = read_summary(run_dir)
    assert set(SUMMARY_FIELDS) <= set(summary)
    assert summary["rounds"] == 2 and summary["strategy"] == "fedavg"
    assert summary["final"] == rounds[-1].central
    # hospitals are mapped by the query round, whatever their (random) node ids
    config = json.loads((run_dir / "config.json").read_text())
    assert sorted(config["hospitals"].values()) == ["hospital-0", "hospital-1", "hospital-2"]
    assert {str(n) for n in grid.node_ids} == set(config["hospitals"])
    # the saved model is the model the last round evaluated, loadable as a state_dict
    state = torch.load(run_dir / "model.pt")
    assert "classifier.4.weight" in state


def test_federated_evaluation_every_skips_the_hospitals_evaluation_and_not_the_training(tmp_path, data_dir):
    """federated-evaluation-every = 2 over 3 rounds: the hospitals evaluate in rounds 2 and 3 (the
    last) only, and the model is the one of a run that evaluates every round."""
    from flwr.app import MessageType

    asked: list[tuple[int, str]] = []

    def count(index, incoming, reply):
        if incoming.metadata.message_type in (MessageType.TRAIN, MessageType.EVALUATE):
            asked.append((int(incoming.content["config"]["server-round"]), incoming.metadata.message_type))
        return reply

    sparse, _ = _run(tmp_path / "sparse", reply_filter=count, **{"num-server-rounds": 3, "federated-evaluation-every": 2})
    every, _ = _run(tmp_path / "every", **{"num-server-rounds": 3})
    assert sorted(set(asked)) == [(1, MessageType.TRAIN), (2, MessageType.EVALUATE), (2, MessageType.TRAIN),
                                  (3, MessageType.EVALUATE), (3, MessageType.TRAIN)]
    rounds = read_round_records(sparse)
    assert [r.hospitals_evaluated for r in rounds] == [False, True, True]
    assert rounds[0].hospital_accuracy == {} and rounds[0].fairness is None
    assert rounds[2].fairness == read_round_records(every)[2].fairness
    assert read_summary(sparse)["fairness"] == rounds[2].fairness
    a, b = torch.load(sparse / "model.pt"), torch.load(every / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_same_result(tmp_path, data_dir):
    a, _ = _run(tmp_path / "a")
    b, _ = _run(tmp_path / "b")
    ra, rb = read_round_records(a), read_round_records(b)
    assert ra[-1].central["loss"] == pytest.approx(rb[-1].central["loss"], rel=1e-5)


def _corrupt_arrays(fn):
    def reply_filter(index, incoming, reply):
        if index == 0 and reply.has_content() and "arrays" in reply.content.array_records:
            state = reply.content["arrays"].to_torch_state_dict()
            fn(state)
            reply.content["arrays"] = ArrayRecord(state)
        return reply

    return reply_filter


def _set_metric(key, value):
    def reply_filter(index, incoming, reply):
        if index == 0 and reply.has_content() and "arrays" in reply.content.array_records:
            m = dict(reply.content["metrics"])
            if value is None:
                m.pop(key)
            else:
                m[key] = value
            reply.content["metrics"] = MetricRecord(m)
        return reply

    return reply_filter


def _first_weight(state):
    return next(k for k, v in state.items() if v.is_floating_point())


def _nan(state):
    state[_first_weight(state)][0] = float("nan")


def _inf(state):
    state[_first_weight(state)].view(-1)[0] = float("inf")


def _missing_key(state):
    del state[_first_weight(state)]


def _extra_key(state):
    state["evil.weight"] = torch.zeros(3)


def _wrong_shape(state):
    k = _first_weight(state)
    state[k] = torch.zeros(*state[k].shape[:-1], state[k].shape[-1] + 1)


def _wrong_dtype(state):
    k = _first_weight(state)
    state[k] = state[k].double()


def _huge_update(state):
    k = _first_weight(state)
    state[k] = state[k] + 1e6


@pytest.mark.parametrize(
    "reply_filter, reason",
    [
        (_corrupt_arrays(_nan), "NaN or Inf"),
        (_corrupt_arrays(_inf), "NaN or Inf"),
        (_corrupt_arrays(_missing_key), "array keys differ"),
        (_corrupt_arrays(_extra_key), "array keys differ"),
        (_corrupt_arrays(_wrong_shape), "has shape"),
        (_corrupt_arrays(_wrong_dtype), "has dtype"),
        (_corrupt_arrays(_huge_update), "exceeds the bound"),
        (_set_metric("num-examples", None), "lack 'num-examples'"),
        (_set_metric("num-examples", -5), "non-negative integer"),
        (_set_metric("num-examples", 10**12), "exceeds the bound"),
        (_set_metric("num-examples", [1, 2]), "not a number"),
        (_set_metric("num-examples", 2.5), "non-negative integer"),
    ],
    ids=["nan", "inf", "missing-key", "extra-key", "shape", "dtype", "norm", "no-examples", "negative-examples",
         "huge-examples", "list-examples", "fractional-examples"],
)
def test_malformed_reply_is_rejected_and_recorded(tmp_path, data_dir, reply_filter, reason):
    run_dir, grid = _run(tmp_path, reply_filter=reply_filter)
    rounds = read_round_records(run_dir)
    assert len(rounds) == 2, "the run must complete"
    for r in rounds:
        by_hospital = {c.hospital: c for c in r.clients}
        bad = by_hospital["hospital-0"]  # node index 0 is partition 0
        assert bad.rejected and reason in bad.reason, bad
        assert bad.weight == 0.0 and not bad.selected
        assert all(not c.rejected for h, c in by_hospital.items() if h != "hospital-0")
        assert not r.kept_previous_model


def _is_train_reply(reply):
    return reply.has_content() and "arrays" in reply.content.array_records


def test_error_reply_and_missing_arrays_are_rejected(tmp_path, data_dir):
    def reply_filter(index, incoming, reply):
        if index == 0 and _is_train_reply(reply):
            return Message(Error(code=1, reason="ValueError: disk full"), reply_to=incoming)
        if index == 1 and _is_train_reply(reply):
            del reply.content["arrays"]
        return reply

    run_dir, _ = _run(tmp_path, num_nodes=4, reply_filter=reply_filter)
    for r in read_round_records(run_dir):
        by_hospital = {c.hospital: c for c in r.clients}
        assert by_hospital["hospital-0"].rejected and "disk full" in by_hospital["hospital-0"].reason
        assert by_hospital["hospital-1"].rejected and "exactly one ArrayRecord" in by_hospital["hospital-1"].reason
        assert not by_hospital["hospital-2"].rejected and not by_hospital["hospital-3"].rejected


def test_a_hospital_that_never_replies_is_recorded_missing(tmp_path, data_dir):
    run_dir, _ = _run(tmp_path, reply_filter=lambda i, incoming, reply: None if i == 2 and _is_train_reply(reply) else reply)
    for r in read_round_records(run_dir):
        assert r.missing == ["hospital-2"] and len(r.clients) == 2
        assert r.unresponsive == ["hospital-2"]  # still online at the (in-process) SuperLink: unresponsive
    assert read_summary(run_dir)["participation"]["hospital-2"]["missing"] == 2
    assert read_summary(run_dir)["participation"]["hospital-2"]["unresponsive"] == 2


def test_a_hospital_that_never_answers_the_query_is_on_the_record_as_unresponsive(tmp_path, data_dir):
    silent = lambda i, incoming, reply: None if i == 2 and str(reply.metadata.message_type) == "query" else reply  # noqa: E731
    run_dir, _ = _run(tmp_path, reply_filter=silent)
    (entry,) = json.loads((run_dir / "config.json").read_text())["failed-hospitals"]
    assert entry["hospital"].startswith("node ") and entry["reason"].startswith("unresponsive: online at the SuperLink")
    assert read_summary(run_dir)["failed_hospitals"] == [entry]


def test_too_few_valid_replies_keep_the_previous_model(tmp_path, data_dir):
    run_dir, _ = _run(tmp_path, reply_filter=_corrupt_arrays(_nan), **{"min-hospitals": 3})
    rounds = read_round_records(run_dir)
    for r in rounds:
        assert r.kept_previous_model and "min-hospitals 3" in r.note
    # nothing was aggregated, so the model (and its central loss) never moved
    assert rounds[0].central["loss"] == pytest.approx(rounds[1].central["loss"])


def test_every_clientapp_failing_fails_the_run(tmp_path, data_dir):
    def all_crash(index, incoming, reply):
        if _is_train_reply(reply):
            return Message(Error(code=1, reason="RuntimeError: broken ClientApp"), reply_to=incoming)
        return reply

    with pytest.raises(FederationFailure, match="failed at every hospital"):
        _run(tmp_path, reply_filter=all_crash)


def test_superlink_node_unavailable_error_counts_as_missing(tmp_path, data_dir):
    # a dead SuperNode's reply comes from the SuperLink (node id 1), not from the hospital
    def unavailable(index, incoming, reply):
        if index == 1 and _is_train_reply(reply):
            err = Message(Error(code=3, reason="Node Unavailable"), reply_to=incoming)
            err.metadata.__dict__["_src_node_id"] = 1
            return err
        return reply

    run_dir, _ = _run(tmp_path, reply_filter=unavailable)
    for r in read_round_records(run_dir):
        assert r.missing == ["hospital-1"]
        assert sorted(c.hospital for c in r.clients) == ["hospital-0", "hospital-2"]


def test_a_hospital_offline_after_the_query_round_is_recorded_offline_and_not_asked(tmp_path, data_dir):
    # its SuperNode stopped heartbeating after it answered the query round: the SuperLink no longer lists it
    cfg = small_run_config(tmp_path)
    grid = None

    def drop_after_query(index, incoming, reply):
        if index == 2 and incoming.metadata.message_type == "query":
            grid.node_ids.remove(incoming.metadata.dst_node_id)
        return reply

    grid = InProcessGrid(client_app, 3, cfg, reply_filter=drop_after_query)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    for r in read_round_records(tmp_path / "runs" / cfg["run-name"]):
        assert r.offline == ["hospital-2"]
        assert r.asked == 2 and r.missing == []
        assert sorted(c.hospital for c in r.clients) == ["hospital-0", "hospital-1"]
    parts = read_summary(tmp_path / "runs" / cfg["run-name"])["participation"]
    assert parts["hospital-2"] == {"asked": 0, "valid": 0, "rejected": 0, "missing": 0, "unresponsive": 0, "offline": 2}
    assert parts["hospital-0"] == {"asked": 2, "valid": 2, "rejected": 0, "missing": 0, "unresponsive": 0, "offline": 0}


def test_near_duplicates_by_hand():
    from hospitrust.server_app.records import near_duplicates

    def hospital(name, *copied):
        record = HospitalRecord(name)
        if copied:
            record.add_signals("hta", {"duplicates_of": list(copied[0])})
        return record

    history = [
        RoundRecord(1, clients=[hospital("a", ["b"]), hospital("b", ["a"]), hospital("c", [])]),
        RoundRecord(2, clients=[hospital("a", ["b", "c"]), hospital("b", ["a", "c"]), hospital("c", ["a", "b"])]),
        RoundRecord(3, clients=[hospital("a"), hospital("b")]),  # a rule without the signal
    ]
    assert near_duplicates(history) == {
        "a": {"rounds": 2, "with": ["b", "c"]},
        "b": {"rounds": 2, "with": ["a", "c"]},
        "c": {"rounds": 1, "with": ["a", "b"]},
    }
    assert near_duplicates(history[2:]) == {}


def test_participation_counts_every_way_a_hospital_can_miss_a_round():
    from hospitrust.server_app.records import absences, participation

    history = [
        RoundRecord(1, clients=[HospitalRecord("a"), HospitalRecord("b", rejected=True)], missing=["c"],
                    unresponsive=["c"]),
        RoundRecord(2, clients=[HospitalRecord("a"), HospitalRecord("b")], offline=["c"]),
        RoundRecord.from_json({"round": 3, "clients": [{"hospital": "a"}, {"hospital": "c"}],
                               "missing": ["b"]}),  # a line from before `offline`
    ]
    parts = participation(history)
    assert parts == {
        "a": {"asked": 3, "valid": 3, "rejected": 0, "missing": 0, "unresponsive": 0, "offline": 0},
        "b": {"asked": 3, "valid": 1, "rejected": 1, "missing": 1, "unresponsive": 0, "offline": 0},
        "c": {"asked": 2, "valid": 1, "rejected": 0, "missing": 1, "unresponsive": 1, "offline": 1},
    }
    assert absences(parts, 3).splitlines() == [
        "b: valid in 1 of 3 rounds (1 rejected, 1 silent, 0 offline)",
        "c: valid in 1 of 3 rounds (0 rejected, 1 silent (1 of them online: unresponsive), 1 offline)",
    ]


def _flower_node_unavailable(incoming):
    """Flower's SuperLink's own reply for a message whose node stopped sending heartbeats (its SuperNode killed):
    error code NODE_UNAVAILABLE, from the SuperLink's node id 1."""
    from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
    from flwr.server.superlink.linkstate.utils import NODE_UNAVAILABLE_ERROR_REASON

    err = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=NODE_UNAVAILABLE_ERROR_REASON), reply_to=incoming)
    err.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    return err


def test_the_record_says_node_unavailable_when_flower_said_so_and_rejoined_when_it_came_back(tmp_path, data_dir):
    """Killed SuperNodes: Flower answers "Node Unavailable" for one at the query round (left out under its own node
    id: before, the entry named the SuperLink's node 1, the error reply's sender) and for another in round 1 (not
    silence within reply-timeout); the second answers in round 2 again: rejoined. The round's progress names the
    hospital, not the SuperLink's node 1."""
    gone_at_query = []

    def unavailable(index, incoming, reply):
        if index == 0 and str(incoming.metadata.message_type) == "query":
            gone_at_query.append(int(incoming.metadata.dst_node_id))
            return _flower_node_unavailable(incoming)
        if index == 1 and _is_train_reply(reply) and int(incoming.content["config"]["server-round"]) == 1:
            return _flower_node_unavailable(incoming)
        return reply

    run_dir, _ = _run(tmp_path, num_nodes=4, reply_filter=unavailable)
    (entry,) = json.loads((run_dir / "config.json").read_text())["failed-hospitals"]
    (node,) = gone_at_query
    assert entry["node_id"] == node != 1 and entry["hospital"] == f"node {node}", entry
    assert entry["reason"].startswith("node unavailable: Flower's SuperLink answered for it"), entry
    first, second = read_round_records(run_dir)
    assert first.missing == ["hospital-1"] and first.node_unavailable == ["hospital-1"]
    assert first.unresponsive == [] and first.rejoined == []
    assert second.missing == [] and second.node_unavailable == [] and second.rejoined == ["hospital-1"]
    events = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    (gone,) = [e for e in events if e["event"] == "unavailable"]
    assert gone["round"] == 1 and gone["hospital"] == "hospital-1" and gone["reason"].startswith("node unavailable")
    assert not [e for e in events if e["event"] == "error"]


def test_round_states_by_hand():
    from hospitrust.server_app.discovery import round_states

    class Grid:
        def get_node_ids(self):
            return [10, 20, 40]  # 30 is offline at the end of the round

    hospitals = {10: "a", 20: "b", 30: "c", 40: "d"}
    states = round_states(2, Grid(), hospitals, asked=[10, 20, 30], answered={10}, unavailable={30: "Node Unavailable"},
                          offline=["d"], evaluated=set(), previous=RoundRecord(1))
    # b: silent and online (unresponsive); c: Flower said unavailable; d: offline at the start, online at the end
    assert states == {"node_unavailable": ["c"], "unresponsive": ["b"], "offline": [], "rejoined": ["d"]}
    states = round_states(3, Grid(), hospitals, asked=[10, 20, 30], answered={10, 20, 30}, unavailable={},
                          offline=[], evaluated={"a", "b", "c"},
                          previous=RoundRecord(2, missing=["b", "c"], node_unavailable=["c"], rejoined=["d"]))
    assert states == {"node_unavailable": [], "unresponsive": [], "offline": [], "rejoined": ["b", "c"]}


def test_a_class_the_final_model_never_recognises_is_named_in_the_summary_and_the_log(tmp_path, data_dir, caplog):
    # every hospital's reply pushes the last layer's bias far towards "normal": the model never says "pneumonia"
    def towards_normal(index, incoming, reply):
        if incoming.metadata.message_type.startswith("train") and "arrays" in reply.content:
            state = reply.content["arrays"].to_torch_state_dict()
            state["classifier.4.bias"] = torch.tensor([50.0, -50.0])
            reply.content["arrays"] = ArrayRecord(state)
        return reply

    with caplog.at_level("INFO", logger="flwr"):
        run_dir, _ = _run(tmp_path, reply_filter=towards_normal, **{"num-server-rounds": 1})
    summary = read_summary(run_dir)
    assert summary["per_class_recall"] == dict(zip(["normal", "pneumonia"], summary["final"]["per_class_recall"]))
    assert summary["per_class_recall"]["normal"] == 1.0 and summary["classes_never_recognised"] == ["pneumonia"]
    assert "the final model never recognises pneumonia (recall 0 on the evaluation set)" in caplog.text
    assert "per-class recall: normal 1.000, pneumonia 0.000" in caplog.text

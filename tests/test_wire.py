"""The arrays' wire form (hospitrust.wire): packed and unpacked bit for bit, fewer Flower objects, every unreadable
packed record refused with its reason; the ServerApp's transport and the ClientApp's mod around it."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.task_identity import TaskIdentity

from hospitrust import wire
from hospitrust.models import build_model
from hospitrust.ops.deploy.audit import describe_reply
from hospitrust.server_app.transport import GridTraits, Sent
from hospitrust.strategies.validation import RejectedReply, error_reason


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    # Flower stamps a new Message with the running task's identity, as a ClientApp or ServerApp process has it
    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _arrays() -> ArrayRecord:
    return ArrayRecord({
        "w": Array(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "steps": Array(np.array(7, dtype=np.int64)),          # a 0-d array
        "empty": Array(np.zeros((0, 5), dtype=np.float64)),   # no bytes of data beyond its header
        "mask": Array(np.array([True, False, True])),
        "w2": Array(np.full((2, 2), -0.0, dtype=np.float16)),
    })


def _same(a: ArrayRecord, b: ArrayRecord) -> None:
    assert list(a.keys()) == list(b.keys())
    for key in a:
        x, y = a[key], b[key]
        assert (x.dtype, tuple(x.shape), x.stype, x.data) == (y.dtype, tuple(y.shape), y.stype, y.data), key


def test_a_packed_record_unpacks_to_the_same_bytes_dtypes_shapes_and_order():
    record = _arrays()
    packed = wire.pack_record(record)
    assert list(packed.keys()) == [wire.PACKED_KEY] and wire.is_packed(packed)
    _same(wire.unpack_record(packed), record)
    assert [e[0] for e in wire.manifest(packed)] == ["w", "steps", "empty", "mask", "w2"]
    # the model's own state: every tensor back as it was
    state = build_model("tiny-cnn", 1, 2).state_dict()
    back = wire.unpack_record(wire.pack_record(ArrayRecord(state))).to_torch_state_dict()
    assert list(back) == list(state) and all(torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype
                                             for k in state)


def test_packing_cuts_a_train_message_from_27_flower_objects_to_5():
    content = RecordDict({"arrays": ArrayRecord(build_model("tiny-cnn", 1, 2).state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    packed = wire.pack_content(content)
    assert packed is not None
    assert len(get_all_nested_objects(content)) == 27 and len(get_all_nested_objects(packed)) == 5
    assert dict(packed.config_records["config"]) == {"server-round": 1}  # other records pass unchanged


def test_what_has_nothing_to_pack_is_left_alone():
    one = ArrayRecord({"only": Array(np.ones(3, dtype=np.float32))})
    assert wire.pack_record(one) is one
    packed = wire.pack_record(_arrays())
    assert wire.pack_record(packed) is packed  # packing twice packs once
    assert wire.pack_content(RecordDict({"arrays": one, "metrics": MetricRecord({"a": 1.0})})) is None
    assert wire.unpack_content(RecordDict({"arrays": one})) is None
    # a record that holds the packed key beside another is not packed: it passes as it came (the checks refuse it)
    mixed = ArrayRecord({wire.PACKED_KEY: packed[wire.PACKED_KEY], "x": Array(np.ones(1, dtype=np.float32))})
    assert not wire.is_packed(mixed) and wire.unpack_content(RecordDict({"arrays": mixed})) is None


def _packed_blob(manifest: object, data: bytes = b"", *, length: int | None = None) -> ArrayRecord:
    header = json.dumps(manifest).encode() if not isinstance(manifest, bytes) else manifest
    blob = struct.pack("<I", len(header) if length is None else length) + header + data
    return ArrayRecord({wire.PACKED_KEY: Array(dtype="uint8", shape=(len(blob),), stype=wire.PACKED_STYPE, data=blob)})


@pytest.mark.parametrize("record, says", [
    (ArrayRecord({wire.PACKED_KEY: Array(dtype="uint8", shape=(2,), stype=wire.PACKED_STYPE, data=b"ab")}),
     "shorter than their 4-byte header"),
    (_packed_blob([], length=999), "the manifest's length (999 bytes) exceeds the packed bytes"),
    (_packed_blob(b"{not json"), "the manifest is not JSON"),
    (_packed_blob({"w": 1}), "the manifest is a dict, expected a list of arrays"),
    (_packed_blob([["w", "float32", [2]]]), "manifest entry 0: expected [name, dtype, shape, stype, bytes]"),
    (_packed_blob([["w", "float32", [-2], "numpy.ndarray", 0]]), "shape must be a list of non-negative integers"),
    (_packed_blob([["w", "float32", [2], "numpy.ndarray", -1]]), "bytes must be a non-negative integer"),
    (_packed_blob([["w", 3, [2], "numpy.ndarray", 0]]), "name, dtype and stype must be strings"),
    (_packed_blob([["w", "float32", [1], "numpy.ndarray", 1], ["w", "float32", [1], "numpy.ndarray", 1]], b"ab"),
     "the name 'w' appears twice"),
    (_packed_blob([["w", "float32", [2], "numpy.ndarray", 8]], b"1234"),
     "the manifest's arrays sum to 8 bytes, the record carries 4"),
])
def test_an_unreadable_packed_record_is_refused_with_what_is_wrong(record, says):
    with pytest.raises(wire.PackingError) as err:
        wire.unpack_content(RecordDict({"arrays": record}))
    assert says in str(err.value)


def _handler_saw(record: list) -> object:
    def handler(msg: Message, context: Context) -> Message:
        record.append(list(msg.content.array_records["arrays"].keys()))
        return Message(RecordDict({"arrays": msg.content.array_records["arrays"],
                                   "metrics": MetricRecord({"num-examples": 3})}), reply_to=msg)
    return handler


def test_the_clientapp_mod_unpacks_before_its_handler_and_packs_the_reply_only_when_the_message_came_packed():
    context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    seen: list = []
    packed_msg = Message(wire.pack_content(RecordDict({"arrays": _arrays()})), dst_node_id=5, message_type="train")
    reply = wire.packed_arrays_mod(packed_msg, context, _handler_saw(seen))
    assert seen == [["w", "steps", "empty", "mask", "w2"]]
    assert wire.is_packed(reply.content.array_records["arrays"])
    _same(wire.unpack_record(reply.content.array_records["arrays"]), _arrays())
    assert dict(reply.content.metric_records["metrics"]) == {"num-examples": 3}
    plain = Message(RecordDict({"arrays": _arrays()}), dst_node_id=5, message_type="train")
    reply = wire.packed_arrays_mod(plain, context, _handler_saw(seen))
    assert not wire.is_packed(reply.content.array_records["arrays"])  # as Flower makes it (SecAgg+'s stages)


class _WireGrid:
    """A grid that crosses a wire: it keeps what was pushed and answers with the replies a test makes."""

    traits = GridTraits(pipelines=True, answers_in_one_pull=True, pull_interval=0.0, packs_arrays=True)

    def __init__(self, answer):
        self.answer, self.pushed = answer, []

    def push_messages(self, messages):
        self.pushed = list(messages)
        for i, m in enumerate(self.pushed):  # the id a SuperLink gives a message it takes
            m.metadata.__dict__["_message_id"] = f"m{i}"
        return [m.metadata.message_id for m in self.pushed]

    def pull_messages(self, ids):
        return [self.answer(m) for m in self.pushed]


def test_the_transport_packs_what_it_sends_and_unpacks_replies_before_anyone_sees_them():
    content = RecordDict({"arrays": _arrays(), "config": ConfigRecord({"server-round": 2})})
    messages = [Message(content, dst_node_id=n, message_type="train") for n in (11, 12)]

    def honest(msg):
        assert wire.is_packed(msg.content.array_records["arrays"])  # what went out is packed
        return Message(wire.pack_content(RecordDict({"arrays": _arrays()})), reply_to=msg)

    grid = _WireGrid(honest)
    heard = []
    replies = Sent(grid, messages, timeout=5, on_reply=lambda r: heard.append(r)).replies()
    assert grid.pushed[0].content is grid.pushed[1].content  # one content for both: packed once
    assert len(replies) == 2 and heard == replies
    for reply in replies:
        _same(reply.content.array_records["arrays"], _arrays())


def test_a_reply_whose_packed_arrays_cannot_be_read_becomes_an_error_reply_naming_why():
    messages = [Message(RecordDict({"arrays": _arrays()}), dst_node_id=21, message_type="train")]
    bad = _packed_blob([["w", "float32", [2], "numpy.ndarray", 8]], b"1234")
    grid = _WireGrid(lambda msg: Message(RecordDict({"arrays": bad}), reply_to=msg))
    (reply,) = Sent(grid, messages, timeout=5).replies()
    assert reply.has_error() and int(reply.metadata.src_node_id) == 21
    # recorded as every error reply is: its reason, which names what is wrong with the hospital's bytes
    said = ("error reply: malformed reply: its packed arrays cannot be read: the manifest's arrays sum to 8 bytes, "
            "the record carries 4")
    assert error_reason(reply.error.reason) == said
    from hospitrust.strategies.validation import check_train_reply

    with pytest.raises(RejectedReply) as rejected:  # the reply check refuses it with that reason, before any array
        check_train_reply(reply, {}, torch.zeros(0), limits=None)  # type: ignore[arg-type]
    assert rejected.value.reason == said


def test_the_audit_describes_a_packed_reply_by_the_arrays_it_carries():
    msg = Message(wire.pack_content(RecordDict({"arrays": _arrays(), "metrics": MetricRecord({"n": 1})})),
                  dst_node_id=1, message_type="train")
    described = describe_reply(msg)
    assert described["arrays"]["arrays/w"] == {"shape": [3, 4], "dtype": "float32", "bytes": len(_arrays()["w"].data)}
    assert set(described["arrays"]) == {f"arrays/{k}" for k in _arrays().keys()}
    broken = Message(RecordDict({"arrays": _packed_blob({"w": 1})}), dst_node_id=1, message_type="train")
    assert "expected a list of arrays" in describe_reply(broken)["arrays"][f"arrays/{wire.PACKED_KEY}"]["unreadable"]

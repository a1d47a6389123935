"""FED-FBD block ownership: plan, stamps, routing, unlearning math, and real in-process runs.

The runs are small (4 hospitals, 4 colors, redundancy 2, small CNN, 2 rounds): the
generated plan then splits the hospitals into two groups sharing two colors each, so a
poisoned hospital's information can reach only its group's colors.
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from conftest import flat_entry, small_run_config
from hospitrust.fbd.mia import mia_auroc
from hospitrust.fbd.plan import PlanError, ShippingPlan, make_plan, parse_plan
from hospitrust.fbd.routing import color_losses, flagged_colors, loss_zscores, parse_color_list, route
from hospitrust.fbd.stamps import StampLog, block_hash
from hospitrust.fbd.training import distillation_loss
from hospitrust.fbd.unlearn import UnlearningError, recalibrate_batchnorm, unlearn_hospital
from hospitrust.fbd.warehouse import BlockVersion, Warehouse, color_key, parse_color_key

SIX = [f"hospital-{i}" for i in range(6)]


# ---- shipping plan ---------------------------------------------------------------------------------
def test_generated_plan_is_the_fbd_spec_layout():
    plan = make_plan(SIX, num_colors=6, redundancy=3, seed=7)
    perm = list(range(6))
    random.Random(7).shuffle(perm)
    # hospital i owns perm[(3i + j) % 6]: two groups of three hospitals sharing three colors
    assert plan.colors_of["hospital-0"] == tuple(perm[0:3]) == plan.colors_of["hospital-2"] == plan.colors_of["hospital-4"]
    assert plan.colors_of["hospital-1"] == tuple(perm[3:6]) == plan.colors_of["hospital-3"] == plan.colors_of["hospital-5"]
    for m in range(6):
        assert len(plan.writers(m)) == 3
    assert sorted(plan.untouched_colors("hospital-0")) == sorted(perm[3:6])


def test_schedule_one_writer_per_color_and_rotation():
    plan = make_plan(SIX, 6, 3, seed=1)
    written = {h: [] for h in SIX}
    for t in (1, 2, 3):
        sched = plan.schedule(t)
        assert sorted(sched) == SIX  # 6 hospitals, 6 colors: everybody writes every round
        assert len(set(sched.values())) == 6  # no color written twice in a round
        for h, m in sched.items():
            assert plan.may_write(h, m)
            written[h].append(m)
    for h in SIX:  # over k = 3 rounds each hospital writes each of its colors once
        assert sorted(written[h]) == sorted(plan.colors_of[h])
    assert plan.schedule(4) == plan.schedule(1)


def test_plan_validation_names_what_is_wrong():
    with pytest.raises(PlanError, match="color 3 has no writer"):
        ShippingPlan(4, {"a": (0, 1), "b": (1, 2)}).validate()
    with pytest.raises(PlanError, match=r"color 2 has 1 writer\(s\) \['b'\], redundancy 2"):
        ShippingPlan(3, {"a": (0, 1), "b": (0, 1, 2)}, redundancy=2).validate()
    with pytest.raises(PlanError, match=r"hospital 'a': colors \[4\] out of range; expected integers 0..3"):
        ShippingPlan(4, {"a": (0, 4), "b": (1, 2, 3)}).validate()
    with pytest.raises(PlanError, match="lists a color twice"):
        ShippingPlan(2, {"a": (0, 0, 1)}).validate()
    with pytest.raises(PlanError, match="must be a multiple of the hospitals"):
        make_plan(SIX[:4], num_colors=6, redundancy=3)
    with pytest.raises(PlanError, match=r"names hospitals \['hospital-9'\]"):
        parse_plan("hospital-9:0,1; hospital-0:0,1", SIX[:2], 2, 1)
    with pytest.raises(PlanError, match="colors must be integers"):
        parse_plan("0:a,b", SIX[:2], 2, 1)


def test_plan_from_text_and_json_round_trip(tmp_path):
    plan = parse_plan("0:0,1; 1:2,3; hospital-2:0,1; 3:2,3", SIX[:4], 4, 2)
    assert plan.colors_of == {"hospital-0": (0, 1), "hospital-1": (2, 3), "hospital-2": (0, 1), "hospital-3": (2, 3)}
    path = plan.save(tmp_path / "plan.json")
    assert ShippingPlan.load(path) == plan
    assert json.loads(path.read_text())["writers"]["2"] == ["hospital-1", "hospital-3"]
    assert parse_plan(str(path), SIX[:4], 4, 2) == plan


# ---- stamps --------------------------------------------------------------------------------------
def test_block_hash_is_sha256_of_key_dtype_shape_bytes():
    t = torch.tensor([1.0, -2.0], dtype=torch.float32)
    n = torch.tensor(3, dtype=torch.int64)
    want = hashlib.sha256()
    for key, x in (("a.weight", t), ("b.num", n)):  # sorted key order
        want.update(key.encode())
        want.update(str(x.dtype).encode())
        want.update(str(tuple(x.shape)).encode())
        want.update(x.numpy().tobytes())
    assert block_hash({"b.num": n, "a.weight": t}) == want.hexdigest()
    flipped = t.clone()
    flipped.view(torch.int32)[0] ^= 1  # one bit
    assert block_hash({"b.num": n, "a.weight": flipped}) != want.hexdigest()
    assert block_hash({"b.num": n, "a.weight": t.double()}) != want.hexdigest()


def test_stamp_log_only_grows(tmp_path):
    log = StampLog(tmp_path / "stamps.jsonl")
    log.append({"event": "init", "color": 0})
    first = (tmp_path / "stamps.jsonl").read_text()
    log.extend([{"event": "write", "color": 1}, {"event": "write", "color": 2}])
    text = (tmp_path / "stamps.jsonl").read_text()
    assert text.startswith(first) and [e["color"] for e in log.read()] == [0, 1, 2]


def test_color_keys():
    assert parse_color_key(color_key(3, "layer1.0.conv1.weight")) == (3, "layer1.0.conv1.weight")
    assert parse_color_key("fc.weight") is None and parse_color_key("color-x/fc") is None


# ---- warehouse and unlearning math ---------------------------------------------------------------
def _warehouse(model="small-cnn", colors=4, seed=0):
    return Warehouse.create(model, 1, 2, 28, colors, seed, shared_init=False)


def _mark(wh, color, trail, influences=None):
    for b in wh.block_names:
        v = wh.meta[(color, b)]
        wh.meta[(color, b)] = BlockVersion(v.hash, list(trail), sorted(set(influences or trail)), 1, trail[-1])


def test_blocks_cover_the_model_and_colors_start_shared_or_apart():
    wh = _warehouse()
    assert wh.block_names == ["stem", "conv2", "neck", "head"]
    assert sorted(k for ks in wh.block_keys.values() for k in ks) == sorted(wh.keys)
    assert wh.hashes()["0/head"] != wh.hashes()["1/head"]
    shared = Warehouse.create("small-cnn", 1, 2, 28, 3, seed=0)  # the default: one initial model for all
    assert shared.hashes()["0/head"] == shared.hashes()["2/head"] == shared.hashes()["1/head"]


def test_unlearning_is_the_donor_average_and_leaves_the_rest_alone():
    wh = _warehouse()
    _mark(wh, 0, ["H", "G"])
    _mark(wh, 1, ["G", "H"])
    _mark(wh, 2, ["K"])
    _mark(wh, 3, ["K", "L"])
    before = wh.hashes()
    new, record = unlearn_hospital(wh, "H")
    assert record.donor_colors == [2, 3] and record.exact
    assert len(record.replaced) == 8 and record.untouched_blocks == 8
    for m in (0, 1):
        for k in wh.keys:
            assert torch.equal(new.states[m][k], (wh.states[2][k] + wh.states[3][k]) / 2), k
        for b in wh.block_names:
            assert new.meta[(m, b)].trail == ["K", "L"] and new.meta[(m, b)].writer == "unlearn:H"
    after = new.hashes()
    assert all(after[k] == before[k] for k in before if k[0] in "23")  # untouched: bit-identical
    assert all(after[k] != before[k] for k in before if k[0] in "01")
    assert not any("H" in v.trail or "H" in v.influences for v in new.meta.values())
    assert wh.hashes() == before  # the input warehouse is not modified


def test_unlearning_follows_distillation_and_refuses_without_donors():
    wh = _warehouse()
    _mark(wh, 0, ["H"])
    _mark(wh, 1, ["G"], influences=["G", "H"])  # G distilled from a color H wrote
    _mark(wh, 2, ["G"])
    _mark(wh, 3, ["K"])
    new, record = unlearn_hospital(wh, "H")
    assert record.donor_colors == [2, 3]
    assert {r["reason"] for r in record.replaced if r["color"] == 1} == {"distilled"}
    assert {r["reason"] for r in record.replaced if r["color"] == 0} == {"wrote"}
    for m in (2, 3):
        _mark(wh, m, ["G"], influences=["G", "H"])
    with pytest.raises(UnlearningError, match="reached every color"):
        unlearn_hospital(wh, "H")
    with pytest.raises(UnlearningError, match="wrote no block"):
        unlearn_hospital(_warehouse(), "nobody")
    plan = ShippingPlan(4, {"H": (1,), "G": (0, 2), "K": (3,)})
    with pytest.raises(UnlearningError, match="audit failure"):
        unlearn_hospital(wh, "H", plan)


def test_batchnorm_counters_are_copied_and_recalibration_stays_in_replaced_blocks():
    wh = _warehouse("resnet18", colors=3)
    _mark(wh, 0, ["H"])
    _mark(wh, 1, ["G"])
    _mark(wh, 2, ["K"])
    wh.states[1]["bn1.num_batches_tracked"] = torch.tensor(3)
    wh.states[2]["bn1.num_batches_tracked"] = torch.tensor(8)
    wh.states[1]["bn1.running_mean"] = torch.full((64,), 1.0)
    wh.states[2]["bn1.running_mean"] = torch.full((64,), 3.0)
    new, _ = unlearn_hospital(wh, "H")
    assert new.states[0]["bn1.num_batches_tracked"].dtype == torch.int64
    assert int(new.states[0]["bn1.num_batches_tracked"]) == 8  # copied (the largest), not the mean 5
    assert torch.equal(new.states[0]["bn1.running_mean"], torch.full((64,), 2.0))
    hashes = new.hashes()
    images = np.random.default_rng(0).integers(0, 256, size=(8, 28, 28, 1), dtype=np.uint8)
    done = recalibrate_batchnorm(new, [(0, "stem"), (0, "layer1")], images, device=torch.device("cpu"))
    assert done == ["0/stem", "0/layer1"]
    assert not torch.equal(new.states[0]["bn1.running_mean"], torch.full((64,), 2.0))
    assert int(new.states[0]["bn1.num_batches_tracked"]) == 8
    changed = {k for k, v in new.hashes().items() if v != hashes[k]}
    assert changed == {"0/stem", "0/layer1"}


# ---- local loss, routing, detection, membership inference -------------------------------------
def test_distillation_loss_by_hand():
    student = torch.tensor([[2.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0]])
    y = torch.tensor([0])
    total, ce, kl = distillation_loss(student, teacher, y, lam=0.5)
    p = torch.softmax(student, 1)[0]
    want_kl = 0.5 * (np.log(0.5 / float(p[0])) + np.log(0.5 / float(p[1])))  # KL(uniform || p)
    assert float(ce) == pytest.approx(-np.log(float(p[0])), rel=1e-6)
    assert float(kl) == pytest.approx(want_kl, rel=1e-6)
    assert float(total) == pytest.approx(float(ce) + 0.5 * want_kl, rel=1e-6)
    assert float(distillation_loss(student, student, y, 1.0)[2]) == pytest.approx(0.0, abs=1e-7)
    assert float(distillation_loss(student, teacher, y, 0.0)[0]) == float(ce)


def test_routing_by_hand():
    probs = np.array([
        [[0.6, 0.4], [0.1, 0.9]],  # color 0
        [[0.2, 0.8], [0.45, 0.55]],  # color 1
        [[0.5, 0.5], [0.3, 0.7]],  # color 2
    ])
    assert np.allclose(route(probs, "ensemble"), [[1.3 / 3, 1.7 / 3], [0.85 / 3, 2.15 / 3]])
    # sample 0: color 1 is most confident (0.8); sample 1: color 0 (0.9)
    assert np.allclose(route(probs, "max-confidence"), [[0.2, 0.8], [0.1, 0.9]])
    assert np.allclose(route(probs, "max-confidence", exclude=[1]), [[0.6, 0.4], [0.1, 0.9]])
    assert np.allclose(route(probs, "ensemble", exclude=[0, 2]), probs[1])
    with pytest.raises(ValueError, match="every color"):
        route(probs, "ensemble", exclude=[0, 1, 2])
    with pytest.raises(ValueError, match="unknown routing mode 'vote'"):
        route(probs, "vote")
    with pytest.raises(ValueError, match="out of range"):
        parse_color_list("1,7", 6)


def test_detection_zscores_by_hand():
    probs = np.array([[[0.5, 0.5]], [[0.5, 0.5]], [[0.5, 0.5]], [[0.99, 0.01]]])
    losses = color_losses(probs, np.array([1]))
    assert losses[3] == pytest.approx(-np.log(0.01))
    z = loss_zscores(losses)
    mean, std = losses.mean(), losses.std()
    assert np.allclose(z, (losses - mean) / std) and z[3] == pytest.approx(np.sqrt(3))  # one outlier of 4
    assert flagged_colors(z, 1.5) == [3]
    assert np.all(loss_zscores(np.ones(4)) == 0)


def test_membership_inference_auroc():
    member = np.array([[0.9, 0.1], [0.2, 0.8]])  # true-class confidence 0.9, 0.8
    non = np.array([[0.6, 0.4], [0.3, 0.7]])  # 0.6, 0.7
    assert mia_auroc(member, [0, 1], non, [0, 1]) == 1.0
    assert mia_auroc(non, [0, 1], non, [0, 1]) == 0.5


# ---- the strategy: permission-checked direct replacement -----------------------------------------
class _Grid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


def _reply(incoming: Message, tensors: dict[str, torch.Tensor], n=10) -> Message:
    arrays = ArrayRecord({k: Array(v.numpy()) for k, v in tensors.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n, "train-loss": 0.5})}),
                   reply_to=incoming)


def test_writes_outside_the_plan_are_rejected_and_recorded(tmp_path):
    from flwr.supercore.task_identity import TaskIdentity

    from hospitrust.strategies import STRATEGIES
    from hospitrust.strategies.fbd import FBD

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    assert STRATEGIES["fbd"] is FBD
    plan = parse_plan("0:0,1; 1:2,3; 2:0,1; 3:2,3", SIX[:4], 4, 2)
    wh = _warehouse()
    log = StampLog(tmp_path / "stamps.jsonl")
    hospitals = {11: "hospital-0", 12: "hospital-1", 13: "hospital-2", 14: "hospital-3"}
    strategy = FBD(hospitals, plan=plan, warehouse=wh, stamp_log=log, seed=0)
    messages = {m.metadata.dst_node_id: m for m in strategy.configure_train(1, None, ConfigRecord(), _Grid(hospitals))}
    sched = plan.schedule(1)
    h0_color = sched["hospital-0"]
    other_own = [m for m in plan.colors_of["hospital-0"] if m != h0_color][0]
    # hospital-0 is shipped only its own colors
    shipped = {parse_color_key(k)[0] for k in messages[11].content["arrays"].keys()}
    assert shipped <= set(plan.colors_of["hospital-0"]) and h0_color in shipped
    before = wh.hashes()
    trained = {k: v + 0.01 if v.is_floating_point() else v for k, v in wh.states[h0_color].items()}
    payload = {color_key(h0_color, k): v for k, v in trained.items()}
    payload.update({color_key(2, k): v for k, v in trained.items() if k.startswith("classifier.4")})  # not its color
    payload.update({color_key(other_own, k): v for k, v in trained.items() if k.startswith("features.0")})  # not now
    h1_color = sched["hospital-1"]
    bad = {color_key(h1_color, k): v + 1 if v.is_floating_point() else v for k, v in wh.states[h1_color].items()}
    bad[color_key(h1_color, "classifier.4.bias")] = torch.tensor([float("nan"), 0.0])
    h3_color = sched["hospital-3"]
    partial = {color_key(h3_color, "classifier.4.weight"): wh.states[h3_color]["classifier.4.weight"] + 1}
    replies = [_reply(messages[11], payload), _reply(messages[12], bad), _reply(messages[14], partial),
               _reply(messages[13], {}, n=0)]
    clients = {c.hospital: flat_entry(c) for c in strategy.aggregate_round(1, replies).clients}
    c0 = clients["hospital-0"]
    assert c0["selected"] and c0["accepted_blocks"] == wh.block_names
    reasons = sorted(r["reason"] for r in c0["rejected_writes"])
    assert any("does not let hospital-0 write color 2" in r for r in reasons)
    assert any(f"scheduled to write color {h0_color} this round, not {other_own}" in r for r in reasons)
    assert "NaN" in " ".join(r["reason"] for r in clients["hospital-1"]["rejected_writes"])
    assert clients["hospital-1"]["accepted_blocks"] == ["stem", "conv2", "neck"]  # the good blocks still count
    assert clients["hospital-3"]["rejected_writes"][0]["reason"].startswith("incomplete block")
    assert clients["hospital-2"]["rejected"] and "num-examples" in clients["hospital-2"]["reason"]
    after = wh.hashes()
    assert torch.equal(wh.states[h0_color]["features.0.weight"], trained["features.0.weight"])  # direct replacement
    for key in before:
        m, b = int(key.split("/")[0]), key.split("/")[1]
        changed = m == h0_color or (m == h1_color and b != "head")
        assert (after[key] != before[key]) == changed, key
    events = [e["event"] for e in log.read()]
    assert events.count("write") == 4 + 3 and events.count("rejected") == 2 + 1 + 1
    assert all(wh.meta[(h0_color, b)].trail == ["hospital-0"] for b in wh.block_names)


# ---- real in-process runs -----------------------------------------------------------------------
def _fbd_config(tmp_path, name, **overrides):
    return small_run_config(tmp_path, **{
        "strategy": "fbd", "fbd.colors": 4, "fbd.redundancy": 2, "num-server-rounds": 2, "train-subsample": 0.03,
        "run-name": name, "partitioner": "iid", "fbd.distill-weight": 0.2, **overrides})


@pytest.fixture(scope="module")
def fbd_runs(tmp_path_factory, _medmnist_problem):
    """An honest run and a run where hospital-0 flips labels and also tries to write a color
    of the other group (the same seed, everything else equal)."""
    from hospitrust.ops.inprocess import run_inprocess

    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    tmp = tmp_path_factory.mktemp("fbd")
    run_inprocess(_fbd_config(tmp, "honest"), 4)
    plan = ShippingPlan.load(tmp / "runs" / "honest" / "fbd_plan.json")
    foreign = plan.untouched_colors("hospital-0")[0]

    def sneak(index, incoming, reply):  # hospital-0 also sends a version of a color it may not write
        if index == 0 and reply.has_content() and "arrays" in reply.content.array_records:
            arrays = reply.content["arrays"]
            for name in list(arrays.keys()):
                color, key = parse_color_key(name)
                arrays[color_key(foreign, key)] = Array(arrays[name].numpy() * 0 + 1)
        return reply

    run_inprocess(_fbd_config(tmp, "poisoned", **{"attack": "label-flip", "malicious-hospitals": "0"}), 4,
                  reply_filter=sneak)
    return tmp / "runs" / "honest", tmp / "runs" / "poisoned", foreign


def test_fbd_run_writes_plan_stamps_warehouse_and_rounds(fbd_runs):
    from hospitrust.server_app.results import (CENTRAL_METRICS, ROUND_FIELDS, read_round_lines, read_round_records,
                                               read_summary)

    honest, _, _ = fbd_runs
    for name in ("config.json", "rounds.jsonl", "summary.json", "warehouse.pt", "fbd_plan.json", "fbd_stamps.jsonl"):
        assert (honest / name).is_file(), name
    assert all(set(ROUND_FIELDS) <= set(line) for line in read_round_lines(honest))  # the written schema
    rounds = read_round_records(honest)
    assert [r.number for r in rounds] == [1, 2]
    for r in rounds:
        assert set(CENTRAL_METRICS) <= set(r.central)
        fbd = r.entries["fbd"]
        assert sorted(fbd["schedule"]) == SIX[:4] and len(set(fbd["schedule"].values())) == 4
        assert set(fbd["routing"]) >= {"ensemble", "max-confidence"}
        assert all(c.selected and c.signals["fbd"]["accepted_blocks"] == ["stem", "conv2", "neck", "head"]
                   for c in r.clients)
        assert fbd["rejected_writes"] == 0
    assert read_summary(honest)["strategy"] == "fbd"
    wh = Warehouse.load(honest / "warehouse.pt")
    stamps = StampLog(honest / "fbd_stamps.jsonl").read()
    latest = {}
    for s in stamps:
        if s["event"] in ("init", "write"):
            latest[f"{s['color']}/{s['block']}"] = s
    assert {k: s["hash"] for k, s in latest.items()} == wh.hashes()  # the log names every current version
    plan = ShippingPlan.load(honest / "fbd_plan.json")
    for (m, b), v in wh.meta.items():
        assert set(v.trail) <= set(plan.writers(m)) and len(v.trail) == 2  # two rounds, one writer per round


def test_poisoned_hospital_is_contained_to_its_colors(fbd_runs):
    from hospitrust.server_app.results import read_round_records, read_summary

    honest, poisoned, foreign = fbd_runs
    plan = ShippingPlan.load(poisoned / "fbd_plan.json")
    clean = plan.untouched_colors("hospital-0")
    assert read_summary(poisoned)["fbd"]["clean_colors"] == clean
    h, p = Warehouse.load(honest / "warehouse.pt").hashes(), Warehouse.load(poisoned / "warehouse.pt").hashes()
    for key in h:  # clean colors bit-identical; the poisoned group's colors differ
        assert (h[key] == p[key]) == (int(key.split("/")[0]) in clean), key
    for r in read_round_records(poisoned):  # the attempted write to a clean color was rejected, every round
        c0 = flat_entry(r.client("hospital-0"))
        assert c0["selected"] and c0["malicious"]
        assert {w["color"] for w in c0["rejected_writes"]} == {foreign} and len(c0["rejected_writes"]) == 4
        assert r.entries["fbd"]["rejected_writes"] == 4
    rejected = [s for s in StampLog(poisoned / "fbd_stamps.jsonl").read() if s["event"] == "rejected"]
    assert len(rejected) == 8 and {s["writer"] for s in rejected} == {"hospital-0"}


def test_the_detection_feature_runs_on_an_fbd_run_through_the_loop(fbd_runs):
    """FBD is a strategy on the one round loop: the detection feature marks the attacker's entries,
    records each round's detection and the run's security, beside the rule's own ``fbd`` entries."""
    from hospitrust.server_app.results import read_round_records, read_summary

    _, poisoned, _ = fbd_runs
    rounds = read_round_records(poisoned)
    assert [r.number for r in rounds] == [1, 2]
    for r in rounds:
        assert {c.hospital: c.malicious for c in r.clients}["hospital-0"] is True
        assert "detection" in r.entries and "fbd" in r.entries and r.evaluation and r.central["auc"] == r.central["auc"]
    summary = read_summary(poisoned)
    assert summary["malicious_hospitals"] == ["hospital-0"] and "security" in summary
    assert summary["fbd"]["rejected_writes"] == 8 and summary["resumed_at"] == []
    assert not (poisoned / "model.pt").exists()  # the final state is the warehouse


def test_fbd_run_resumed_after_round_1_equals_the_unbroken_run(tmp_path, _medmnist_problem):
    """The warehouse is in the checkpoint: stopped after round 1 and resumed, the run ends with the
    unbroken run's colors, bit for bit, and the same records."""
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records, read_summary

    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_inprocess(_fbd_config(tmp_path, "unbroken"), 4)
        run_inprocess(_fbd_config(tmp_path, "resumed", **{"num-server-rounds": 1}), 4)
        run_inprocess(_fbd_config(tmp_path, "resumed", **{"resume-from": str(tmp_path / "runs" / "resumed")}), 4)
    finally:
        torch.set_num_threads(threads)
    unbroken, resumed = tmp_path / "runs" / "unbroken", tmp_path / "runs" / "resumed"
    assert Warehouse.load(resumed / "warehouse.pt").hashes() == Warehouse.load(unbroken / "warehouse.pt").hashes()
    a, b = read_summary(unbroken), read_summary(resumed)
    assert b["resumed_at"] == [1] and a["fbd"]["block_hashes"] == b["fbd"]["block_hashes"]
    assert a["fbd"]["final_routing"] == b["fbd"]["final_routing"]
    ra, rb = read_round_records(unbroken), read_round_records(resumed)
    assert [r.entries["fbd"]["colors"] for r in ra] == [r.entries["fbd"]["colors"] for r in rb]
    init = [s for s in StampLog(resumed / "fbd_stamps.jsonl").read() if s["event"] == "init"]
    assert len(init) == len(Warehouse.load(unbroken / "warehouse.pt").hashes())  # written once, not again on resume


def test_unlearn_cli_end_to_end(fbd_runs, capsys):
    from hospitrust.cli.main import main

    honest, poisoned, _ = fbd_runs
    before = Warehouse.load(poisoned / "warehouse.pt")
    assert main(["unlearn", str(poisoned), "--hospital", "hospital-0"]) == 0
    out = capsys.readouterr().out
    assert "unlearning time" in out and "membership inference AUROC" in out
    record = json.loads((poisoned / "unlearned-hospital-0" / "unlearning.json").read_text())
    assert record["exact"] and record["seconds"] < 1.0
    assert record["donor_colors"] == ShippingPlan.load(poisoned / "fbd_plan.json").untouched_colors("hospital-0")
    ev = record["evaluation"]
    assert set(ev["before"]) >= {"accuracy", "auc", "mia_auroc"} and 0.0 <= ev["after"]["mia_auroc"] <= 1.0
    after = Warehouse.load(poisoned / "unlearned-hospital-0" / "warehouse.pt")
    assert not any("hospital-0" in v.trail or "hospital-0" in v.influences for v in after.meta.values())
    replaced = {f"{r['color']}/{r['block']}" for r in record["replaced"]}
    for key, value in after.hashes().items():
        assert (value == before.hashes()[key]) == (key not in replaced), key
    # exactness: unlearning the poisoned hospital leaves the same warehouse, bit for bit, as
    # unlearning it from the honest run: nothing of what hospital-0 did survives
    assert main(["unlearn", str(honest), "--hospital", "hospital-0", "--no-evaluate"]) == 0
    assert Warehouse.load(honest / "unlearned-hospital-0" / "warehouse.pt").hashes() == after.hashes()
    log = StampLog(poisoned / "fbd_stamps.jsonl").read()
    assert sum(1 for s in log if s["event"] == "unlearn") == len(replaced)
    assert main(["unlearn", str(poisoned), "--hospital", "hospital-9"]) == 2
    assert "not in this run's plan; hospitals: hospital-0" in capsys.readouterr().err
    assert main(["unlearn", str(poisoned.parent / "missing"), "--hospital", "hospital-0"]) == 2
    assert "must be the directory of a strategy=fbd run" in capsys.readouterr().err


def test_fbd_config_errors():
    from hospitrust.config import ConfigError, RunConfig, parse_run_config

    flat = RunConfig().to_flat()
    with pytest.raises(ConfigError, match="fbd.exclude-colors leaves none"):
        parse_run_config({**flat, "strategy": "fbd", "fbd.colors": 2, "fbd.exclude-colors": "0,1"})
    with pytest.raises(ConfigError, match="out of range"):
        parse_run_config({**flat, "strategy": "fbd", "fbd.exclude-colors": "9"})
    assert parse_run_config({**flat, "strategy": "fbd", "model": "resnet18"}).strategy == "fbd"


def test_fbd_refuses_generic_loop_options_by_name():
    from hospitrust.config import ConfigError, RunConfig, parse_run_config

    flat = {**RunConfig().to_flat(), "strategy": "fbd"}
    parse_run_config(flat)  # defaults are fine
    assert parse_run_config({**flat, "resume-from": "/tmp/some-run"}).resume_from  # the warehouse is checkpointed
    for key, value in (("secagg.enabled", True), ("contribution-scoring.enabled", True)):
        with pytest.raises(ConfigError, match=f"strategy fbd does not support {key}"):
            parse_run_config({**flat, key: value})


def test_negative_batchnorm_variance_is_rejected_by_both_validators():
    """A reply whose BatchNorm running_var has negative entries (Gaussian noise sent as an
    update does this) would turn every prediction into NaN: the generic validator rejects the
    reply and FBD rejects the block write."""
    from flwr.supercore.task_identity import TaskIdentity

    from hospitrust.aggregation import flatten_state
    from hospitrust.strategies.fbd import FBD
    from hospitrust.strategies.validation import RejectedReply, ReplyLimits, check_train_reply

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    bn = torch.nn.BatchNorm1d(3)
    global_state = {k: v.clone() for k, v in bn.state_dict().items()}
    incoming = Message(RecordDict({"arrays": ArrayRecord({k: Array(v.numpy()) for k, v in global_state.items()})}),
                       dst_node_id=5, message_type="train")
    bad = {k: v.clone() for k, v in global_state.items()}
    bad["running_var"][1] = -0.5
    with pytest.raises(RejectedReply, match="running_var.*negative"):
        check_train_reply(_reply(incoming, bad), global_state, flatten_state(global_state)[0], ReplyLimits())
    good = {k: v.clone() for k, v in global_state.items()}
    good["running_var"][1] = 0.0  # zero is a valid variance
    assert check_train_reply(_reply(incoming, good), global_state, flatten_state(global_state)[0], ReplyLimits())

    wh = Warehouse.create("resnet18", 1, 2, 28, 2, 0, shared_init=True)
    strategy = FBD({11: "hospital-0", 12: "hospital-1"}, plan=parse_plan("0:0; 1:1", SIX[:2], 2, 1), warehouse=wh,
                   stamp_log=None, seed=0)
    key = next(k for k in wh.states[0] if k.endswith("running_var"))
    tensors = {key: -torch.ones_like(wh.states[0][key])}
    assert "negative" in strategy._tensor_problem(0, tensors)
    assert strategy._tensor_problem(0, {key: torch.ones_like(wh.states[0][key])}) == ""


def test_evaluator_leaves_a_broken_color_out_instead_of_failing(tmp_path, data_dir):
    """A color predicting NaN is reported broken, flagged and left out of routing; the round's
    metrics stay finite (the ResNet-18 noise run once died here in round 1)."""
    from hospitrust.config import parse_run_config
    from hospitrust.strategies.fbd import WarehouseEvaluator
    from hospitrust.datasets.server import server_sets
    from hospitrust.tasks.task import resolve_task

    cfg = parse_run_config(small_run_config(tmp_path, **{"strategy": "fbd", "fbd.colors": 3, "fbd.redundancy": 1}))
    wh = _warehouse(colors=3)
    wh.states[1]["classifier.4.weight"] = torch.full_like(wh.states[1]["classifier.4.weight"], float("nan"))
    task = resolve_task(cfg)
    sets = server_sets(cfg.server_data, task, cfg.federation, cfg.task.custom)
    central, fbd = WarehouseEvaluator(cfg.options("fbd"), task.num_classes, torch.device("cpu"), sets)(wh)
    assert fbd["broken_colors"] == [1] and 1 in fbd["flagged_colors"] and 1 in fbd["excluded_colors"]
    assert fbd["colors"]["1"]["broken"] and fbd["colors"]["1"]["z"] is None
    assert np.isfinite(central["auc"]) and np.isfinite(central["balanced_accuracy"])
    json.dumps(fbd, allow_nan=False)  # what goes into rounds.jsonl is plain JSON


def test_fbd_unlearning_table_unlearns_every_hospital_of_a_grid_and_resumes(fbd_runs, tmp_path):
    import importlib.util
    import shutil
    import sys

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("fbd_unlearning", REPO / "benchmarks" / "fbd_unlearning.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules["fbd_unlearning"] = script
    spec.loader.exec_module(script)
    honest, _, _ = fbd_runs
    # a bench folder's layout: cells/<axis=label__...>/ holding the run
    cell = tmp_path / "grid" / "cells" / "dataset=pneumoniamnist__skew=iid__seed=1"
    shutil.copytree(honest, cell, ignore=shutil.ignore_patterns("unlearned-*"))
    records = script.unlearn_cell(cell)
    plan = ShippingPlan.load(cell / "fbd_plan.json")
    assert [r["hospital"] for r in records] == list(plan.hospitals)
    for r in records:  # two groups sharing colors: every hospital has donors
        assert "refused" not in r and r["exact"]
        saved = json.loads((cell / f"unlearned-{r['hospital']}" / "unlearning.json").read_text())
        assert r["auc_drop"] == pytest.approx(saved["evaluation"]["auc_drop"])
    text = script.table(tmp_path / "grid", ["dataset", "skew"])
    row = next(line for line in text.splitlines() if line.startswith("| pneumoniamnist | iid |"))
    assert row.split("|")[3].strip() == str(len(plan.hospitals)) and row.split("|")[4].strip() == "0"
    # a second call reads the records back instead of unlearning again
    stamp = (cell / "fbd_stamps.jsonl").read_text()
    assert script.unlearn_cell(cell) == records
    assert (cell / "fbd_stamps.jsonl").read_text() == stamp
    with pytest.raises(SystemExit, match="--by attack"):
        script.table(tmp_path / "grid", ["attack"])

"""FedAgain, HTA and EARN: hand-computed math, and the strategies on synthetic replies (no training)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from scipy.stats import rankdata, spearmanr

from conftest import flat_entry
from hospitrust.aggregation import (
    excused_direction,
    fedagain_divergence,
    fedagain_trust,
    flatten_state,
    hta_fusion,
    hta_signals,
    hta_weights,
    mad_exclusion,
    median_norm_clip,
    plausible_median_norm,
    reputation_update,
)
from hospitrust.aggregation import earn
from hospitrust.aggregation.duplicates import duplicate_groups, group_representatives, pairwise_cosine
from hospitrust.strategies import build_strategy


# ---- synthetic replies with any state dict and metrics ---------------------------------------
def _send(strategy, rnd, global_state, deltas, metrics=None, num_examples=None):
    """Global model ``global_state``; node i answers global + deltas[i] (a dict of tensors)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1

    class _Grid:
        def get_node_ids(self):
            return list(strategy.hospitals)

    msgs = sorted(strategy.configure_train(rnd, ArrayRecord(global_state), ConfigRecord(), _Grid()),
                  key=lambda m: m.metadata.dst_node_id)
    replies = []
    for i, msg in enumerate(msgs):
        state = {k: (v + deltas[i][k]).float() for k, v in global_state.items()}
        m = {"num-examples": 10 if num_examples is None else num_examples[i], "train-loss": 0.5}
        m.update((metrics or [{}] * len(msgs))[i])
        replies.append(Message(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(m)}), reply_to=msg))
    result = strategy.aggregate_round(rnd, replies)
    arrays, by_name = result.arrays, {c.hospital: flat_entry(c) for c in result.clients}
    return arrays, by_name


def _hospitals(n):
    return {100 + i: f"h{i}" for i in range(n)}


# ---- FedAgain ------------------------------------------------------------------------------
def test_fedagain_trust_formula_by_hand():
    # the paper's rule (no floors): T = 1 / (E D + eps)
    r = fedagain_trust([0.5, 0.25], [2.0, 2.0], divergence_quantile=0.0, error_quantile=0.0, error_floor=0.0, eps=0.0)
    assert r["trust"].tolist() == pytest.approx([1.0, 2.0])
    assert r["weights"].tolist() == pytest.approx([1 / 3, 2 / 3])
    # floors: D' = max(D, median D), E' = max(E, median E, 0.01)
    r = fedagain_trust([0.1, 0.2, 0.4], [1.0, 2.0, 4.0], eps=0.0)
    assert r["divergence"].tolist() == pytest.approx([2.0, 2.0, 4.0])
    assert r["error"].tolist() == pytest.approx([0.2, 0.2, 0.4])
    assert r["trust"].tolist() == pytest.approx([2.5, 2.5, 1 / 1.6])


def test_fedagain_divergences_by_hand():
    u = torch.tensor([[3.0, 4.0], [-1.0, 1.0]])
    assert fedagain_divergence(u, kind="l2").tolist() == pytest.approx([5.0, math.sqrt(2)])
    g = torch.tensor([1.0, 0.0])  # returned weights [4, 4] and [0, 1]
    assert fedagain_divergence(u, g, kind="cosine").tolist() == pytest.approx([1 - 1 / math.sqrt(2), 1.0])


def test_fedagain_free_rider_floor():
    gen = torch.Generator().manual_seed(0)
    d = torch.cat([1.0 + 0.1 * torch.rand(9, generator=gen), torch.zeros(1)])  # hospital 9 returns the global model
    e = 0.2 + 0.05 * torch.rand(10, generator=gen)
    paper = fedagain_trust(e, d, divergence_quantile=0.0, error_quantile=0.0, error_floor=0.0)
    assert float(paper["weights"][9]) > 0.99  # the known hole: D = 0 takes everything
    ours = fedagain_trust(e, d)
    # floored at the median divergence: worth no more than the best honest hospital
    assert float(ours["weights"][9]) <= float(ours["weights"][:9].max()) + 1e-12
    assert float(ours["weights"][9]) < 1.5 / 10


def test_fedagain_lying_error_is_bounded():
    gen = torch.Generator().manual_seed(1)
    d = 1.0 + 0.1 * torch.rand(10, generator=gen)
    e = 0.15 + 0.1 * torch.rand(10, generator=gen)
    e[3] = 0.0  # hospital 3 reports E = 0
    paper = fedagain_trust(e, d, divergence_quantile=0.0, error_quantile=0.0, error_floor=0.0)
    assert float(paper["weights"][3]) > 0.99
    ours = fedagain_trust(e, d)
    # bound: a liar's E' is the round's median error, so its trust is at most that of an
    # honest hospital at the median error and median divergence; here below 1.5 x 1/n
    bound = 1.0 / (float(torch.quantile(e, 0.5)) * float(torch.quantile(d, 0.5)) + 1e-6)
    assert float(ours["trust"][3]) <= bound + 1e-9
    assert float(ours["weights"][3]) < 1.5 / 10


def test_fedagain_strategy_weights_from_reported_errors():
    s = build_strategy("fedagain", _hospitals(3))
    g = {"w": torch.zeros(2)}
    deltas = [{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.0, 0.0])}]
    metrics = [{"benchmark-error": 0.2}, {"benchmark-error": 0.0}, {"benchmark-error": 0.4}]
    arrays, by = _send(s, 1, g, deltas, metrics)
    # E' = max(E, median 0.2) = [0.2, 0.2, 0.4]; D' = max(D, median 5) = [5, 5, 5]; T = [1, 1, 0.5]
    assert [by[f"h{i}"]["weight"] for i in range(3)] == pytest.approx([0.4, 0.4, 0.2], rel=1e-5)
    assert by["h2"]["flagged"] is False and by["h1"]["trust"] == pytest.approx(by["h0"]["trust"])
    assert torch.allclose(torch.from_numpy(arrays["w"].numpy()), torch.tensor([2.4, 3.2]), atol=1e-5)


def test_fedagain_server_variant_uses_the_reference_cohort():
    calls = []

    def scores(state, updates):
        calls.append(updates.shape)
        return torch.tensor([0.8, 0.8, 0.4], dtype=torch.float64)

    s = build_strategy("fedagain", _hospitals(3), options=dict(benchmark="server"), candidate_scores=scores)
    g = {"w": torch.zeros(2)}
    deltas = [{"w": torch.tensor([3.0, 4.0])}] * 3
    _, by = _send(s, 1, g, deltas, [{"benchmark-error": 0.0}] * 3)  # lies ignored
    assert calls == [(3, 2)]
    assert [by[f"h{i}"]["benchmark_error_used"] for i in range(3)] == pytest.approx([0.2, 0.2, 0.6])
    with pytest.raises(ValueError, match="candidate_scores"):
        build_strategy("fedagain", _hospitals(3), options=dict(benchmark="server"))


# ---- HTA -----------------------------------------------------------------------------------
def test_hta_signals_by_hand():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    sig = hta_signals(x, torch.tensor([0.8, 0.4, 0.9]))
    assert sig["s"].tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert sig["m"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert sig["v"].tolist() == pytest.approx([1.0, 0.5, 1.0])  # over the median 0.8, clipped to 1
    y = torch.tensor([[1.0, 0.0], [1.0, 0.0], [10.0, 0.0], [0.1, 0.0], [0.0, 0.0]])
    m = hta_signals(y, magnitude_tolerance=2.0)["m"]
    # median norm 1: exp(-(|ln r| - ln 2)) beyond 2x, symmetric; a zero update gets 0
    assert m.tolist() == pytest.approx([1.0, 1.0, 0.2, 0.2, 0.0])
    assert hta_signals(y)["s"].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.0])


def test_hta_fusion_by_hand():
    s, m, v = torch.tensor([0.25]), torch.tensor([0.5]), torch.tensor([0.5])
    assert float(hta_fusion(s, m, v, 0.5, 1.0, 1.0)) == pytest.approx(0.125)
    assert float(hta_fusion(s, m, v, 0.0, 0.0, 1.0)) == pytest.approx(0.5)  # exponent 0: ablation
    assert float(hta_fusion(torch.tensor([0.0]), m, v, 0.0, 1.0, 1.0)) == pytest.approx(0.25)  # 0^0 = 1


def test_reputation_ema_and_variance_penalty_by_hand():
    ema, var, rep = reputation_update(1.0, None, 0.0, rate=0.5, variance_penalty=1.0)
    assert (ema, var, rep) == (1.0, 0.0, 1.0)
    ema, var, rep = reputation_update(0.0, ema, var, rate=0.5, variance_penalty=1.0)
    assert (ema, var, rep) == pytest.approx((0.5, 0.25, 0.0))  # delta -1: var 0.5 (0 + 0.5)
    ema, var, rep = reputation_update(1.0, ema, var, rate=0.5, variance_penalty=1.0)
    assert (ema, var) == pytest.approx((0.75, 0.1875))  # delta 0.5: var 0.5 (0.25 + 0.125)
    assert rep == pytest.approx(0.75 - math.sqrt(0.1875))
    # an on-off hospital ends below a steady one with the same mean
    steady = onoff = None
    sv = ov = 0.0
    for t in range(10):
        steady, sv, srep = reputation_update(0.5, steady, sv, rate=0.3)
        onoff, ov, orep = reputation_update(float(t % 2), onoff, ov, rate=0.3)
    assert orep < srep - 0.2


def test_mad_exclusion_by_hand():
    r = torch.tensor([0.9, 0.85, 0.8, 0.95, 0.1, 0.7, 0.45])
    ex = mad_exclusion(r, lam=2.0, kappa=0.5)
    assert float(ex["mu"]) == pytest.approx(0.8) and float(ex["mad"]) == pytest.approx(0.1)
    # 0.1 is below both 0.6 (mu - 2 MAD) and 0.4 (kappa mu); 0.45 only below the first: kept
    assert ex["excluded"].tolist() == [False, False, False, False, True, False, False]
    assert ex["below_mad"].tolist()[6] and not ex["below_kappa"].tolist()[6]
    # all reputations equal: MAD 0, nobody is below kappa mu: nobody excluded
    assert not mad_exclusion(torch.full((5,), 0.3))["excluded"].any()


def test_hta_weights_by_hand():
    x = torch.tensor([[1.0, 0.0], [0.0, 3.0], [100.0, 0.0]])
    up, w = hta_weights(x, torch.tensor([1.0, 0.5]).repeat(1)[[0, 1, 0]], torch.tensor([10.0, 20.0, 10.0]),
                        torch.tensor([True, True, False]), clip_to_median_norm=True)
    assert w.tolist() == pytest.approx([0.5, 0.5, 0.0])  # R n = 10, 10, excluded
    # kept median norm = 2: the second update is clipped to norm 2
    assert up.tolist() == pytest.approx([0.5, 1.0])


def _toy_reference(direction_ok, special):
    """A stand-in for the reference cohort: updates along the honest direction (not too large)
    validate well; the specialist's own direction adds a little (it knows the rare class)."""

    def scores(state, updates):
        u = updates.double()
        norms = torch.linalg.vector_norm(u, dim=1)
        cos_ok = (u @ direction_ok) / (norms * torch.linalg.vector_norm(direction_ok)).clamp_min(1e-12)
        cos_sp = (u @ special) / (norms * torch.linalg.vector_norm(special)).clamp_min(1e-12)
        size = torch.exp(-(norms / torch.linalg.vector_norm(direction_ok) - 2.0).clamp_min(0.0))
        return 0.5 + 0.4 * cos_ok.clamp_min(0) * size + 0.1 * cos_sp.clamp_min(0)

    return scores


def test_hta_excludes_sign_flip_and_scaling_and_keeps_the_specialist():
    d, n = 20, 10
    ones = torch.ones(d, dtype=torch.float64)
    special = torch.zeros(d, dtype=torch.float64)
    special[0], special[1] = 4.0, -4.0
    s = build_strategy("hta", _hospitals(n), candidate_scores=_toy_reference(ones, special))
    gen = torch.Generator().manual_seed(0)
    g = {"w": torch.zeros(d)}
    for rnd in range(1, 5):
        honest = [ones + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64) for _ in range(n)]
        ups = honest[:7] + [ones + special, -honest[8], 10 * honest[9]]  # h7 specialist, h8 flips, h9 scales
        arrays, by = _send(s, rnd, g, [{"w": u} for u in ups])
        assert by["h8"]["excluded"] and by["h8"]["flagged"] and by["h8"]["weight"] == 0.0
        assert by["h9"]["excluded"] and by["h9"]["weight"] == 0.0 and "kappa" in by["h9"]["exclusion_reason"]
        assert not by["h7"]["excluded"] and by["h7"]["weight"] > 0.05, by["h7"]
        assert all(not by[f"h{i}"]["excluded"] for i in range(7))
        for key in ("s", "m", "v", "tau", "reputation", "reference_balanced_accuracy"):
            assert all(0.0 <= by[f"h{i}"][key] <= 1.0 for i in range(n)), key
        agg = torch.from_numpy(arrays["w"].numpy()).double()
        assert float(torch.linalg.vector_norm(agg - ones)) < 0.5 * float(torch.linalg.vector_norm(ones))
    assert s.reputation["h7"] > 0.5 and s.reputation["h8"] < 0.1 and s.reputation["h9"] < 0.3
    assert set(s.ema) == {f"h{i}" for i in range(n)}  # state by hospital name


def test_duplicate_groups_by_hand():
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    c = torch.tensor([1.0, 0.1, 0.0])  # cos(a, c) = 1 / sqrt(1.01) = 0.995
    x = torch.stack([a, 2 * a, b, -a, torch.zeros(3), torch.zeros(3), c])
    dup = duplicate_groups(x, 0.99)
    assert dup["group"].tolist() == [0, 0, 2, 3, 4, 5, 0]  # a, 2a and c; zero updates stay alone
    assert dup["size"].tolist() == [3, 3, 1, 1, 1, 1, 3]
    assert dup["max_cosine"].tolist() == pytest.approx([1.0, 1.0, 0.1 / math.sqrt(1.01), 0.0, 0.0, 0.0, 1 / math.sqrt(1.01)])
    assert duplicate_groups(x)["group"].tolist() == [0, 0, 2, 3, 4, 5, 6]  # default 0.999: c (0.995) is not a copy
    assert pairwise_cosine(x)[3, 0] == pytest.approx(-1.0)
    chain = torch.tensor([[1.0, 0.0], [1.0, 0.12], [1.0, 0.24]])  # 0-1 and 1-2 linked, 0-2 not: one group
    assert duplicate_groups(chain, 0.99)["size"].tolist() == [3, 3, 3]
    assert duplicate_groups(torch.ones(1, 4))["max_cosine"].tolist() == [-1.0]
    with pytest.raises(ValueError, match=r"cosine in \(0, 1\]"):
        duplicate_groups(x, 1.5)


def test_group_representatives_by_hand():
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    assert group_representatives(x, torch.tensor([0, 0, 2])).tolist() == [[2.0, 0.0], [0.0, 1.0]]
    assert group_representatives(x, torch.tensor([0, 1, 2])) is x
    with pytest.raises(ValueError, match="one entry per update"):
        group_representatives(x, torch.tensor([0, 0]))


def test_hta_signals_see_copies_once():
    """Two honest updates and three copies of a crafted one. Counted as five, the copies are
    the coordinate median and the median norm; counted as three voices, they are neither."""
    x = torch.tensor([[3.0, 0.0], [0.0, 3.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    group = duplicate_groups(x)["group"]
    plain, merged = hta_signals(x), hta_signals(x, group=group)
    # five: median (-1, -1), the copy: s = 1 for the copies, 0 for the honest (cosine -0.71)
    assert plain["s"].tolist() == pytest.approx([0.0, 0.0, 1.0, 1.0, 1.0])
    # voices (3, 0), (0, 3), (-1, -1): coordinate median (0, 0), no direction: s = 1 for all
    assert merged["s"].tolist() == pytest.approx([1.0] * 5)
    # median norm: sqrt 2 over five (the honest at 3 are beyond the tolerance 2), 3 over voices
    beyond = math.exp(-(math.log(3 / math.sqrt(2)) - math.log(2.0)))
    assert plain["m"].tolist() == pytest.approx([beyond, beyond, 1.0, 1.0, 1.0])
    assert merged["m"].tolist() == pytest.approx([1.0, 1.0, beyond, beyond, beyond])
    # validation's median: 0.2 over five (the copies'), 0.8 over voices
    acc = torch.tensor([0.8, 0.8, 0.2, 0.2, 0.2])
    assert hta_signals(x, acc)["v"].tolist() == pytest.approx([1.0] * 5)
    assert hta_signals(x, acc, group=group)["v"].tolist() == pytest.approx([1.0, 1.0, 0.25, 0.25, 0.25])


def test_hta_weights_share_one_voice_among_copies():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    rep, n = torch.ones(4), torch.tensor([10.0, 10.0, 10.0, 30.0])
    _, w = hta_weights(x, rep, n, torch.ones(4, dtype=torch.bool), clip_to_median_norm=False,
                       group_size=torch.tensor([1, 1, 2, 2]))
    assert w.tolist() == pytest.approx([10 / 40, 10 / 40, 5 / 40, 15 / 40])  # the pair weighs (10 + 30) / 2
    with pytest.raises(ValueError, match="group_size"):
        hta_weights(x, rep, n, torch.ones(4, dtype=torch.bool), group_size=torch.tensor([1, 1, 0, 2]))


@pytest.mark.parametrize("merge", [True, False])
def test_hta_gives_colluders_sending_one_update_one_hospitals_say(merge):
    """Seven honest hospitals with their own data (noise 0.3 on a shared direction: pairwise
    cosine about 0.9) and three that send one crafted update, a little off the honest mean
    (as ALIE and min-max do). Merged, the three together weigh about one honest hospital and
    are flagged; not merged, they hold about three tenths and pass."""
    d, n = 20, 10
    ones = torch.ones(d, dtype=torch.float64)
    s = build_strategy("hta", _hospitals(n), options=dict(ablation=dict(merge_duplicates=merge)))
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 6):
        honest = [ones + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64) for _ in range(7)]
        crafted = torch.stack(honest).mean(0) - 0.3 * torch.stack(honest).std(0)
        _, by = _send(s, rnd, {"w": torch.zeros(d)}, [{"w": u} for u in honest + [crafted] * 3])
        colluders = sum(by[f"h{i}"]["weight"] for i in (7, 8, 9))
        assert max(by[f"h{i}"]["max_peer_cosine"] for i in range(7)) < 0.99
        assert all(by[f"h{i}"]["max_peer_cosine"] == pytest.approx(1.0) for i in (7, 8, 9))
        if merge:
            assert colluders < 1.5 / 8 and all(by[f"h{i}"]["flagged"] for i in (7, 8, 9))
            assert by["h7"]["duplicates_of"] == ["h8", "h9"] and by["h8"]["duplicate_group_size"] == 3
            assert not any(by[f"h{i}"]["flagged"] for i in range(7))
        else:
            assert colluders > 0.25 and not any(by[f"h{i}"]["flagged"] for i in range(n))
            assert by["h7"]["duplicates_of"] == [] and by["h8"]["duplicate_group_size"] == 1


# ---- EARN ----------------------------------------------------------------------------------
def test_earn_pieces_by_hand():
    assert earn.peer_reliability(torch.tensor([1, 2, 3, 5, 9])).tolist() == pytest.approx([0, 0.25, 0.5, 1, 1])
    assert earn.trust_step(torch.tensor([0.0, 0.95, 0.8]), torch.tensor([True, True, False])).tolist() == \
        pytest.approx([0.1, 1.0, 0.4])
    assert earn.capped_weights(torch.tensor([0.9, 0.05, 0.05]), 0.5).tolist() == pytest.approx([0.5, 0.25, 0.25])
    assert earn.capped_weights(torch.tensor([0.9, 0.05, 0.05]), 1.0).tolist() == pytest.approx([0.9, 0.05, 0.05])
    # all trust 0: FedAvg with the cap
    fed = torch.tensor([0.6, 0.3, 0.1])
    assert earn.rare_row_weights(fed, torch.zeros(3), torch.tensor([5.0, 0, 0])).tolist() == \
        pytest.approx([0.5, 0.375, 0.125])
    # trust 1 at the only holder: (0.1 + 1) / 2 = 0.55 -> capped at 0.5
    w = earn.rare_row_weights(fed, torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, 0, 5.0]))
    assert w.tolist() == pytest.approx([0.5 * 0.6 / 0.9, 0.5 * 0.3 / 0.9, 0.5])


def test_earn_row_agreement_and_audit_by_hand():
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    holders = torch.tensor([True, True, True])
    ag = earn.row_agreement(rows, holders, None, None, mode="peer")
    # peers of 0: median([1,0],[0,1]) = [.5,.5] -> cos 0.7071; peers of 2: [1,0] -> 0
    assert ag["peer"].tolist() == pytest.approx([1 / math.sqrt(2), 1 / math.sqrt(2), 0.0])
    hist = rows.clone()
    ag = earn.row_agreement(rows, holders, hist, torch.tensor([True, True, False]), mode="blend")
    assert float(ag["p"]) == pytest.approx(0.5)  # n(c) = 3
    assert ag["agreement"].tolist() == pytest.approx([0.5 / math.sqrt(2) + 0.5, 0.5 / math.sqrt(2) + 0.5, 0.0])
    solo = earn.row_agreement(rows[:1], torch.tensor([True]), None, None)
    assert math.isnan(float(solo["agreement"][0]))  # one holder, no history: nothing to judge by
    feats = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    labels = torch.tensor([1, 1, 0, 2])
    audit = earn.row_audit(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]), feats, labels, 1)
    assert audit.tolist() == pytest.approx([1.0, -1.0, -1.0])


def test_shift_free_row_audit_by_hand():
    """A row update along the cohort's mean feature (raise the class everywhere) scores 0; the
    plain audit scores it by feature size. Mean feature [1.5, .5], unit [3, 1] / sqrt(10)."""
    feats = torch.tensor([[2.0, 0.0], [2.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, 1, 1])
    rows = torch.tensor([[3.0, 1.0], [0.0, 1.0]])
    # plain: [3,1].[1,1] - [3,1].[2,0] = 4 - 6; [0,1]: 1 - 0
    assert earn.row_audit(rows, feats, labels, 1).tolist() == pytest.approx([-2.0, 1.0])
    # shift-free: [3,1] -> 0; [0,1] -> [0,1] - (1/sqrt(10)) [3,1]/sqrt(10) = [-.3, .9]: .6 - (-.6)
    assert earn.row_audit(rows, feats, labels, 1, shift_free=True).tolist() == pytest.approx([0.0, 1.2])
    # zero features: nothing to remove, the plain audit
    zeros = torch.zeros(4, 2)
    assert earn.row_audit(rows, zeros, labels, 1, shift_free=True).tolist() == pytest.approx([0.0, 0.0])


def test_spearman_matches_scipy():
    a = torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, 0.0])
    b = torch.tensor([10.0, 2.0, 3.0, 4.0, 4.0, 1.0])
    assert earn.average_ranks(a).tolist() == pytest.approx(rankdata(a.numpy()).tolist())
    assert earn.spearman(a, b) == pytest.approx(spearmanr(a.numpy(), b.numpy())[0])
    assert math.isnan(earn.spearman(torch.ones(4), b[:4]))


def _local_updates(global_state, datasets, C, F, H, seed):
    torch.manual_seed(seed)
    out = []
    for xs, ys in datasets:
        m = torch.nn.Sequential(torch.nn.Linear(F, H), torch.nn.ReLU(), torch.nn.Linear(H, C))
        m.load_state_dict(global_state)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        for _ in range(2):
            perm = torch.randperm(len(ys))
            for i in range(0, len(ys), 32):
                b = perm[i : i + 32]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(xs[b]), ys[b]).backward()
                opt.step()
        out.append({k: v.detach() - global_state[k] for k, v in m.state_dict().items()})
    return out


@pytest.mark.parametrize("split", ["natural", "specialist"])
def test_earn_update_evidence_spearman_on_trained_updates(split):
    """Real local SGD (a small MLP, softmax cross-entropy, the hospitals' optimizer settings) on
    10 hospitals with Dirichlet(0.5) class mixes of a RetinaMNIST-like prior; the specialist
    split gives the rarest class to one hospital. Evidence = positive part of the bias update."""
    C, F, H, n = 5, 20, 16, 10
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only contend
    try:
        per_round, counts, bias = _trained_evidence(split, C, F, H, n)
    finally:
        torch.set_num_threads(threads)
    # the first round from a random model is weaker; from the second round on >= 0.7
    assert min(per_round[1:]) >= 0.7, per_round
    # the sign separates: in the specialist split only the holder's class-4 bias goes up
    if split == "specialist":
        assert bool(bias[0, 4] > 0) and bool((bias[1:, 4] < 0).all())


def _trained_evidence(split, C, F, H, n):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    means = torch.randn(C, F) * 1.5
    prior = np.array([0.45, 0.12, 0.19, 0.18, 0.06])
    counts = np.floor(rng.dirichlet([0.5] * n, size=C).T * (prior * 1080)[None, :]).astype(int)
    if split == "specialist":
        counts[:, 4] = 0
        counts[0, 4] = int(prior[4] * 1080)
    datasets = []
    for row in counts:
        ys = torch.cat([torch.full((int(k),), c) for c, k in enumerate(row)]).long()
        datasets.append((means[ys] + torch.randn(len(ys), F), ys))
    net = torch.nn.Sequential(torch.nn.Linear(F, H), torch.nn.ReLU(), torch.nn.Linear(H, C))
    g = {k: v.detach().clone() for k, v in net.state_dict().items()}
    sizes = torch.tensor(counts.sum(1), dtype=torch.float32)
    per_round = []
    for rnd in range(5):
        ups = _local_updates(g, datasets, C, F, H, seed=rnd)
        bias = torch.stack([u["2.bias"] for u in ups])
        per_round.append(earn.mean_class_spearman(earn.update_evidence(bias), torch.tensor(counts)))
        w = sizes / sizes.sum()
        g = {k: g[k] + sum(wi * u[k] for wi, u in zip(w, ups)) for k in g}
    return per_round, counts, bias


def _earn_round(s, rnd, gen, audit_faker=True, n=6, C=3, H=4, flipper=None, specialist_body=None,
                scaled: tuple[int, float] | None = None):
    """Rare class 2: h0 holds it (row along feature e2, bias up); h1 fakes it consistently
    (bias up, row along e0); the rest hold classes 0 and 1 only; ``flipper`` (an index) sends
    its honest update negated; ``specialist_body`` replaces h0's body update (the others' is
    about (1, 1, 1)); ``scaled`` = (index, factor): that hospital also holds class 2, as h0
    does, and sends its update times factor."""
    g = {"body": torch.zeros(3), "head.weight": torch.zeros(C, H), "head.bias": torch.zeros(C)}
    deltas, metrics = [], []
    for i in range(n):
        w = 0.05 * torch.randn(C, H, generator=gen)
        b = 0.05 * torch.randn(C, generator=gen)
        w[0, 0] += 1.0
        w[1, 1] += 1.0
        if i == 0 or (scaled is not None and i == scaled[0]):
            w[2, 2] += 1.0
            b[2] = 0.5
        elif i == 1:
            w[2, 0] += 1.0
            b[2] = 0.5
        else:
            w[2, 2] -= 0.3
            b[2] = -0.3
        delta = {"body": torch.ones(3) + 0.05 * torch.randn(3, generator=gen), "head.weight": w, "head.bias": b}
        if i == 0 and specialist_body is not None:
            delta["body"] = specialist_body + 0.05 * torch.randn(3, generator=gen)
        if i == flipper:
            delta = {k: -v for k, v in delta.items()}
        if scaled is not None and i == scaled[0]:
            delta = {k: scaled[1] * v for k, v in delta.items()}
        deltas.append(delta)
        metrics.append({"class-counts": [50, 50, 20 if i == 0 else 0]})
    return _send(s, rnd, g, deltas, metrics)


def _reference_features(state):
    feats = torch.tensor([[1.0, 0, 0, 0]] * 3 + [[0, 1.0, 0, 0]] * 3 + [[0, 0, 1.0, 0]] * 3)
    return feats, torch.tensor([0] * 3 + [1] * 3 + [2] * 3)


def test_earn_rewards_the_specialist_and_not_a_consistent_faker():
    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg"), head_features=_reference_features)  # the FedAvg base: the weights below by hand
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 13):
        arrays, by = _earn_round(s, rnd, gen)
    assert s.trust["h0"][2] >= 0.8  # slow to earn: +0.1 per agreeing round
    assert s.trust["h1"][2] < 0.05  # the faker agrees with its own history but fails the audit
    fair = 1 / 6
    assert by["h1"]["rare_row_weight"]["2"] <= fair + 1e-9
    # two holders: p = 1/4, so the four non-holders count 3/4 each (earn-nonholder-by-peers):
    # base shares 1/5 for each holder, 3/20 for each non-holder; + trust 1 x evidence share 1/2
    # (the faker claims the other half), normalized over 1.5
    assert by["h0"]["rare_row_weight"]["2"] == pytest.approx((1 / 5 + 0.5) / 1.5)
    assert by["h3"]["rare_row_weight"]["2"] == pytest.approx((3 / 20) / 1.5)
    assert by["h1"]["flagged"] and not by["h0"]["flagged"]
    assert 2 in by["h0"]["holds"] and 2 in by["h1"]["holds"] and 2 not in by["h3"]["holds"]
    assert not math.isnan(by["h0"]["evidence_spearman"])


def test_earn_on_an_hta_base_weighs_the_body_by_reputation_and_keeps_it_across_a_checkpoint():
    kw = dict(options=dict(rare_classes="2", base="hta"), head_features=_reference_features, hta_options={"validation_exponent": 0.0})
    s = build_strategy("earn", _hospitals(7), **kw)
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 13):
        _, by = _earn_round(s, rnd, gen, n=7, flipper=6)
    # HTA's direction signal is 0 for the negated update: no reputation, no weight in the body
    assert by["h6"]["s"] == 0.0 and by["h6"]["weight"] == pytest.approx(0.0, abs=1e-12)  # float64
    assert by["h6"]["flagged"]
    assert sum(c["weight"] for c in by.values()) == pytest.approx(1.0)
    # the rare row still rewards the specialist and holds the faker to at most its base weight
    assert s.trust["h0"][2] >= 0.8 and s.trust["h1"][2] < 0.05
    assert by["h1"]["rare_row_weight"]["2"] <= by["h1"]["weight"] + 1e-9
    assert by["h0"]["rare_row_weight"]["2"] > by["h0"]["weight"]
    # HTA's reputations travel with EARN's state (the server checkpoint)
    restored = build_strategy("earn", _hospitals(7), **kw)
    restored.load_state_dict(s.state_dict())
    assert restored.base_rule.reputation == s.base_rule.reputation and restored.base_rule.ema == s.base_rule.ema
    assert restored.trust == s.trust


def test_earn_excuses_an_audited_specialists_direction_but_not_a_sign_flipper():
    """HTA alone marks the specialist down for its orthogonal body update (s = 0); once its
    grade-2 row has passed the audit, EARN floors its s at that trust x the round's median s,
    so it counts as a typical hospital and regains about its data share of the body. The sign flipper (its negated rare row even passes the audit)
    is still held out by v, the reference-cohort check of its whole update."""
    honest = flatten_state({"body": torch.ones(3), "head.weight": torch.zeros(3, 4), "head.bias": torch.zeros(3)})[0]

    def scores(state, updates):  # a hurt reference cohort for updates that point against the body
        return torch.where(updates.double() @ honest.double() > -2.0, 0.8, 0.3)

    body = {}
    for excuse in (False, True):
        # hta_merge_duplicates off: these synthetic honest hospitals send near-identical updates (cosine > 0.99)
        s = build_strategy("earn", _hospitals(7), options=dict(rare_classes="2", ablation=dict(excuse_direction=excuse)), head_features=_reference_features, candidate_scores=scores, hta_options={"ablation": {"merge_duplicates": False}})
        gen = torch.Generator().manual_seed(0)
        for rnd in range(1, 16):
            _, by = _earn_round(s, rnd, gen, n=7, flipper=6, specialist_body=torch.tensor([1.0, -2.5, 0.0]))
        assert s.trust["h0"][2] == pytest.approx(1.0) and s.trust["h6"][2] >= 0.8  # both pass the row audit
        assert by["h6"]["weight"] == pytest.approx(0.0, abs=1e-12) and by["h6"]["excluded"]  # float64
        body[excuse] = by["h0"]
    assert body[False]["s"] < 0.1 and body[False]["weight"] < 0.05
    assert body[True]["s"] > 0.9 and body[True]["s_raw"] < 0.1  # the others' s are about 1 here
    assert body[True]["weight"] > 0.12  # 6 kept hospitals of 10 examples each: 1/6 at full reputation


def test_earn_nonholder_weight_scales_non_holders_out_of_the_rare_row():
    """h0 and h1 hold class 2 by the evidence (bias up); h2..h5 do not. At 0 the rare row is
    the holders' alone (capped at half each); at 0.5 the non-holders keep a smaller share than
    at 1 (the rule as specified); the body does not change."""
    def row(factor):
        s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg", nonholder_weight=factor, ablation=dict(nonholder_by_peers=False)), head_features=_reference_features)
        _, by = _earn_round(s, 1, torch.Generator().manual_seed(0))
        assert all((2 in by[f"h{i}"]["holds"]) == (i < 2) for i in range(6))
        assert by["h2"]["weight"] == pytest.approx(1 / 6)  # the body: FedAvg whatever the factor
        return [by[f"h{i}"]["rare_row_weight"]["2"] for i in range(6)]

    zero, half, one = row(0.0), row(0.5), row(1.0)
    assert zero == pytest.approx([0.5, 0.5, 0, 0, 0, 0])
    assert all(0 < h < o for h, o in zip(half[2:], one[2:]))
    assert sum(half[:2]) > sum(one[:2]) and sum(half) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="earn.nonholder-weight"):
        build_strategy("earn", _hospitals(3), options=dict(nonholder_weight=1.5))


def test_nonholder_factor_by_hand():
    # 1 - p(c), p(c) = clip((n - 1) / 4, 0, 1)
    assert [earn.nonholder_factor(k, by_peers=True) for k in (0, 1, 2, 3, 5, 9)] == pytest.approx([1, 1, 0.75, 0.5, 0, 0])
    assert earn.nonholder_factor(3, 0.5, by_peers=True) == pytest.approx(0.25)
    assert earn.nonholder_factor(9, 0.5) == 0.5  # fixed: the weight whatever the holders
    with pytest.raises(ValueError, match="weight"):
        earn.nonholder_factor(2, 1.5)


def test_earn_nonholder_by_peers_keeps_non_holders_in_a_thin_row_and_drops_them_from_a_well_held_one():
    """Two holders (p = 0.25): the row is the fixed factor 0.75's. Five holders of seven
    (p = 1): the two non-holders get no share of the row, and the body is FedAvg either way."""
    def fixed_row(factor):
        s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg", nonholder_weight=factor, ablation=dict(nonholder_by_peers=False)), head_features=_reference_features)
        by = _earn_round(s, 1, torch.Generator().manual_seed(0))[1]
        return [by[f"h{i}"]["rare_row_weight"]["2"] for i in range(6)]

    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg"), head_features=_reference_features)  # by peers: the default
    _, by = _earn_round(s, 1, torch.Generator().manual_seed(0))
    assert [by[f"h{i}"]["rare_row_weight"]["2"] for i in range(6)] == pytest.approx(fixed_row(0.75))
    assert fixed_row(0.75) != pytest.approx(fixed_row(1.0))

    g = {"body": torch.zeros(3), "head.weight": torch.zeros(3, 4), "head.bias": torch.zeros(3)}
    gen = torch.Generator().manual_seed(1)
    deltas = [{"body": torch.ones(3) + 0.05 * torch.randn(3, generator=gen),
               "head.weight": 0.05 * torch.randn(3, 4, generator=gen),
               "head.bias": torch.tensor([0.1, 0.1, 0.5 if i < 5 else -0.3])} for i in range(7)]
    s = build_strategy("earn", _hospitals(7), options=dict(rare_classes="2", base="fedavg", ablation=dict(nonholder_by_peers=True)), head_features=_reference_features)
    _, by = _send(s, 1, g, deltas)
    assert [2 in by[f"h{i}"]["holds"] for i in range(7)] == [True] * 5 + [False] * 2
    row = [by[f"h{i}"]["rare_row_weight"]["2"] for i in range(7)]
    assert row[5:] == [0.0, 0.0] and sum(row[:5]) == pytest.approx(1.0)  # the holders' (+ trust x evidence) alone
    assert by["h6"]["weight"] == pytest.approx(1 / 7)


def test_excused_direction_by_hand():
    s = torch.tensor([0.0, 0.5, 0.9, 0.1])  # median 0.3 (torch.quantile interpolates)
    assert excused_direction(s, [1.0, 1.0, 0.5, 0.5]).tolist() == pytest.approx([0.3, 0.5, 0.9, 0.15])
    assert excused_direction(s, [0.0] * 4).tolist() == pytest.approx(s.tolist())
    with pytest.raises(ValueError, match="one value per update"):
        excused_direction(s, [0.1, 0.2])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        excused_direction(s, [0.1, 1.5, 0.0, 0.0])


def test_earn_rare_rows_average_clipped_updates_so_a_scaled_holder_counts_at_the_median_norm():
    """h5 holds the rare class and passes every row check, but sends its update x10 (the
    scaling attack): it earns trust, and unclipped its rare row dominates the average."""
    def last_rare_row(factor, clip):
        s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg", clip_rows=clip), head_features=_reference_features)
        gen = torch.Generator().manual_seed(0)
        for rnd in range(1, 11):
            arrays, by = _earn_round(s, rnd, gen, scaled=(5, factor))
        state = arrays.to_torch_state_dict()  # the global model is 0 every round: this is the aggregate
        return torch.cat([state["head.weight"][2], state["head.bias"][2:]]), by, s

    honest, _, _ = last_rare_row(1.0, clip="update")
    unclipped, by_off, _ = last_rare_row(10.0, clip="off")
    assert by_off["h5"]["rare_row_clip"]["2"] == 1.0
    assert torch.linalg.vector_norm(unclipped - honest) > 2 * torch.linalg.vector_norm(honest)
    for clip in ("update", "holders"):
        clipped, by, s = last_rare_row(10.0, clip=clip)
        assert s.trust["h5"][2] >= 0.8 and s.trust["h0"][2] >= 0.8  # the scaled holder passes the row checks
        assert by["h5"]["rare_row_clip"]["2"] < 0.15 and by["h0"]["rare_row_clip"]["2"] > 0.9
        # the weights are the same either way; only the scale of h5's row differs
        assert by["h5"]["rare_row_weight"] == pytest.approx(by_off["h5"]["rare_row_weight"])
        assert torch.linalg.vector_norm(clipped - honest) < 0.25 * torch.linalg.vector_norm(honest), clip


def test_earn_holders_row_clip_leaves_a_specialist_with_a_large_update_its_row():
    """h0's whole update is the largest (a big body step from its rare-class training): the
    update clip shrinks its rare row with it; the holders clip keeps the row (h0 is its class's
    only typical holder here), and still clips the scaled h5."""
    clips = {}
    for clip in ("update", "holders"):
        s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", base="fedavg", clip_rows=clip), head_features=_reference_features)
        gen = torch.Generator().manual_seed(0)
        for rnd in range(1, 4):
            _, by = _earn_round(s, rnd, gen, specialist_body=torch.tensor([4.0, 4.0, 4.0]), scaled=(5, 10.0))
        clips[clip] = {h: by[h]["rare_row_clip"]["2"] for h in ("h0", "h5")}
    assert clips["update"]["h0"] < 0.7
    assert clips["holders"]["h0"] == pytest.approx(1.0)
    assert clips["holders"]["h5"] < 0.3


def test_rare_row_clip_by_hand():
    rows = torch.tensor([[3.0, 4.0], [0.0, 1.0], [0.0, 10.0], [6.0, 8.0]])  # norms 5, 1, 10, 10
    holders = torch.tensor([True, False, True, True])  # holders' median row norm: 10
    update_clip = torch.tensor([0.2, 0.5, 1.0, 0.1])
    # row factors min(1, 10 / norm): 1, 1, 1, 1 -> the max with the update clip is 1 everywhere
    assert earn.rare_row_clip(rows, holders, update_clip).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    holders = torch.tensor([True, True, False, False])  # median of 5 and 1: 3
    assert earn.rare_row_clip(rows, holders, update_clip).tolist() == pytest.approx([0.6, 1.0, 1.0, 0.3])
    # no holder: the median over everyone (7.5)
    assert earn.rare_row_clip(rows, torch.zeros(4, dtype=torch.bool), update_clip).tolist() == pytest.approx(
        [1.0, 1.0, 1.0, 0.75])


def test_median_norm_clip_by_hand():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 10.0]])  # norms 1, 2, 3, 10; median 2.5
    assert median_norm_clip(x).tolist() == pytest.approx([1.0, 1.0, 2.5 / 3, 0.25])
    keep = torch.tensor([True, True, False, False])  # median of the kept norms: 1.5
    assert median_norm_clip(x, keep).tolist() == pytest.approx([1.0, 0.75, 0.5, 0.15])


def test_plausible_median_norm_trims_the_scaled_norms_by_hand():
    # seven honest norms 1..7 and three scaled ones: the plain median 5.5 is the honest 5th-6th;
    # trimming the norms above 2 x 5.5 = 11 leaves 1..7, whose median 4 is the honest median
    norms = torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 30, 40, 50])
    assert plausible_median_norm(norms, None) == pytest.approx(5.5)
    assert plausible_median_norm(norms, 2.0) == pytest.approx(4.0)
    # only the top is trimmed: short norms stay, so they cannot move the median up
    assert plausible_median_norm(torch.tensor([0.01, 0.02, 4.0, 5.0, 6.0]), 2.0) == pytest.approx(4.0)
    # nothing above the tolerance: the plain median; a zero median: the plain median
    assert plausible_median_norm(torch.tensor([1.0, 2.0, 3.0]), 2.0) == pytest.approx(2.0)
    assert plausible_median_norm(torch.tensor([0.0, 0.0, 5.0]), 2.0) == 0.0
    with pytest.raises(ValueError, match="tolerance must be >= 1"):
        plausible_median_norm(norms, 0.5)


def test_trimmed_median_norm_reaches_m_and_the_clip_by_hand():
    # norms 1, 2, 3, 4, 30, 40: plain median 3.5; trimmed (<= 7): 1..4, median 2.5
    x = torch.tensor([[1.0, 0], [2.0, 0], [3.0, 0], [4.0, 0], [30.0, 0], [40.0, 0]])
    assert hta_signals(x, magnitude_tolerance=2.0)["m"][0] == pytest.approx(math.exp(-(math.log(3.5) - math.log(2))))
    m = hta_signals(x, magnitude_tolerance=2.0, trim_norms=True)["m"]
    # against 2.5: beyond 2x, m = 2 / ratio: 1 is 0.4x (m = 0.8), 30 is 12x (1/6), 40 is 16x (1/8)
    assert m.tolist() == pytest.approx([0.8, 1.0, 1.0, 1.0, 1 / 6, 1 / 8])
    assert median_norm_clip(x, None, 2.0).tolist() == pytest.approx([1.0, 1.0, 2.5 / 3, 2.5 / 4, 2.5 / 30, 2.5 / 40])
    keep = torch.tensor([True] * 6)
    up, _ = hta_weights(x, torch.ones(6), torch.ones(6), keep, trim_tolerance=2.0)
    assert up.tolist() == pytest.approx([(1 + 2 + 2.5 * 4) / 6, 0.0])  # every update clipped to 2.5 at most
    up_plain, _ = hta_weights(x, torch.ones(6), torch.ones(6), keep)
    assert up_plain.tolist() == pytest.approx([(1 + 2 + 3 + 3.5 * 3) / 6, 0.0])


def _split_head(u):
    """A 13-vector as a model with a body (3) and a 2-class head on 4 features (8 + 2)."""
    return {"body": u[:3], "head.weight": u[3:11].reshape(2, 4), "head.bias": u[11:]}


@pytest.mark.parametrize("strategy", ["hta", "earn"])
def test_hta_trim_norms_keeps_scalers_from_raising_the_clip(strategy):
    d, n = 13, 10
    ones = torch.ones(d, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)

    def local(size):
        return size * (ones + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64))

    honest = [local(i + 1) for i in range(7)]
    ups = honest + [10 * local(2), 10 * local(3), 10 * local(4)]  # three scalers, each on its own data
    norms = torch.stack([torch.linalg.vector_norm(u) for u in ups])
    honest_median = float(norms[3])  # the 4th of the seven honest norms
    g = {"body": torch.zeros(3), "head.weight": torch.zeros(2, 4), "head.bias": torch.zeros(2)}
    result = {}
    for trim in (False, True):
        # kappa 0: nobody is excluded, so the scaled norms reach the clip's median
        hta_options = {"validation_exponent": 0.0, "exclusion_fraction": 0.0, "ablation": {"trim_norms": trim}}
        s = (build_strategy("hta", _hospitals(n), options=hta_options) if strategy == "hta" else
             build_strategy("earn", _hospitals(n), options=dict(rare_classes="0"), hta_options=hta_options))
        arrays, by = _send(s, 1, g, [_split_head(u) for u in ups])
        agg = torch.cat([v.double().flatten() for v in arrays.to_torch_state_dict().values()])
        result[trim] = (float(torch.linalg.vector_norm(agg)), by["h0"]["m"])
        if strategy == "earn":  # the rare rows are clipped as the whole updates are, at the same median
            kept = torch.tensor([not by[f"h{i}"]["excluded"] for i in range(n)])
            thr = plausible_median_norm(norms[kept], 2.0 if trim else None)
            for i in range(n):
                assert by[f"h{i}"]["rare_row_clip"]["0"] == pytest.approx(min(1.0, thr / float(norms[i])), rel=1e-5)
    # plain: the median norm is the honest 5th-6th, so the updates are clipped above the honest median
    assert result[False][0] > honest_median
    # trimmed: no update passes above the honest median, and the shortest honest one looks more plausible
    assert result[True][0] <= honest_median * 1.0001
    assert result[True][1] > result[False][1]


def test_earn_history_only_without_audit_shows_the_known_failure():
    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", agreement="history", audit=False))
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 13):
        _, by = _earn_round(s, rnd, gen)
    # history rewards consistency, not rightness: the faker earns as much trust as the specialist
    assert s.trust["h1"][2] >= 0.8
    assert by["h1"]["rare_row_weight"]["2"] > 1.5 / 6


def test_earn_with_zero_trust_is_capped_fedavg_on_rare_rows():
    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", evidence="reported", base="fedavg"), head_features=_reference_features)
    gen = torch.Generator().manual_seed(0)
    _, by = _earn_round(s, 1, gen)  # round 1: h0's peer (the faker) disagrees: trust stays 0
    assert all(by[f"h{i}"]["rare_row_weight"]["2"] == pytest.approx(1 / 6) for i in range(6))
    assert by["h0"]["evidence"] == [50.0, 50.0, 20.0]


def test_trust_rule_config_is_validated():
    from hospitrust.config import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match="fedagain.divergence"):
        parse_run_config({"strategy": "fedagain", "fedagain.divergence": "manhattan"})
    with pytest.raises(ConfigError, match="earn.rare-classes"):
        parse_run_config({"strategy": "earn", "earn.rare-classes": "four"})
    with pytest.raises(ConfigError, match="hta.exclusion-fraction"):
        parse_run_config({"strategy": "hta", "hta.exclusion-fraction": 2.0})
    with pytest.raises(ConfigError, match="earn.clip-rows"):
        parse_run_config({"strategy": "earn", "earn.clip-rows": True})  # an option with three values now, not a switch
    cfg = parse_run_config({"strategy": "earn", "hta.direction-exponent": 0.0, "earn.rare-classes": "1,4"})
    assert cfg.options("hta").direction_exponent == 0.0 and cfg.options("earn").rare_classes == "1,4"  # EARN's HTA base
    # an option of a rule that is not selected is refused, naming the key and the selected rule
    with pytest.raises(ConfigError, match=r"hta.exclusion-fraction = 0.4: an option of strategy hta, but the selected strategy is 'krum'"):
        parse_run_config({"strategy": "krum", "hta.exclusion-fraction": 0.4})
    with pytest.raises(ConfigError, match="selected strategy is 'hta'"):
        parse_run_config({"strategy": "hta", "earn.rare-classes": "1,4"})
    with pytest.raises(ConfigError, match="earn.ablation.excuse-direction = true needs earn.audit = true"):
        keys = {"earn.audit": False, "earn.ablation.excuse-direction": True}  # set by the user, e.g. simulate -c
        parse_run_config({"strategy": "earn", **keys}, explicit=set(keys))
    with pytest.raises(ConfigError, match="needs earn.audit = true"):  # as a hospitrust 0.1 config said it
        with pytest.warns(FutureWarning):
            parse_run_config({"strategy": "earn", "earn-audit": False, "earn-excuse-direction": True},
                             explicit={"earn-audit", "earn-excuse-direction"})
    assert not parse_run_config({"strategy": "earn", "earn.audit": False}).options("earn").audit  # the excuse, default on, lapses


def test_model_audit_hand_computed():
    """Margin gain of class c's logit (class-c images minus the rest) over the global model."""
    labels = torch.tensor([0, 0, 1, 1])
    global_logits = torch.zeros(4, 2)
    cands = torch.zeros(3, 4, 2)
    cands[0, :, 1] = torch.tensor([0.0, 0.0, 2.0, 2.0])  # raises class 1 where it belongs: +2
    cands[1, :, 1] = 3.0  # raises class 1 everywhere (a faker's relabelled images): 0
    cands[2, :, 1] = torch.tensor([1.0, 1.0, 0.0, 0.0])  # raises it on the wrong images: -1
    audit = earn.model_audit(cands, global_logits, labels, 1)
    assert audit.tolist() == pytest.approx([2.0, 0.0, -1.0])
    assert torch.isnan(earn.model_audit(cands, global_logits, torch.tensor([1, 1, 1, 1]), 1)).all()


def _candidate_logits(global_state, updates):
    """The synthetic rounds' models: logits = h(x) W^T + b on the reference features."""
    from hospitrust.aggregation import flatten_state, unflatten_state

    feats, labels = _reference_features(global_state)
    vec, spec = flatten_state(global_state)

    def logits(state):
        return (feats @ state["head.weight"].T + state["head.bias"]).double()

    cands = torch.stack([logits(unflatten_state(vec + u, spec, global_state)) for u in updates])
    return logits(global_state), cands, labels


def test_earn_model_audit_rewards_the_specialist_and_not_the_faker():
    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", audit_by="model"), candidate_logits=_candidate_logits, hta_options={"ablation": {"merge_duplicates": False}})  # synthetic honest updates: cosine > 0.99
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 13):
        _, by = _earn_round(s, rnd, gen)
    assert s.trust["h0"][2] >= 0.8 and s.trust["h1"][2] < 0.05
    assert by["h1"]["rare_row_weight"]["2"] <= 1 / 6 + 1e-9
    assert by["h0"]["row_audit"]["2"] > 0 > by["h1"]["row_audit"]["2"]


def test_earn_audit_by_is_validated():
    with pytest.raises(ValueError, match="earn.audit-by"):
        build_strategy("earn", _hospitals(3), options=dict(audit_by="oracle"))
    from hospitrust.config import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match="earn.audit-by"):
        parse_run_config({"strategy": "earn", "earn.audit-by": "row-shiftfree"})
    assert parse_run_config({"strategy": "earn", "earn.audit-by": "model"}).options("earn").audit_by == "model"


def test_update_count_evidence_hand_computed():
    """n_k * clip(softmax(b)_c + db_kc / (eta * E * ceil(n_k / B)), 0, 1)."""
    global_bias = torch.zeros(2)  # prior 1/2, 1/2
    db = torch.tensor([[0.1, -0.1], [-0.2, 0.2], [-1.0, 1.0]])
    n = torch.tensor([64, 32, 32])
    ev = earn.update_count_evidence(db, n, global_bias, learning_rate=0.1, batch_size=32, local_epochs=1)
    # hospital 0: 2 steps -> share 0.5 +- 0.1 / 0.2 = (1.0, 0.0); hospital 1: 1 step -> (0.0, 1.0)... clipped
    assert ev[0].tolist() == pytest.approx([64.0, 0.0])
    assert ev[1].tolist() == pytest.approx([0.0, 32.0])
    assert ev[2].tolist() == pytest.approx([0.0, 32.0])  # clipped at [0, 1]
    small = earn.update_count_evidence(torch.tensor([[0.01, -0.01]]), torch.tensor([32]), global_bias,
                                       learning_rate=0.1, batch_size=32, local_epochs=2)
    assert small[0].tolist() == pytest.approx([32 * 0.55, 32 * 0.45])  # 2 epochs: 2 steps


def test_earn_runs_on_update_count_evidence():
    s = build_strategy("earn", _hospitals(6), options=dict(rare_classes="2", evidence="update-count"), train_config={"learning-rate": 0.1, "batch-size": 32, "local-epochs": 1})
    gen = torch.Generator().manual_seed(0)
    for rnd in range(1, 4):
        _, by = _earn_round(s, rnd, gen)
    assert 2 in by["h0"]["holds"] and 2 not in by["h3"]["holds"]  # h3's class-2 bias went down
    assert not math.isnan(by["h0"]["evidence_spearman"])


def test_fedagain_median_divergence_sees_a_sign_flip_that_l2_does_not():
    """l2 gives a sign-flipped copy of an honest update the same D; measured from the
    coordinate-wise median update it is far away and loses trust."""
    from hospitrust.aggregation import fedagain_divergence, fedagain_trust

    honest = torch.tensor([[1.0, 2.0], [1.2, 1.8], [0.8, 2.2], [1.0, 2.1]])
    x = torch.cat([honest, -honest[:1]])  # hospital 4 flips hospital 0's update
    l2 = fedagain_divergence(x, kind="l2")
    assert l2[4] == pytest.approx(float(l2[0]))
    med = fedagain_divergence(x, kind="median")
    # median of each coordinate over the 5 rows: (1.0, 2.0)
    assert med.tolist() == pytest.approx([0.0, math.hypot(0.2, 0.2), math.hypot(0.2, 0.2), 0.1, math.hypot(2, 4)])
    w = fedagain_trust(torch.full((5,), 0.2), med)["weights"]
    assert w[4] < 0.2 * w[:4].min()

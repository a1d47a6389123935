"""The field's attacks (issue 34): rule-tailored ALIE and IPM, Shejwalkar-Houmansadr's AGR-tailored
attacks, Neurotoxin, DBA and the defence-aware attacks on HTA, EARN and FLTrust. Hand-computed
cases, the constraint each attack claims, and ByzFL 0.0.11's optimal ALIE/IPM (within 1e-5)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from conftest import jitter

from hospitrust import aggregation as agg
from hospitrust.aggregation import earn
from hospitrust.aggregation.hta import hta_fusion, hta_signals, mad_exclusion, reputation_update
from hospitrust.aggregation.pre_aggregation import nnm_mixing
from hospitrust.attacks.math import data as D
from hospitrust.attacks.math import defence_aware as A
from hospitrust.attacks.math import tailored as TA
from hospitrust.attacks.math import update as U

T = functools.partial(torch.tensor, dtype=torch.float64)


def close(a, b, atol=1e-9):  # float64
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=atol, rtol=0)


def _honest(seed=0, n=8, d=6):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5


# ------------------------------------------------------------------ the searches, by hand
def test_maximise_strength_hand():
    calls = []

    def objective(s):
        calls.append(s)
        return -(s - 3.0) ** 2

    best, value = TA.maximise_strength(objective, start=0.0, step=1.0, evals=6, ratio=0.8)
    # expansion: 0, 1 (better, step 2), 3 (better, step 4), 7 (worse, step 3.2); contraction: 6.2, 5.56
    assert calls == pytest.approx([0.0, 1.0, 3.0, 7.0, 6.2, 5.56])
    assert (best, value) == (3.0, 0.0)
    with pytest.raises(ValueError, match="ratio must be in"):
        TA.maximise_strength(objective, ratio=0.4)


def test_halving_search_hand():
    # on success the next try is half the last step up, on failure half down: converges to the edge
    assert TA._halving_search(lambda g: g <= 3.7, 10.0, 1e-7) == pytest.approx(3.7, abs=1e-6)
    assert TA._halving_search(lambda g: False, 10.0, 1e-7) == 0.0


def test_tailored_alie_on_the_mean_goes_as_far_as_its_evaluations_allow():
    h = _honest()
    z_out, rec = TA.tailored_alie(h, agg.mean, 2, evals=5)
    # the mean moves by (2/10) z |sigma|: every expansion step improves (10, 30, 70, 150)
    assert rec["strength"] == 150.0
    sigma = h.std(0)
    assert rec["distance"] == pytest.approx(0.2 * 150.0 * float(sigma.norm()))
    close(z_out, U.alie(h, 150.0))


def test_tailored_ipm_keeps_the_start_when_nothing_is_better():
    h = _honest()
    # a rule that ignores the last rows: no strength moves it, the search keeps eps = start
    _, rec = TA.tailored_ipm(h, lambda x: x[:8].mean(0), 2, start=0.5)
    assert rec["strength"] == 0.5 and rec["distance"] == pytest.approx(0.0, abs=1e-12)  # float64


def test_tailored_attack_with_a_pre_aggregation_chain_in_the_loop():
    h = _honest(1, n=9)
    rule = TA.with_pre_aggregation(agg.coordinate_median, [functools.partial(nnm_mixing, f=2)])
    mal, rec = TA.tailored_alie(h, rule, 2)
    stack = torch.cat([h, mal.expand(2, -1)])
    assert rec["distance"] == pytest.approx(float((rule(stack) - h.mean(0)).norm()))
    assert rec["distance"] >= float((rule(torch.cat([h, h.mean(0).expand(2, -1)])) - h.mean(0)).norm())


# ------------------------------------------------------------------ AGR-tailored: the objective holds
def test_agr_tailored_krum_and_multi_krum_get_selected():
    h = _honest(2, n=10)
    mal, rec = TA.agr_tailored_krum(h, 2, 2)
    assert rec["gamma"] > 0
    stack = torch.cat([mal.expand(2, -1), h])
    assert agg.krum_select(stack, 2) < 2
    mal, rec = TA.agr_tailored_multi_krum(h, 2, 2)
    chosen = agg.multi_krum_select(torch.cat([mal.expand(2, -1), h]), 2)
    assert rec["gamma"] > 0 and {0, 1} <= set(chosen.tolist())
    mal, rec = TA.agr_tailored_bulyan(_honest(3, n=11), 2, 2)
    assert {0, 1} <= set(agg.bulyan_select(torch.cat([mal.expand(2, -1), _honest(3, n=11)]), 2).tolist())


def test_agr_tailored_trimmed_mean_and_median_move_the_aggregate():
    h = _honest(4, n=10)
    for mal, rec, rule in ((*TA.agr_tailored_trimmed_mean(h, 3, 3), lambda x: agg.trimmed_mean(x, 3)),
                           (*TA.agr_tailored_median(h, 3), agg.coordinate_median)):
        out = rule(torch.cat([mal.expand(3, -1), h]))
        assert rec["distance"] == pytest.approx(float((out - h.mean(0)).norm()))
        baseline = rule(torch.cat([h.mean(0).expand(3, -1), h]))
        assert rec["distance"] > float((baseline - h.mean(0)).norm())


# ------------------------------------------------------------------ Neurotoxin and DBA, by hand
def test_neurotoxin_hand():
    honest = T([[3.0, -1.0, 0.5, 0.0], [1.0, 1.0, 0.5, 0.0]])  # mean (2, 0, 0.5, 0)
    backdoor = T([1.0, 1.0, 1.0, 1.0])
    close(U.neurotoxin(backdoor, honest, 0.25), [0.0, 1.0, 1.0, 1.0])  # ceil(1) coordinate out: |2|
    close(U.neurotoxin(backdoor, honest, 0.5), [0.0, 1.0, 0.0, 1.0])
    close(U.neurotoxin(backdoor, honest, 0.75), [0.0, 0.0, 0.0, 1.0])  # tie at 0: the lower index out
    close(U.neurotoxin(backdoor, honest.mean(0), 0.0), backdoor)
    with pytest.raises(ValueError, match="top_fraction must be in"):
        U.neurotoxin(backdoor, honest, 1.0)


def test_dba_parts_are_disjoint_stripes_of_the_whole_trigger():
    images = np.zeros((2, 6, 6, 1), dtype=np.uint8)
    parts = [D.dba_trigger(images, i, 3, patch_size=3) for i in range(3)]
    for i, p in enumerate(parts):  # part i: row 3 + i of the bottom-right 3x3 square
        expected = np.zeros_like(images)
        expected[:, 3 + i, 3:6, :] = 255
        assert np.array_equal(p, expected)
    union = np.maximum.reduce(parts)
    assert np.array_equal(union, D.apply_trigger(images, patch_size=3))
    assert D.dba_part_slices(6, 6, 1, 2, patch_size=3) == (slice(4, 6), slice(3, 6))  # rows [1, 3) of the patch
    with pytest.raises(ValueError, match="parts must be an integer in"):
        D.dba_trigger(images, 0, 4, patch_size=3)


# ------------------------------------------------------------------ defence-aware attacks
def test_turn_towards_hand():
    close(A.turn_towards(T([1.0, 0.0, 0.0]), T([1.0, 1.0, 0.0]), 0.6, 5.0), [3.0, 4.0, 0.0])
    with pytest.raises(ValueError, match="parallel"):
        A.turn_towards(T([1.0, 0.0]), T([-2.0, 0.0]), 0.5, 1.0)


def test_hta_trust_needed_hand():
    others = torch.full((8,), 0.8, dtype=torch.float64)  # median 0.8, MAD 0: excluded iff R < 0.4
    assert A.hta_trust_needed(None, 0.0, others)["tau"] == pytest.approx(0.4, abs=1e-9)  # float64: first round: R = tau
    # r = 0.9 + 0.3 delta, sd = sqrt(0.21) |delta|: R = 0.9 + (0.3 + sqrt(0.21)) delta >= 0.4
    expected = 0.9 - 0.5 / (0.3 + math.sqrt(0.21))
    need = A.hta_trust_needed(0.9, 0.0, others)
    assert need["tau"] == pytest.approx(expected, abs=1e-9) and need["feasible"]  # float64


def test_hta_band_attack_stays_in_the_band_under_htas_own_functions():
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(9, 50, generator=g, dtype=torch.float64) * 0.3 + 1.0
    others = torch.full((9,), 0.8, dtype=torch.float64)
    reference = agg.coordinate_median(honest)
    median_norm = float(torch.quantile(honest.norm(dim=1), 0.5))
    target = -honest.mean(0) + torch.randn(50, generator=g, dtype=torch.float64)
    mal, rec = A.hta_band_attack(reference, target, median_norm=median_norm, ema=None, var=0.0, others=others)
    assert rec["feasible"] and rec["cosine"] == pytest.approx((0.4 + 0.02) ** 2, abs=1e-6)
    signals = hta_signals(torch.cat([honest, mal[None]]))
    tau = float(hta_fusion(signals["s"], signals["m"], signals["v"])[-1])
    rep = reputation_update(tau, None, 0.0)[2]
    assert not bool(mad_exclusion(torch.cat([others, T([rep])]))["excluded"][-1])
    perp = target - (target @ reference) / (reference @ reference) * reference
    assert float(mal @ perp) > 0.9 * float(mal.norm() * perp.norm()) * math.sqrt(1 - rec["cosine"] ** 2)


def test_earn_row_push_passes_earns_checks():
    reference = T([1.0, 1.0, 0.0, 0.0, 0.5])  # 4 weights and the bias
    row = T([1.0, 1.2, 0.1, 0.0, 0.4])
    push = T([0.0, 0.0, 1.0, -1.0, -1.0])
    audit = T([1.0, 0.0, 0.0, 0.0, 0.0])
    out, rec = A.earn_row_push(row, reference, push, agree_threshold=0.5, audit_direction=audit)
    assert rec["feasible"] and float(out.norm()) == pytest.approx(float(row.norm()))
    rows = torch.stack([reference, reference * 1.1, reference * 0.9, out])
    holders = earn.holder_mask(earn.update_evidence(rows[:, -1:]))[:, 0]
    assert bool(holders.all())  # a positive bias update: still a holder
    agreement = earn.row_agreement(rows, holders, None, None, mode="peer")["agreement"][-1]
    assert float(agreement) >= 0.5
    features = T([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # mean h(class c) - mean h(rest) = e_0
    assert float(earn.row_audit(rows[:, :4], features, torch.tensor([0, 1]), 0)[-1]) > 0
    assert float(out @ push) > float(row @ push)
    # when the reference itself fails the audit there is nothing to rotate from
    _, bad = A.earn_row_push(row, reference, push, agree_threshold=0.5, audit_direction=-audit)
    assert not bad["feasible"]


def test_fltrust_small_cosine_keeps_a_positive_weight_and_pulls():
    g = torch.Generator().manual_seed(1)
    root = torch.randn(30, generator=g, dtype=torch.float64)
    direction = torch.randn(30, generator=g, dtype=torch.float64)
    mal, rec = A.fltrust_small_cosine(root, direction, cosine=0.1)
    assert float(agg.fltrust_trust(mal[None], root)[0]) == pytest.approx(0.1)
    honest = root + 0.1 * torch.randn(5, 30, generator=g, dtype=torch.float64)
    perp = direction - (direction @ root) / (root @ root) * root
    before = agg.fltrust(honest, root) @ perp
    after = agg.fltrust(torch.cat([honest, mal.expand(3, -1)]), root) @ perp
    assert float(after) > float(before)
    with pytest.raises(ValueError, match="FLTrust weight 0"):
        A.fltrust_small_cosine(root, direction, cosine=0.0)


# ------------------------------------------------------------------ against ByzFL 0.0.11
# (the `byzfl` fixture, tests/conftest.py, imports it for the tests that compare with it)


def _near(ours, theirs):
    ours, theirs = torch.as_tensor(ours).float(), torch.as_tensor(theirs).float()
    scale = max(1.0, float(theirs.abs().max()))
    torch.testing.assert_close(ours / scale, theirs / scale, atol=1e-5, rtol=0)


RULE_PAIRS = {
    "mean": (agg.mean, lambda byzfl: byzfl.Average(), []),
    "median": (agg.coordinate_median, lambda byzfl: byzfl.Median(), []),
    "trimmed-mean": (lambda x: agg.trimmed_mean(x, 2), lambda byzfl: byzfl.TrMean(2), []),
    "krum": (lambda x: agg.krum(x, 2), lambda byzfl: byzfl.Krum(2), []),
    "nnm+median": (TA.with_pre_aggregation(agg.coordinate_median, [functools.partial(nnm_mixing, f=2)]),
                   lambda byzfl: byzfl.Median(), ["nnm"]),
}


@pytest.mark.parametrize("name", list(RULE_PAIRS))
def test_tailored_alie_and_ipm_match_byzfls_optimal_attacks(name, input_jitter, byzfl):
    honest = jitter(torch.randn(9, 6, generator=torch.Generator().manual_seed(7)) + 0.3, input_jitter)
    ours_rule, theirs_rule, pre = RULE_PAIRS[name]
    pre_list = [byzfl.NNM(2)] if pre else []
    theirs = byzfl.Optimal_ALittleIsEnough(agg=theirs_rule(byzfl), pre_agg_list=pre_list, f=2)(honest.clone())
    _near(TA.tailored_alie(honest, ours_rule, 2, step=-10.0)[0], theirs)  # their tau = our -z
    theirs = byzfl.Optimal_InnerProductManipulation(agg=theirs_rule(byzfl), pre_agg_list=pre_list, f=2)(honest.clone())
    _near(TA.tailored_ipm(honest, ours_rule, 2)[0], theirs)

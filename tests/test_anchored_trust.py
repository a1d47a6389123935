"""Anchored trust (issue 45's rule): its math by hand, its strategy's state, and its aware attack's search."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from hospitrust.aggregation.anchored_trust import (
    anchored_trust,
    full_trust_at,
    local_steps,
    reference_histories,
    saturating_trust,
)
from hospitrust.attacks.math.defence_aware import anchored_trust_push
from hospitrust.strategies.anchored_trust import AnchoredTrust
from hospitrust.strategies.validation import CheckedReply
from hospitrust.strategies.intake import round_context

T = functools.partial(torch.tensor, dtype=torch.float64)


def _round(x, g, *, examples=None, steps=None, anchor_steps=1.0, history=None, anchor_history=None, path=None,
           last=None, **kw):
    n = x.shape[0]
    zeros = torch.zeros_like(x)
    return anchored_trust(x, g, T(examples or [1.0] * n), T(steps or [1.0] * n), anchor_steps,
                          zeros if history is None else history, zeros if anchor_history is None else anchor_history,
                          path, last, **kw)


def test_local_steps_are_epochs_times_batches():
    assert local_steps(T([1, 32, 33, 0]), 32, 2).tolist() == [2.0, 2.0, 4.0, 1.0]  # at least one step
    with pytest.raises(ValueError, match="batch_size and local_epochs"):
        local_steps(T([1]), 0, 1)


def test_saturating_trust_by_hand():
    # full trust at 0.5, falling to 0 at 0.5 below it
    assert saturating_trust(T([-0.3, 0.0, 0.25, 0.5, 0.9]), 0.5, 0.5).tolist() == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.0])
    with pytest.raises(ValueError, match="width"):
        saturating_trust(T([0.1]), 0.5, 0.0)


def test_one_round_by_hand_projection_and_zero_trust():
    # anchor (1, 0); x1 = (1, 1): cosine 0.707 >= tau -> trust 1; x2 = (-1, 0): history cosine -1 -> trust 0,
    # and its part against the anchor is removed (it would be the zero vector anyway)
    # f = 1: full trust at min(0.5, the largest history cosine 0.707) = 0.5; -1 is 1.5 below it
    out = _round(T([[1.0, 1.0], [-1.0, 0.0]]), T([1.0, 0.0]), step_bound=100.0, assumed_malicious=1)
    assert out["trust"].tolist() == [1.0, 0.0]
    torch.testing.assert_close(out["history_cosine"], T([1 / math.sqrt(2), -1.0]))
    torch.testing.assert_close(out["round_cosine"], T([1 / math.sqrt(2), -1.0]))
    torch.testing.assert_close(out["against_anchor"], T([0.0, 1.0]))
    # shares of the whole round's examples: the untrusted half of the step is not taken
    torch.testing.assert_close(out["weights"], T([0.5, 0.0]))
    torch.testing.assert_close(out["update"], T([0.5, 0.5]))


def test_the_part_against_the_anchor_is_removed_before_the_mean():
    # x = (-1, 2): along the anchor -1 -> projected to (0, 2); history cosine -1/sqrt(5) < 0 -> trust 0, so use a
    # history that keeps it trusted: H = (3, 0) before, decay 0.5 -> H' = (1.5, 0) + (-1, 2)/sqrt(5)
    x = T([[-1.0, 2.0]])
    hist = T([[3.0, 0.0]])
    out = _round(x, T([2.0, 0.0]), history=hist, anchor_history=T([[1.0, 0.0]]), decay=0.5, full_trust_cosine=0.1,
                 step_bound=100.0)
    h_vec = T([1.5 - 1 / math.sqrt(5), 2 / math.sqrt(5)])
    a_vec = T([0.5 + 1.0, 0.0])
    expected_h = float(h_vec @ a_vec / (h_vec.norm() * a_vec.norm()))
    assert out["history_cosine"].item() == pytest.approx(expected_h, rel=1e-12)  # float64: every input and step is float64
    assert out["trust"].item() == 1.0
    torch.testing.assert_close(out["update"], T([0.0, 2.0]))  # the trusted update without its part against g
    torch.testing.assert_close(out["history"], h_vec.unsqueeze(0))
    torch.testing.assert_close(out["anchor_history"], a_vec.unsqueeze(0))


def test_the_bound_is_the_trusted_median_norm_per_step_times_the_hospitals_steps():
    # three updates along the anchor, one local step each: per-step norms 1, 2, 10, median 2; kappa = 2 -> bound 4,
    # so the third is clipped by 0.4 and the mean is (1 + 2 + 4) / 3
    out = _round(T([[1.0, 0.0], [2.0, 0.0], [10.0, 0.0]]), T([1.0, 0.0]), step_bound=2.0)
    assert out["bound"].tolist() == [4.0, 4.0, 4.0]
    assert out["clip_factor"].tolist() == pytest.approx([1.0, 1.0, 0.4])
    torch.testing.assert_close(out["update"], T([7.0 / 3.0, 0.0]))
    # a hospital of 3 steps may move 3 x as far; an untrusted row (against the anchor) does not set the median
    out = _round(T([[1.0, 0.0], [9.0, 0.0], [-50.0, 0.0]]), T([1.0, 0.0]), steps=[1.0, 3.0, 1.0], step_bound=2.0,
                 assumed_malicious=1)
    assert out["trust"].tolist() == [1.0, 1.0, 0.0]
    assert out["bound"].tolist() == pytest.approx([2.0, 6.0, 2.0])  # the lower median of 1 and 3 per step: 1


def test_full_trust_is_at_the_n_minus_f_th_largest_history_cosine():
    h = T([0.9, 0.8, 0.3, 0.2, -0.1])
    assert full_trust_at(h, 0.5, 2) == pytest.approx(0.3)  # the third largest
    assert saturating_trust(h, 0.3, 0.5).tolist() == pytest.approx([1.0, 1.0, 1.0, 0.8, 0.2])
    assert full_trust_at(h, 0.5, 0) == pytest.approx(-0.1)  # no attacker assumed: every hospital at full trust
    assert full_trust_at(T([0.9, 0.8, 0.7]), 0.5, 1) == pytest.approx(0.5)  # never above tau
    with pytest.raises(ValueError, match="assumed_malicious"):
        full_trust_at(h, 0.5, 5)
    with pytest.raises(ValueError, match="full_trust_cosine"):
        full_trust_at(h, 0.0, 1)


def test_the_honest_majority_keeps_full_trust_when_every_history_drifts():
    # late in training every honest history points away from the reference (negative cosines, measured); with
    # f = 2 of 6 the four highest keep full trust and only those far below lose it
    x = T([[-1.0, 0.3], [-1.0, 0.5], [-1.0, 0.7], [-1.0, 1.0], [-1.0, 0.0], [-1.0, -0.2]])
    out = _round(x, T([0.0, -1.0]), assumed_malicious=2, step_bound=100.0)
    h = out["history_cosine"]
    assert int((h < 0).sum()) == 4  # most point away from the reference
    kth = float(torch.sort(h, descending=True).values[3])
    assert out["full_trust_cosine"][0].item() == pytest.approx(kth)
    assert int((out["trust"] == 1.0).sum()) >= 4


def test_the_federations_path_joins_the_reference():
    # anchor (1, 0), last aggregate (0, 5): reference = (1, 0) + (0, 1); x = (0, 1) has cosine 0 with the anchor
    # alone but 1/sqrt(2) with the reference
    out = _round(T([[0.0, 1.0]]), T([1.0, 0.0]), last=T([0.0, 5.0]), full_trust_cosine=0.5, step_bound=100.0)
    assert out["history_cosine"].item() == pytest.approx(1 / math.sqrt(2))
    torch.testing.assert_close(out["path_history"], T([[0.0, 1.0]]))
    # decayed on the next round: 0.9 x (0, 1) + (1, 0)
    nxt = _round(T([[1.0, 0.0]]), T([1.0, 0.0]), path=out["path_history"], last=T([1.0, 0.0]))
    torch.testing.assert_close(nxt["path_history"], T([[1.0, 0.9]]))


def test_at_full_trust_inside_the_bound_it_is_fedavg():
    gen = torch.Generator().manual_seed(3)
    g = torch.rand(6, generator=gen, dtype=torch.float64) + 1.0
    x = torch.rand(4, 6, generator=gen, dtype=torch.float64) + 0.5  # positive: along g, no projection
    examples = [10.0, 30.0, 5.0, 55.0]
    out = _round(x, g, examples=examples, full_trust_cosine=0.1, step_bound=1e6)
    assert out["trust"].tolist() == [1.0] * 4
    w = T(examples) / sum(examples)
    torch.testing.assert_close(out["update"], (w.unsqueeze(1) * x).sum(0))


def test_duplicates_share_one_voice_and_a_zero_anchor_takes_no_step():
    x = T([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    out = _round(x, T([1.0, 1.0]), group_size=T([2, 2, 1]), step_bound=100.0)
    # every trust 1 (cosine 0.707 >= 0.5); weights n_i t_i / s_i over the sum of n_i / s_i = 0.5 + 0.5 + 1
    torch.testing.assert_close(out["weights"], T([0.25, 0.25, 0.5]))
    zero = _round(x, T([0.0, 0.0]))
    assert zero["weights"].tolist() == [0.0, 0.0, 0.0] and zero["update"].tolist() == [0.0, 0.0]


def test_bad_input_names_what_was_wrong():
    x = T([[1.0, 0.0]])
    with pytest.raises(ValueError, match="decay"):
        _round(x, T([1.0, 0.0]), decay=1.0)
    with pytest.raises(ValueError, match="step_bound"):
        _round(x, T([1.0, 0.0]), step_bound=0.0)
    with pytest.raises(ValueError, match="history and anchor_history"):
        anchored_trust(x, T([1.0, 0.0]), T([1.0]), T([1.0]), 1.0, torch.zeros(2, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="one value per update"):
        anchored_trust(x, T([1.0, 0.0]), T([1.0, 2.0]), T([1.0]), 1.0, torch.zeros(1, 2), torch.zeros(1, 2))


class _Anchor:
    """A stand-in reference-cohort trainer: a fixed anchor over 2 local steps."""

    local_steps = 2

    def __init__(self, g):
        self.g = g

    def __call__(self, global_state, server_round):
        return self.g.clone()


def test_strategy_keeps_histories_per_hospital_and_restores_them():
    names = {1: "a", 2: "b"}
    rule = AnchoredTrust(names, {"step_bound": 100.0}, server_update=_Anchor(T([1.0, 0.0])),
                         train_config={"batch-size": 32, "local-epochs": 1}, assumed_malicious=1)
    rule.global_state = {"w": torch.zeros(2)}
    replies = [CheckedReply(1, {}, None, 10, {}), CheckedReply(2, {}, None, 10, {})]
    agg = rule.aggregate(T([[1.0, 1.0], [-1.0, 0.5]]), T([10.0, 10.0]), round_context(rule, 1, replies))
    assert agg.extra["trust"] == [1.0, 0.0] and agg.extra["flagged"] == [False, True]
    saved = rule.state_dict()
    again = AnchoredTrust(names, {"step_bound": 100.0}, server_update=_Anchor(T([1.0, 0.0])),
                          train_config={"batch-size": 32, "local-epochs": 1}, assumed_malicious=1)
    again.global_state = rule.global_state
    again.load_state_dict(saved)
    x2 = T([[0.5, 1.0], [1.0, 0.0]])
    first = rule.aggregate(x2, T([10.0, 10.0]), round_context(rule, 2, replies))
    second = again.aggregate(x2, T([10.0, 10.0]), round_context(again, 2, replies))
    torch.testing.assert_close(first.update, second.update)
    assert first.extra["history_cosine"] == second.extra["history_cosine"]


def test_strategy_needs_the_anchors_steps():
    with pytest.raises(ValueError, match="server_update callable"):
        AnchoredTrust({1: "a"})
    with pytest.raises(ValueError, match="local_steps"):
        AnchoredTrust({1: "a"}, server_update=lambda state, rnd: torch.zeros(2))


def test_aware_push_by_hand():
    # anchor (1, 0), pull (0, 1), no history, reference the anchor: trust = min(1, 1 - (0.5 - cos(theta)) / 0.5)
    # = min(1, 2 cos(theta)), so the push
    # t sin(theta) is sin(theta) up to 60 degrees and sin(2 theta) beyond: its maximum is at 60 degrees
    row, found = anchored_trust_push(T([2.0, 0.0]), T([-1.0, 3.0]), T([0.0, 0.0]), T([1.0, 0.0]), decay=0.9,
                                     full_trust_cosine=0.5, trust_width=0.5, norm=2.0, angles=91)
    assert found["angle"] == pytest.approx(60.0)
    assert found["trust"] == pytest.approx(1.0)
    torch.testing.assert_close(row, T([1.0, math.sqrt(3)]))
    with pytest.raises(ValueError, match="parallel"):
        anchored_trust_push(T([1.0, 0.0]), T([2.0, 0.0]), T([0.0, 0.0]), T([1.0, 0.0]), decay=0.9,
                            full_trust_cosine=0.5, trust_width=0.5, norm=1.0)


def test_aware_push_spends_a_history_built_honestly():
    # a long history along the anchor keeps trust 1 even for an update orthogonal to it: the push is 90 degrees
    _, found = anchored_trust_push(T([1.0, 0.0]), T([0.0, 1.0]), T([10.0, 0.0]), T([10.0, 0.0]), decay=0.9,
                                   full_trust_cosine=0.5, trust_width=0.5, norm=1.0, angles=91)
    assert found["angle"] == pytest.approx(90.0) and found["trust"] == 1.0


def test_the_rule_and_its_attacker_share_one_reference():
    # A = (1, 0), P = (0, 2), anchor (0, 3) -> unit (0, 1), last step (4, 0) -> unit (1, 0), decay 0.5:
    # A' = (0.5, 0) + (0, 1) = (0.5, 1); P' = (0, 1) + (1, 0) = (1, 1)
    a, p = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 2.0], dtype=torch.float64)
    new_a, new_p = reference_histories(a, p, torch.tensor([0.0, 3.0], dtype=torch.float64),
                                       torch.tensor([4.0, 0.0], dtype=torch.float64), 0.5)
    assert new_a.tolist() == [0.5, 1.0] and new_p.tolist() == [1.0, 1.0]
    # no path in the first round, and a zero anchor adds nothing
    new_a, new_p = reference_histories(a, p, torch.zeros(2, dtype=torch.float64), None, 0.5)
    assert new_a.tolist() == [0.5, 0.0] and new_p.tolist() == [0.0, 1.0]
    # the rule's history cosine is cos(H', A' + P') with that very reference, row by row
    x = torch.tensor([[1.0, 1.0], [2.0, -1.0]], dtype=torch.float64)
    hist, a2, p2 = torch.zeros_like(x), torch.stack([a, a]), torch.stack([p, p])
    out = anchored_trust(x, torch.tensor([0.0, 3.0], dtype=torch.float64), torch.ones(2), torch.ones(2), 1.0, hist, a2,
                         p2, torch.tensor([4.0, 0.0], dtype=torch.float64), decay=0.5)
    for i in range(2):
        ra, rp = reference_histories(a, p, torch.tensor([0.0, 3.0], dtype=torch.float64),
                                     torch.tensor([4.0, 0.0], dtype=torch.float64), 0.5)
        expected = torch.nn.functional.cosine_similarity(x[i] / x[i].norm(), ra + rp, dim=0)
        assert float(out["history_cosine"][i]) == pytest.approx(float(expected), rel=1e-12)  # float64

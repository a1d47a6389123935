"""EARN's per-round trust update, as pure functions (``hospitrust.aggregation.earn``), on cases
computed by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from hospitrust.aggregation.earn import (
    class_rows,
    extend_history,
    history_means,
    lost_trust_flags,
    rare_row_step,
)

F64 = torch.float64


def test_class_rows_put_each_class_weight_row_before_its_bias():
    W = torch.arange(12, dtype=F64).reshape(2, 2, 3)
    B = torch.tensor([[10.0, 11.0], [12.0, 13.0]], dtype=F64)
    rows = class_rows(W, B)
    assert rows.shape == (2, 2, 4)
    assert rows[1, 0].tolist() == [6.0, 7.0, 8.0, 12.0]


def test_a_rare_row_step_by_hand():
    # two holders pointing the same way, a non-holder across; no history yet (peer mode: p = 1)
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
    holders = torch.tensor([True, True, False])
    step = rare_row_step(
        rows, holders, torch.zeros(3, 2, dtype=F64), torch.tensor([False, False, False]),
        trust=torch.tensor([0.3, 0.4, 0.2], dtype=F64), base_weights=torch.tensor([0.5, 0.25, 0.25], dtype=F64),
        evidence=torch.tensor([10.0, 30.0, 0.0], dtype=F64), update_clip=torch.tensor([1.0, 0.5, 1.0], dtype=F64),
        audit=torch.tensor([0.5, -0.2, math.nan], dtype=F64), mode="peer", agree_threshold=0.1,
        gain=0.1, decay=0.5, nonholder_weight=0.0, cap=1.0)
    # agreement: cos with the other holders' median row: 1, 1; the non-holder's with [1, 0]: 0
    assert step.agreement.tolist() == [1.0, 1.0, 0.0]
    # hospital 1 agrees but fails the audit: 0.4 x 0.5; hospital 0: 0.3 + 0.1; the non-holder is not judged
    assert step.trust.tolist() == pytest.approx([0.4, 0.2, 0.2])
    # base [2/3, 1/3, 0] (non-holder x 0) + trust x evidence share [0.4 x 0.25, 0.2 x 0.75, 0] = [0.7667, 0.4833, 0]
    assert step.weight.tolist() == pytest.approx([0.76667 / 1.25, 0.48333 / 1.25, 0.0], abs=1e-5)
    assert step.clip.tolist() == [1.0, 0.5, 1.0]  # the whole-update clip (clip_holders False)


def test_near_duplicates_share_one_trust_term_and_no_holder_weight_falls_back_to_the_base():
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    step = rare_row_step(
        rows, torch.tensor([True, True]), torch.zeros(2, 2, dtype=F64), torch.tensor([False, False]),
        trust=torch.tensor([0.9, 0.9], dtype=F64), base_weights=torch.tensor([0.5, 0.5], dtype=F64),
        evidence=torch.tensor([1.0, 1.0], dtype=F64), update_clip=torch.ones(2, dtype=F64),
        group_size=torch.tensor([2.0, 2.0], dtype=F64), cap=1.0)
    assert step.trust.tolist() == pytest.approx([1.0, 1.0])  # 0.9 + 0.1, capped at 1
    assert step.weight.tolist() == pytest.approx([0.5, 0.5]) and step.audit is None


def test_the_history_counts_a_hospital_first_rounds_then_locks():
    t = torch.ones(1, 2, dtype=F64)
    sums, rounds = {"a": 2 * t, "b": t}, {"a": 2, "b": 1}
    rows = torch.tensor([[[5.0, 5.0]], [[3.0, 1.0]], [[2.0, 4.0]]], dtype=F64)
    new_sums, new_rounds = extend_history(sums, rounds, ["a", "b", "c"], rows, limit=2)
    assert new_rounds == {"a": 2, "b": 2, "c": 1}
    assert new_sums["a"].tolist() == [[2.0, 2.0]]  # locked: unchanged
    assert new_sums["b"].tolist() == [[4.0, 2.0]] and new_sums["c"].tolist() == [[2.0, 4.0]]
    assert rounds == {"a": 2, "b": 1} and sums["b"].tolist() == [[1.0, 1.0]]  # the inputs are left as they were
    known, means = history_means(new_sums, new_rounds, ["b", "d"], (1, 2))
    assert known.tolist() == [True, False]
    assert means.tolist() == [[[2.0, 1.0]], [[0.0, 0.0]]]


def test_a_locked_holder_below_the_threshold_is_flagged():
    holders = torch.tensor([[True, False], [False, True], [True, True]])
    trust = {0: torch.tensor([0.05, 0.05, 0.05], dtype=F64), 1: torch.tensor([0.5, 0.5, 0.01], dtype=F64)}
    assert lost_trust_flags([True, True, False], holders, trust, 0.1) == [True, False, False]

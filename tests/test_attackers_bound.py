"""Simulated attackers are bound by the server's own reply checks (issue 44): a colluding row that a
reply would not get through (norm above max-update-norm, NaN, a negative BatchNorm variance) is
rejected and recorded as that reply would be, min-hospitals is checked again, nothing is clipped;
the adaptive searches keep their strength inside the bound, search both ways and can add copy noise.
Hand-computed cases, then one small in-process run that shows the record."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from hospitrust.attacks.interfaces import ColludingAttack, RoundAwareColludingAttack, RoundView
from hospitrust.attacks.math import tailored as TA
from hospitrust.attacks.registry import ATTACKS, build_attack
from hospitrust.attacks.threat_model import ColludingAdversary
from hospitrust.strategies import build_strategy
from hospitrust.strategies.base import AttackerRows
from hospitrust.strategies.validation import ReplyLimits

# the model: w (3 weights), a BatchNorm variance (2) and an integer counter; updates are (w, running_var)
GLOBAL = {"w": torch.zeros(3), "bn.running_var": torch.ones(2), "bn.num_batches_tracked": torch.tensor(5)}
HONEST = [[1.0, 2.0, 2.0, 0.0, 0.0], [2.0, 1.0, 2.0, 0.0, 0.0], [3.0, 3.0, 2.0, 0.0, 0.0]]  # norms 3, 3, 4.69


class _Grid:
    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return self.nodes


def _round(strategy, vectors, steps=()):
    """Send GLOBAL, answer from node i with GLOBAL + vectors[i]; aggregate with ``steps``."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    messages = sorted(strategy.configure_train(1, ArrayRecord(GLOBAL), ConfigRecord(), _Grid(strategy.hospitals)),
                      key=lambda m: m.metadata.dst_node_id)
    replies = []
    for vec, msg in zip(vectors, messages):
        v = torch.tensor(vec, dtype=torch.float32)
        state = {"w": GLOBAL["w"] + v[:3], "bn.running_var": GLOBAL["bn.running_var"] + v[3:],
                 "bn.num_batches_tracked": torch.tensor(6)}
        replies.append(Message(RecordDict({"arrays": ArrayRecord(state),
                                           "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})}),
                               reply_to=msg))
    return strategy.aggregate_round(1, replies, steps)


def _fedavg(min_hospitals=2, max_norm=10.0):
    hospitals = {101: "a", 102: "b", 103: "c", 104: "d"}
    return build_strategy("fedavg", hospitals, min_hospitals=min_hospitals, limits=ReplyLimits(max_update_norm=max_norm))


class _Sends(ColludingAttack):
    """A colluding attack that sends a fixed row (hand cases)."""

    name = "sends"

    def __init__(self, row):
        self.row = torch.tensor(row, dtype=torch.float32)

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return self.row.expand(num_malicious, -1).clone()


def _attacked(row, malicious=("d",)):
    return (AttackerRows(ColludingAdversary(_Sends(row), set(malicious), seed=0)),)


def _without_nan(entry):
    return {k: v for k, v in entry.items() if not (isinstance(v, float) and math.isnan(v))}


# ------------------------------------------------------------------ the server's re-check, by hand
def test_an_over_bound_colluding_row_is_rejected_and_recorded_as_a_reply_would_be():
    over = [-60.0, -60.0, -60.0, 0.0, 0.0]  # norm 103.9 > 10
    result = _round(_fedavg(), HONEST + [[0.1] * 3 + [0.0, 0.0]], _attacked(over))
    (rejected,) = [c.to_json() for c in result.clients if c.rejected]
    assert rejected["hospital"] == "d" and rejected["reason"] == "update norm 103.9 exceeds the bound 10 (max-update-norm)"
    # the same update sent as a reply: rejected by check_train_reply with the same record
    as_reply = _round(_fedavg(), HONEST + [over])
    (reply_entry,) = [c.to_json() for c in as_reply.clients if c.rejected]
    assert _without_nan(rejected) == _without_nan(reply_entry)
    assert set(rejected) == set(reply_entry)
    # the round goes on with the three valid replies, none clipped: FedAvg's mean of the honest rows
    assert not result.kept_previous_model and result.metrics["valid-replies"] == 3
    state = result.arrays.to_torch_state_dict()
    torch.testing.assert_close(state["w"], torch.tensor([2.0, 2.0, 2.0]))
    torch.testing.assert_close(state["bn.running_var"], torch.ones(2))
    assert [c.hospital for c in result.clients if not c.rejected] == ["a", "b", "c"]


def test_too_few_valid_rows_after_the_check_keep_the_previous_model():
    result = _round(_fedavg(min_hospitals=4), HONEST + [[0.1] * 3 + [0.0, 0.0]], _attacked([-60.0] * 3 + [0.0, 0.0]))
    assert result.kept_previous_model and result.arrays is None
    assert result.note == "3 valid replies < min-hospitals 4: kept the previous model"
    assert result.metrics["valid-replies"] == 3
    assert [(c.hospital, c.rejected, c.weight) for c in result.clients] == [
        ("d", True, 0.0), ("a", False, 0.0), ("b", False, 0.0), ("c", False, 0.0)]


@pytest.mark.parametrize("row, reason", [
    ([float("nan"), 0.0, 0.0, 0.0, 0.0], "arrays contain NaN or Inf: ['w']"),
    ([0.0, 0.0, 0.0, -3.0, 0.0], "array 'bn.running_var' (a BatchNorm variance) has negative entries"),
    ([10.0, 0.0, 0.0, 0.0, 0.0], None),  # exactly the bound: accepted, as a reply is
])
def test_every_reply_check_on_an_update_applies_to_a_colluding_row(row, reason):
    result = _round(_fedavg(), HONEST + [[0.1] * 3 + [0.0, 0.0]], _attacked(row))
    as_reply = _round(_fedavg(), HONEST + [row])
    for res in (result, as_reply):
        assert [c.reason for c in res.clients if c.rejected] == ([reason] if reason else [])
    if reason is None:  # accepted and averaged as sent: (1+2+3+10)/4
        torch.testing.assert_close(result.arrays.to_torch_state_dict()["w"], torch.tensor([4.0, 1.5, 1.5]))


def test_a_step_that_is_not_an_attackers_is_not_rechecked():
    """Pre-aggregation and other steps return rows made from checked ones: no second check (a run
    without a colluding attack aggregates exactly as before)."""
    def blow_up(server_round, updates, hospitals):
        return updates * 100.0  # norms 300+: would fail the check

    result = _round(_fedavg(), HONEST + [[0.1] * 3 + [0.0, 0.0]], (blow_up,))
    assert not any(c.rejected for c in result.clients) and result.metrics["valid-replies"] == 4


# ------------------------------------------------------------------ the adaptive searches stay inside the bound
def test_both_directions_finds_a_maximum_below_the_start_by_hand():
    def objective(x):
        return -((x + 3.0) ** 2)

    # 0 (-9), +1 (-16: no), -1 (-4: yes, direction -), -3 (0: yes), -7 (-16: no), then -3 -/+ 3.2: evals spent
    assert TA.maximise_strength(objective, step=1.0, evals=6, both_directions=True) == (-3.0, 0.0)
    # ByzFL's one-way search never leaves 0 in that direction
    assert TA.maximise_strength(objective, step=1.0, evals=6) == (0.0, -9.0)


def test_tailored_ipm_never_sends_a_row_above_the_bound():
    honest = torch.tensor(HONEST)[:, :3]  # mean (2, 2, 2), norm 3.464
    rule = functools.partial(torch.mean, dim=0)  # on the mean IPM's distance grows with |eps| without end
    free, found_free = TA.tailored_ipm(honest, rule, 2)
    assert float(free.norm()) > 10.0  # unbounded, the search goes far past any bound
    for both in (False, True):
        tried = []

        def watched(stack):
            tried.append(float(stack[-1].norm()))
            return rule(stack)

        row, found = TA.tailored_ipm(honest, watched, 2, max_norm=10.0, both_directions=both, evals=20)
        assert float(row.norm()) <= 10.0 * (1 - TA.BOUND_MARGIN)
        assert max(tried) <= 10.0 and float(row.norm()) > 9.0  # only rows inside were evaluated; it gets close
        # eps >= 0 moves the mean by m (1 + eps) / (h + m) |mean|: the found distance, by hand
        eps = found["strength"]
        assert eps > 0 and found["distance"] == pytest.approx(2 * (1 + eps) / 5 * 3.4641016, rel=1e-5)


def test_tailored_attacks_with_copy_noise_keep_every_copy_inside_the_bound():
    honest = torch.tensor(HONEST)[:, :3]
    updates = torch.cat([honest, torch.zeros(3, 3)])
    view = RoundView(1, updates, ["a", "b", "c", "d", "e", "f"], [3, 4, 5], rule=functools.partial(torch.mean, dim=0),
                     generator=torch.Generator().manual_seed(1), max_norm=10.0)
    for name in ("tailored-ipm", "tailored-alie"):
        attack = build_attack(name, {name: ATTACKS[name].Options(copy_noise=0.3)})
        rows, info = attack.craft_round(view)
        norms = torch.linalg.vector_norm(rows, dim=1)
        assert bool((norms <= 10.0).all()) and info["norm"] == pytest.approx(float(norms.max()))
        assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[1], rows[2])  # not identical copies


def test_agr_tailored_keeps_gamma_inside_the_bound():
    honest = torch.tensor(HONEST)[:, :3]
    rule = functools.partial(torch.mean, dim=0)
    free, _ = TA.agr_tailored_distance(honest, 2, rule)
    bounded, found = TA.agr_tailored_distance(honest, 2, rule, max_norm=5.0)
    assert float(free.norm()) > 5.0 and float(bounded.norm()) <= 5.0 and found["gamma"] > 0


# ------------------------------------------------------------------ a real run: the record
@pytest.mark.parametrize("bounds, reason_end", [
    ({"max-update-norm": 100.0}, "exceeds the bound 100 (max-update-norm)"),
    ({"max-update-norm": 1e12, "round-norm-bound.over-median": 3.0}, "x the round's median update norm"),
])
def test_an_in_process_run_records_the_rejected_colluding_row(tmp_path, data_dir, bounds, reason_end):
    from conftest import small_run_config
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1, "train-subsample": 0.03, "attack": "ipm",
                                        "ipm.eps": 1e7, "malicious-hospitals": "0", **bounds, "run-name": "r"})
    run_inprocess(cfg, 4)
    (line,) = read_round_records(tmp_path / "runs" / "r")
    bad = [c for c in line.clients if c.malicious]
    assert len(bad) == 1 and bad[0].rejected and bad[0].weight == 0.0
    assert bad[0].reason.startswith("update norm ") and reason_end in bad[0].reason
    good = [c for c in line.clients if not c.malicious]
    assert len(good) == 3 and not any(c.rejected for c in good)
    assert all(c.update_norm is not None and c.update_norm <= 100.0 for c in good)
    assert not line.kept_previous_model



# ------------------------------------------------------------------ the bound measured from the round (round-norm-bound.over-median)
def _fedavg_relative(ratio, min_hospitals=2, max_norm=100.0):
    hospitals = {101: "a", 102: "b", 103: "c", 104: "d"}
    return build_strategy("fedavg", hospitals, min_hospitals=min_hospitals,
                          limits=ReplyLimits(max_update_norm=max_norm, max_norm_over_median=ratio))


def test_a_reply_far_above_the_rounds_median_norm_is_rejected_by_hand():
    # norms 3, 3, 4.690 and 20: median (3 + 4.690) / 2 = 3.845, 3 x 3.845 = 11.54 < 20
    far = [20.0, 0.0, 0.0, 0.0, 0.0]
    result = _round(_fedavg_relative(3.0), HONEST + [far])
    (rejected,) = [c for c in result.clients if c.rejected]
    assert rejected.hospital == "d"
    assert rejected.reason == "update norm 20 exceeds 3 x the round's median update norm 3.845 (round-norm-bound)"
    torch.testing.assert_close(result.arrays.to_torch_state_dict()["w"], torch.tensor([2.0, 2.0, 2.0]))
    # off (0), or a ratio the row fits under (6 x 3.845 = 23.07), and the same reply is averaged
    for ratio in (0.0, 6.0):
        kept = _round(_fedavg_relative(ratio), HONEST + [far])
        assert not any(c.rejected for c in kept.clients)
        torch.testing.assert_close(kept.arrays.to_torch_state_dict()["w"], torch.tensor([6.5, 1.5, 1.5]))


def test_a_colluding_row_meets_the_same_relative_bound_as_a_reply():
    far = [20.0, 0.0, 0.0, 0.0, 0.0]
    attacked = _round(_fedavg_relative(3.0), HONEST + [[0.1] * 3 + [0.0, 0.0]], _attacked(far))
    as_reply = _round(_fedavg_relative(3.0), HONEST + [far])
    (a,) = [c.to_json() for c in attacked.clients if c.rejected]
    (b,) = [c.to_json() for c in as_reply.clients if c.rejected]
    assert _without_nan(a) == _without_nan(b)
    # measured after the attacker's step: the row it replaced (norm 0.17) never counts in the median
    assert attacked.metrics["valid-replies"] == 3


def test_the_relative_bound_is_skipped_where_it_has_no_scale_or_is_turned_off():
    far = [20.0, 0.0, 0.0, 0.0, 0.0]
    # most rows did not move: median 0, nothing to measure against, every row kept
    still = _round(_fedavg_relative(3.0), [[0.0] * 5, [0.0] * 5, [0.0] * 5, far])
    assert not any(c.rejected for c in still.clients)
    # central DP's call (round_bound=False): the far row enters
    strategy = _fedavg_relative(3.0)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    messages = sorted(strategy.configure_train(1, ArrayRecord(GLOBAL), ConfigRecord(), _Grid(strategy.hospitals)),
                      key=lambda m: m.metadata.dst_node_id)
    replies = [Message(RecordDict({"arrays": ArrayRecord({"w": GLOBAL["w"] + torch.tensor(v[:3]),
                                                          "bn.running_var": GLOBAL["bn.running_var"],
                                                          "bn.num_batches_tracked": torch.tensor(6)}),
                                   "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})}), reply_to=m)
               for v, m in zip(HONEST + [far], messages)]
    assert not any(c.rejected for c in strategy.aggregate_round(1, replies, round_bound=False).clients)


def test_a_run_that_cannot_apply_the_relative_bound_says_why():
    from hospitrust.config import parse_run_config
    from hospitrust.server_app.services import _round_bound_not_applied
    from hospitrust.strategies import strategy_class

    def why(**values):
        cfg = parse_run_config({"round-norm-bound.over-median": 3.0, **values})
        return _round_bound_not_applied(cfg, strategy_class(cfg.strategy))

    assert why() == [] and why(strategy="median") == []
    assert why(strategy="fbd") == ["FED-FBD's replies are blocks, checked one by one"]


def test_rows_rejected_by_the_relative_bound_count_against_min_hospitals():
    result = _round(_fedavg_relative(3.0, min_hospitals=4), HONEST + [[20.0, 0.0, 0.0, 0.0, 0.0]])
    assert result.kept_previous_model and result.note == "3 valid replies < min-hospitals 4: kept the previous model"


def test_a_ratio_below_one_is_refused_with_what_is_expected():
    from hospitrust.config import parse_run_config
    from hospitrust.errors import ConfigError

    for bad in (0.5, float("inf")):
        with pytest.raises(ConfigError, match="round-norm-bound.over-median.*expected 0 \\(off\\) or a finite number of at "
                                              "least 1"):
            parse_run_config({"round-norm-bound.over-median": bad})
        with pytest.raises(ValueError, match="0 \\(off\\) or a finite number of at least 1"):
            ReplyLimits(max_norm_over_median=bad)


class _ToldBound(RoundAwareColludingAttack):
    """A round-aware attack that sends its rows unchanged and keeps the bound it was told."""

    name = "told-bound"

    def craft_round(self, view):
        self.told = view.max_norm
        return view.updates[view.malicious_rows].clone(), {}


@pytest.mark.parametrize("ratio, max_norm, told", [
    (0.0, 100.0, 100.0),  # off: max-update-norm alone
    (3.0, 100.0, 3.0 * (3.0 + 22 ** 0.5) / 2),  # norms 3, 3, 4.690 and the crafted row at the top: median 3.845
    (3.0, 5.0, 5.0),  # the smaller of the two
])
def test_a_round_aware_attack_is_told_the_smaller_bound(ratio, max_norm, told):
    from hospitrust.features.adversary import RoundAwareAdversary

    attack = _ToldBound()
    feature = RoundAwareAdversary(attack, {"d"}, seed=0)
    feature.wrap_strategy(_fedavg_relative(ratio, max_norm=max_norm))
    feature.evaluator = lambda server_round, hospitals: None  # _ToldBound never asks the rule
    feature._checked = lambda hospitals: [SimpleNamespace(num_examples=10) for _ in hospitals]
    feature.step(1, torch.tensor(HONEST + [[0.1] * 3 + [0.0, 0.0]]), ["a", "b", "c", "d"])
    assert attack.told == pytest.approx(told)


def test_the_bounds_earlier_name_is_read_with_a_deprecation_line():
    from hospitrust.config import parse_run_config

    with pytest.warns(FutureWarning, match="'max-norm-over-median' is deprecated: it is now 'round-norm-bound.over-median'"):
        cfg = parse_run_config({"max-norm-over-median": 4.0})
    assert cfg.round_norm_bound.over_median == 4.0

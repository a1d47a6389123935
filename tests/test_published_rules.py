"""The seed papers' rules as published (issue 24): each new name selects the published form, checked
against hand-computed cases; the existing names keep their behaviour (tests/test_golden.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import flat_entry
from hospitrust.aggregation import fedagain_trust
from hospitrust.aggregation.earn import holder_mask, peer_reliability
from hospitrust.contribution import (
    everybody_else,
    everybody_else_published,
    fair_private,
    fair_private_published,
    marginals_from_table,
    shapley_exact,
)
from hospitrust.contribution.interface import HospitalReport, SecureRoundView, score_round
from hospitrust.strategies import PRESETS, build_strategy, strategy_names
from hospitrust.strategies.intake import round_context

PUBLISHED = ("fedagain-published", "fedagain-authors-code", "hta-published", "hta-published-no-m",
             "hta-published-no-memory", "hta-published-no-direction", "earn-published")


def _rule(name, n, global_state, **kwargs):
    s = build_strategy(name, {100 + i: f"h{i}" for i in range(n)}, **kwargs)
    s.global_state = global_state
    return s


def _aggregate(strategy, updates, metrics=None, num_examples=None, server_round=1):
    """``aggregate`` on bare replies (node id and metrics: what the rules read of a reply)."""
    u = torch.tensor(updates, dtype=torch.float32)
    n = u.shape[0]
    replies = [SimpleNamespace(node_id=100 + i, metrics=(metrics or [{}] * n)[i]) for i in range(n)]
    ne = torch.tensor(num_examples or [10.0] * n, dtype=torch.float64)
    return strategy.aggregate(u, ne, round_context(strategy, server_round, replies))


def test_every_published_name_is_selectable_from_the_run_config():
    from hospitrust.config import parse_run_config

    assert sorted(PRESETS) == sorted(PUBLISHED)  # each a preset of its rule (issue 31), no class of its own
    for name in PUBLISHED:
        assert name in strategy_names()
        assert parse_run_config({"strategy": name}).strategy == name
    cfg = parse_run_config({"strategy": "contribution", "contribution-scoring.enabled": True,
                            "contribution.score": "ee-published"})
    assert cfg.options("contribution").score == "ee-published"


# ---- FedAgain ----------------------------------------------------------------------------------
# E = (0.1, 0.2, 0.4), ||u|| = (1, 2, 0.5): E D = (0.1, 0.4, 0.2), T = 1 / (E D + 1e-6) ~ (10, 2.5, 5),
# weights T / 17.5 = (4/7, 1/7, 2/7); aggregate = (4/7 x 1, 1/7 x 2, 2/7 x 0.5) on three axes.
FA_UPDATES = [[1.0, 0, 0], [0, 2.0, 0], [0, 0, 0.5]]
FA_ERRORS = [{"benchmark-error": 0.1}, {"benchmark-error": 0.2}, {"benchmark-error": 0.4}]


def test_fedagain_published_is_the_unfloored_trust_weighted_sum():
    agg = _aggregate(_rule("fedagain-published", 3, {"w": torch.zeros(3)}), FA_UPDATES, FA_ERRORS)
    assert agg.weights.tolist() == pytest.approx([4 / 7, 1 / 7, 2 / 7], rel=1e-5)
    assert agg.update.tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7], rel=1e-5)
    assert agg.extra["error_floored"] == pytest.approx([0.1, 0.2, 0.4])  # no floor
    assert agg.extra["flagged"] == [False, False, False]  # no outlier detection
    # fedagain (the default) floors E at the median 0.2 and D at the median 1: E'D' = (0.2, 0.4, 0.4),
    # T ~ (5, 2.5, 2.5), weights (1/2, 1/4, 1/4)
    default = _aggregate(_rule("fedagain", 3, {"w": torch.zeros(3)}), FA_UPDATES, FA_ERRORS)
    assert default.weights.tolist() == pytest.approx([0.5, 0.25, 0.25], rel=1e-5)


def test_fedagain_published_hands_a_free_rider_the_aggregate_as_the_paper_does():
    # hospital 2 returns the global model (D = 0): T = 1 / (0.2 x 0 + 1e-6) = 1e6 against 1 / 0.1 and 1 / 0.4
    agg = _aggregate(_rule("fedagain-published", 3, {"w": torch.zeros(3)}), [[1.0, 0, 0], [0, 2.0, 0], [0, 0, 0]],
                     [{"benchmark-error": 0.1}, {"benchmark-error": 0.2}, {"benchmark-error": 0.2}])
    assert float(agg.weights[2]) == pytest.approx(1e6 / (1e6 + 10 + 2.5), rel=1e-5)


def test_fedagain_eps_placement_by_hand():
    # eps = 0.1 to make it visible. E = (0.5, 0.25), D = (0.5, 1): E D = 0.25 for both.
    # product (paper): T = 1 / 0.35 for both; factors (code): 1 / (0.6 x 0.6) = 2.7778, 1 / (0.35 x 1.1) = 2.5974
    paper = fedagain_trust([0.5, 0.25], [0.5, 1.0], divergence_quantile=0, error_quantile=0, error_floor=0, eps=0.1)
    code = fedagain_trust([0.5, 0.25], [0.5, 1.0], divergence_quantile=0, error_quantile=0, error_floor=0, eps=0.1,
                          eps_placement="factors")
    assert paper["trust"].tolist() == pytest.approx([1 / 0.35, 1 / 0.35])
    assert code["trust"].tolist() == pytest.approx([1 / 0.36, 1 / 0.385])
    with pytest.raises(ValueError, match="eps_placement"):
        fedagain_trust([0.5], [0.5], eps_placement="sum")


def test_fedagain_authors_code_uses_cosine_divergence_and_eps_on_each_factor():
    # global w = (1, 0). u0 = (0, 1): w0 = (1, 1), cos 1/sqrt2, D0 = 1 - 1/sqrt2; u1 = (-2, 0): w1 = (-1, 0), cos -1,
    # D1 = 2. Equal E: weights proportional to 1 / (D + 1e-6): w0 = D1 / (D0 + D1) = (4 + 2 sqrt2) / (5 + 2 sqrt2)
    s = _rule("fedagain-authors-code", 2, {"w": torch.tensor([1.0, 0.0])})
    agg = _aggregate(s, [[0.0, 1.0], [-2.0, 0.0]], [{"benchmark-error": 0.5}] * 2)
    d0 = 1 - 1 / math.sqrt(2)
    assert agg.extra["divergence"] == pytest.approx([d0, 2.0], rel=1e-6)
    assert float(agg.weights[0]) == pytest.approx((4 + 2 * math.sqrt(2)) / (5 + 2 * math.sqrt(2)), rel=1e-5)
    t0 = 1 / ((0.5 + 1e-6) * (d0 + 1e-6))
    assert agg.extra["trust"][0] == pytest.approx(t0, rel=1e-9)  # float64


# ---- HTA ---------------------------------------------------------------------------------------
def test_hta_published_magnitude_has_no_dead_zone_and_no_clip():
    # three updates along one axis, norms 1, 2, 4: s = 1 each; no validation (v = 1).
    # published: m = exp(-|ln(norm / 2)|) = (1/2, 1, 1/2) = tau = R (first round), weights R n / sum = (1/4, 1/2, 1/4),
    # no clip: aggregate = 1/4 + 1 + 1 = 2.25.
    upd = [[1.0, 0], [2.0, 0], [4.0, 0]]
    agg = _aggregate(_rule("hta-published", 3, {"w": torch.zeros(2)}), upd)
    assert agg.extra["m"] == pytest.approx([0.5, 1.0, 0.5])
    assert agg.weights.tolist() == pytest.approx([0.25, 0.5, 0.25])
    assert agg.update.tolist() == pytest.approx([2.25, 0.0])
    # hta's m: norms within 2x of the median are fine, m = 1 for all three
    from hospitrust.aggregation import hta_signals

    assert hta_signals(torch.tensor(upd), magnitude_tolerance=2.0, trim_norms=True)["m"].tolist() == [1.0, 1.0, 1.0]
    # no m (b = 0): tau = 1 for all, weights 1/3, unclipped: 7/3
    no_m = _aggregate(_rule("hta-published-no-m", 3, {"w": torch.zeros(2)}), upd)
    assert no_m.update.tolist() == pytest.approx([7 / 3, 0.0])


def test_hta_published_direction_and_its_ablation():
    # u = (1, 0), (1, 0), (0, 1), norms 1: m = 1. Coordinate median (1, 0): s = (1, 1, 0).
    # published: tau = R = (1, 1, 0); mu = 1, MAD = 0: h2 below mu - 2 MAD = 1 and kappa mu = 0.5, excluded;
    # aggregate (1, 0). No direction (a = 0): tau = 1 for all, weights 1/3: (2/3, 1/3).
    upd = [[1.0, 0], [1.0, 0], [0, 1.0]]
    pub = _aggregate(_rule("hta-published", 3, {"w": torch.zeros(2)}), upd)
    assert pub.extra["s"] == pytest.approx([1.0, 1.0, 0.0])
    assert pub.extra["excluded"] == [False, False, True]
    assert pub.update.tolist() == pytest.approx([1.0, 0.0])
    no_dir = _aggregate(_rule("hta-published-no-direction", 3, {"w": torch.zeros(2)}), upd)
    assert no_dir.weights.tolist() == pytest.approx([1 / 3] * 3)
    assert no_dir.update.tolist() == pytest.approx([2 / 3, 1 / 3])


def test_hta_published_memory_and_its_ablation_over_two_rounds():
    # round 1: h2 orthogonal, tau = 0; round 2: all aligned, tau = 1.
    # published (rate 0.3, penalty 1): h2's r = 0 + 0.3 (1 - 0) = 0.3, sigma^2 = 0.7 (0 + 0.3 x 1) = 0.21,
    # R = clip(0.3 - sqrt(0.21), 0, 1) = 0: excluded again. No memory: R = tau = 1, weight 1/3.
    r1, r2 = [[1.0, 0], [1.0, 0], [0, 1.0]], [[1.0, 0], [1.0, 0], [1.0, 0]]
    pub, no_mem = (_rule(n, 3, {"w": torch.zeros(2)}) for n in ("hta-published", "hta-published-no-memory"))
    for s in (pub, no_mem):
        _aggregate(s, r1, server_round=1)
    a, b = _aggregate(pub, r2, server_round=2), _aggregate(no_mem, r2, server_round=2)
    assert pub.ema["h2"] == pytest.approx(0.3) and pub.var["h2"] == pytest.approx(0.21)
    assert a.extra["reputation"] == pytest.approx([1.0, 1.0, 0.0])
    assert a.extra["excluded"] == [False, False, True]
    assert b.extra["reputation"] == pytest.approx([1.0, 1.0, 1.0])
    assert b.weights.tolist() == pytest.approx([1 / 3] * 3)


# ---- EARN --------------------------------------------------------------------------------------
# reported training-image counts of classes (0, 1, 2) at four hospitals
COUNTS = [[100, 25, 19], [100, 30, 0], [100, 5, 50], [100, 0, 0]]


def test_holder_threshold_and_peer_reliability_by_hand():
    held = holder_mask(torch.tensor(COUNTS, dtype=torch.float64), 20)
    # at least 20 images: class 0 all four; class 1 h0, h1 (h2's 5 do not count); class 2 h2 only (h0's 19 do not)
    assert held.tolist() == [[True, True, False], [True, True, False], [True, False, True], [True, False, False]]
    assert holder_mask(torch.tensor(COUNTS, dtype=torch.float64)).sum(0).tolist() == [4, 3, 2]  # any image holds
    # p(c) = clip((n(c) - 1) / 4, 0, 1): 1 holder 0, 2 holders 1/4, 3 holders 1/2, 5 or more 1
    assert peer_reliability(torch.tensor([1, 2, 3, 5, 9])).tolist() == [0.0, 0.25, 0.5, 1.0, 1.0]


def _earn_case(name):
    # a linear head (weight (3, 2), bias (3,)) is all the model: updates are 9 numbers each
    state = {"fc.weight": torch.zeros(3, 2), "fc.bias": torch.zeros(3)}
    gen = torch.Generator().manual_seed(0)
    upd = (torch.randn(4, 9, generator=gen) * 0.1).tolist()
    return _aggregate(_rule(name, 4, state, **({"options": {"evidence": "reported"}} if name == "earn" else {})),
                      upd, [{"class-counts": c} for c in COUNTS])


def test_earn_published_picks_rare_classes_by_holders_of_20_images():
    # holders by >= 20 images: n = (4, 2, 1), mean 7/3; rare: n < 0.6 x 7/3 = 1.4 -> class 2 (also the least held)
    pub = _earn_case("earn-published")
    assert pub.extra["rare_classes"][0] == [2]
    assert pub.extra["holds"] == [[0, 1], [0, 1], [0, 2], [0]]
    # earn with the same reported counts: any image holds, rare by image totals (400, 60, 69) below 0.6 x 176.3
    default = _earn_case("earn")
    assert default.extra["rare_classes"][0] == [1, 2]
    assert default.extra["holds"] == [[0, 1, 2], [0, 1], [0, 1, 2], [0]]


def test_earn_holder_threshold_needs_counts_as_evidence():
    with pytest.raises(ValueError, match="holder-min-count"):
        build_strategy("earn", {1: "a", 2: "b"}, options={"holder_min_count": 20})  # evidence 'update' is no count


# ---- Fair-Private and Everybody-Else -----------------------------------------------------------
def test_fair_private_published_by_hand():
    # phi = (LOO + IOI) / 2 = (3, -1, 1), sum 3, Delta 4: FP = 4/3 phi = (4, -4/3, 4/3)
    loo, ioi = [4.0, -1.0, 1.0], [2.0, -1.0, 1.0]
    np.testing.assert_allclose(fair_private_published(loo, ioi, 4.0), [4.0, -4 / 3, 4 / 3])
    # hospitrust's fp shares only the residual 4 - 3 = 1, by |m| / 5: (3.6, -0.8, 1.2)
    np.testing.assert_allclose(fair_private(loo, ioi, 4.0), [3.6, -0.8, 1.2])
    # the weight: lambda = 1/4: phi = (1/4 x 4, 3/4 x 4) = (1, 3), Delta 2: (0.5, 1.5)
    np.testing.assert_allclose(fair_private_published([4.0, 0.0], [0.0, 4.0], 2.0, loo_weight=0.25), [0.5, 1.5])
    # every marginal 0: Delta split equally (efficiency kept)
    np.testing.assert_allclose(fair_private_published([0.0] * 4, [0.0] * 4, 1.0), [0.25] * 4)
    with pytest.raises(ValueError, match="loo_weight"):
        fair_private_published([1.0], [1.0], 1.0, loo_weight=1.5)


def test_everybody_else_published_by_hand():
    # phi = (2, 1, 0), Delta_j = 6: credit to the others r = 6 - phi = (4, 5, 6); r_bar_i = mean over j != i:
    # (5.5, 5, 4.5), sum 15; EE = 6 r_bar / 15 = (2.2, 2.0, 1.8). The null hospital (phi 0) gets 1.8, not 0.
    np.testing.assert_allclose(everybody_else_published([2.0, 1, 0], [2.0, 1, 0], [6.0, 6, 6]), [2.2, 2.0, 1.8])
    # hospitrust's ee, not efficient: mean_{j != i} Delta_j - sum_{j != i} m_j = (5, 4, 3)
    np.testing.assert_allclose(everybody_else([2.0, 1, 0], [2.0, 1, 0], [6.0, 6, 6]), [5.0, 4.0, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        everybody_else_published([1.0], [1.0], [1.0])


def _random_game(seed, n):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=1 << n)
    values[0] = 0.0
    return values


@pytest.mark.parametrize("seed", range(5))
def test_published_scores_are_efficient_and_symmetric(seed):
    n = 5
    values = _random_game(seed, n)
    loo, ioi, delta = marginals_from_table(values)
    fp = fair_private_published(loo, ioi, delta)
    ee = everybody_else_published(loo, ioi, np.full(n, delta))
    assert fp.sum() == pytest.approx(delta) and ee.sum() == pytest.approx(delta)  # efficiency
    # symmetry: hospitals 0 and 1 with the same reports get the same score
    loo[1], ioi[1] = loo[0], ioi[0]
    for score in (fair_private_published(loo, ioi, delta), everybody_else_published(loo, ioi, np.full(n, delta))):
        assert score[0] == pytest.approx(score[1])


@pytest.mark.parametrize("seed", range(3))
def test_fair_private_published_null_player_and_additive_games(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=4)
    a[2] = 0.0  # a null player
    masks = np.arange(16)
    values = np.array([sum(a[i] for i in range(4) if (m >> i) & 1) for m in masks])  # additive: v(S) = sum a
    loo, ioi, delta = marginals_from_table(values)
    fp = fair_private_published(loo, ioi, delta)
    np.testing.assert_allclose(fp, shapley_exact(values), atol=1e-12)  # float64: = Shapley = a
    assert fp[2] == pytest.approx(0.0, abs=1e-12)  # float64
    assert everybody_else_published(loo, ioi, np.full(4, delta))[2] != pytest.approx(0.0, abs=1e-6)


def test_score_round_records_the_published_scores():
    # v_new 0.8, v_previous 0.5 for all: Delta 0.3. LOO = 0.8 - (0.7, 0.75, 0.8) = (0.1, 0.05, 0),
    # IOI = (0.7, 0.6, 0.5) - 0.5 = (0.2, 0.1, 0): phi = (0.15, 0.075, 0), FP = 0.3 phi / 0.225 = (0.2, 0.1, 0)
    reps = tuple(HospitalReport(h, 0.8, 0.5, without, alone, 0.5, 1 / 3)
                 for h, without, alone in (("a", 0.7, 0.7), ("b", 0.75, 0.6), ("c", 0.8, 0.5)))
    rs = score_round(SecureRoundView(round=1, total_weight=1.0, reports=reps))
    assert rs.scores["fp-published"] == pytest.approx([0.2, 0.1, 0.0])
    # r = 0.3 - phi = (0.15, 0.225, 0.3), r_bar = (0.2625, 0.225, 0.1875), sum 0.675: EE = 0.3 r_bar / 0.675
    assert rs.scores["ee-published"] == pytest.approx([0.3 * x / 0.675 for x in (0.2625, 0.225, 0.1875)])
    assert sum(rs.scores["ee-published"]) == pytest.approx(0.3)


def test_contribution_weighting_by_a_published_score():
    s = build_strategy("contribution", {1: "a", 2: "b"}, options={"score": "fp-published"})
    s.receive_scores({"a": {"fp": 1.0, "fp-published": 0.3}, "b": {"fp": 1.0, "fp-published": 0.1}})
    agg = _aggregate_contribution(s)
    assert agg.weights.tolist() == pytest.approx([0.75, 0.25])
    assert agg.extra["contribution_weighting"] == ["fp-published"] * 2


def _aggregate_contribution(s):
    replies = [SimpleNamespace(node_id=1, metrics={}), SimpleNamespace(node_id=2, metrics={})]
    return s.aggregate(torch.ones(2, 3), torch.tensor([10.0, 10.0], dtype=torch.float64), round_context(s, 1, replies))


# ---- a real in-process federation with a published name ----------------------------------------
def test_fedagain_published_in_a_real_inprocess_run(tmp_path, data_dir):
    from flwr.app import Context, RecordDict

    from conftest import small_run_config
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, **{"strategy": "fedagain-published", "num-server-rounds": 1,
                                        "train-subsample": 0.03, "batch-size": 64, "local-epochs": 1})
    server_app(InProcessGrid(client_app, 3, cfg), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                           run_config=cfg))
    (rec,) = read_round_records(tmp_path / "runs" / cfg["run-name"])
    assert not rec.kept_previous_model
    clients = [flat_entry(c) for c in rec.clients]  # the rule's signals beside the common fields
    trust = [c["trust"] for c in clients]
    assert [c["weight"] for c in clients] == pytest.approx([t / sum(trust) for t in trust])
    for c in clients:  # the paper's factors, unfloored: T = 1 / (E D + 1e-6)
        assert c["error_floored"] == pytest.approx(c["benchmark_error_used"])
        assert c["trust"] == pytest.approx(1 / (c["benchmark_error_used"] * c["divergence"] + 1e-6), rel=1e-9)  # float64
        assert c["flagged"] is False


@pytest.mark.parametrize("name,keys", [("hta-published-no-memory", ("s", "m", "v", "tau", "reputation")),
                                       ("earn-published", ("holds", "rare_classes", "earn_trust"))])
def test_published_hta_and_earn_in_a_real_inprocess_run(tmp_path, data_dir, name, keys):
    from flwr.app import Context, RecordDict

    from conftest import small_run_config
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, **{"strategy": name, "num-server-rounds": 1, "train-subsample": 0.03,
                                        "batch-size": 64, "local-epochs": 1})
    server_app(InProcessGrid(client_app, 4, cfg), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                           run_config=cfg))
    (rec,) = read_round_records(tmp_path / "runs" / cfg["run-name"])
    assert not rec.kept_previous_model, rec.note
    clients = [flat_entry(c) for c in rec.clients]  # the rule's signals beside the common fields
    for c in clients:
        assert not c["rejected"], c["reason"]
        assert all(k in c for k in keys), (name, keys)
    if name == "hta-published-no-memory":  # no memory: the reputation is the round's tau
        assert [c["reputation"] for c in clients] == pytest.approx([c["tau"] for c in clients])
    else:  # a holder has at least 20 training images of the class, by its reported counts
        for c in clients:
            counts = [int(x) for x in c["evidence"]]
            assert c["holds"] == [k for k, x in enumerate(counts) if x >= 20]


ISSUE_24_GRIDS = {"fedagain-corruption": 588, "fedagain-corruption-cpu": 147, "contribution-published": 90, "hta-ablation": 288, "fbd-detection": 126,
                  "fbd-unlearning": 36, "fltrust-root": 42, "privacy-utility": 12, "earn-threshold": 84}


@pytest.mark.parametrize("grid", sorted(ISSUE_24_GRIDS))
def test_the_issue_24_grids_parse_and_state_their_budget(grid):
    from pathlib import Path

    from hospitrust.bench.grid import parse_grid

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{grid}.toml"
    assert "Budget (CPU, 2 cores)" in path.read_text()
    assert len(parse_grid(path, validate=False).cells) == ISSUE_24_GRIDS[grid]

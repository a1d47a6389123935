"""The field's defences as selectable rules (issue 34): each strategy on a hand-computed stack with its
per-hospital records, state across rounds through a checkpoint, seeded draws, a grid naming every
rule, and one in-process run of every rule.
"""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from conftest import flat_entry, small_run_config
from hospitrust.aggregation import flame, monna, monna_around
from hospitrust.server_app.checkpoint import from_plain, to_plain
from hospitrust.strategies import build_strategy
from hospitrust.strategies.intake import round_context

#: every rule issue 34 adds (test_strategies runs the in-process check of the others)
FIELD_RULES = ["caf", "clipped-clustering", "dnc", "flame", "foolsgold", "mda", "monna", "signguard", "smea"]


def _strategy(name, n, **kwargs):
    s = build_strategy(name, {100 + i: f"h{i}" for i in range(n)}, **kwargs)
    return s


def _aggregate(s, rows, server_round=1, hospitals=None, global_model=None):
    """``aggregate`` on the float64 stack ``rows`` from hospitals ``hospitals`` (indices; all by default)."""
    x = torch.tensor(rows, dtype=torch.float64)
    idx = list(range(len(rows))) if hospitals is None else hospitals
    s.global_state = {"w": torch.zeros(x.shape[1], dtype=torch.float64) if global_model is None
                      else torch.tensor(global_model, dtype=torch.float64)}
    replies = [SimpleNamespace(node_id=100 + i, metrics={}) for i in idx]
    return s.aggregate(x, torch.full((len(rows),), 10.0, dtype=torch.float64), round_context(s, server_round, replies))


def _through_checkpoint(s):
    """The strategy's state as a checkpoint file holds it (weights_only load) into a fresh strategy."""
    buf = io.BytesIO()
    torch.save(to_plain(s.state_dict()), buf)
    buf.seek(0)
    fresh = _strategy(s.name, len(s.hospitals), options=s.options)
    fresh.load_state_dict(from_plain(torch.load(buf, weights_only=True)))
    return fresh


def test_every_field_rule_is_registered_with_its_section():
    from hospitrust.config.sections import all_sections
    from hospitrust.strategies import STRATEGIES

    assert set(FIELD_RULES) <= set(STRATEGIES)
    sections = all_sections()
    for name in ("clipped-clustering", "dnc", "flame", "foolsgold", "signguard"):
        assert sections[name].kind == "strategy"
    sized = {name for name in FIELD_RULES if STRATEGIES[name].sized_for_attackers}
    assert sized == {"caf", "dnc", "mda", "monna", "smea"}


# ---- FLAME -------------------------------------------------------------------------------------
FLAME_ROWS = [[1.0, 0.0], [2.0, 0.1], [1.0, 0.05], [3.0, 0.0], [0.0, -5.0]]


def test_flame_admits_the_majority_cosine_cluster_and_clips_to_the_median_norm():
    s = _strategy("flame", 5, options={"noise_lambda": 0.0, "cluster": "updates"})
    agg = _aggregate(s, FLAME_ROWS)
    bound = math.hypot(2.0, 0.1)  # median of 1, 2.0025, 1.0012, 3, 5
    assert agg.extra["admitted"] == [True, True, True, True, False]
    assert agg.extra["cluster_label"][4] == -1 and min(agg.extra["cluster_label"][:4]) >= 0
    assert agg.extra["clip_factor"] == pytest.approx([1, 1, 1, bound / 3, bound / 5])
    expected = (torch.tensor([1.0, 0]) + torch.tensor([2.0, 0.1]) + torch.tensor([1.0, 0.05])
                + torch.tensor([3.0, 0]) * bound / 3) / 4
    assert torch.allclose(agg.update, expected.double())
    assert agg.weights.tolist() == pytest.approx([0.25, 0.25, 0.25, bound / 12, 0.0])


def test_flame_clusters_the_local_models_by_default_and_its_noise_is_seeded_by_run_and_round():
    # the rule hands the math the round's global model: the models global + u_i are clustered
    s = _strategy("flame", 5, options={"noise_lambda": 0.0})
    assert s.options.cluster == "models"
    for w in ([0.0, 0.0], [0.0, 10.0], [-3.0, 1.0]):
        got = _aggregate(s, FLAME_ROWS, global_model=w)
        _, rec = flame(torch.tensor(FLAME_ROWS).double(), global_model=torch.tensor(w).double(), noise_lambda=0.0)
        assert got.extra["cluster_label"] == rec.detail["labels"].tolist() and torch.allclose(got.weights, rec.weights)
    assert _aggregate(s, FLAME_ROWS, global_model=[0.0, 10.0]).extra["cluster_label"] != _aggregate(
        _strategy("flame", 5, options={"noise_lambda": 0.0, "cluster": "updates"}), FLAME_ROWS,
        global_model=[0.0, 10.0]).extra["cluster_label"]
    rows = torch.randn(5, 4000, generator=torch.Generator().manual_seed(1)).tolist()
    noisy = [_aggregate(_strategy("flame", 5, seed=seed, options={"noise_lambda": 1.0}), rows, server_round=rnd).update
             for seed, rnd in ((3, 1), (3, 1), (3, 2), (4, 1))]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0], noisy[2]) and not torch.equal(noisy[0], noisy[3])
    plain = _aggregate(_strategy("flame", 5, options={"noise_lambda": 0.0}), rows).update
    median_norm = float(torch.tensor(rows).norm(dim=1).median())
    assert float((noisy[0] - plain).std()) == pytest.approx(median_norm, rel=0.05)  # lambda = 1: std = S


# ---- FoolsGold ---------------------------------------------------------------------------------
def test_foolsgold_learning_rates_from_the_history_and_the_history_through_a_checkpoint():
    s = _strategy("foolsgold", 3)
    first = _aggregate(s, [[1.0, 0], [1.0, 0], [0.0, 1]])
    # h0 and h1 identical (cosine 1): pardoning leaves them at 1, h2 at 0; alpha = 1 - max = (0, 0, 1)
    assert first.extra["max_similarity"] == pytest.approx([1, 1, 0])
    assert first.extra["learning_rate"] == pytest.approx([0, 0, 1])
    assert first.selected.tolist() == [False, False, True] and torch.allclose(first.update, torch.tensor([0.0, 1]).double())
    resumed = _through_checkpoint(s)
    # histories (1, 1), (2, 0), (0, 2): cosines 0.707, 0.707, 0; all v equal, alpha all 1 - 0.707: rescaled to 1
    second = [_aggregate(t, [[0.0, 1], [1.0, 0], [0.0, 1]], server_round=2) for t in (s, resumed)]
    for agg in second:
        assert agg.extra["max_similarity"] == pytest.approx([2 ** -0.5] * 3)
        assert agg.extra["learning_rate"] == pytest.approx([1, 1, 1])
        assert torch.allclose(agg.update, torch.tensor([1 / 3, 2 / 3]).double())
    assert torch.equal(s.history["h2"], torch.tensor([0.0, 2]).double())
    # h2 absent in round 3: its row is copied out of round 2's stack, which is then free
    _aggregate(s, [[1.0, 0], [1.0, 1]], server_round=3, hospitals=[0, 1])
    assert s.history["h2"]._base is None and torch.equal(s.history["h1"], torch.tensor([3.0, 1]).double())


# ---- DnC ---------------------------------------------------------------------------------------
DNC_ROWS = [[1.0, 1, 1], [1.1, 0.9, 1], [0.9, 1.1, 1], [1.0, 1, 1.2], [10.0, -10, 10]]


def test_dnc_removes_the_top_singular_direction_outlier_and_records_every_score():
    s = _strategy("dnc", 5, assumed_malicious=1)  # sub-dim 10000 >= d: every coordinate
    agg = _aggregate(s, DNC_ROWS)
    centred = np.array(DNC_ROWS) - np.mean(DNC_ROWS, axis=0)
    top = np.linalg.svd(centred)[2][0]
    assert agg.extra["outlier_score"] == pytest.approx(((centred @ top) ** 2).tolist())
    assert agg.selected.tolist() == [True, True, True, True, False]
    assert torch.allclose(agg.update, torch.tensor([1.0, 1.0, 1.05]).double())
    assert _strategy("dnc", 5, assumed_malicious=2).required_replies() == 3
    assert _strategy("dnc", 5, assumed_malicious=2, options={"filter_fraction": 1.5}).required_replies() == 4


def test_dnc_coordinates_are_drawn_from_the_run_seed_and_the_round():
    rows = torch.randn(6, 5000, generator=torch.Generator().manual_seed(2)).tolist()

    def scores(seed, rnd):
        return _aggregate(_strategy("dnc", 6, seed=seed, options={"sub_dim": 50}), rows, server_round=rnd
                          ).extra["outlier_score"]

    assert scores(7, 1) == scores(7, 1) and scores(7, 1) != scores(7, 2) and scores(7, 1) != scores(8, 1)


# ---- SignGuard ---------------------------------------------------------------------------------
SIGN_ROWS = [[1.0, 1, -1, 0.5], [1.0, 2, -1, 1], [2.0, 1, -2, 1], [1.0, 1, -1, 1], [-1.0, -1, 1, -1]]


def test_signguard_keeps_the_norm_band_and_the_largest_sign_cluster_clipped_to_the_median_norm():
    s = _strategy("signguard", 5, options={"coordinate_fraction": 1.0})
    agg = _aggregate(s, SIGN_ROWS)
    norms = torch.tensor(SIGN_ROWS).norm(dim=1).double()  # 1.80, 2.65, 3.16, 2, 2: median 2
    assert agg.extra["norm_ratio"] == pytest.approx((norms / 2).tolist())
    assert agg.extra["norm_ok"] == [True] * 5
    assert agg.extra["sign_shares"] == [pytest.approx([0.75, 0, 0.25])] * 4 + [pytest.approx([0.25, 0, 0.75])]
    assert agg.extra["in_largest_sign_cluster"] == [True, True, True, True, False]
    assert agg.extra["clip_factor"] == pytest.approx(torch.clamp(2 / norms, max=1).tolist())
    clipped = torch.tensor(SIGN_ROWS[:4]).double() * torch.clamp(2 / norms[:4], max=1)[:, None]
    assert torch.allclose(agg.update, clipped.mean(0))
    # a scaled update falls out of the norm band, whatever its signs
    far = _aggregate(_strategy("signguard", 5, options={"coordinate_fraction": 1.0}),
                     SIGN_ROWS[:4] + [[10.0, 10, -10, 5]])
    assert far.extra["norm_ok"] == [True, True, True, True, False] and not far.selected[4]


def test_signguard_coordinates_are_drawn_from_the_run_seed_and_the_round():
    rows = torch.randn(5, 3000, generator=torch.Generator().manual_seed(4)).tolist()

    def shares(seed, rnd):
        return _aggregate(_strategy("signguard", 5, seed=seed), rows, server_round=rnd).extra["sign_shares"]

    assert shares(1, 1) == shares(1, 1) and shares(1, 1) != shares(1, 2)


# ---- clipped clustering ------------------------------------------------------------------------
CC_ROWS = [[1.0, 0], [2.0, 0.2], [1.5, -0.1], [0.0, -3]]


def test_clipped_clustering_clips_to_the_median_of_every_norm_so_far_through_a_checkpoint():
    s = _strategy("clipped-clustering", 4)
    first = _aggregate(s, CC_ROWS)
    norms = torch.tensor(CC_ROWS).double().norm(dim=1)
    tau = float((norms[1] + norms[2]) / 2)  # median of 1, 2.01, 1.503, 3
    assert first.selected.tolist() == [True, True, True, False]
    assert first.extra["cluster_label"][:3] == [first.extra["cluster_label"][0]] * 3 != first.extra["cluster_label"][3:]
    assert first.extra["clip_factor"] == pytest.approx([1, tau / float(norms[1]), 1, tau / 3])
    expected = (torch.tensor(CC_ROWS[0]) + torch.tensor(CC_ROWS[1]) * tau / float(norms[1]) + torch.tensor(CC_ROWS[2])) / 3
    assert torch.allclose(first.update, expected.double())
    resumed = _through_checkpoint(s)
    for t in (s, resumed):  # round 2, ten times larger: the median of 8 norms is (3 + 10) / 2
        second = _aggregate(t, [[10 * v for v in row] for row in CC_ROWS], server_round=2)
        assert second.extra["clip_factor"][0] == pytest.approx(6.5 / 10)
        assert t.norm_history.numel() == 8


# ---- MDA, SMEA, CAF, MoNNA ---------------------------------------------------------------------
def test_mda_and_smea_average_the_tightest_n_minus_f():
    for name in ("mda", "smea"):
        agg = _aggregate(_strategy(name, 5, assumed_malicious=1), [[0.0], [1.0], [2.0], [3.0], [10.0]])
        assert agg.selected.tolist() == [True, True, True, True, False], name
        assert agg.weights.tolist() == pytest.approx([0.25] * 4 + [0]) and float(agg.update) == pytest.approx(1.5)
        assert _strategy(name, 9, assumed_malicious=4).required_replies() == 9


def test_mda_and_smea_refuse_a_federation_whose_subsets_cannot_be_enumerated():
    with pytest.raises(ValueError, match=r"C\(60, 5\) = 5461512 subsets, more than 200000; set a smaller assumed-malicious"):
        _strategy("mda", 60, assumed_malicious=5)
    _strategy("smea", 60, assumed_malicious=2)  # C(60, 2) = 1770


def test_caf_down_weights_the_far_update_to_nothing():
    # c = 1: mean 2, variance 16, tau = (4, 4, 4, 4, 64): c = (15/16 x 4, 0), sum 3.75 > n - 2f = 3;
    # then mean 0, variance 0 (the smallest): kept, and the loop stops
    agg = _aggregate(_strategy("caf", 5, assumed_malicious=1), [[0.0], [0.0], [0.0], [0.0], [10.0]])
    assert agg.weights.tolist() == pytest.approx([0.25] * 4 + [0]) and agg.selected.tolist() == [True] * 4 + [False]
    assert float(agg.update) == 0.0


def test_monna_averages_the_server_update_with_the_hospitals_nearest_to_it():
    s = _strategy("monna", 4, assumed_malicious=1, server_update=lambda state, rnd: torch.tensor([1.0], dtype=torch.float64))
    agg = _aggregate(s, [[0.8], [1.5], [1.1], [9.0]])
    assert agg.extra["distance_to_server_update"] == pytest.approx([0.2, 0.5, 0.1, 8.0])
    assert agg.selected.tolist() == [True, True, True, False] and agg.weights.tolist() == pytest.approx([0.25] * 3 + [0])
    assert float(agg.update) == pytest.approx((1.0 + 0.8 + 1.5 + 1.1) / 4)
    assert s.required_replies() == 2
    with pytest.raises(ValueError, match="server_update"):
        _strategy("monna", 4)


def test_monna_around_is_monna_with_the_trusted_row_stacked_first():
    gen = torch.Generator().manual_seed(5)
    x, trusted = torch.randn(7, 300, generator=gen), torch.randn(300, generator=gen)
    for f in (0, 1, 3):
        out, rec = monna_around(x, trusted, f)
        ref, ref_rec = monna(torch.cat([trusted[None], x]), f, trusted_index=0)
        assert torch.allclose(out, ref, atol=1e-6)
        assert torch.equal(rec.selected, ref_rec.selected[1:]) and torch.allclose(rec.weights, ref_rec.weights[1:])


# ---- the bench and a real run ------------------------------------------------------------------
def test_a_grid_can_name_every_field_rule():
    from hospitrust.bench.grid import parse_grid

    grid = parse_grid({"grid": {"name": "field-rules", "hospitals": 4},
                       "base": {"num-server-rounds": 1, "flame.noise-lambda": 0.01, "dnc.sub-dim": 500},
                       "axes": {"strategy": FIELD_RULES}})
    by_rule = {cell.run_config["strategy"]: cell.run_config for cell in grid.cells}
    assert sorted(by_rule) == FIELD_RULES
    assert by_rule["flame"]["flame.noise-lambda"] == 0.01 and by_rule["dnc"]["dnc.sub-dim"] == 500
    assert "flame.noise-lambda" not in by_rule["dnc"]  # a cell keeps the keys of the rule it selects


def test_every_field_rule_in_a_real_inprocess_run(tmp_path, data_dir):
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.results import read_round_records

    records = {"flame": "clip_factor", "foolsgold": "learning_rate", "dnc": "outlier_score", "signguard": "sign_shares",
               "clipped-clustering": "cluster_label", "monna": "distance_to_server_update"}
    for name in FIELD_RULES:
        # the hospitals' evaluation only (no central test-set pass): the rules' wiring is what is tested
        cfg = small_run_config(tmp_path, **{"strategy": name, "num-server-rounds": 1, "train-subsample": 0.03,
                                            "run-name": name, "checkpoint": False,
                                            "server-data.evaluation": "federated"})
        server_app(InProcessGrid(client_app, 4, cfg),
                   Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
        (round1,) = read_round_records(tmp_path / "runs" / name)
        assert not round1.kept_previous_model, (name, round1.note)
        assert len(round1.clients) == 4 and any(c.selected for c in round1.clients), name
        if name in records:
            assert all(records[name] in flat_entry(c) for c in round1.clients), (name, round1.clients[0])

"""Contribution scoring in real Flower runs: in-process ServerApp + ClientApps, under SecAgg+ too (the deployed
federation's SecAgg+ run: tests/test_deploy.py)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from conftest import flat_entry, small_run_config
from hospitrust.client_app import app as client_app
from hospitrust.config import ConfigError, parse_run_config
from hospitrust.client_app.contribution import STATE_SENT
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.server_app.results import read_round_records, read_summary
from hospitrust.server_app import app as server_app
from hospitrust.strategies.intake import round_context

SCORES = {"loo", "ioi", "fp", "ee", "cos", "fp-published", "ee-published"}


def _run(tmp_path, name, num_nodes=3, **overrides):
    cfg = small_run_config(tmp_path, **{"run-name": name, **overrides})
    grid = InProcessGrid(client_app, num_nodes, cfg)
    received = []  # everything the server is handed back by the hospitals
    pull = grid.pull_messages

    def recording_pull(ids):
        replies = pull(ids)
        received.extend(replies)
        return replies

    grid.pull_messages = recording_pull
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return tmp_path / "runs" / name, grid, received


def test_contribution_strategy_run_scores_every_round_and_weights_by_score(tmp_path, data_dir):
    run_dir, _, _ = _run(tmp_path, "contrib", **{"strategy": "contribution", "contribution-scoring.enabled": True,
                                                 "contribution-scoring.utility": "neg-loss"})
    rounds = read_round_records(run_dir)
    for r in rounds:
        c = r.entries["contribution"]
        assert c["scored"] and set(c["hospitals"]) == {"hospital-0", "hospital-1", "hospital-2"}
        for vals in c["hospitals"].values():
            assert set(vals) == SCORES and all(np.isfinite(v) for v in vals.values())
        # Fair-Private is efficient: it shares out exactly the round's (mean reported) gain
        assert sum(v["fp"] for v in c["hospitals"].values()) == pytest.approx(c["total_gain"], abs=1e-9)  # float64
    # round 1 is FedAvg (no scores yet); round 2 weighs by round 1's clipped positive FP
    first = {c.hospital: c for c in rounds[0].clients}
    n = np.array([first[h].num_examples for h in sorted(first)], dtype=float)
    np.testing.assert_allclose([first[h].weight for h in sorted(first)], n / n.sum())
    fp1 = {h: max(v["fp"], 0.0) for h, v in rounds[0].entries["contribution"]["hospitals"].items()}
    second = {c.hospital: flat_entry(c) for c in rounds[1].clients}  # the rule's signals beside the fields
    if sum(fp1.values()) > 0:
        for h, c in second.items():
            assert c["weight"] == pytest.approx(fp1[h] / sum(fp1.values()))
            assert c["contribution_weighting"] == "fp"
    else:  # no positive score yet (tiny local validation sets): FedAvg again
        n2 = np.array([second[h]["num_examples"] for h in sorted(second)], dtype=float)
        np.testing.assert_allclose([second[h]["weight"] for h in sorted(second)], n2 / n2.sum())
        assert all(c["contribution_weighting"] == "fedavg" for c in second.values())
    summary = read_summary(run_dir)
    totals = summary["contribution"]["totals"]
    for h, t in totals.items():
        assert t["rounds"] == 2
        assert t["fp"] == pytest.approx(sum(r.entries["contribution"]["hospitals"][h]["fp"] for r in rounds))
    with (run_dir / "contribution_ledger.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["hospital"] for r in rows} == set(totals)
    assert sum(float(r["payout_share_fp"]) for r in rows) == pytest.approx(1.0) or all(
        float(r["payout_share_fp"]) == 0 for r in rows)
    assert len(json.loads((run_dir / "contribution_ledger.json").read_text())["rounds"]) == 2


def test_contribution_strategy_weights_by_clipped_positive_scores():
    from types import SimpleNamespace

    from hospitrust.strategies import build_strategy

    strategy = build_strategy("contribution", {1: "a", 2: "b", 3: "c"}, options={"score": "ee"})
    updates = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    n = torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64)
    replies = [SimpleNamespace(node_id=i, metrics={}) for i in (1, 2, 3)]
    # no scores yet: FedAvg
    agg = strategy.aggregate(updates, n, round_context(strategy, 1, replies))
    torch.testing.assert_close(agg.weights, n / n.sum())
    # ee totals 0.3, -0.1, 0.1 -> weights 0.75, 0, 0.25; b is out of the aggregate
    strategy.receive_scores({"a": {"fp": 9.0, "ee": 0.3}, "b": {"fp": 9.0, "ee": -0.1}, "c": {"fp": 9.0, "ee": 0.1}})
    agg = strategy.aggregate(updates, n, round_context(strategy, 2, replies))
    torch.testing.assert_close(agg.weights, torch.tensor([0.75, 0.0, 0.25], dtype=torch.float64))
    torch.testing.assert_close(agg.update, torch.tensor([1.0, 0.25], dtype=torch.float64))
    assert agg.selected.tolist() == [True, False, True] and agg.extra["contribution_weighting"] == ["ee"] * 3
    # nobody positive: FedAvg again
    strategy.receive_scores({h: {"fp": 0.0, "ee": -1.0} for h in "abc"})
    torch.testing.assert_close(strategy.aggregate(updates, n, round_context(strategy, 3, replies)).weights, n / n.sum())
    with pytest.raises(ValueError, match="contribution.score = 'shapley': Input should be 'fp', 'ee', 'fp-published' or 'ee-published'"):
        build_strategy("contribution", {1: "a"}, options={"score": "shapley"})


def test_secagg_server_never_holds_an_update_and_scores_match_plain_fedavg(tmp_path, data_dir):
    common = {"contribution-scoring.enabled": True, "contribution-scoring.utility": "neg-loss", "num-server-rounds": 1}
    plain_dir, _, _ = _run(tmp_path, "plain", **common)
    secure_dir, grid, received = _run(tmp_path, "secure", **{**common, "secagg.enabled": True})

    # the server was never handed a model or an update: every reply's array records are empty
    # (secaggplus_mod clears them; what travels is the masked, quantized vector)
    assert received
    for msg in received:
        if msg.has_content():
            assert all(len(rec) == 0 for rec in msg.content.array_records.values()), msg.metadata.message_type
    # ... although each hospital did train and send a (masked) model different from the aggregate
    final = torch.load(secure_dir / "model.pt")
    for ctx in grid.contexts.values():
        sent = ctx.state[STATE_SENT].to_torch_state_dict()
        assert any(not torch.allclose(sent[k], final[k], atol=1e-4) for k in final)

    secure = read_round_records(secure_dir)[0]
    plain = read_round_records(plain_dir)[0]
    assert all(c.signals["secagg"]["secure_aggregation"] for c in secure.clients)
    assert secure.entries["contribution"]["scored"]
    # the SecAgg+ aggregate is FedAvg up to quantization, and so are FP and EE
    plain_model = torch.load(plain_dir / "model.pt")
    assert max(float((plain_model[k] - final[k]).abs().max()) for k in final) < 1e-3
    for h, vals in plain.entries["contribution"]["hospitals"].items():
        for s in ("fp", "ee", "loo", "ioi"):
            assert secure.entries["contribution"]["hospitals"][h][s] == pytest.approx(vals[s], abs=2e-3), (h, s)


def test_a_selfish_hospital_moves_its_loo_ioi_and_fp_but_not_its_ee(tmp_path, data_dir):
    common = {"contribution-scoring.enabled": True, "contribution-scoring.utility": "neg-loss", "num-server-rounds": 1}
    honest_dir, _, _ = _run(tmp_path, "honest", **common)
    selfish_dir, _, _ = _run(tmp_path, "selfish", **{**common, "contribution-scoring.selfish-hospitals": "0",
                                                     "contribution-scoring.selfish-inflation": 0.1})
    honest = read_round_records(honest_dir)[0].entries["contribution"]["hospitals"]
    selfish = read_round_records(selfish_dir)[0].entries["contribution"]["hospitals"]
    me = "hospital-0"
    assert selfish[me]["loo"] == pytest.approx(honest[me]["loo"] + 0.1, abs=1e-6)
    assert selfish[me]["ioi"] == pytest.approx(honest[me]["ioi"] + 0.1, abs=1e-6)
    # its reports do enter its Fair-Private score (up or down: the residual moves too) ...
    assert selfish[me]["fp"] != pytest.approx(honest[me]["fp"], abs=1e-6)
    # ... which stays efficient: the lie does not change the round's gain being shared
    assert sum(v["fp"] for v in selfish.values()) == pytest.approx(sum(v["fp"] for v in honest.values()), abs=1e-9)  # float64
    assert selfish[me]["ee"] == pytest.approx(honest[me]["ee"], abs=1e-9)  # float64: its own reports never enter it
    for other in ("hospital-1", "hospital-2"):  # its lie lowers the others' EE by exactly its inflation
        assert selfish[other]["ee"] == pytest.approx(honest[other]["ee"] - 0.1, abs=1e-6)


def test_secure_aggregation_config_is_checked():
    with pytest.raises(ConfigError, match="strategy must be 'fedavg'"):
        parse_run_config({"secagg.enabled": True, "strategy": "krum"})
    with pytest.raises(ConfigError, match="fraction-train must be 1.0"):
        parse_run_config({"secagg.enabled": True, "fraction-train": 0.5})
    with pytest.raises(ConfigError, match="weighted-mean strategy"):
        parse_run_config({"contribution-scoring.enabled": True, "strategy": "median"})
    with pytest.raises(ConfigError, match="contribution-scoring.enabled = true"):
        parse_run_config({"strategy": "contribution"})

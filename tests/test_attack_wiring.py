"""Attacks wired into real (in-process) Flower runs: ground truth, the attack's effect, security metrics."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.client_app import app as client_app
from hospitrust.config import parse_node_config, parse_run_config
from hospitrust.server_app.results import read_round_records, read_summary
from hospitrust.server_app import app as server_app
from hospitrust.attacks.threat_model import hospital_attack, is_malicious, malicious_partitions


def _run(tmp_path, reply_filter=None, num_nodes=4, **overrides):
    cfg = small_run_config(tmp_path, **{"train-subsample": 0.05, "batch-size": 64, **overrides})
    grid = InProcessGrid(client_app, num_nodes, cfg, reply_filter=reply_filter)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return tmp_path / "runs" / cfg["run-name"]


def test_malicious_set_is_fixed_by_seed_and_fraction():
    cfg = parse_run_config({**small_run_config(__import__("pathlib").Path("/tmp")), "attack": "sign-flip",
                            "malicious-fraction": 0.3}).threat_model
    bad = malicious_partitions(cfg, 10)
    assert len(bad) == 3 and bad == malicious_partitions(cfg, 10)
    node = parse_node_config({"partition-id": sorted(bad)[0], "num-partitions": 10})
    assert is_malicious(cfg, node) and hospital_attack(cfg, node) is not None
    honest = parse_node_config({"partition-id": next(i for i in range(10) if i not in bad), "num-partitions": 10})
    assert not is_malicious(cfg, honest) and hospital_attack(cfg, honest) is None
    # a red-team SuperNode says so itself
    assert is_malicious(cfg, parse_node_config({"data-path": "/x", "malicious": True}))


def test_update_attack_sign_flip_reaches_the_server(tmp_path, data_dir, monkeypatch):
    import hospitrust.server_app.loop as loop

    logged: list[str] = []

    def keep(level, msg, *args):
        logged.append(msg % args if args else msg)

    monkeypatch.setattr(loop, "log", keep)  # what the terminal shows: the ServerApp's log lines
    seen = {}

    def capture(index, incoming, reply):
        if reply.has_content() and "arrays" in reply.content.array_records:
            g = incoming.content["arrays"].to_torch_state_dict()
            r = reply.content["arrays"].to_torch_state_dict()
            k = "classifier.4.weight"
            seen.setdefault(index, []).append(float(((r[k] - g[k]) * 1).sum()))
            seen.setdefault(("dot", index), []).append((r[k] - g[k]).flatten())
        return reply

    run_dir = _run(tmp_path, reply_filter=capture, **{"attack": "sign-flip", "malicious-hospitals": "0"})
    rounds = read_round_records(run_dir)
    for r in rounds:
        truth = {c.hospital: c.malicious for c in r.clients}
        assert truth == {"hospital-0": True, "hospital-1": False, "hospital-2": False, "hospital-3": False}
        assert "detection" in r.entries
    summary = read_summary(run_dir)
    assert summary["malicious_hospitals"] == ["hospital-0"] and summary["attack"] == "sign-flip"
    assert set(summary["security"]) >= {"tpr", "fpr", "rounds_to_detection", "honest_rare_class_flag_rate"}
    # each round line says whom the rule flagged against the true attacker, the table ends with TPR and FPR
    lines = [line for line in logged if line.startswith("round ") and "/2 " in line]
    assert len(lines) == 2
    for line, r in zip(lines, rounds):
        caught = sum(1 for c in r.clients if c.malicious and (c.rejected or not c.selected or c.flagged))
        assert f"| attackers flagged {caught}/1" in line
        assert ("(missed hospital-0)" in line) == (caught == 0)
    sec = summary["security"]
    final = next(line for line in logged if line.startswith("hospitrust: finished"))
    assert (f"detection over all hospital-rounds: TPR {sec['tpr']:.3f} ({sec['tp']} of {sec['tp'] + sec['fn']} "
            f"attacker replies flagged)  FPR {sec['fpr']:.3f}") in final
    # the flipped update points against the honest ones
    u0, u1 = seen[("dot", 0)][0], seen[("dot", 1)][0]
    assert torch.dot(u0, u1) < 0


def test_backdoor_reports_attack_success_rate(tmp_path, data_dir):
    run_dir = _run(tmp_path, **{"attack": "backdoor", "malicious-hospitals": "0,1", "backdoor.target": 1})
    for r in read_round_records(run_dir):
        asr = r.central["attack_success_rate"]
        assert asr is not None and 0.0 <= asr <= 1.0


def test_colluding_alie_replaces_the_attackers_updates(tmp_path, data_dir):
    run_dir = _run(tmp_path, **{"attack": "alie", "alie.z": 1.5, "malicious-hospitals": "2"})
    rounds = read_round_records(run_dir)
    assert len(rounds) == 2
    assert [c.hospital for r in rounds for c in r.clients if c.malicious] == ["hospital-2", "hospital-2"]


def test_unknown_attack_is_a_config_error():
    from hospitrust.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="unknown attack 'teleport'"):
        parse_run_config({**RunConfig().to_flat(), "attack": "teleport"})


def test_colluding_adversary_rewrites_only_malicious_rows():
    from hospitrust.attacks import ALIE
    from hospitrust.attacks.threat_model import ColludingAdversary

    updates = torch.tensor([[1.0, 2.0], [3.0, 2.0], [100.0, -100.0], [2.0, 5.0]])
    adversary = ColludingAdversary(ALIE(z=1.0), {"c"}, seed=0)
    out = adversary(1, updates, ["a", "b", "c", "d"])
    honest = updates[[0, 1, 3]]
    expected = honest.mean(0) - honest.std(0, unbiased=True)
    assert torch.allclose(out[2], expected)
    assert torch.equal(out[[0, 1, 3]], honest)
    # nobody malicious in this round's replies: unchanged
    assert torch.equal(adversary(1, honest, ["a", "b", "d"]), honest)


def test_data_attacker_reports_the_class_counts_it_trained_on(tmp_path, data_dir):
    """A label flipper (here: a rare-class faker relabelling its class-1 images as class 0)
    reports the counts of its poisoned labels, which the reported-evidence rules see;
    honest hospitals report their own."""
    from hospitrust.datasets import federation

    counts = {}

    def capture(index, incoming, reply):
        if reply.has_content() and "arrays" in reply.content.array_records:  # a train reply
            counts[index] = list(reply.content["metrics"]["class-counts"])
        return reply

    _run(tmp_path, reply_filter=capture, num_nodes=4, **{
        "num-server-rounds": 1, "attack": "label-flip", "label-flip.mode": "source-to-target",
        "label-flip.source": 1, "label-flip.target": 0, "malicious-hospitals": "0"})
    cfg = parse_run_config(small_run_config(tmp_path, **{"train-subsample": 0.05, "batch-size": 64}))
    true = [federation.simulated_hospital(cfg.federation, i, 4).train.class_counts(2) for i in range(4)]
    assert true[0][1] > 0  # the attacker has class-1 images to relabel
    assert counts[0] == [true[0][0] + true[0][1], 0]
    assert [counts[i] for i in (1, 2, 3)] == true[1:]

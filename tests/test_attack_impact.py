"""A whole federated run under attack against the same run without it: 30% label flippers
cost FedAvg balanced accuracy (in-process ServerApp + ClientApps, same seed, same data)."""

from __future__ import annotations

from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.client_app import app as client_app
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.server_app.results import read_round_records, read_summary
from hospitrust.server_app import app as server_app

HOSPITALS = 10


def _final(tmp_path, name: str, **attack) -> tuple[dict, list[dict]]:
    cfg = small_run_config(tmp_path, **{"run-name": name, "num-server-rounds": 3, "train-subsample": 0.5,
                                        "local-epochs": 1, "batch-size": 32, **attack})
    grid = InProcessGrid(client_app, HOSPITALS, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    run_dir = tmp_path / "runs" / name
    return read_summary(run_dir), read_round_records(run_dir)


def test_thirty_percent_label_flippers_cost_fedavg_balanced_accuracy(tmp_path, data_dir):
    clean, _ = _final(tmp_path, "no-attack")
    # pneumonia relabelled 'normal' by 3 of 10 hospitals: a missed diagnosis (the attack matrix's label flip)
    attacked, rounds = _final(tmp_path, "label-flip", **{
        "attack": "label-flip", "label-flip.mode": "source-to-target", "label-flip.source": 1, "label-flip.target": 0,
        "malicious-fraction": 0.3})
    assert len(attacked["malicious_hospitals"]) == 3 and clean["malicious_hospitals"] == []
    assert all(sum(bool(c.malicious) for c in r.clients) == 3 for r in rounds)
    drop = clean["final"]["balanced_accuracy"] - attacked["final"]["balanced_accuracy"]
    print(f"FedAvg balanced accuracy: no attack {clean['final']['balanced_accuracy']:.4f}, "
          f"30% label flippers {attacked['final']['balanced_accuracy']:.4f}, drop {drop:.4f}")
    assert drop > 0.05
    assert attacked["final"]["per_class_recall"][1] < clean["final"]["per_class_recall"][1]
    assert attacked["final"]["attack_success_rate"] > 0.2  # pneumonia images called normal

"""FedAgain, HTA and EARN each in a real in-process run: the signals reach rounds.jsonl."""

from __future__ import annotations

import pytest
from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.client_app import app as client_app
from hospitrust.inprocess import InProcessGrid
from hospitrust.results import read_rounds
from hospitrust.server_app import app as server_app

CASES = {
    "fedagain": ({"fedagain-benchmark": "server", "fedagain-divergence": "cosine"}, ("trust", "divergence", "flagged")),
    "hta": ({}, ("s", "m", "v", "tau", "reputation", "excluded", "exclusion_reason", "flagged")),
    "earn": ({"earn-rare-classes": "0", "earn-base": "fedavg"}, ("evidence", "earn_trust", "row_audit", "rare_row_weight", "evidence_spearman")),
    # EARN on an HTA base: HTA's signals (v from the reference cohort) and EARN's, side by side; s_raw: HTA's direction before EARN's excuse
    "earn-on-hta": ({"strategy": "earn", "earn-rare-classes": "0", "earn-base": "hta"},
                    ("s", "s_raw", "v", "reference_balanced_accuracy", "reputation", "excluded", "earn_trust", "rare_row_weight")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trust_rule_in_a_real_inprocess_run(tmp_path, data_dir, name):
    extra, keys = CASES[name]
    cfg = small_run_config(tmp_path, **{"strategy": name.split("-")[0], "num-server-rounds": 2, "train-subsample": 0.03,
                                        "batch-size": 64, "local-epochs": 1, **extra})
    grid = InProcessGrid(client_app, 5, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    rounds = read_rounds(tmp_path / "runs" / cfg["run-name"])
    assert len(rounds) == 2
    for rec in rounds:
        assert not rec["kept_previous_model"], rec["note"]
        assert len(rec["clients"]) == 5
        for c in rec["clients"]:
            assert not c["rejected"], c["reason"]
            for k in keys:
                assert k in c, (name, k)
        assert sum(c["weight"] for c in rec["clients"]) == pytest.approx(1.0)

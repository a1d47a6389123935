"""FedAgain, HTA and EARN each in a real in-process run: the signals reach rounds.jsonl."""

from __future__ import annotations

import pytest
from flwr.app import Context, RecordDict

from conftest import flat_entry, small_run_config
from hospitrust.client_app import app as client_app
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.server_app.results import read_round_records
from hospitrust.server_app import app as server_app

CASES = {
    "fedagain": ({"fedagain.benchmark": "server", "fedagain.divergence": "cosine"}, ("trust", "divergence", "flagged")),
    "hta": ({}, ("s", "m", "v", "tau", "reputation", "excluded", "exclusion_reason", "flagged", "max_peer_cosine",
                 "duplicate_group_size", "duplicates_of")),
    "earn": ({"earn.rare-classes": "0", "earn.base": "fedavg"}, ("evidence", "earn_trust", "row_audit", "rare_row_weight", "evidence_spearman")),
    # EARN on an HTA base: HTA's signals (v from the reference cohort) and EARN's, side by side; s_raw: HTA's direction before EARN's excuse
    "earn-on-hta": ({"strategy": "earn", "earn.rare-classes": "0", "earn.base": "hta"},
                    ("s", "s_raw", "v", "reference_balanced_accuracy", "reputation", "excluded", "earn_trust", "rare_row_weight")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trust_rule_in_a_real_inprocess_run(tmp_path, data_dir, name):
    extra, keys = CASES[name]
    cfg = small_run_config(tmp_path, **{"strategy": name.split("-")[0], "num-server-rounds": 2, "train-subsample": 0.03,
                                        "batch-size": 64, "local-epochs": 1, **extra})
    grid = InProcessGrid(client_app, 5, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    rounds = read_round_records(tmp_path / "runs" / cfg["run-name"])
    assert len(rounds) == 2
    for rec in rounds:
        assert not rec.kept_previous_model, rec.note
        assert len(rec.clients) == 5
        for c in map(flat_entry, rec.clients):  # the rule's signals beside the common fields
            assert not c["rejected"], c["reason"]
            for k in keys:
                assert k in c, (name, k)
        assert sum(c.weight for c in rec.clients) == pytest.approx(1.0)
    # each rule names its own trust signal (never found by its name): the record says which
    signal = {"fedagain": "trust", "hta": "reputation"}.get(name, "earn_trust")
    assert {rec.trust_signal for rec in rounds} == {signal}


def test_hta_groups_alie_copies_in_a_real_inprocess_run(tmp_path, data_dir):
    """Hospitals 3 and 4 send ALIE's one crafted update: HTA counts them as one voice and flags
    them in every round, the honest three are never grouped, and summary.json names the pair."""
    from hospitrust.server_app.results import read_summary

    cfg = small_run_config(tmp_path, **{"strategy": "hta", "num-server-rounds": 2, "train-subsample": 0.03,
                                        "batch-size": 64, "local-epochs": 1, "attack": "alie",
                                        "malicious-hospitals": "3,4"})
    grid = InProcessGrid(client_app, 5, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    run = tmp_path / "runs" / cfg["run-name"]
    bad = set()
    for rec in read_round_records(run):
        by = {c.hospital: flat_entry(c) for c in rec.clients}
        bad = {h for h, c in by.items() if c["malicious"]}
        assert len(bad) == 2
        for h, c in by.items():
            assert (c["duplicate_group_size"] == 2) == (h in bad), (h, c["max_peer_cosine"])
            assert c["flagged"] or h not in bad
        a, b = sorted(bad)
        assert by[a]["duplicates_of"] == [b] and by[a]["max_peer_cosine"] == pytest.approx(1.0)
        # w ~ reputation x examples / group size: each of the pair at half its own say
        per_say = {h: c["weight"] * c["duplicate_group_size"] / (c["reputation"] * c["num_examples"])
                   for h, c in by.items() if not c["excluded"] and c["reputation"] > 0}
        assert len(set(round(v, 9) for v in per_say.values())) == 1, per_say
    a, b = sorted(bad)
    assert read_summary(run)["near_duplicates"] == {a: {"rounds": 2, "with": [b]}, b: {"rounds": 2, "with": [a]}}

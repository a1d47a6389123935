"""Detection bookkeeping against ground truth, on hand-made rounds."""

from __future__ import annotations

import math

from hospitrust.records import HospitalRecord
from hospitrust.server_app.records import flagged_hospitals, rare_class_holders, run_security


def test_flagged_means_rejected_or_left_out_or_said_so():
    clients = [
        HospitalRecord("a", rejected=True, selected=False, weight=0.0),
        HospitalRecord("b", rejected=False, selected=False, weight=0.0),
        HospitalRecord("c", rejected=False, selected=True, weight=0.01),  # small, not suspected
        HospitalRecord("d", rejected=False, selected=True, weight=0.3, flagged=True),
        HospitalRecord("e", rejected=False, selected=False, flagged=False),  # the rule's own word counts
    ]
    assert flagged_hospitals(clients) == {"a": True, "b": True, "c": False, "d": True, "e": False}


def test_rare_class_holders():
    rows = [{"hospital": "h0", "train": [50, 9]}, {"hospital": "h1", "train": [50, 1]}, {"hospital": "h2", "train": [50, 0]}]
    rare, holders = rare_class_holders(rows)
    assert rare == 1 and holders == {"h0"}  # 10 / 3 = 3.3 is the fair share of class 1


def test_run_security_pools_rounds():
    truth = {"m": True, "h0": False, "h1": False}
    rounds = [{"m": False, "h0": True, "h1": False}, {"m": True, "h0": False, "h1": False}]
    sec = run_security(rounds, truth, rare_holders={"h0"})
    assert (sec["tp"], sec["fn"], sec["fp"], sec["tn"]) == (1, 1, 1, 3)
    assert sec["tpr"] == 0.5 and sec["fpr"] == 0.25 and sec["precision"] == 0.5
    assert sec["rounds_to_detection"] == {"m": 2}
    assert sec["honest_rare_class_holders"] == ["h0"] and sec["honest_rare_class_flag_rate"] == 0.5
    empty = run_security(rounds, {"m": False, "h0": False, "h1": False}, set())
    assert math.isnan(empty["tpr"]) and math.isnan(empty["honest_rare_class_flag_rate"])

"""The HTA authors' findings recomputed from grid cells: hand-computed paired differences."""

from __future__ import annotations

import pandas as pd
import pytest

from hospitrust.bench.findings import hta_findings


def _cell(strategy, partitioner, attack, value, alpha=0.1, seed=1, dataset="pneumoniamnist"):
    return {"dataset": dataset, "strategy": strategy, "partitioner": partitioner, "dirichlet.alpha": alpha,
            "attack": attack, "malicious-fraction": 0.0 if attack == "none" else 0.3, "seed": seed,
            "final_balanced_accuracy": value}


def _cells():
    rows = []
    clean = {("fedavg", "iid"): 0.80, ("fedavg", "dirichlet"): 0.60, ("hta", "iid"): 0.84,
             ("hta", "dirichlet"): 0.70, ("multi-krum", "iid"): 0.82, ("multi-krum", "dirichlet"): 0.50}
    for (strategy, part), v in clean.items():
        rows.append(_cell(strategy, part, "none", v))
    attacked = {("hta", "iid", "sign-flip"): 0.70, ("multi-krum", "iid", "sign-flip"): 0.75,
                ("hta", "iid", "scaling"): 0.80, ("multi-krum", "iid", "scaling"): 0.78}
    for (strategy, part, attack), v in attacked.items():
        rows.append(_cell(strategy, part, attack, v))
    rows.append(_cell("fedavg", "dirichlet", "none", 0.1, alpha=0.5))  # another regime: not in these pairs
    return pd.DataFrame(rows)


def test_findings_are_means_of_hand_computed_pairs():
    table = hta_findings(_cells()).set_index("finding")
    ours = table["ours (points)"]
    # iid - dir0.1 per rule: 20, 14, 32 -> 22.0
    assert ours["heterogeneity cost"] == pytest.approx(22.0)
    assert table.loc["heterogeneity cost", "pairs"] == 3
    # clean - attacked on (rule, regime): hta 84-70, 84-80; mk 82-75, 82-78 -> (14 + 4 + 7 + 4) / 4
    assert ours["attacker cost"] == pytest.approx(7.2, abs=0.05)
    # clean gains over FedAvg per regime: hta 4, 10 -> 7; mk 2, -10 -> -4
    assert ours["HTA clean gain over FedAvg"] == pytest.approx(7.0)
    assert ours["Multi-Krum clean gain over FedAvg"] == pytest.approx(-4.0)
    assert ours["HTA minus Multi-Krum, sign flip"] == pytest.approx(-5.0)
    assert ours["HTA minus Multi-Krum, scaling"] == pytest.approx(2.0)
    assert table.loc["HTA minus Multi-Krum, scaling", "HTA authors (points)"] == -6.7


def test_findings_are_per_dataset_and_skip_what_cannot_be_paired():
    other = _cells().assign(dataset="retinamnist")
    other = other[other["attack"] == "none"]  # no attacked cells there
    table = hta_findings(pd.concat([_cells(), other]))
    retina = table[table["dataset"] == "retinamnist"]
    assert set(retina["finding"]) == {"heterogeneity cost", "HTA clean gain over FedAvg",
                                      "Multi-Krum clean gain over FedAvg"}
    assert hta_findings(pd.DataFrame()).empty

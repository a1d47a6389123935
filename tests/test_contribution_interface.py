"""The narrow interface: scoring can only ever see aggregates and hospitals' reported scalars.

Three layers of proof: (1) the view's types hold scalars only and refuse anything else;
(2) the scoring modules import no tensor library and read no array record (source check);
(3) scores are a function of the reported scalars alone, and a hospital's counterfactual
models are exactly the coalition models the ground truth uses.
The run-level proof (a SecAgg+ run where the server receives no individual update) is in
test_contribution_wiring.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hospitrust.client_app import contribution as contribution_client
from hospitrust.contribution.interface import ContributionLedger, HospitalReport, SecureRoundView, score_round
from hospitrust.contribution.federation import ContributionTracker, parse_report
from hospitrust.records import RoundRecord
from hospitrust.contribution.scores import coalition_weights

PKG = Path(__file__).resolve().parent.parent / "hospitrust" / "contribution"


def _report(name, v_new=0.8, v_prev=0.6, without=0.7, alone=0.75, cos=0.5, w=0.5):
    return HospitalReport(hospital=name, v_new=v_new, v_previous=v_prev, v_without_self=without, v_self_only=alone,
                          cosine=cos, weight=w)


def test_the_view_has_only_scalar_fields():
    assert [f.name for f in dataclasses.fields(HospitalReport)] == [
        "hospital", "v_new", "v_previous", "v_without_self", "v_self_only", "cosine", "weight"]
    assert [f.name for f in dataclasses.fields(SecureRoundView)] == [
        "round", "total_weight", "reports", "server_v_new", "server_v_previous"]
    view = SecureRoundView(round=1, total_weight=1.0, reports=(_report("a"), _report("b")))
    for r in view.reports:
        for f in dataclasses.fields(r):
            assert isinstance(getattr(r, f.name), (str, float))


@pytest.mark.parametrize("bad", [torch.zeros(3), np.zeros(3), [0.1, 0.2], {"u": 1.0}, None, float("nan"), True])
def test_anything_but_a_finite_scalar_is_refused(bad):
    with pytest.raises((TypeError, ValueError)):
        _report("a", without=bad)


def test_the_view_refuses_foreign_objects_and_duplicates():
    with pytest.raises(TypeError, match="HospitalReport"):
        SecureRoundView(round=1, total_weight=1.0, reports=({"hospital": "a"},))
    with pytest.raises(ValueError, match="twice"):
        SecureRoundView(round=1, total_weight=1.0, reports=(_report("a"), _report("a")))
    with pytest.raises(TypeError):
        SecureRoundView(round=1, total_weight=torch.ones(2), reports=())
    with pytest.raises(TypeError):
        SecureRoundView(round=1, total_weight=1.0, reports=(), updates=torch.zeros(2, 3))  # no such slot
    with pytest.raises(TypeError, match="SecureRoundView"):
        score_round({"reports": []})
    with pytest.raises(ValueError, match="weight"):
        _report("a", w=0.0)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_scoring_code_imports_no_tensor_library_and_reads_no_array_record():
    for name in ("scores.py", "interface.py", "federation.py"):
        mods = _imports(PKG / name)
        assert not any(m == "torch" or m.startswith("torch.") for m in mods), name
        # nor the hospital-side module (which holds updates)
        assert "hospitrust.client_app.contribution" not in mods, name
        assert not any(m.startswith("hospitrust.strategies") or m.startswith("hospitrust.aggregation") for m in mods), name
    fed = (PKG / "federation.py").read_text()
    tree = ast.parse(fed)
    # replies are only ever read through their metric records (and metadata/error)
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "array_records" not in attrs and "to_torch_state_dict" not in attrs and "to_numpy_ndarrays" not in attrs
    # the only array record touched is the outgoing evaluate message's global model, passed through as-is
    subscripts = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Subscript)]
    assert [s for s in subscripts if "arrays" in s] == ["m.content['arrays']"]


def test_scores_depend_on_the_reported_scalars_only():
    reports = (_report("a", 0.8, 0.6, 0.7, 0.75, 0.9, 0.5), _report("b", 0.82, 0.61, 0.78, 0.62, 0.1, 0.3),
               _report("c", 0.79, 0.58, 0.80, 0.55, -0.4, 0.2))
    s1 = score_round(SecureRoundView(round=3, total_weight=1.0, reports=reports))
    s2 = score_round(SecureRoundView(round=3, total_weight=1.0, reports=tuple(dataclasses.replace(r) for r in reports)))
    assert s1.scores == s2.scores
    # hand check: LOO = v_new - v_without, IOI = v_alone - v_prev, FP sums to the mean gain
    np.testing.assert_allclose(s1.scores["loo"], [0.1, 0.04, -0.01], atol=1e-12)  # float64
    np.testing.assert_allclose(s1.scores["ioi"], [0.15, 0.01, -0.03], atol=1e-12)  # float64
    assert sum(s1.scores["fp"]) == pytest.approx(np.mean([0.2, 0.21, 0.21]))
    # EE of "a" from b's and c's reports only: mean gain (0.21, 0.21) minus their midpoints
    # m_b = (0.04 + 0.01) / 2 = 0.025, m_c = (-0.01 - 0.03) / 2 = -0.02
    assert s1.scores["ee"][0] == pytest.approx(0.21 - 0.005)


def test_counterfactual_models_are_the_coalition_models():
    # 3 hospitals, FedAvg weights; hospital 1 rebuilds M - U_1 and M0 + U_1 from M0, its own sent model and M
    g = torch.Generator().manual_seed(0)
    m0 = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    sent = [{k: v + torch.randn(v.shape, generator=g) for k, v in m0.items()} for _ in range(3)]
    w = np.array([0.5, 0.3, 0.2])
    new = {k: m0[k] + sum(float(w[i]) * (sent[i][k] - m0[k]) for i in range(3)) for k in m0}
    without, alone = contribution_client.counterfactual_states(m0, sent[1], new, float(w[1]))
    cw = coalition_weights(w, 0b101)  # coalition {0, 2}
    expected = {k: m0[k] + sum(float(cw[i]) * (sent[i][k] - m0[k]) for i in range(3)) for k in m0}
    for k in m0:
        torch.testing.assert_close(without[k], expected[k])
        torch.testing.assert_close(alone[k], sent[1][k])
    # alone in the round: leaving itself out leaves M0
    without, _ = contribution_client.counterfactual_states(m0, sent[0], sent[0], 1.0)
    for k in m0:
        torch.testing.assert_close(without[k], m0[k])


def test_selfish_inflation_raises_loo_and_ioi_by_the_amount():
    honest = {"v_new": 0.8, "v_previous": 0.6, "v_without_self": 0.7, "v_self_only": 0.65, "cosine": 0.1, "weight": 0.5}
    lied = contribution_client.inflate(honest, 0.05)
    assert lied["v_new"] - lied["v_without_self"] == pytest.approx(0.15)
    assert lied["v_self_only"] - lied["v_previous"] == pytest.approx(0.10)


def test_parse_report_names_what_is_wrong():
    from hospitrust.contribution.interface import REPORT_KEYS

    good = {key: 0.5 for key in REPORT_KEYS.values()}
    assert parse_report("h", good, 0.5).v_new == 0.5
    with pytest.raises(ValueError, match="missing contribution-cosine"):
        parse_report("h", {k: v for k, v in good.items() if k != "contribution-cosine"}, 0.5)
    with pytest.raises(ValueError, match="the server sent 0.25"):
        parse_report("h", good, 0.25)
    with pytest.raises(ValueError, match="finite"):
        parse_report("h", {**good, "contribution-v-new": float("inf")}, 0.5)


def test_ledger_totals_payouts_and_files(tmp_path):
    ledger = ContributionLedger()
    for rnd, gain in ((1, 0.1), (2, 0.05)):
        reps = (_report("a", 0.8, 0.8 - gain, 0.7, 0.85, 0.5, 0.6), _report("b", 0.8, 0.8 - gain, 0.8, 0.6, 0.5, 0.4))
        ledger.add(score_round(SecureRoundView(round=rnd, total_weight=1.0, reports=reps)))
    totals = ledger.totals()
    assert totals["a"]["rounds"] == 2 and totals["a"]["fp"] + totals["b"]["fp"] == pytest.approx(0.15)
    shares = ledger.payout_shares("fp")
    assert sum(shares.values()) == pytest.approx(1.0) and shares["a"] > shares["b"]
    csv_path, json_path = ledger.write(tmp_path)
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("hospital,rounds,loo,ioi,fp,ee,cos") and len(lines) == 3
    data = json.loads(json_path.read_text())
    assert len(data["rounds"]) == 2 and {r["hospital"] for r in data["totals"]} == {"a", "b"}
    with pytest.raises(ValueError, match="unknown score"):
        ledger.payout_shares("shapley")
    # a resumed run rebuilds the same ledger from rounds.jsonl records
    tracker = ContributionTracker({1: "a", 2: "b"})
    tracker.restore([RoundRecord(number=r.round, entries={"contribution": {"scored": True, **r.to_record()}})
                     for r in ledger.rounds])
    assert tracker.ledger.totals() == totals

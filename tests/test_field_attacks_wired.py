"""The field's attacks (issue 34) as selectable components: each one through its registry name and
options (build_attack, then craft_round / poison), with hand-computed cases or the constraint it claims;
the round-aware adversary's rule in the loop (a private copy: the run's rule is never changed); a grid
naming every new attack; and one in-process run of each new attack (1 round, tiny budget)."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hospitrust.aggregation import coordinate_median, trimmed_mean
from hospitrust.aggregation.pre_aggregation import nnm
from hospitrust.attacks.interfaces import RoundView
from hospitrust.attacks.math import data as D
from hospitrust.attacks.math import tailored as TA
from hospitrust.attacks.registry import ATTACKS, AttackError, build_attack
from hospitrust.features.adversary import RoundAwareAdversary, private_copy
from hospitrust.strategies.hta import HTA
from hospitrust.strategies.krum import Krum
from hospitrust.strategies.registry import strategy_class
from hospitrust.strategies.validation import CheckedReply
from hospitrust.strategies.intake import round_context

NEW = ("tailored-alie", "tailored-ipm", "agr-tailored", "neurotoxin", "dba", "hta-aware", "earn-aware", "fltrust-aware",
       "anchored-trust-aware")
T = functools.partial(torch.tensor, dtype=torch.float64)


def _honest(seed=0, n=6, d=8):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5


def _built(name, **options):
    cls = ATTACKS[name]
    return build_attack(name, {name: cls.Options(**options)})


def _view(honest, malicious=(0,), **kw):
    n = honest.shape[0] + len(malicious)
    rows = sorted(malicious)
    updates = torch.zeros(n, honest.shape[1], dtype=honest.dtype)
    updates[[i for i in range(n) if i not in rows]] = honest
    return RoundView(1, updates, [f"h{i}" for i in range(n)], rows, **kw)


def _replies(n, examples=10):
    return [CheckedReply(i + 1, {}, None, examples, {}) for i in range(n)]


def test_every_new_attack_is_registered_with_its_kind_and_section():
    kinds = {name: ATTACKS[name].kind for name in NEW}
    assert kinds == {"tailored-alie": "colluding", "tailored-ipm": "colluding", "agr-tailored": "colluding",
                     "neurotoxin": "data", "dba": "data", "hta-aware": "colluding", "earn-aware": "colluding",
                     "fltrust-aware": "colluding", "anchored-trust-aware": "colluding"}
    from hospitrust.config import parse_run_config
    from conftest import small_run_config

    cfg = parse_run_config({**small_run_config(Path("/tmp")), "attack": "neurotoxin", "neurotoxin.top-fraction": 0.3,
                            "malicious-hospitals": "0"})
    assert cfg.options("neurotoxin").top_fraction == 0.3
    # a round-aware attack cannot be a sybil base (it needs the round, not a stack alone)
    with pytest.raises(AttackError, match="sybil.base must be"):
        build_attack("sybil", {"sybil": ATTACKS["sybil"].Options(base="tailored-alie")})


def test_a_grid_names_every_new_attack():
    from hospitrust.bench import parse_grid

    grid = parse_grid({"grid": {"name": "t", "hospitals": 4}, "base": {"num-server-rounds": 1, "malicious-fraction": 0.25},
                       "axes": {"attack": list(NEW), "strategy": ["median"]},
                       "when": [{"if": {"attack": "hta-aware"}, "set": {"strategy": "hta"}},
                                {"if": {"attack": "earn-aware"}, "set": {"strategy": "earn"}},
                                {"if": {"attack": "fltrust-aware"}, "set": {"strategy": "fltrust"}},
                                {"if": {"attack": "anchored-trust-aware"}, "set": {"strategy": "anchored-trust"}}]})
    assert sorted(c.run_config["attack"] for c in grid.cells) == sorted(NEW)


# ------------------------------------------------------------------ rule-tailored
@pytest.mark.parametrize("name, math_fn, key", [("tailored-alie", TA.tailored_alie, "z"),
                                                ("tailored-ipm", TA.tailored_ipm, "eps")])
def test_tailored_attacks_search_against_the_rule_in_the_view(name, math_fn, key):
    honest = _honest()
    rule = functools.partial(trimmed_mean, f=2)
    attack = _built(name, evals=9, step=2.0)
    rows, info = attack.craft_round(_view(honest, malicious=(1, 4), rule=rule))
    expected, found = math_fn(honest, rule, 2, step=2.0, evals=9, both_directions=True)  # the option's default
    assert rows.shape == (2, 8) and torch.equal(rows[0], rows[1])
    torch.testing.assert_close(rows[0], expected)
    assert info == {key: found["strength"], "distance": found["distance"],
                    "norm": float(torch.linalg.vector_norm(rows[0].double()))}
    # the search starts at strength 0 (the honest mean itself): it never ends worse than that
    at_zero = float(torch.linalg.vector_norm(rule(torch.cat([honest, honest.mean(0).expand(2, -1)])) - honest.mean(0)))
    assert info["distance"] >= at_zero
    with pytest.raises(TypeError, match="needs the run's rule"):
        attack.craft(honest, 2, server_round=1)


def _hta(names, **options):
    return HTA({i + 1: n for i, n in enumerate(names)}, {"validation_exponent": 0.0, **options})


def _step_with_rule(feature, strategy, updates, names, server_round):
    feature.wrap_strategy(strategy)
    feature._checked = lambda hospitals: _replies(len(hospitals))  # what the rule reads of the replies
    return feature.step(server_round, updates, names)


def test_the_rule_in_the_loop_is_a_private_copy_hta_state_untouched():
    names = [f"h{i}" for i in range(6)]
    hta = _hta(names)
    hta.global_state = {"w": torch.zeros(8)}
    honest = _honest(n=6)
    ne = torch.full((6,), 10.0, dtype=torch.float64)
    hta.aggregate(honest, ne, round_context(hta, 1, _replies(6)))  # a round of history: reputations to keep
    before = copy.deepcopy(hta.state_dict())
    feature = RoundAwareAdversary(build_attack("tailored-alie"), {"h2"}, seed=0)
    out = _step_with_rule(feature, hta, honest.clone(), names, 2)
    assert hta.state_dict()["ema"] == before["ema"] and hta.state_dict()["var"] == before["var"]
    assert hta.state_dict()["reputation"] == before["reputation"] and hta.rng.getstate() == before["rng"]
    assert torch.equal(out[[0, 1, 3, 4, 5]], honest[[0, 1, 3, 4, 5]]) and not torch.equal(out[2], honest[2])
    record = feature.record(SimpleNamespace(number=2))["adversary"]
    assert record["attack"] == "tailored-alie" and record["active"] and record["z"] != 0
    # the copy aggregates exactly as the rule itself then does on the same stack
    copy_result = private_copy(hta).aggregate(out, ne, round_context(hta, 2, _replies(6)))
    real = hta.aggregate(out, ne, round_context(hta, 2, _replies(6)))
    torch.testing.assert_close(copy_result.update, real.update)


def test_the_pre_aggregation_chain_is_in_the_loop():
    names = [f"h{i}" for i in range(6)]
    from hospitrust.strategies.median import Median

    median = Median({i + 1: n for i, n in enumerate(names)})
    median.global_state = {"w": torch.zeros(8)}
    chain = SimpleNamespace(steps=("nnm",), apply=lambda r, x: SimpleNamespace(rows=nnm(x, 1)[0]))
    feature = RoundAwareAdversary(build_attack("tailored-ipm"), {"h0"}, seed=0, pre_aggregation=chain)
    feature.wrap_strategy(median)
    feature._checked = lambda hospitals: _replies(len(hospitals))
    stack = _honest(n=6)
    evaluate = feature.evaluator(1, names)
    torch.testing.assert_close(evaluate(stack).update, coordinate_median(nnm(stack, 1)[0]))


def test_agr_tailored_on_krum_uses_the_rules_own_selection():
    honest = _honest(n=6, d=10)
    names = [f"h{i}" for i in range(7)]
    krum = Krum({i + 1: n for i, n in enumerate(names)}, assumed_malicious=1)
    ne = torch.full((7,), 10.0, dtype=torch.float64)

    def aggregate(x):
        return krum.aggregate(x, ne, round_context(krum, 1, _replies(7)))

    view = _view(honest, malicious=(3,), rule=lambda x: aggregate(x).update, aggregate=aggregate, strategy=lambda: krum)
    rows, info = _built("agr-tailored", perturbation="unit").craft_round(view)
    expected, found = TA.agr_tailored_krum(honest, 1, 1, "unit")
    torch.testing.assert_close(rows[0], expected)
    assert info["gamma"] == found["gamma"] > 0 and info["rule"] == "krum"
    assert bool(aggregate(view.with_rows(rows)).selected[3])  # Krum picks the malicious row
    # twice that gamma is past the edge the search found: Krum no longer picks it
    far = honest.mean(0) + 2 * info["gamma"] * (-honest.mean(0) / honest.mean(0).norm())
    assert not bool(aggregate(view.with_rows(far.unsqueeze(0))).selected[3])


def test_agr_tailored_on_the_median_and_its_refusals():
    honest = _honest(n=7)
    median_rule = type("Median", (), {"name": "median", "agr_tailored": "distance"})()
    rows, info = _built("agr-tailored").craft_round(_view(honest, malicious=(0, 1), rule=coordinate_median,
                                                         strategy=lambda: median_rule))
    expected, found = TA.agr_tailored_median(honest, 2, "unit")
    torch.testing.assert_close(rows[0], expected)
    assert info["gamma"] == found["gamma"]
    attack = build_attack("agr-tailored")
    rules = {name: strategy_class(name) for name in ("fedavg", "krum", "multi-krum", "bulyan", "median", "trimmed-mean")}
    with pytest.raises(ValueError, match="defined for the rules tagged agr_tailored .*not for strategy 'fedavg'.*'min-max' "
                                         "or 'min-sum'"):
        attack.check_rule(rules["fedavg"])
    with pytest.raises(ValueError, match="pre-aggregation chain 'nnm'.*tailored-alie"):
        attack.check_rule(rules["krum"], ("nnm",))
    # a run is refused before its first round, the message listing the registry's tagged rules
    from conftest import small_run_config

    from hospitrust.config import parse_run_config

    cfg = parse_run_config({**small_run_config(Path("/tmp")), "strategy": "fedavg", "attack": "agr-tailored"})
    with pytest.raises(ValueError, match="defined for the rules bulyan, krum, median, multi-krum, trimmed-mean "):
        RoundAwareAdversary.for_run(SimpleNamespace(attack=attack, cfg=cfg, truth={}))
    # the rule's tag, not its name: Krum inherits Multi-Krum's
    assert [attack.check_rule(rules[n]) for n in ("krum", "multi-krum", "bulyan", "median", "trimmed-mean")] == [
        "selection", "selection", "selection", "distance", "distance"]


# ------------------------------------------------------------------ backdoors
def test_neurotoxin_projects_each_attackers_own_update_by_hand():
    honest = T([[3.0, 0.1, -2.0, 0.5], [3.0, 0.1, -2.0, 0.5]])
    view = _view(honest, malicious=(0, 3))
    view.updates[0] = T([1.0, 2.0, 3.0, 4.0])
    view.updates[3] = T([-1.0, -2.0, -3.0, -4.0])
    attack = _built("neurotoxin", top_fraction=0.5, mask_from="honest-updates")
    rows, info = attack.craft_round(view)
    # |honest mean| = (3, 0.1, 2, 0.5): the top half (coordinates 0 and 2) is left to the honest hospitals
    torch.testing.assert_close(rows, T([[0.0, 2.0, 0.0, 4.0], [0.0, -2.0, 0.0, -4.0]]))
    assert info["coordinates_kept"] == 2
    # the paper's estimate: the previous global update; none in round 1, so nothing is projected then
    paper = _built("neurotoxin", top_fraction=0.25)
    assert paper.needs_previous_global_update()
    rows, info = paper.craft_round(view)
    assert torch.equal(rows, view.updates[[0, 3]]) and info["projected"] is False
    view.previous_global_update = T([0.0, 0.0, 0.0, 9.0])
    rows, _ = paper.craft_round(view)
    torch.testing.assert_close(rows[0], T([1.0, 2.0, 3.0, 0.0]))
    # the data side is the backdoor's (same draws, same trigger)
    images = np.random.default_rng(1).integers(0, 200, size=(10, 6, 6, 1), dtype=np.uint8)
    labels = np.arange(10) % 2
    got = paper.poison(images, labels, rng=np.random.default_rng(3), num_classes=2)
    want = build_attack("backdoor").poison(images, labels, rng=np.random.default_rng(3), num_classes=2)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_dba_each_malicious_hospital_stamps_its_stripe_and_the_test_gets_the_whole_trigger():
    from hospitrust.attacks.threat_model import ThreatModel, hospital_attack, unwrapped
    from hospitrust.config import parse_node_config

    threat = ThreatModel("dba", {"dba": ATTACKS["dba"].Options(poison_fraction=1.0, patch_size=3)},
                         malicious_hospitals="1,3")
    parts = []
    for pid in (1, 3):
        attack = unwrapped(hospital_attack(threat, parse_node_config({"partition-id": pid, "num-partitions": 4})))
        parts.append((attack.part, attack.of))
    assert parts == [(0, 2), (1, 2)]  # 2 colluders: the 3 trigger rows cut into [0, 1) and [1, 3)
    images = np.zeros((4, 6, 6, 1), dtype=np.uint8)
    labels = np.array([1, 1, 0, 1])
    out, out_labels = attack.poison(images, labels, rng=np.random.default_rng(0), num_classes=2)
    assert (out_labels == 0).all()
    assert (out[:, 4:6, 3:6, 0] == 255).all() and (out[:, 3, :, 0] == 0).all() and out.sum() == 4 * 6 * 255
    whole = attack.trigger(images)
    assert (whole[:, 3:6, 3:6, 0] == 255).all() and whole.sum() == 4 * 9 * 255
    assert np.array_equal(whole, D.apply_trigger(images, 3))
    with pytest.raises(ValueError, match="more stripes than its dba.patch-size = 3"):
        ATTACKS["dba"].Options(parts=4)


# ------------------------------------------------------------------ defence-aware
def test_hta_aware_stays_inside_the_dual_mad_band():
    names = [f"h{i}" for i in range(8)]
    hta = _hta(names)
    hta.global_state = {"w": torch.zeros(12)}
    ne = torch.full((8,), 10.0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(12, generator=gen, dtype=torch.float64)
    for r in (1, 2):  # two honest rounds: every hospital builds its reputation
        hta.aggregate(base + 0.3 * torch.randn(8, 12, generator=gen, dtype=torch.float64), ne, round_context(hta, r, _replies(8)))
    stack = base + 0.3 * torch.randn(8, 12, generator=gen, dtype=torch.float64)
    malicious = [1, 6]

    def aggregate(x):
        return private_copy(hta).aggregate(x, ne, round_context(hta, 3, _replies(8)))

    view = RoundView(3, stack, names, malicious, rule=lambda x: aggregate(x).update, aggregate=aggregate,
                     strategy=lambda: private_copy(hta), generator=torch.Generator().manual_seed(0))
    rows, info = _built("hta-aware", spread=0.5).craft_round(view)
    assert all(info["feasible"]) and all(0 <= c < 1 for c in info["cosine"])
    result = aggregate(view.with_rows(rows))
    assert not any(result.extra["excluded"][i] for i in malicious)
    assert not any(result.extra["duplicate_group_size"][i] > 1 for i in malicious)  # the copies differ
    honest_mean = stack[[i for i in range(8) if i not in malicious]].mean(0)
    assert all(float(rows[k] @ honest_mean) < float(stack[i] @ honest_mean) for k, i in enumerate(malicious))
    with pytest.raises(ValueError, match="written against the rule hta"):
        _built("hta-aware").craft_round(RoundView(3, stack, names, malicious, strategy=lambda: Krum({1: "a"})))


def test_fltrust_aware_by_hand():
    honest = T([[0.0, 2.0, 0.0], [0.0, 4.0, 0.0]])
    view = _view(honest, malicious=(0,))
    view.updates[0] = T([3.0, 0.0, 0.0])
    rows, info = _built("fltrust-aware", cosine=0.1).craft_round(view)
    # c r + sqrt(1 - c^2) t, scaled to |own| = 3: r = e1 (its own update), t = -e2 (against the honest mean)
    torch.testing.assert_close(rows[0], T([0.3, -3.0 * math.sqrt(0.99), 0.0]))
    assert info == {"cosine": 0.1}
    # its own update zero (a colluder whose round moved nothing: Dirichlet 0.1, seed 41, which crashed the run): the
    # honest mean (0, 3, 0) is its root estimate; minus that mean is parallel to it, so it turns towards the
    # honest rows' spread instead, at cosine 0.1 to the estimate, scaled to its norm 3
    zero_own = _view(T([[1.0, 2.0, 0.0], [-1.0, 4.0, 0.0]]), malicious=(0,))
    rows, _ = _built("fltrust-aware", cosine=0.1).craft_round(zero_own)
    assert float(torch.linalg.vector_norm(rows[0])) == pytest.approx(3.0)
    assert float(rows[0] @ T([0.0, 1.0, 0.0])) / 3.0 == pytest.approx(0.1)
    # nothing at all to go on (every update zero): it sends zero rather than ending the run
    rows, _ = _built("fltrust-aware", cosine=0.1).craft_round(_view(torch.zeros(2, 3, dtype=torch.float64)))
    assert torch.equal(rows[0], torch.zeros(3, dtype=torch.float64))


class _EarnStandIn:
    """The parts of EARN the attack reads: its name, options and global model (no reference cohort)."""

    name = "earn"

    def __init__(self, threshold):
        self.options = SimpleNamespace(agree_threshold=threshold, audit_by="row")
        self.head_features = None
        self.global_state = {"fc.weight": T([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]), "fc.bias": T([0.0, 0.0])}


def test_earn_aware_pushes_only_the_rare_row_and_keeps_earns_checks():
    # (w_0 (3), w_1 (3), b_0, b_1): class 1 has one honest holder (positive bias update), class 0 three
    honest = T([[0.1, 0.2, 0.0, 0.5, 0.4, 0.3, 0.2, 0.3],
                [0.2, 0.1, 0.1, 0.0, 0.1, 0.0, 0.3, -0.1],
                [0.1, 0.0, 0.2, 0.1, 0.0, 0.1, 0.1, -0.2]])
    view = _view(honest, malicious=(0,), strategy=lambda: _EarnStandIn(0.3))
    own = T([0.0, 0.1, 0.1, 0.2, 0.2, 0.2, 0.1, 0.05])
    view.updates[0] = own
    rows, info = _built("earn-aware").craft_round(view)
    assert info["class"] == 1 and info["feasible"] == [True]
    changed = torch.nonzero(rows[0] != own).flatten().tolist()
    assert set(changed) <= {3, 4, 5, 7}  # class 1's weight row and bias only
    row = torch.cat([rows[0][3:6], rows[0][7:8]])
    peer = torch.cat([honest[0][3:6], honest[0][7:8]])  # the one holder's row is the peers' median
    cos = float(row @ peer / (row.norm() * peer.norm()))
    assert 0.3 <= cos < 0.99 and float(row[-1]) > 0
    torch.testing.assert_close(row.norm(), torch.cat([own[3:6], own[7:8]]).norm())
    # pushed towards minus the global row of class 1 (0, 1, 1): that row's logit falls
    assert float(row[:3] @ T([0.0, 1.0, 1.0])) < float(peer[:3] @ T([0.0, 1.0, 1.0])) * row.norm() / peer.norm()


# ------------------------------------------------------------------ in-process runs
RUNS = [  # attack, strategy, hospitals, extra keys
    ("tailored-alie", "median", 4, {"tailored-alie.evals": 6}),
    ("tailored-ipm", "trimmed-mean", 4, {"tailored-ipm.evals": 6}),
    ("agr-tailored", "median", 4, {}),
    ("neurotoxin", "fedavg", 4, {"neurotoxin.mask-from": "honest-updates"}),
    ("dba", "fedavg", 4, {"malicious-hospitals": "0,1"}),
    ("hta-aware", "hta", 4, {"hta.validation-exponent": 0.0}),
    ("earn-aware", "earn", 4, {}),
    ("fltrust-aware", "fltrust", 4, {}),
    ("anchored-trust-aware", "anchored-trust", 4, {}),
    ("sentinel-aware", "sentinel", 4, {}),
]


def test_every_new_attack_runs_in_process(tmp_path, data_dir, monkeypatch):
    from conftest import small_run_config
    from hospitrust.aggregation import _codegen

    monkeypatch.setattr(_codegen, "_backend", "eager")  # 1-round runs: no torch.compile of the median kernels
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records

    for attack, strategy, hospitals, extra in RUNS:
        cfg = small_run_config(tmp_path / attack, **{
            "num-server-rounds": 1, "train-subsample": 0.03, "local-epochs": 1, "attack": attack, "strategy": strategy,
            "malicious-hospitals": "0", "run-name": "r", "reference-cohort-per-class": 5, **extra})
        run_inprocess(cfg, hospitals)
        (line,) = read_round_records(tmp_path / attack / "runs" / "r")
        bad = {c.hospital for c in line.clients if c.malicious}
        assert len(bad) == len(cfg["malicious-hospitals"].split(",")), attack
        assert all(not c.rejected for c in line.clients), attack
        if attack in ("neurotoxin", "dba"):  # backdoor success beside clean accuracy
            assert 0.0 <= line.central["attack_success_rate"] <= 1.0 and "balanced_accuracy" in line.central
        adversary = line.entries.get("adversary") or {}
        if attack != "dba":  # every round-aware attack records what it chose
            assert adversary["attack"] == attack and adversary["active"], attack
        if attack.startswith("tailored-"):  # the searched strength keeps the rows inside the server's bound
            assert adversary["norm"] <= cfg["max-update-norm"], attack
    assert read_round_records(tmp_path / "neurotoxin" / "runs" / "r")[0].entries["adversary"]["projected"] is True

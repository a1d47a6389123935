"""Sentinel (issue 60): its math on hand-computed cases with a quadratic stand-in for the cohort's loss,
the strategy's records, its refusal without a cohort, and its aware attack finding the largest push the
rule keeps (and a harmful one where the rule lets one through)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

from hospitrust.aggregation.sentinel import balanced_cross_entropy, sentinel
from hospitrust.attacks.interfaces import RoundView
from hospitrust.attacks.registry import ATTACKS, build_attack
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sentinel import Sentinel
from hospitrust.strategies.validation import CheckedReply
from hospitrust.strategies.intake import round_context

T = functools.partial(torch.tensor, dtype=torch.float64)
TARGET = T([1.0, 1.0])


def _quadratic(steps: torch.Tensor) -> torch.Tensor:
    """The cohort's loss of the model w + s with w = 0: ||s - (1, 1)||^2."""
    return ((steps.double() - TARGET) ** 2).sum(1)


def test_balanced_cross_entropy_by_hand():
    assert balanced_cross_entropy(torch.zeros(3, 2), torch.tensor([0, 1, 1])) == pytest.approx(math.log(2))
    logits = T([[2.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    class0 = (math.log(1 + math.exp(-2)) + math.log(2)) / 2  # the rare class counts as much as the common
    class1 = math.log(1 + math.exp(-3))
    assert balanced_cross_entropy(logits, torch.tensor([0, 0, 1])) == pytest.approx((class0 + class1) / 2, rel=1e-12)  # float64
    with pytest.raises(ValueError, match=r"logits must be \(m, C\)"):
        balanced_cross_entropy(torch.zeros(2, 2), torch.tensor([0]))


def test_one_round_by_hand_the_best_prefix_is_kept():
    x = T([[1.0, 0.0], [0.0, 1.0], [-5.0, 0.0]])
    out = sentinel(x, T([0.5, 0.0]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=math.inf)
    # alone: 1, 1, 37; prefixes: (1, 0) -> 1, (0.5, 0.5) -> 0.5, (-4/3, 1/3) -> 53/9; the anchor: 1.25
    assert out["clipped_loss"].tolist() == [1.0, 1.0, 37.0] and out["rank"].tolist() == [1, 2, 3]
    torch.testing.assert_close(out["prefix_loss"], T([1.0, 0.5, 53 / 9]))
    assert out["anchor_loss"] == pytest.approx(1.25) and out["chosen"] == 2 and out["fell_back"] is False
    torch.testing.assert_close(out["update"], T([0.5, 0.5]))
    assert out["weights"].tolist() == [0.5, 0.5, 0.0]


def test_the_weights_are_the_kept_hospitals_examples():
    x = T([[1.0, 0.0], [0.0, 1.0], [-5.0, 0.0]])
    out = sentinel(x, T([0.5, 0.0]), T([3.0, 1.0, 1.0]), _quadratic, step_bound=math.inf)
    # (3 (1, 0) + (0, 1)) / 4 = (0.75, 0.25): loss 0.625, the best prefix
    torch.testing.assert_close(out["update"], T([0.75, 0.25]))
    assert out["weights"].tolist() == [0.75, 0.25, 0.0]


def test_the_servers_own_update_is_the_step_when_it_does_better():
    x = T([[1.0, 0.0], [-5.0, 0.0]])
    out = sentinel(x, T([1.0, 1.0]), T([1.0, 1.0]), _quadratic, step_bound=math.inf)
    assert out["fell_back"] is True and out["chosen"] == 0 and out["anchor_loss"] == 0.0
    torch.testing.assert_close(out["update"], T([1.0, 1.0]))
    assert out["weights"].tolist() == [0.0, 0.0]


def test_every_update_is_clipped_to_kappa_times_the_servers_norm():
    x = T([[1.0, 0.0], [0.0, 1.0], [-5.0, 0.0]])
    out = sentinel(x, T([0.5, 0.0]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=2.0)
    assert out["bound"] == pytest.approx(1.0)
    torch.testing.assert_close(out["clip_factor"], T([1.0, 1.0, 0.2]))
    assert out["clipped_loss"].tolist()[2] == pytest.approx(5.0)  # (-1, 0): 4 + 1
    # however large the hospitals' updates, the step is within the bound
    big = sentinel(100 * x, T([0.5, 0.0]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=2.0)
    assert float(torch.linalg.vector_norm(big["update"])) <= 1.0 + 1e-12


def test_equal_losses_keep_the_most_hospitals_and_prefer_them_to_the_server():
    flat = lambda steps: torch.zeros(steps.shape[0], dtype=torch.float64)  # noqa: E731
    out = sentinel(T([[1.0, 0.0], [0.0, 1.0]]), T([1.0, 1.0]), T([1.0, 1.0]), flat, step_bound=math.inf)
    assert out["chosen"] == 2 and out["fell_back"] is False and out["weights"].tolist() == [0.5, 0.5]


def test_a_candidate_whose_loss_is_not_a_number_is_never_kept():
    def losses(steps):
        out = _quadratic(steps)
        out[(steps[:, 0] < -1).nonzero().flatten()] = float("nan")
        return out
    out = sentinel(T([[-5.0, 0.0], [1.0, 1.0]]), T([0.1, 0.0]), T([1.0, 1.0]), losses, step_bound=math.inf)
    assert out["clipped_loss"].tolist()[0] == math.inf and out["rank"].tolist() == [2, 1]
    assert out["weights"].tolist() == [0.0, 1.0]


def test_bad_input_names_what_was_wrong():
    x = T([[1.0, 0.0]])
    with pytest.raises(ValueError, match="step_bound must be > 0"):
        sentinel(x, T([1.0, 0.0]), T([1.0]), _quadratic, step_bound=0.0)
    with pytest.raises(ValueError, match="num_examples must be"):
        sentinel(x, T([1.0, 0.0]), T([0.0]), _quadratic, step_bound=1.0)
    with pytest.raises(ValueError, match="length d=2"):
        sentinel(x, T([1.0]), T([1.0]), _quadratic, step_bound=1.0)
    with pytest.raises(ValueError, match="losses returned 1 values for 2 candidates"):
        sentinel(T([[1.0, 0.0], [0.0, 1.0]]), T([1.0, 0.0]), T([1.0, 1.0]), lambda s: torch.zeros(1), step_bound=1.0)


def _rule(anchor=T([0.5, 0.0]), kappa=math.inf):
    return Sentinel({1: "a", 2: "b", 3: "c"}, {"step_bound": kappa}, server_update=lambda state, rnd: anchor.clone(),
                    candidate_losses=lambda state, steps: _quadratic(steps))


def test_the_strategy_records_each_hospitals_check():
    rule = _rule()
    rule.global_state = {"w": torch.zeros(2)}
    replies = [CheckedReply(i, {}, None, 10, {}) for i in (1, 2, 3)]
    agg = rule.aggregate(T([[1.0, 0.0], [0.0, 1.0], [-5.0, 0.0]]), T([10.0, 10.0, 10.0]), round_context(rule, 1, replies))
    torch.testing.assert_close(agg.update, T([0.5, 0.5]))
    assert agg.selected.tolist() == [True, True, False] and agg.extra["flagged"] == [False, False, True]
    assert agg.extra["rank"] == [1, 2, 3] and agg.extra["step_loss"] == [0.5] * 3
    assert agg.extra["anchor_loss"] == [1.25] * 3 and agg.extra["fell_back"] == [False] * 3


def test_the_strategy_needs_the_servers_update_and_the_cohorts_loss():
    with pytest.raises(ValueError, match="server's own update"):
        Sentinel({1: "a"})
    assert Sentinel.needs(Sentinel.Options(), {}) == {"cohort_split"}


def test_without_a_cohort_it_refuses_to_start_naming_the_missing_server_data():
    from conftest import small_run_config
    from hospitrust.config import parse_run_config
    from hospitrust.config.run import check_server_data

    cfg = parse_run_config({**small_run_config(Path("/tmp")), "strategy": "sentinel", "reference-cohort-per-class": 1})
    found = " ".join(check_server_data(cfg.model_copy(update={"reference_cohort_per_class": 0})))
    assert "strategy sentinel needs the server's reference cohort" in found and "no cohort-free setting" in found


def _aware_view(rule, honest, malicious_rows, max_norm=None):
    n = honest.shape[0] + len(malicious_rows)
    updates = torch.zeros(n, honest.shape[1], dtype=torch.float64)
    updates[[i for i in range(n) if i not in malicious_rows]] = honest
    names = {i + 1: h for i, h in enumerate("abcdefgh"[:n])}
    replies = [CheckedReply(i + 1, {}, None, 10, {}) for i in range(n)]

    def aggregate(stack):
        return rule.aggregate(stack, torch.full((n,), 10.0, dtype=torch.float64), round_context(rule, 1, replies))

    return RoundView(1, updates, [names[i + 1] for i in range(n)], list(malicious_rows), rule=lambda s: aggregate(s).update,
                     aggregate=aggregate, strategy=lambda: rule, generator=torch.Generator().manual_seed(0),
                     max_norm=max_norm, num_examples=torch.full((n,), 10.0, dtype=torch.float64))


def test_the_aware_attack_finds_the_largest_push_the_rule_keeps():
    # the cohort's loss is flat along (1, -1): a push there is invisible to the check, so the rule keeps it
    flat_along = lambda steps: ((steps.double() @ T([1.0, 1.0]) - 2.0) ** 2)  # noqa: E731
    rule = Sentinel({i + 1: h for i, h in enumerate("abcd")}, {"step_bound": 4.0},
                    server_update=lambda state, rnd: T([0.5, 0.5]), candidate_losses=lambda state, s: flat_along(s))
    rule.global_state = {"w": torch.zeros(2)}
    honest = T([[1.5, 0.3], [1.4, 0.4], [1.6, 0.5]])
    attack = build_attack("sentinel-aware", {"sentinel-aware": ATTACKS["sentinel-aware"].Options(spread=0.0)})
    view = _aware_view(rule, honest, [3])
    rows, info = attack.craft_round(view)
    assert info["kept"] is True and info["push"] > 0
    assert float(torch.linalg.vector_norm(rows[0])) <= 4.0 * math.sqrt(0.5) + 1e-9  # inside kappa x ||g||
    agg = view.aggregate(view.with_rows(rows))
    assert bool(agg.selected[3])
    # harmful where the check cannot see: along (1, -1) the step moves from the honest mean towards -mean
    blind = T([1.0, -1.0]) / math.sqrt(2)
    mean = honest.mean(0)
    assert float((agg.update - mean) @ blind) < -0.1 and float(-mean @ blind) < 0


def test_the_aware_attack_is_kept_at_no_push_when_the_check_sees_every_direction():
    rule = _rule(anchor=T([0.5, 0.5]), kappa=4.0)
    rule.hospitals = {i + 1: h for i, h in enumerate("abcd")}
    rule.global_state = {"w": torch.zeros(2)}
    honest = T([[1.0, 0.8], [0.8, 1.0], [1.2, 0.9]])
    attack = build_attack("sentinel-aware", {"sentinel-aware": ATTACKS["sentinel-aware"].Options(spread=0.0, steps=20)})
    rows, info = attack.craft_round(_aware_view(rule, honest, [3]))
    # against the quadratic the honest mean (1, 0.9) is near the optimum: only a small push is kept
    assert 0 <= info["push"] < 0.2


def test_the_aware_attack_is_refused_against_another_rule():
    from hospitrust.strategies.fedavg import FedAvg

    rule = FedAvg({1: "a", 2: "b"})
    rule.global_state = {"w": torch.zeros(2)}
    view = RoundView(1, T([[1.0, 0.0], [0.0, 1.0]]), ["a", "b"], [1], strategy=lambda: rule,
                     aggregate=lambda s: Aggregate(s.mean(0), torch.ones(2), torch.ones(2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="written against the rule sentinel"):
        build_attack("sentinel-aware", {"sentinel-aware": ATTACKS["sentinel-aware"].Options()}).craft_round(view)


def test_the_cohort_is_split_per_class_into_disjoint_parts():
    import numpy as np

    from hospitrust.datasets.federation import LabelledImages
    from hospitrust.server_app.services import cohort_parts

    labels = np.array([0] * 10 + [1] * 10 + [2] * 3)
    images = np.arange(len(labels), dtype=np.float32).reshape(-1, 1, 1, 1)
    train_part, check_part = cohort_parts(LabelledImages(images, labels), 0.5, seed=7)
    assert sorted(np.bincount(check_part.labels).tolist()) == [2, 5, 5]  # round(1.5) = 2 of the 3
    assert sorted(np.bincount(train_part.labels).tolist()) == [1, 5, 5]
    assert not set(train_part.images.ravel().tolist()) & set(check_part.images.ravel().tolist())
    again = cohort_parts(LabelledImages(images, labels), 0.5, seed=7)[1]
    assert np.array_equal(again.images, check_part.images)  # seeded: the same split every round and restart
    whole = cohort_parts(LabelledImages(images, labels), 0.0, seed=7)
    assert whole[0].labels is labels and whole[1].labels is labels
    with pytest.raises(ValueError, match=r"check fraction must be in \[0, 1\)"):
        cohort_parts(LabelledImages(images, labels), 1.0, seed=7)


def _verdict_module():
    import importlib.util
    import sys

    here = Path(__file__).resolve().parents[1] / "benchmarks" / "leaderboard" / "v3"
    sys.path.insert(0, str(here))
    spec = importlib.util.spec_from_file_location("sentinel_verdict", here / "sentinel_verdict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _synthetic(worst_gap=0.02, clean_gap=0.0, auc_gap=0.0, seeds=range(21, 31)):
    import pandas as pd

    verdict = _verdict_module()
    rows = []
    for i, s in enumerate(seeds):
        control, fedavg = 0.80 + 0.005 * i, 0.85 + 0.004 * i
        rows.append(("cohort-only-converged", s, "none", control, 0.90))
        rows.append(("fedavg", s, "none", fedavg, 0.93))
        rows.append(("sentinel", s, "none", fedavg + clean_gap + 0.001 * (i % 3), 0.93 + auc_gap))
        for j, a in enumerate(verdict.WORST_OVER):  # the worst attack differs by seed
            rows.append(("sentinel", s, a, control + worst_gap + (0.0 if j == i % len(verdict.WORST_OVER) else 0.05), 0.9))
    return verdict, pd.DataFrame(rows, columns=["rule", "seed", "attack_label", "final_balanced_accuracy", "final_auc"])


def test_the_declared_decision_test_by_hand():
    verdict, cells = _synthetic()
    holds, table = verdict.verdict(cells)
    # every seed above on all three: one-sided p = 1/1024 each, Holm 3/1024
    assert holds and table["p"].tolist() == pytest.approx([1 / 1024] * 3)
    assert table["p_holm"].tolist() == pytest.approx([3 / 1024] * 3)
    assert table.loc[0, "mean"] == pytest.approx(0.02)  # the worst over the eleven attacks, minus the control
    # clean 0.02 below FedAvg on every seed: past the 0.01 margin, so comparison 2 fails and sentinel does not hold
    verdict, cells = _synthetic(clean_gap=-0.02)
    holds, table = verdict.verdict(cells)
    assert not holds and table.loc[1, "seeds_above"] == 0 and table.loc[1, "p"] == pytest.approx(1.0)
    # 0.005 below FedAvg is inside the margin: non-inferior
    holds, table = verdict.verdict(_synthetic(clean_gap=-0.005)[1])
    assert holds and table.loc[1, "mean"] == pytest.approx(-0.005 + 0.001, abs=1e-3)
    # a missing aware cell is named, not silently dropped from the worst case
    cells = cells[~((cells["seed"] == 23) & (cells["attack_label"] == "sentinel-aware"))]
    with pytest.raises(verdict.IncompleteGrid, match="seed 23: sentinel x sentinel-aware"):
        verdict.verdict(cells)


def test_the_declared_evaluation_parts_are_the_generators_output_with_the_chosen_design_and_each_conditions_controls():
    import importlib.util
    import sys

    from hospitrust.bench.grid import parse_grid
    from hospitrust.config import parse_run_config

    here = Path(__file__).resolve().parents[1] / "benchmarks" / "leaderboard" / "v3"
    sys.path.insert(0, str(here.parent / "v2"))
    spec = importlib.util.spec_from_file_location("sentinel_parts", here / "sentinel_parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    assert parts.CHOSEN and parts.main(["--check"]) == 0  # the 20 committed parts, as generated
    grid = parse_grid(here / "sentinel-alpha0.1-s30.toml")
    assert len(grid.cells) == parts.cells_per_seed() == 56 and {c.axes["seed"] for c in grid.cells} == {30}
    rule = parse_run_config(next(c for c in grid.cells if c.axes["strategy"] == "sentinel").run_config)
    o = rule.strategy_options
    assert (o.start, o.fall_back, o.step_bound, o.server_epochs, o.floor_epochs) == ("cohort-model", "server-or-keep",
                                                                                       16.0, 1, 240)
    # each condition's controls as its own tuning chose them (Dirichlet 0.1's hospitals alone: lr 0.01, 135 epochs)
    local = next(c for c in grid.cells if c.axes["strategy"] == "local-only-mean")
    assert local.control == {"control": "local-only-mean", "control-epochs": 135, "control-learning-rate": 0.01}
    main = parse_grid(here / "sentinel-main-s21.toml")
    assert next(c for c in main.cells if c.axes["strategy"] == "local-only-mean").control["control-epochs"] == 120


def test_the_robust_candidates_by_hand():
    x = T([[1.0, 1.0], [1.0, 0.8], [-5.0, -5.0]])
    # trimmed (1 each end): (1, 0.8), loss 0.04; the mean (-1, -1.067), loss 8.27; the server (0.5, 0.5): 0.5
    out = sentinel(x, T([0.5, 0.5]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=math.inf,
                   candidates="trimmed-and-mean", trim=1)
    assert out["candidate"] == "trimmed-mean" and out["fell_back"] is False
    torch.testing.assert_close(out["update"], T([1.0, 0.8]))
    torch.testing.assert_close(out["prefix_loss"], T([0.04, 4.0 + (3.2 / 3 + 1) ** 2]))
    assert out["weights"].tolist() == pytest.approx([1 / 3] * 3)
    # where the server's own update does better, it is the step
    out = sentinel(x, T([1.0, 1.0]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=math.inf, candidates="trimmed-mean", trim=1)
    assert out["candidate"] == "server" and out["weights"].tolist() == [0.0, 0.0, 0.0]
    # the mean wins where it does best; trim is capped at (n - 1) // 2
    honest = T([[1.0, 1.0], [1.2, 1.0], [0.8, 1.0]])
    out = sentinel(honest, T([0.1, 0.1]), T([1.0, 1.0, 2.0]), _quadratic, step_bound=math.inf,
                   candidates="trimmed-and-mean", trim=5)
    assert out["candidate"] in ("trimmed-mean", "mean") and out["fell_back"] is False
    with pytest.raises(ValueError, match="candidates must be"):
        sentinel(x, T([0.5, 0.5]), T([1.0, 1.0, 1.0]), _quadratic, step_bound=1.0, candidates="median")


def test_the_fall_back_may_keep_the_model_when_the_servers_step_is_worse_too():
    x = T([[-5.0, 0.0], [0.0, -5.0]])  # every hospitals' candidate makes the loss worse
    out = sentinel(x, T([-1.0, -1.0]), T([1.0, 1.0]), _quadratic, step_bound=math.inf, may_keep=True)
    # L(w) = 2, the server's (-1, -1): 8, so the model is kept
    assert out["fell_back"] is True and out["candidate"] == "keep" and out["anchor_loss"] == pytest.approx(2.0)
    torch.testing.assert_close(out["update"], T([0.0, 0.0]))
    out = sentinel(x, T([0.5, 0.5]), T([1.0, 1.0]), _quadratic, step_bound=math.inf, may_keep=True)
    assert out["candidate"] == "server"  # the server's step does better than keeping: 0.5 < 2
    robust = sentinel(x, T([-1.0, -1.0]), T([1.0, 1.0]), _quadratic, step_bound=math.inf, candidates="trimmed-mean",
                      may_keep=True)
    assert robust["candidate"] == "keep"


class _Floor:
    """A hand-made floor: the check loss of a model {"w": x} is ||x - (1, 1)||^2; ``part`` at (1, 0)
    (loss 1), ``whole`` at (1, 1)."""

    def __init__(self):
        self.part, self.whole = {"w": T([1.0, 0.0])}, {"w": T([1.0, 1.0])}

    def check_loss(self, state):
        return float(((state["w"].double() - TARGET) ** 2).sum())

    def check_balanced_accuracy(self, state):  # a stand-in that falls as the loss grows: 1 / (1 + loss)
        return 1.0 / (1.0 + self.check_loss(state))


def test_the_floor_releases_the_federated_model_where_it_does_as_well_and_the_servers_own_otherwise():
    from flwr.app import ArrayRecord

    floors = []
    rule = Sentinel({1: "a"}, {"floor": "cohort-model", "floor_epochs": 3, "floor_learning_rate": 0.05},
                    server_update=lambda state, rnd: T([0.0, 0.0]), candidate_losses=lambda state, steps: _quadratic(steps),
                    cohort_floor=lambda fraction, epochs, lr: floors.append((fraction, epochs, lr)) or _Floor())
    assert floors == [(0.5, 3, 0.05)]  # the held-out share, the floor's epochs and rate
    good = ArrayRecord({"w": T([1.0, 0.5])})  # loss 0.25 < the floor's 1.0
    released, entries = rule.released(1, good)
    assert released is good and entries == {"sentinel_floor": {"released": "federated", "federated_loss": 0.25,
                                                                "floor_loss": 1.0}}
    tie = ArrayRecord({"w": T([0.0, 1.0])})  # loss 1.0: ties go to the hospitals' model
    assert rule.released(2, tie)[0] is tie
    bad = ArrayRecord({"w": T([-3.0, 1.0])})  # loss 16: the whole cohort's model is released, and saved
    released, entries = rule.released(3, bad)
    assert entries["sentinel_floor"]["released"] == "floor" and entries["sentinel_floor"]["federated_loss"] == 16.0
    torch.testing.assert_close(released.to_torch_state_dict()["w"], T([1.0, 1.0]))
    torch.testing.assert_close(rule.final_model(bad)["w"], T([1.0, 1.0]))
    assert Sentinel.needs(Sentinel.Options(floor="cohort-model"), {}) == {"cohort_split", "cohort_floor"}
    with pytest.raises(ValueError, match="floor = 'cohort-model' needs the server's own model"):
        Sentinel({1: "a"}, {"floor": "cohort-model"}, server_update=lambda s, r: T([0.0]),
                 candidate_losses=lambda s, steps: _quadratic(steps))
    by_accuracy = Sentinel({1: "a"}, {"floor": "cohort-model", "floor_check": "balanced-accuracy"},
                           server_update=lambda state, rnd: T([0.0, 0.0]),
                           candidate_losses=lambda state, steps: _quadratic(steps), cohort_floor=lambda *a: _Floor())
    released, entries = by_accuracy.released(1, good)  # 1 / 1.25 = 0.8 against the floor's 1 / 2 = 0.5
    assert released is good and entries == {"sentinel_floor": {"released": "federated",
                                                                "federated_balanced_accuracy": 0.8,
                                                                "floor_balanced_accuracy": 0.5}}
    assert by_accuracy.released(2, tie)[0] is tie  # 0.5 = 0.5: the federation
    assert by_accuracy.released(3, bad)[1]["sentinel_floor"]["released"] == "floor"  # 1 / 17
    plain = _rule()  # no floor: the global model itself, no entries
    assert plain.released(1, bad) == (bad, {}) and plain.final_model(bad)["w"].tolist() == [-3.0, 1.0]


def test_the_start_is_the_servers_own_model_trained_on_the_cohorts_training_part():
    from flwr.app import ArrayRecord

    initial = ArrayRecord({"w": T([5.0, 5.0])})
    assert _rule().initial_model(initial) is initial  # the default: the run's initial model
    made = []
    rule = Sentinel({1: "a"}, {"start": "cohort-model", "floor_epochs": 7, "floor_learning_rate": 0.02},
                    server_update=lambda state, rnd: T([0.0, 0.0]), candidate_losses=lambda state, steps: _quadratic(steps),
                    cohort_floor=lambda fraction, epochs, lr: made.append((fraction, epochs, lr)) or _Floor())
    assert made == [(0.5, 7, 0.02)]  # trained once, with the floor's recipe
    torch.testing.assert_close(rule.initial_model(initial).to_torch_state_dict()["w"], T([1.0, 0.0]))  # ``part``
    assert rule.floor is None and rule.released(1, initial) == (initial, {})  # a start is no floor
    with pytest.raises(ValueError, match=r"differ in \['v', 'w'\]"):
        rule.initial_model(ArrayRecord({"v": T([0.0])}))
    assert Sentinel.needs(Sentinel.Options(start="cohort-model"), {}) == {"cohort_split", "cohort_floor"}
    with pytest.raises(ValueError, match="sentinel.start = 'cohort-model' needs the server's own model"):
        Sentinel({1: "a"}, {"start": "cohort-model"}, server_update=lambda s, r: T([0.0]),
                 candidate_losses=lambda s, steps: _quadratic(steps))


@pytest.mark.data
def test_a_run_started_from_the_servers_own_model_sends_it_to_the_first_round(tmp_path, data_dir, monkeypatch):
    from flwr.app import Context, RecordDict

    from conftest import small_run_config
    from hospitrust.bench.controls import _setup
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.evaluation import Evaluation
    from hospitrust.server_app.services import ServerServices

    cfg = small_run_config(tmp_path, **{"strategy": "sentinel", "sentinel.start": "cohort-model", "sentinel.floor-epochs": 2,
                                        "sentinel.fall-back": "server-or-keep", "num-server-rounds": 1,
                                        "train-subsample": 0.03, "reference-cohort-per-class": 4})
    seen = []
    original = Evaluation.initial
    monkeypatch.setattr(Evaluation, "initial", lambda self, arrays: seen.append(arrays.to_torch_state_dict()) or
                        original(self, arrays))
    server_app(InProcessGrid(client_app, 4, cfg), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                          run_config=cfg))
    s = _setup(cfg)
    part = ServerServices(s.cfg, s.task, s.device, s.sets)["cohort_floor"](0.5, 2, 0.01).part
    assert len(seen) == 1 and set(seen[0]) == set(part)
    assert all(torch.equal(seen[0][k], part[k]) for k in part)  # round 0 is the server's own model, bit for bit


@pytest.mark.data
def test_the_floor_is_the_cohort_only_converged_controls_model_bit_for_bit(tmp_path, data_dir):
    """The model the floor releases is the one the leaderboard's control trains (the same function, images, seed
    and salt), and training it leaves the run's random state as it was."""
    import random

    import numpy as np

    from conftest import small_run_config
    from hospitrust.bench.controls import COHORT_SALT, Control, _converge, _setup
    from hospitrust.server_app.services import ServerServices

    cfg = small_run_config(tmp_path, **{"strategy": "sentinel", "reference-cohort-per-class": 4, "seed": 5})
    s = _setup(cfg)
    control = Control.from_keys({"control": "cohort-only-converged", "control-epochs": 3, "control-learning-rate": 0.05})
    model, _ = _converge(s, s.sets.cohort.images, s.sets.cohort.labels, control, COHORT_SALT, s.evaluate)
    floor = ServerServices(s.cfg, s.task, s.device, s.sets)["cohort_floor"](0.5, 3, 0.05)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = random.random(), np.random.rand(), torch.rand(1)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    whole, part = floor.whole, floor.part
    assert (random.random(), np.random.rand(), torch.rand(1)) == before
    expected = model.state_dict()
    assert set(whole) == set(expected) and all(torch.equal(whole[k], expected[k].cpu()) for k in expected)
    assert any(not torch.equal(part[k], whole[k]) for k in whole)  # the training part alone: another model
    assert floor.check_loss(part) > 0 and len(floor.train_part.labels) == 4  # 2 of each class's 4 held out
    assert 0.0 <= floor.check_balanced_accuracy(whole) <= 1.0


@pytest.mark.data
def test_a_run_with_the_floor_records_what_it_released_and_saves_it(tmp_path, data_dir):
    from flwr.app import Context, RecordDict

    from conftest import small_run_config
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, **{"strategy": "sentinel", "sentinel.floor": "cohort-model", "sentinel.floor-epochs": 2,
                                        "num-server-rounds": 2, "train-subsample": 0.03, "reference-cohort-per-class": 4})
    server_app(InProcessGrid(client_app, 4, cfg), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                          run_config=cfg))
    run_dir = tmp_path / "runs" / cfg["run-name"]
    rounds = read_round_records(run_dir)
    entries = [r.entries["sentinel_floor"] for r in rounds]
    assert len(entries) == 2 and all(e["released"] in ("federated", "floor") for e in entries)
    assert all(math.isfinite(e["federated_loss"]) and math.isfinite(e["floor_loss"]) for e in entries)
    assert entries[0]["floor_loss"] == entries[1]["floor_loss"]  # the server's own model is trained once
    assert (run_dir / "model.pt").is_file()

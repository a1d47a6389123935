"""Model-poisoning attacks, schedules, registry/plugins, settings and security metrics.

Each attack is checked on small hand-made stacks against the rule its paper states.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch

import hospitrust.attacks as A
from hospitrust.attacks import metrics as M
from hospitrust.attacks.math import update as U
from hospitrust.attacks.threat_model import configured_attack
from hospitrust.config import ConfigError, parse_run_config


def _configured(attack: str, **flat):
    """The attack a run config with these keys builds (the real config path)."""
    return configured_attack(parse_run_config({"attack": attack, **flat}).threat_model)


def _stack(n: int = 8, d: int = 40, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # honest updates share a drift (so the mean has a clear sign) plus spread
    return (0.3 + torch.randn(n, d, generator=g)).to(dtype)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ============================================================ single-hospital rules
def test_sign_flip_scale_free_ride_and_noise():
    u = torch.tensor([1.0, -2.0, 0.5])
    assert torch.equal(U.sign_flip(u), -u)
    assert torch.equal(U.scale(u, 10.0), torch.tensor([10.0, -20.0, 5.0]))
    z = U.free_ride(u)
    assert torch.equal(z, torch.zeros(3)) and z.dtype == u.dtype
    disguised = U.free_ride(torch.zeros(10_000), noise=1e-3, generator=_gen())
    assert 0 < disguised.abs().max() < 1e-2
    noise = U.gaussian_noise(torch.zeros(20_000), 2.0, _gen())
    assert abs(float(noise.std()) - 2.0) < 0.05
    # the same generator seed gives the same attack; additive keeps the honest part
    assert torch.equal(U.gaussian_noise(u, 1.0, _gen(3)), U.gaussian_noise(u, 1.0, _gen(3)))
    assert torch.allclose(U.gaussian_noise(u, 1.0, _gen(3), additive=True) - u, U.gaussian_noise(u, 1.0, _gen(3)))
    assert torch.equal(u, torch.tensor([1.0, -2.0, 0.5]))  # input untouched
    with pytest.raises(ValueError, match="sigma"):
        U.gaussian_noise(u, -1.0)
    with pytest.raises(ValueError, match="noise"):
        U.free_ride(u, noise=-0.1)
    with pytest.raises(TypeError):
        U.sign_flip(np.ones(3))


def test_update_attack_classes():
    u = torch.tensor([1.0, -2.0, 0.5])
    assert torch.equal(A.SignFlip().apply(u, server_round=1), -u)
    assert torch.equal(A.Scaling(3.0).apply(u, server_round=1), 3 * u)
    assert torch.equal(A.FreeRider().apply(u, server_round=1), torch.zeros(3))
    assert A.GaussianNoise(1.0).apply(u, server_round=1, generator=_gen()).shape == u.shape


# ================================================================ colluding rules
def test_alie_hand_computed_3x2():
    # columns: [1, 3, 5] -> mean 3, std (ddof=1) 2 ; [2, 6, 1] -> mean 3, std sqrt(7)
    h = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([3.0 - 1.5 * 2.0, 3.0 - 1.5 * math.sqrt(7.0)], dtype=torch.float64)
    assert torch.allclose(U.alie(h, 1.5), expected, atol=1e-12)  # float64


def test_alie_within_z_std_of_mean():
    h = _stack()
    mean, std = h.mean(0), h.std(0)
    for z in (0.5, 1.0, 1.5):
        mal = U.alie(h, z)
        assert torch.all((mal - mean).abs() <= z * std + 1e-12)
        assert torch.all(mal <= mean)  # mean - z * std with z > 0
    with pytest.raises(ValueError, match="at least 2"):
        U.alie(h[:1], 1.0)


def test_alie_z_formula_is_a_no_op_at_10_2():
    assert U.alie_z_from_formula(10, 2) == 0.0
    assert U.alie_z_from_formula(5, 1) == 0.0
    assert U.alie_z_from_formula(10, 1) == pytest.approx(-0.1397, abs=1e-3)
    assert U.alie_z_from_formula(10, 3) == pytest.approx(0.180, abs=1e-3)
    assert U.alie_z_from_formula(10, 2, form="paper") == pytest.approx(0.2533, abs=1e-3)
    with pytest.raises(ValueError):
        U.alie_z_from_formula(10, 10)


def test_ipm_is_minus_eps_mean():
    h = _stack()
    assert torch.allclose(U.ipm(h, 0.5), -0.5 * h.mean(0))
    assert torch.allclose(U.ipm(h, 100.0), -100.0 * h.mean(0))
    with pytest.raises(ValueError, match="eps"):
        U.ipm(h, -0.1)
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        U.ipm(h[0], 0.5)


def _dists(mal: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(h - mal, dim=1)


@pytest.mark.parametrize("perturbation", ["std", "unit", "sign"])
def test_min_max_envelope_and_near_maximal_gamma(perturbation):
    h = _stack()
    max_pair = float(torch.cdist(h, h).max())
    mal = U.min_max(h, perturbation)
    assert float(_dists(mal, h).max()) <= max_pair * (1 + 1e-9)
    gamma = U.min_max_gamma(h, perturbation)
    assert gamma > 0
    p = U.perturbation_vector(h, perturbation)
    assert torch.allclose(mal, h.mean(0) + gamma * p)
    bigger = h.mean(0) + gamma * 1.001 * p
    assert float(_dists(bigger, h).max()) > max_pair  # slightly larger gamma violates
    # the paper's bisection finds the same gamma
    assert U.min_max_gamma(h, perturbation, method="bisection") == pytest.approx(gamma, rel=1e-4)


@pytest.mark.parametrize("perturbation", ["std", "unit", "sign"])
def test_min_sum_envelope_and_near_maximal_gamma(perturbation):
    h = _stack()
    bound = float((torch.cdist(h, h) ** 2).sum(dim=1).max())
    mal = U.min_sum(h, perturbation)
    assert float((_dists(mal, h) ** 2).sum()) <= bound * (1 + 1e-9)
    gamma = U.min_sum_gamma(h, perturbation)
    p = U.perturbation_vector(h, perturbation)
    bigger = h.mean(0) + gamma * 1.001 * p
    assert float((_dists(bigger, h) ** 2).sum()) > bound
    assert U.min_sum_gamma(h, perturbation, method="bisection") == pytest.approx(gamma, rel=1e-4)


def test_min_max_float32_and_direction():
    h = _stack(dtype=torch.float32)
    mal = U.min_max(h, "std")
    assert mal.dtype == torch.float32
    assert torch.all(mal <= h.mean(0) + 1e-6)  # p = -std pushes every coordinate down
    with pytest.raises(ValueError, match="perturbation"):
        U.min_max(h, "bogus")
    with pytest.raises(ValueError, match="at least 2"):
        U.min_sum(h[:1])


@pytest.mark.parametrize("fn", [U.fang_trimmed_mean, U.fang_median])
def test_fang_beyond_honest_range_opposite_to_mean(fn):
    h = _stack(n=6, d=200)
    mal = fn(h, 3, generator=_gen(1))
    assert mal.shape == (3, 200)
    s = torch.sign(h.mean(0))
    lo, hi = h.min(0).values, h.max(0).values
    up, down = s < 0, s > 0
    assert up.any() and down.any()
    assert torch.all(mal[:, down] <= lo[down])  # honest mean > 0: at/below the minimum
    assert torch.all(mal[:, up] >= hi[up])  # honest mean < 0: at/above the maximum
    # ... and within Fang's b = 2 interval
    assert torch.all(mal[:, down] >= torch.where(lo > 0, lo / 2, 2 * lo)[down] - 1e-12)
    assert torch.all(mal[:, up] <= torch.where(hi > 0, 2 * hi, hi / 2)[up] + 1e-12)
    assert not torch.equal(mal[0], mal[1])  # attackers differ
    with pytest.raises(ValueError):
        fn(h, 0)


def test_fang_hand_case():
    # coordinate 0: honest mean > 0, min 1 > 0 -> values in [0.5, 1]
    # coordinate 1: honest mean < 0, max -1 <= 0 -> values in [-1, -0.5]
    h = torch.tensor([[1.0, -3.0], [2.0, -1.0]], dtype=torch.float64)
    mal = U.fang_trimmed_mean(h, 50, generator=_gen())
    assert torch.all((mal[:, 0] >= 0.5) & (mal[:, 0] <= 1.0))
    assert torch.all((mal[:, 1] >= -1.0) & (mal[:, 1] <= -0.5))


def test_mimic_and_sybil():
    h = _stack(n=4, d=5)
    assert torch.equal(U.mimic(h, 2), h[2])
    with pytest.raises(ValueError, match="target_index"):
        U.mimic(h, 4)
    copies = U.sybil(h[0], 3)
    assert copies.shape == (3, 5) and all(torch.equal(r, h[0]) for r in copies)
    crafted = A.Sybil("mean").craft(h, 3, server_round=1)
    assert torch.allclose(crafted, h.mean(0).expand(3, -1))
    crafted = A.Sybil(A.SignFlip()).craft(h, 2, server_round=1)
    assert torch.allclose(crafted[0], -h.mean(0)) and torch.equal(crafted[0], crafted[1])


def test_jittered_copies_norm_and_cosine():
    u = torch.randn(20000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(U.jittered_copies(u, 3, 0.0), U.sybil(u, 3))
    rows = U.jittered_copies(u, 3, 0.2, torch.Generator().manual_seed(1))
    noise_norms = torch.linalg.vector_norm(rows - u, dim=1) / torch.linalg.vector_norm(u)
    assert noise_norms.tolist() == pytest.approx([0.2] * 3)
    unit = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    cos = unit @ unit.T
    assert cos[0, 1] == pytest.approx(1 / 1.04, abs=0.01) and cos[1, 2] == pytest.approx(1 / 1.04, abs=0.01)
    assert torch.equal(rows, U.jittered_copies(u, 3, 0.2, torch.Generator().manual_seed(1)))  # seeded
    with pytest.raises(ValueError, match="relative_noise"):
        U.jittered_copies(u, 3, -0.1)


@pytest.mark.parametrize("name", ["alie", "ipm", "min-max", "min-sum"])
def test_copy_noise_setting_reaches_the_colluders(name):
    h = _stack(n=6, d=400)
    exact = _configured(name).craft(h, 3, server_round=1)
    assert all(torch.equal(r, exact[0]) for r in exact)
    jittered = _configured(name, **{f"{name}.copy-noise": 0.3}).craft(
        h, 3, server_round=1, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(jittered[0], jittered[1])
    rel = torch.linalg.vector_norm(jittered - exact, dim=1) / torch.linalg.vector_norm(exact[0])
    assert rel.tolist() == pytest.approx([0.3] * 3)


@pytest.mark.parametrize(
    "attack",
    [A.ALIE(1.0), A.IPM(0.5), A.MinMax("std"), A.MinSum("unit"), A.FangTrimmedMean(), A.FangMedian(), A.Mimic(1), A.Sybil()],
)
def test_colluding_classes_shape(attack):
    h = _stack(n=5, d=7, dtype=torch.float32)
    out = attack.craft(h, 3, server_round=1, generator=_gen())
    assert out.shape == (3, 7) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_attack_update_stack_server_step():
    h = _stack(n=6, d=10)
    out = A.attack_update_stack(A.IPM(0.5), h, [1, 4], server_round=1)
    honest = h[[0, 2, 3, 5]]
    assert torch.allclose(out[1], -0.5 * honest.mean(0)) and torch.allclose(out[4], out[1])
    assert torch.equal(out[[0, 2, 3, 5]], honest)
    assert torch.equal(h, _stack(n=6, d=10))  # input untouched
    flipped = A.attack_update_stack(A.SignFlip(), h, [0], server_round=1)
    assert torch.equal(flipped[0], -h[0]) and torch.equal(flipped[1:], h[1:])
    # inactive: malicious hospitals keep their own honest updates
    off = A.attack_update_stack(A.DelayedStart(A.IPM(0.5), start_round=3), h, [1], server_round=2)
    assert torch.equal(off, h)
    with pytest.raises(ValueError, match="at least one honest"):
        A.attack_update_stack(A.IPM(0.5), h, range(6), server_round=1)


def test_attack_state_dict_client_helper():
    g = {"w": torch.ones(2, 2), "b": torch.zeros(2), "bn.num_batches_tracked": torch.tensor(5)}
    w = {"w": torch.full((2, 2), 3.0), "b": torch.ones(2), "bn.num_batches_tracked": torch.tensor(7)}
    out = A.attack_state_dict(A.SignFlip(), g, w, server_round=1)
    assert torch.equal(out["w"], torch.full((2, 2), -1.0))  # 1 - (3 - 1)
    assert torch.equal(out["b"], -torch.ones(2))
    assert int(out["bn.num_batches_tracked"]) == 7
    free = A.attack_state_dict(A.FreeRider(), g, w, server_round=1)
    assert torch.equal(free["w"], g["w"]) and torch.equal(free["b"], g["b"])
    off = A.attack_state_dict(A.OnOff(A.SignFlip(), rounds={2}), g, w, server_round=1)
    assert torch.equal(off["w"], w["w"])


# ======================================================================= schedules
def test_on_off_rounds_and_period():
    a = A.OnOff(A.SignFlip(), rounds={2, 5})
    assert [r for r in range(1, 9) if a.active(r)] == [2, 5]
    b = A.OnOff(A.SignFlip(), period=3)
    assert [r for r in range(1, 10) if b.active(r)] == [3, 6, 9]
    c = A.OnOff(A.SignFlip(), period=4, on_for=2)
    assert [r for r in range(1, 10) if c.active(r)] == [3, 4, 7, 8]
    u = torch.tensor([1.0, 2.0])
    assert torch.equal(b.apply(u, server_round=1), u)  # off: honest update
    assert torch.equal(b.apply(u, server_round=3), -u)
    with pytest.raises(ValueError, match="exactly one"):
        A.OnOff(A.SignFlip())
    with pytest.raises(ValueError, match="on_for"):
        A.OnOff(A.SignFlip(), period=2, on_for=3)


def test_delayed_start_and_nesting():
    a = A.DelayedStart(A.IPM(0.5), start_round=3)
    assert [r for r in range(1, 7) if a.active(r)] == [4, 5, 6]
    assert A.DelayedStart(A.SignFlip(), start_round=0).active(1)
    nested = A.DelayedStart(A.OnOff(A.SignFlip(), period=2), start_round=3)
    assert [r for r in range(1, 9) if nested.active(r)] == [4, 6, 8]
    h = _stack(n=4, d=3)
    # an inactive colluding attack sends copies of the honest mean
    assert torch.allclose(a.craft(h, 2, server_round=1), h.mean(0).expand(2, -1))
    assert torch.allclose(a.craft(h, 2, server_round=4), -0.5 * h.mean(0).expand(2, -1))


def test_schedule_keeps_interface_and_pickles():
    for attack, iface in [(A.LabelFlip(), A.DataAttack), (A.SignFlip(), A.UpdateAttack), (A.ALIE(), A.ColludingAttack)]:
        wrapped = A.DelayedStart(A.OnOff(attack, period=2), start_round=1)
        assert isinstance(wrapped, iface) and isinstance(wrapped, A.DelayedStart) and isinstance(wrapped.attack, A.OnOff)
        assert A.attack_kind(wrapped) == iface.kind
        back = pickle.loads(pickle.dumps(wrapped))
        assert isinstance(back, iface) and [r for r in range(1, 7) if back.active(r)] == [2, 4, 6]
        assert repr(copy.deepcopy(wrapped)) == repr(wrapped)
    with pytest.raises(TypeError):
        A.OnOff(object(), period=2)


def test_data_attack_inactive_returns_data_unchanged():
    images = np.zeros((4, 5, 5, 1), dtype=np.uint8)
    labels = np.array([0, 1, 2, 1])
    rng = np.random.default_rng(0)
    a = A.DelayedStart(A.LabelFlip("all-to-one", target=2), start_round=2)
    i2, l2 = a.poison_for_round(images, labels, server_round=1, rng=rng, num_classes=3)
    assert i2 is images and l2 is labels
    _, l3 = a.poison_for_round(images, labels, server_round=3, rng=rng, num_classes=3)
    assert np.array_equal(l3, [2, 2, 2, 2])


# ======================================================== registry, plugins, settings
class MyPluginAttack(A.UpdateAttack):
    """A user's own update attack (halves the update)."""

    def apply(self, update, *, server_round, generator=None):
        return update / 2


class MyConfigurablePlugin(A.ColludingAttack):
    from hospitrust.attacks.colluding import IPMOptions as Options  # a plugin declares options like any attack

    def __init__(self, eps):
        self.eps = eps

    @classmethod
    def from_options(cls, options, build):
        return cls(options.eps)

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return (-self.eps * honest.mean(0)).repeat(num_malicious, 1)


class NotAnAttack:
    pass


def test_registry_builds_every_attack_with_kind():
    names = {
        "label-flip", "backdoor", "corruption", "label-noise", "sign-flip", "scaling", "gaussian-noise",
        "free-rider", "nan-update", "alie", "ipm", "min-max", "min-sum", "fang-trimmed-mean", "fang-median", "mimic", "sybil",
        "tailored-alie", "tailored-ipm", "agr-tailored", "neurotoxin", "dba", "hta-aware", "earn-aware", "fltrust-aware",
        "anchored-trust-aware", "sentinel-aware",
    }  # fmt: skip
    assert set(A.ATTACKS) == names
    kinds = {"label-flip": "data", "backdoor": "data", "corruption": "data", "label-noise": "data", "sign-flip": "update",
             "scaling": "update", "gaussian-noise": "update", "free-rider": "update", "nan-update": "update",
             "neurotoxin": "data", "dba": "data"}
    for name in names:
        attack = A.build_attack(name)
        assert A.attack_kind(attack) == A.ATTACKS[name].kind == kinds.get(name, "colluding")  # the class carries its kind
    assert A.build_attack("none") is None
    with pytest.raises(A.AttackError, match="unknown attack"):
        A.build_attack("sign-flop")


def test_build_attack_uses_its_section_and_the_schedule():
    attack = _configured("alie", **{"alie.z": 1.5, "attack-schedule.start-round": 2, "attack-schedule.period": 2})
    assert isinstance(attack, A.DelayedStart) and isinstance(attack, A.ColludingAttack)
    assert attack.attack.attack.z == 1.5
    assert [r for r in range(1, 9) if attack.active(r)] == [4, 6, 8]
    on = _configured("scaling", **{"attack-schedule.on-rounds": "1, 3", "scaling.gamma": 4})
    assert [r for r in range(1, 6) if on.active(r)] == [1, 3] and on.attack.gamma == 4.0
    lf = _configured("label-flip", **{"label-flip.mode": "source-to-target", "label-flip.source": 2, "label-flip.target": 0})
    assert (lf.mode, lf.source, lf.target) == ("source-to-target", 2, 0)
    sy = _configured("sybil", **{"sybil.base": "ipm", "ipm.eps": 0.7})  # the base attack takes its own section
    assert isinstance(sy.base, A.IPM) and sy.base.eps == 0.7


def test_old_flat_attack_keys_still_work_with_a_deprecation_line():
    with pytest.warns(FutureWarning, match="'attack-gamma' is deprecated: it is now 'scaling.gamma'"):
        on = _configured("scaling", **{"attack-gamma": 4, "attack-schedule.on-rounds": "1, 3"})
    assert on.attack.gamma == 4.0 and [r for r in range(1, 6) if on.active(r)] == [1, 3]
    with pytest.warns(FutureWarning, match="'attack-target' is deprecated: it is now 'backdoor.target'"):
        assert _configured("backdoor", **{"attack-target": 1}).target == 1  # a shared old key goes to the selected attack


def test_plugin_loading():
    attack = A.build_attack(f"{__name__}:MyPluginAttack")
    assert isinstance(attack, MyPluginAttack)
    assert torch.equal(attack.apply(torch.tensor([2.0]), server_round=1), torch.tensor([1.0]))
    conf = _configured(f"{__name__}:MyConfigurablePlugin", **{"attack-schedule.period": 2})
    assert isinstance(conf, A.ColludingAttack) and conf.attack.eps == 0.5 and not conf.active(1)
    assert isinstance(_configured(f"{__name__}:MyPluginAttack"), MyPluginAttack)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("no_such_package_xyz.mod:Thing", "cannot import module"),
        (f"{__name__}:DoesNotExist", "has no attribute"),
        (f"{__name__}:NotAnAttack", "implements none of"),
        (f"{__name__}:_UNUSED", "not a class"),
        ("hospitrust.attacks.interfaces:UpdateAttack", "abstract"),
        (":Name", "package.module:ClassName"),
    ],
)
def test_plugin_loading_errors(path, match):
    with pytest.raises(A.AttackError, match=match):
        A.build_attack(path)


_UNUSED = 42


def test_attack_options_defaults_bounds_and_errors():
    cfg = parse_run_config({"num-server-rounds": 5, "strategy": "fedavg"})
    assert cfg.attack == "none" and not cfg.attack_enabled and cfg.malicious_fraction == 0.0
    o = cfg.attack_sections()
    assert (o["scaling"].gamma, o["alie"].z, o["ipm"].eps, o["corruption"].severity, o["backdoor"].poison_fraction) == (
        10.0, 1.0, 0.5, 5, 0.5)
    assert cfg.to_flat()["malicious-fraction"] == 0.0
    assert parse_run_config({"attack": "corruption", "corruption.kind": "gaussian-noise"}).options("corruption").kind == "gaussian_noise"
    bad = [
        ({"malicious-fraction": 1.0}, "malicious-fraction"),
        ({"attack": "corruption", "corruption.severity": 6}, "corruption.severity"),
        ({"attack": "ipm", "ipm.eps": -1}, "ipm.eps"),
        ({"attack": "nope"}, "unknown attack"),
        ({"malicious-hospitals": "1,x"}, "malicious-hospitals"),
        ({"malicious-hospitals": "1", "malicious-fraction": 0.2}, "not both"),
        ({"attack": "scaling", "attack-schedule.on-rounds": "0"}, "on-rounds"),
        ({"attack": "scaling", "attack-schedule.on-rounds": "1", "attack-schedule.period": 2}, "not both"),
        ({"attack": "scaling", "attack-schedule.period": 2, "attack-schedule.on-for": 3}, "on-for"),
        ({"attack": "sybil", "sybil.base": "label-flip"}, "sybil.base"),
        ({"attack": "label-flip", "label-flip.mode": "sideways"}, "label-flip.mode"),
        ({"attack": "sign-flip", "scaling.gamma": 3.0}, "selected attack is 'sign-flip'"),
    ]
    for values, match in bad:
        with pytest.raises(ConfigError, match=match):
            parse_run_config(values)


def test_malicious_set():
    a = A.malicious_set(10, malicious_fraction=0.3, seed=1)
    assert len(a) == 3 and a == A.malicious_set(10, malicious_fraction=0.3, seed=1) and all(0 <= h < 10 for h in a)
    assert any(A.malicious_set(10, malicious_fraction=0.3, seed=s) != a for s in range(2, 8))
    assert len(A.malicious_set(5, malicious_fraction=0.01, seed=0)) == 1  # > 0 gives at least one
    assert A.malicious_set(10, seed=0) == frozenset()
    assert A.malicious_set(10, malicious_hospitals="0, 7", seed=0) == frozenset({0, 7})
    with pytest.raises(ValueError, match="out of range"):
        A.malicious_set(5, malicious_hospitals="5", seed=0)
    with pytest.raises(ValueError, match="no honest"):
        A.malicious_set(2, malicious_fraction=0.9, seed=0)


# ========================================================================= metrics
def test_backdoor_and_targeted_flip_success():
    true = np.array([0, 0, 1, 1, 2, 2])
    pred_trig = np.array([0, 0, 0, 1, 0, 0])  # target 0: of the 4 non-target images, 3 -> 0
    assert M.backdoor_success_rate(pred_trig, true, 0) == pytest.approx(0.75)
    assert math.isnan(M.backdoor_success_rate([0, 0], [0, 0], 0))
    pred = np.array([0, 1, 2, 1, 2, 1])  # source 1 -> target 2: 1 of 2
    assert M.targeted_flip_success(pred, true, 1, 2) == pytest.approx(0.5)
    assert math.isnan(M.targeted_flip_success(pred, true, 5, 2))
    with pytest.raises(ValueError):
        M.targeted_flip_success([0], [0, 1], 1, 2)


def test_detection_rates_hand_case():
    malicious = {"a": True, "b": True, "c": False, "d": False, "e": False}
    flagged = {"a": True, "b": False, "c": True, "d": False}  # e missing: not flagged
    r = M.detection_rates(flagged, malicious)
    assert (r["tp"], r["fp"], r["fn"], r["tn"]) == (1, 1, 1, 2)
    assert r["tpr"] == pytest.approx(0.5) and r["fpr"] == pytest.approx(1 / 3) and r["precision"] == pytest.approx(0.5)
    none_bad = M.detection_rates({}, {"x": False, "y": False})
    assert math.isnan(none_bad["tpr"]) and none_bad["fpr"] == 0.0 and math.isnan(none_bad["precision"])
    all_bad = M.detection_rates({1: True}, {1: True})
    assert all_bad["tpr"] == 1.0 and math.isnan(all_bad["fpr"])
    with pytest.raises(ValueError, match="not in the malicious map"):
        M.detection_rates({"z": True}, malicious)


def test_rounds_to_detection():
    malicious = {0: True, 1: True, 2: False}
    flags = [{0: False, 2: True}, {0: True}, {0: True, 1: False}]
    assert M.rounds_to_detection(flags, malicious) == {0: 2, 1: None}
    assert M.rounds_to_detection(flags, malicious, first_round=0) == {0: 1, 1: None}


def test_nan_update_is_all_nan():
    out = A.NonFinite().apply(torch.ones(4), server_round=1)
    assert out.shape == (4,) and bool(torch.isnan(out).all())

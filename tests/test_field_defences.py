"""The field's defences (issue 34): pre-aggregation steps and their chain, FLAME, FoolsGold, DnC,
SignGuard, clipped clustering, MDA, SMEA, MoNNA, CAF. Hand-computed cases, properties, and ByzFL
0.0.11 where it implements the same definition (within 1e-5)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from conftest import jitter
from hospitrust.aggregation import pre_aggregation as P
from hospitrust.aggregation.clipped_clustering import clipped_clustering
from hospitrust.aggregation.dnc import dnc, random_coordinates
from hospitrust.aggregation.flame import flame, flame_admitted
from hospitrust.aggregation.foolsgold import foolsgold, foolsgold_weights
from hospitrust.aggregation.signguard import sign_statistics, signguard
from hospitrust.aggregation.subset_rules import caf, mda, monna, smea

T = functools.partial(torch.tensor, dtype=torch.float64)


def close(a, b, atol=1e-9):  # float64
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=atol, rtol=0)


# ------------------------------------------------------------------ pre-aggregation, by hand
def test_nnm_hand():
    y, rec = P.nnm(T([[0.0], [1.0], [3.0], [10.0]]), 1)  # n - f = 3 neighbours, itself first
    close(y, [[4 / 3], [4 / 3], [4 / 3], [14 / 3]])
    assert rec.members == [[0, 1, 2], [1, 0, 2], [2, 1, 0], [3, 2, 1]]
    close(rec.mixing.sum(1), torch.ones(4))


def test_arc_hand():
    x = T([[3.0, 4.0], [0.0, 1.0], [0.0, 2.0], [6.0, 8.0]])  # norms 5, 1, 2, 10
    y, rec = P.arc(x, 1)  # k = floor(2 * 1 * 3 / 4) = 1: the largest clipped to 5
    close(y, [[3.0, 4.0], [0.0, 1.0], [0.0, 2.0], [3.0, 4.0]])
    assert rec.clipped == [3] and rec.threshold == 5.0 and rec.detail["num_clipped"] == 1
    y, rec = P.arc(x, 2)  # k = floor(2 * 2 * 2 / 4) = 2: the two largest clipped to 2
    close(y, [[1.2, 1.6], [0.0, 1.0], [0.0, 2.0], [1.2, 1.6]])
    close(rec.factors, [0.4, 1.0, 1.0, 0.2])
    assert P.arc_clip_count(10, 0) == 0 and P.arc_clip_count(10, 3) == 4  # floor(42 / 10)


def test_static_clipping_and_bucketing_hand():
    x = T([[3.0, 4.0], [0.0, 1.0], [0.0, 2.0], [6.0, 8.0]])
    y, rec = P.static_clipping(x, 2.0)
    close(rec.factors, [0.4, 1.0, 1.0, 0.2])
    assert rec.clipped == [0, 3]
    y, rec = P.bucketing(x, 2, permutation=[3, 0, 1, 2])
    close(y, [[4.5, 6.0], [0.0, 1.5]])
    assert rec.members == [[3, 0], [1, 2]]
    y, rec = P.bucketing(x, 3, permutation=[3, 0, 1, 2])  # the last bucket is smaller
    close(y, [[3.0, 13 / 3], [0.0, 2.0]])
    with pytest.raises(ValueError, match="permutation must hold every row index"):
        P.bucketing(x, 2, permutation=[0, 0, 1, 2])
    with pytest.raises(ValueError, match="bucket_size >= 1"):
        P.bucketing(x, 0)


def test_chain_is_the_steps_in_order_and_origin_traces_the_hospitals():
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[0] *= 20
    steps = [functools.partial(P.arc_mixing, f=2), functools.partial(P.nnm_mixing, f=2),
             functools.partial(P.bucketing_mixing, bucket_size=2, permutation=[8, 7, 6, 5, 4, 3, 2, 1, 0])]
    y, recs = P.chain(x, steps)
    step_by_step = P.bucketing(P.nnm(P.arc(x, 2)[0], 2)[0], 2, permutation=[8, 7, 6, 5, 4, 3, 2, 1, 0])[0]
    close(y, step_by_step, atol=1e-10)  # float64
    assert [r.step for r in recs] == ["arc", "nnm", "bucketing"] and y.shape == (5, 6)
    close(P.origin(recs) @ x, y, atol=1e-10)  # float64
    assert P.chain(x, [])[0] is x
    buf = torch.empty_like(y)
    assert P.chain(x, steps, out=buf)[0] is buf and P.nnm(x, 2, out=torch.empty_like(x))[0].shape == x.shape
    close(buf, y, atol=1e-10)  # float64
    with pytest.raises(ValueError, match="out must have shape"):
        P.arc(x, 2, out=buf)
    with pytest.raises(ValueError, match="f < n"):
        P.nnm(x, 9)


def test_nnm_is_permutation_equivariant():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    close(P.nnm(x[perm], 2)[0], P.nnm(x, 2)[0][perm], atol=1e-12)  # float64


# ------------------------------------------------------------------ rules, by hand
def test_mda_smea_monna_hand():
    x = T([[0.0], [1.0], [2.0], [10.0]])
    out, rec = mda(x, 1)
    close(out, [1.0])
    assert rec.detail["subset"] == [0, 1, 2] and rec.detail["diameter"] == pytest.approx(2.0) and rec.excluded == [3]
    out, rec = smea(x, 1)  # {0, 1, 2}: variance 2/3, the smallest of the four subsets
    close(out, [1.0])
    assert rec.detail["max_eigenvalue"] == pytest.approx(2 / 3)
    x = T([[0.0], [1.0], [5.0], [6.0]])
    close(monna(x, 1, trusted_index=2)[0], [4.0])  # 5, 6 and 1
    close(monna(x, 1, trusted_index=0)[0], [2.0])  # 0, 1 and 5


def test_caf_hand():
    # round 1: mu = 2.5, tau = (6.25, 6.25, 6.25, 56.25), c = (8/9, 8/9, 8/9, 0), sum 8/3 > 2;
    # round 2: mu = 0 with covariance 0: the smallest eigenvalue, so the result
    out, rec = caf(T([[0.0], [0.0], [0.0], [10.0]]), 1)
    close(out, [0.0])
    assert rec.detail["iterations"] == 2 and rec.excluded == [3]
    close(caf(T([[1.0, 2.0], [3.0, 4.0]]), 0)[0], [2.0, 3.0])  # f = 0: the mean


def test_subset_rules_refuse_what_they_cannot_do():
    x = torch.zeros(40, 2)
    with pytest.raises(ValueError, match=r"C\(40, 15\) = .* subsets, more than MAX_SUBSETS"):
        smea(x, 15)
    with pytest.raises(ValueError, match="2f < n"):
        mda(x[:4], 2)
    with pytest.raises(ValueError, match="trusted_index"):
        monna(x[:4], 1, trusted_index=4)


def test_flame_hand():
    x = T([[1.0, 0.0], [1.0, 0.1], [1.0, -0.1], [0.9, 0.0], [-5.0, 0.0]])
    out, rec = flame(x, noise_lambda=0.0)
    # the opposite update is HDBSCAN noise; the others' norms are at most the median norm (1.005)
    close(out, [0.975, 0.0])
    assert rec.excluded == [4] and rec.detail["labels"].tolist() == [0, 0, 0, 0, -1]
    assert rec.detail["clip_bound"] == pytest.approx(math.sqrt(1.01))


def test_flame_clusters_models_given_the_global_model_and_adds_noise_of_lambda_times_the_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20000, generator=g, dtype=torch.float64) * 0.01 + 0.05
    w = torch.randn(20000, generator=g, dtype=torch.float64)
    models = x + w
    cos = models @ models.T / (models.norm(dim=1)[:, None] * models.norm(dim=1)[None, :])
    _, rec = flame(x, global_model=w, noise_lambda=0.0)
    assert rec.detail["labels"].tolist() == flame_admitted(1.0 - cos)[1].tolist()
    plain = flame(x, noise_lambda=0.0)[0]
    noisy, rec = flame(x, noise_lambda=0.01, generator=torch.Generator().manual_seed(1))
    assert rec.detail["noise_std"] == pytest.approx(0.01 * rec.detail["clip_bound"])
    assert float((noisy - plain).std()) == pytest.approx(rec.detail["noise_std"], rel=0.03)


def test_foolsgold_hand_sybils_get_nothing():
    # two identical histories: cosine 1, learning rate 0; the third: alpha 1 -> 0.99 -> logit clipped to 1
    x = T([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    out, history, rec = foolsgold(x)
    close(rec.detail["learning_rates"], [0.0, 0.0, 1.0])
    close(out, [0.0, 1.0])
    close(history, x)


def test_foolsgold_pardoning_hand():
    h = T([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    parts = foolsgold_weights(h @ h.T)
    v = 1 / math.sqrt(1.01)  # cos(h0, h1); cos(h1, h2) = 0.1 v
    close(parts["max_similarity"], [v, v, 0.1 * v])
    close(parts["similarity"][2, 1], 0.1 * v * 0.1 * v / v)  # pardoned: times v_2 / v_1
    close(parts["similarity"][1, 2], 0.1 * v)  # not pardoned (v_2 < v_1)
    # alpha = 1 - max: (1 - v, 1 - v, 1 - 0.01 v) / max; logit(.005) + .5 < 0 -> 0
    close(parts["weights"], [0.0, 0.0, 1.0])


def test_foolsgold_history_is_state_in_and_out(input_jitter):
    x1, x2 = T([[1.0, 0.0], [0.0, 1.0]]), T([[0.0, 1.0], [1.0, 0.0]])
    x1, x2 = jitter(x1, input_jitter, seed=1), jitter(x2, input_jitter, seed=2)  # copies up to rounding are copies
    _, h1, _ = foolsgold(x1)
    out, h2, rec = foolsgold(x2, h1)
    close(h2, [[1.0, 1.0], [1.0, 1.0]], atol=1e-6)  # the histories now agree: both are Sybils
    close(rec.detail["learning_rates"], [0.0, 0.0])
    close(out, [0.0, 0.0])
    buf = h1.clone()
    assert foolsgold(x2, buf, out=buf)[1] is buf
    close(buf, h2)
    with pytest.raises(ValueError, match="history must have the updates' shape"):
        foolsgold(x2, torch.zeros(3, 2))


@pytest.mark.parametrize("cosine", [1.0 - 2.0 ** -52, 1.0, 1.0 + 2.0 ** -52])
def test_foolsgold_copies_get_zero_whatever_the_last_bit_of_their_cosine(cosine):
    """2 / (sqrt(2) sqrt(2)) is 0.9999999999999998 on one CPU and 1.0 on another: both, and one ulp above, give 0."""
    assert foolsgold_weights(T([[1.0, cosine], [cosine, 1.0]]))["weights"].tolist() == [0.0, 0.0]


def test_foolsgold_decides_a_copy_at_the_explicit_threshold():
    """alpha = 1 - cosine: just below ALPHA_ZERO it is a copy (weight 0), just above it a distinct client (after
    the rescaling by the largest, alpha = 1 -> 0.99, logit ln 99 + 0.5 > 1: weight 1)."""
    from hospitrust.aggregation.foolsgold import ALPHA_ZERO

    for alpha, weight in ((0.5 * ALPHA_ZERO, 0.0), (2.0 * ALPHA_ZERO, 1.0)):
        c = 1.0 - alpha
        got = foolsgold_weights(T([[1.0, c], [c, 1.0]]))["weights"]
        assert got.tolist() == [weight, weight], (alpha, got)


def test_dnc_hand():
    out, rec = dnc(T([[0.0], [1.0], [2.0], [10.0]]), 1)  # d = 1: the score is the squared deviation
    close(out, [1.0])
    close(rec.detail["scores"], [3.25 ** 2, 2.25 ** 2, 1.25 ** 2, 6.75 ** 2])
    out, rec = dnc(T([[1.0, 0.0], [1.1, 0.1], [0.9, -0.1], [5.0, 5.0]]), 1)
    close(out, [1.0, 0.0])
    assert rec.excluded == [3]
    idx = random_coordinates(1_000_000, 100, torch.Generator().manual_seed(0))
    assert idx.numel() == 100 and bool((idx[1:] > idx[:-1]).all())


def test_signguard_hand():
    x = T([[1, 1, 1, 1], [2, 1, 1, 1], [1, 1, 2, 1], [-1, -1, -1, -1], [30, 30, 30, 30]])
    # median norm sqrt(7): the last is 22.7x it (norm filter); the fourth has the other signs
    out, rec = signguard(x, coordinate_fraction=1.0)
    close(out, [4 / 3, 1.0, 4 / 3, 1.0])
    assert rec.excluded == [3, 4] and rec.detail["norm_ok"].tolist() == [True, True, True, True, False]
    close(sign_statistics(T([[1.0, 0.0, -2.0, 3.0]])), [[0.5, 0.25, 0.25]])


def test_clipped_clustering_hand():
    x = T([[1.0, 0.0], [2.0, 0.0], [1.5, 0.1], [-1.0, 0.0], [-1.0, 0.1]])
    out, history, rec = clipped_clustering(x)
    tau = math.sqrt(1.01)  # the median of the five norms
    norms = x.norm(dim=1)
    expected = (x[:3] * torch.clamp(tau / norms[:3], max=1.0)[:, None]).mean(0)
    close(out, expected)
    assert rec.excluded == [3, 4] and rec.detail["clip_bound"] == pytest.approx(tau)
    _, history2, rec2 = clipped_clustering(x, torch.full((6,), 10.0))  # median of 11 norms: 10
    assert history2.numel() == 11 and rec2.detail["clip_bound"] == pytest.approx(10.0)
    assert bool((rec2.detail["clip_factors"] == 1.0).all())


# ------------------------------------------------------------------ properties
def _honest_and_outliers(seed=0, n=9, f=2, d=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.1 + 1.0
    x[:f] = -20.0 * x[:f]
    return x, f


RULES = {
    "mda": lambda x, f: mda(x, f)[1],
    "smea": lambda x, f: smea(x, f)[1],
    "caf": lambda x, f: caf(x, f)[1],
    "monna": lambda x, f: monna(x, f, trusted_index=x.shape[0] - 1)[1],
    "dnc": lambda x, f: dnc(x, f)[1],
    "flame": lambda x, f: flame(x, noise_lambda=0.0)[1],
    "signguard": lambda x, f: signguard(x, coordinate_fraction=1.0)[1],
    "clipped_clustering": lambda x, f: clipped_clustering(x)[2],
    "foolsgold": lambda x, f: foolsgold(x)[2],
}


@pytest.mark.parametrize("name", [r for r in RULES if r not in ("foolsgold", "caf")])
def test_far_attackers_are_left_out(name):
    x, f = _honest_and_outliers()
    rec = RULES[name](x, f)
    assert not bool(rec.selected[:f].any()), name
    assert 0.9 < float(rec.weights.sum()) <= 1.0 + 1e-12  # below 1 where the rule clips


def test_caf_weights_far_attackers_to_nothing():
    x, f = _honest_and_outliers()
    rec = RULES["caf"](x, f)
    assert float(rec.weights[:f].sum()) < 1e-3


@pytest.mark.parametrize("name", ["mda", "smea", "caf", "dnc", "flame", "signguard", "clipped_clustering", "foolsgold"])
def test_permutation_invariant(name):
    x, f = _honest_and_outliers(seed=3)
    perm = torch.tensor([4, 8, 0, 2, 7, 1, 6, 3, 5])
    rule = {"mda": lambda x: mda(x, f)[0], "smea": lambda x: smea(x, f)[0], "caf": lambda x: caf(x, f)[0],
            "dnc": lambda x: dnc(x, f)[0], "flame": lambda x: flame(x, noise_lambda=0.0)[0],
            "signguard": lambda x: signguard(x, coordinate_fraction=1.0)[0],
            "clipped_clustering": lambda x: clipped_clustering(x)[0], "foolsgold": lambda x: foolsgold(x)[0]}[name]
    close(rule(x[perm]), rule(x), atol=1e-9)  # float64


def test_subset_rules_stay_in_the_honest_hull():
    x, f = _honest_and_outliers(seed=5)
    honest = x[f:]
    for out in (mda(x, f)[0], smea(x, f)[0], monna(x, f, trusted_index=8)[0]):
        # a mean of honest rows only: inside the honest coordinate range
        assert bool((out >= honest.min(0).values - 1e-12).all() and (out <= honest.max(0).values + 1e-12).all())


def test_rules_run_on_float32_and_return_its_dtype():
    x, f = _honest_and_outliers()
    x = x.float()
    for out in (mda(x, f)[0], smea(x, f)[0], caf(x, f)[0], flame(x)[0], foolsgold(x)[0], dnc(x, f)[0],
                signguard(x)[0], clipped_clustering(x)[0], P.chain(x, [functools.partial(P.nnm_mixing, f=f)])[0]):
        assert out.dtype == torch.float32


# ------------------------------------------------------------------ against ByzFL 0.0.11
# (the `byzfl` fixture, tests/conftest.py, imports it for the tests that compare with it)


def _data(seed, n=8, d=5, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * scale
    x[0] += 6.0
    x[1] *= 4.0
    return x


def _near(ours, theirs):
    torch.testing.assert_close(torch.as_tensor(ours).float(), torch.as_tensor(theirs).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("f", [1, 2, 3])
def test_pre_aggregation_and_subset_rules_match_byzfl(seed, f, input_jitter, byzfl):
    x = jitter(_data(seed), input_jitter, seed=seed)
    _near(P.nnm(x, f)[0], byzfl.NNM(f)(x.clone()))
    _near(P.arc(x, f)[0], byzfl.ARC(f)(x.clone()))
    _near(mda(x, f)[0], byzfl.MDA(f)(x.clone()))
    _near(monna(x, f, trusted_index=2)[0], byzfl.MoNNA(f, 2)(x.clone()))
    # SMEA and CAF: ByzFL's one random power-iteration step is exact in one dimension only
    x1 = x[:, :1].clone()
    _near(smea(x1, f)[0], byzfl.SMEA(f)(x1.clone()))
    _near(caf(x1, f)[0], byzfl.CAF(f)(x1.clone()))


def test_static_clipping_and_bucketing_match_byzfl(byzfl):
    x = _data(4)
    _near(P.static_clipping(x, 2.0)[0], byzfl.Clipping(2.0)(x.clone()))
    for seed in (0, 1, 2):
        ours = P.bucketing(x, 3, generator=torch.Generator().manual_seed(seed))[0]
        torch.manual_seed(seed)  # ByzFL draws the order from torch's global generator
        _near(ours, byzfl.Bucketing(3)(x.clone()))


def test_chain_matches_byzfl_pre_aggregators_in_order(byzfl):
    x = _data(5)
    ours = P.chain(x, [functools.partial(P.arc_mixing, f=2), functools.partial(P.nnm_mixing, f=2)])[0]
    _near(ours, byzfl.NNM(2)(byzfl.ARC(2)(x.clone())))

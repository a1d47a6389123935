"""Contribution math: hand-computed cases, the axioms, and the ground truth (exact Shapley)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hospitrust.contribution.scores import (
    coalition_values,
    coalition_weights,
    cosine_to_aggregate,
    everybody_else,
    fair_private,
    include_one_in,
    leave_one_out,
    marginals_from_table,
    multi_round_shapley,
    shapley_exact,
    shapley_monte_carlo,
    shapley_permutations,
    spearman,
)

# a 3-player game written out by hand: v({})=0, v(0)=4, v(1)=2, v(2)=0, v(01)=8, v(02)=4, v(12)=3, v(012)=9
GAME3 = np.array([0.0, 4.0, 2.0, 8.0, 0.0, 4.0, 3.0, 9.0])  # bitmask order: {}, 0, 1, 01, 2, 02, 12, 012


def _random_game(rng, n):
    return np.concatenate([[0.0], rng.normal(size=(1 << n) - 1)])


def _fp_ee_from_table(values):
    loo, ioi, delta = marginals_from_table(values)
    return fair_private(loo, ioi, delta), everybody_else(loo, ioi, np.full(loo.shape, delta))


# ---- hand-computed ----------------------------------------------------------------------------
def test_shapley_of_the_hand_game():
    # phi_0 = 1/3 (4-0) + 1/6 (8-2) + 1/6 (4-0) + 1/3 (9-3) = 4/3 + 1 + 2/3 + 2 = 5
    # phi_1 = 1/3 (2) + 1/6 (8-4) + 1/6 (3-0) + 1/3 (9-4) = 2/3 + 2/3 + 1/2 + 5/3 = 3.5
    # phi_2 = 1/3 (0) + 1/6 (4-4) + 1/6 (3-2) + 1/3 (9-8) = 0 + 0 + 1/6 + 1/3 = 0.5
    np.testing.assert_allclose(shapley_exact(GAME3), [5.0, 3.5, 0.5])


def test_loo_ioi_fp_ee_of_the_hand_game():
    loo, ioi, delta = marginals_from_table(GAME3)
    np.testing.assert_allclose(loo, [9 - 3, 9 - 4, 9 - 8])  # [6, 5, 1]
    np.testing.assert_allclose(ioi, [4, 2, 0])
    assert delta == 9
    np.testing.assert_allclose(leave_one_out(9.0, [3, 4, 8]), loo)
    np.testing.assert_allclose(include_one_in([4, 2, 0], 0.0), ioi)
    # m = [5, 3.5, 0.5], sum 9 = Delta: no residual, FP = m (= Shapley here)
    np.testing.assert_allclose(fair_private(loo, ioi, delta), [5.0, 3.5, 0.5])
    # EE_i = Delta - sum_{j != i} m_j with m = [5, 3.5, 0.5]: 9 - 4 = 5, 9 - 5.5 = 3.5, 9 - 8.5 = 0.5
    np.testing.assert_allclose(everybody_else(loo, ioi, [9, 9, 9]), [5.0, 3.5, 0.5])
    # each hospital's own reports do not enter its EE: with different gains reported,
    # EE_0 = mean(Delta_1, Delta_2) - (m_1 + m_2) = (8 + 10) / 2 - 4 = 5
    assert everybody_else(loo, ioi, [100.0, 8.0, 10.0])[0] == pytest.approx(5.0)


def test_fair_private_shares_the_residual_by_the_size_of_the_midpoint():
    # m = [(2+2)/2, (0+2)/2] = [2, 1]; Delta = 6: residual 3 shared 2:1 -> [4, 2]
    np.testing.assert_allclose(fair_private([2.0, 0.0], [2.0, 2.0], 6.0), [4.0, 2.0])
    # a negative midpoint takes its share of a positive residual by |m|: m = [2, -1], R = 2 - 1 = ... Delta 4
    # R = 4 - 1 = 3, |m| = [2, 1] -> [2 + 2, -1 + 1] = [4, 0]
    np.testing.assert_allclose(fair_private([2.0, -1.0], [2.0, -1.0], 4.0), [4.0, 0.0])


def test_with_two_hospitals_fp_and_ee_are_exactly_shapley():
    values = np.array([1.0, 3.0, 2.0, 7.0])  # {}, 0, 1, 01
    loo, ioi, delta = marginals_from_table(values)
    # Shapley: phi_0 = ((3 - 1) + (7 - 2)) / 2 = 3.5, phi_1 = ((2 - 1) + (7 - 3)) / 2 = 2.5
    np.testing.assert_allclose(shapley_exact(values), [3.5, 2.5])
    np.testing.assert_allclose(everybody_else(loo, ioi, [delta, delta]), [3.5, 2.5])
    np.testing.assert_allclose(fair_private(loo, ioi, delta), [3.5, 2.5])


def test_cosine():
    assert cosine_to_aggregate([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine_to_aggregate([0.0, 1.0], [2.0, 0.0]) == pytest.approx(0.0)
    assert cosine_to_aggregate([-1.0, 0.0], [2.0, 0.0]) == pytest.approx(-1.0)
    assert cosine_to_aggregate([0.0, 0.0], [2.0, 0.0]) == 0.0


def test_coalition_weights_renormalize_fedavg_weights():
    np.testing.assert_allclose(coalition_weights([0.5, 0.3, 0.2], 0b101), [0.5 / 0.7, 0.0, 0.2 / 0.7])
    np.testing.assert_allclose(coalition_weights([0.5, 0.3, 0.2], 0), [0.0, 0.0, 0.0])


def test_multi_round_shapley_sums_rounds():
    np.testing.assert_allclose(multi_round_shapley([[1.0, 2.0], [0.5, -1.0]]), [1.5, 1.0])
    np.testing.assert_allclose(multi_round_shapley([[1.0, 2.0], [0.5, -1.0]], [1.0, 2.0]), [2.0, 0.0])


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


# ---- axioms, on random games --------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_shapley_axioms_and_permutation_definition(n):
    rng = np.random.default_rng(n)
    values = _random_game(rng, n)
    phi = shapley_exact(values)
    assert phi.sum() == pytest.approx(values[-1] - values[0])  # efficiency
    if n <= 5:  # against the permutation definition
        brute = np.zeros(n)
        perms = list(itertools.permutations(range(n)))
        for p in perms:
            mask = 0
            for i in p:
                brute[i] += values[mask | (1 << i)] - values[mask]
                mask |= 1 << i
        np.testing.assert_allclose(phi, brute / len(perms))


@pytest.mark.parametrize("seed", range(20))
def test_fair_private_efficiency(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    values = _random_game(rng, n)
    fp, _ = _fp_ee_from_table(values)
    assert fp.sum() == pytest.approx(values[-1] - values[0])


def _game_with_null_player(rng, n, null):
    base = _random_game(rng, n - 1)  # a game of the other n-1 players
    values = np.zeros(1 << n)
    for mask in range(1 << n):
        rest = [(mask >> i) & 1 for i in range(n) if i != null]
        values[mask] = base[sum(b << k for k, b in enumerate(rest))]
    return values


@pytest.mark.parametrize("seed", range(10))
def test_fair_private_null_player_and_shapley_agree(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 8))
    null = int(rng.integers(n))
    values = _game_with_null_player(rng, n, null)
    fp, ee = _fp_ee_from_table(values)
    assert fp[null] == pytest.approx(0.0, abs=1e-12)  # float64
    assert shapley_exact(values)[null] == pytest.approx(0.0, abs=1e-12)  # float64


def test_everybody_else_gives_up_the_null_player_axiom():
    # v(S) = 1 if S holds at least one of players 0 and 1 (substitutes), player 2 is null.
    # LOO = [0, 0, 0], IOI = [1, 1, 0], m = [0.5, 0.5, 0], Delta = 1: EE_2 = 1 - 1 = 0 here...
    values = np.array([0, 1, 1, 1, 0, 1, 1, 1], dtype=float)
    fp, ee = _fp_ee_from_table(values)
    assert fp[2] == 0.0 and ee[2] == pytest.approx(0.0)
    # ... but with 3 of {0, 1, 2} needed of a 3-player core plus null player 3 (v = 1 iff 0,1,2
    # all in S): LOO = [1, 1, 1, 0], IOI = 0, m = [.5, .5, .5, 0], Delta = 1: EE_3 = 1 - 1.5 = -0.5
    values = coalition_values(4, lambda mask: float(mask & 0b0111 == 0b0111))
    fp, ee = _fp_ee_from_table(values)
    assert fp[3] == pytest.approx(0.0) and ee[3] == pytest.approx(-0.5)
    assert shapley_exact(values)[3] == pytest.approx(0.0)


def test_fair_private_when_every_marginal_is_zero_splits_equally():
    # 2-of-3 majority among players 0..2 plus a null player 3: every LOO and IOI is 0
    values = coalition_values(4, lambda mask: float(bin(mask & 0b0111).count("1") >= 2))
    loo, ioi, delta = marginals_from_table(values)
    assert not loo.any() and not ioi.any() and delta == 1.0
    np.testing.assert_allclose(fair_private(loo, ioi, delta), [0.25] * 4)  # efficiency kept, null player lost


def _symmetric_game(rng, n, i, k):
    values = _random_game(rng, n)
    for mask in range(1 << n):  # v(S) := v(swap_ik(S)) for every S, by averaging
        bi, bk = (mask >> i) & 1, (mask >> k) & 1
        swapped = (mask & ~((1 << i) | (1 << k))) | (bk << i) | (bi << k)
        if swapped > mask:
            avg = 0.5 * (values[mask] + values[swapped])
            values[mask] = values[swapped] = avg
    return values


@pytest.mark.parametrize("seed", range(10))
def test_symmetry_of_fp_ee_and_shapley(seed):
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(3, 8))
    i, k = rng.choice(n, size=2, replace=False)
    values = _symmetric_game(rng, n, int(i), int(k))
    fp, ee = _fp_ee_from_table(values)
    phi = shapley_exact(values)
    assert fp[i] == pytest.approx(fp[k]) and ee[i] == pytest.approx(ee[k]) and phi[i] == pytest.approx(phi[k])


@pytest.mark.parametrize("seed", range(10))
def test_additive_games_all_three_equal_shapley(seed):
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(2, 9))
    a = rng.normal(size=n)
    values = coalition_values(n, lambda mask: 0.7 + sum(a[i] for i in range(n) if (mask >> i) & 1))
    fp, ee = _fp_ee_from_table(values)
    np.testing.assert_allclose(shapley_exact(values), a, atol=1e-12)  # float64
    np.testing.assert_allclose(fp, a, atol=1e-12)  # float64
    np.testing.assert_allclose(ee, a, atol=1e-12)  # float64


@pytest.mark.parametrize("seed", range(10))
def test_everybody_else_ignores_what_the_hospital_itself_reports(seed):
    rng = np.random.default_rng(400 + seed)
    n = int(rng.integers(2, 10))
    loo, ioi, gain = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    honest = everybody_else(loo, ioi, gain)
    for i in range(n):
        lied_loo, lied_ioi, lied_gain = loo.copy(), ioi.copy(), gain.copy()
        lied_loo[i] += abs(rng.normal()) * 100
        lied_ioi[i] += abs(rng.normal()) * 100
        lied_gain[i] -= rng.normal() * 100
        lying = everybody_else(lied_loo, lied_ioi, lied_gain)
        assert lying[i] == pytest.approx(honest[i])  # its own score does not move
        # Fair-Private does move with its own reports (it rewards self-evaluation)
        assert fair_private(lied_loo, lied_ioi, gain.mean())[i] > fair_private(loo, ioi, gain.mean())[i]


# ---- bad input ----------------------------------------------------------------------------
def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="at least 2"):
        everybody_else([1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        fair_private([1.0, float("nan")], [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="expected 2"):
        fair_private([1.0, 2.0], [1.0], 1.0)
    with pytest.raises(ValueError, match="2\\^n entries"):
        shapley_exact([0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="n <= 16"):
        coalition_values(17, lambda m: 0.0)
    with pytest.raises(ValueError, match="same size"):
        cosine_to_aggregate([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        leave_one_out(1.0, [[1.0]])


# ---- Monte-Carlo Shapley (the n = 20 ground truth of benchmarks/contribution.py) ------------------
def test_monte_carlo_shapley_over_all_six_orders_of_the_hand_game_is_exact():
    orders = np.array(list(itertools.permutations(range(3))))
    masks = np.zeros((6, 4), dtype=np.int64)
    for k, order in enumerate(orders):
        for j, player in enumerate(order):
            masks[k, j + 1] = masks[k, j] | (1 << player)
    phi, stderr = shapley_monte_carlo(orders, GAME3[masks])
    np.testing.assert_allclose(phi, [5.0, 3.5, 0.5])
    # player 2's marginals in the six orders (012, 021, 102, 120, 201, 210), by hand: 1, 0, 1, 1, 0, 0:
    # mean 0.5, sample variance 6 x 0.25 / 5 = 0.3
    assert stderr[2] == pytest.approx(math.sqrt(0.3) / math.sqrt(6))


def test_permutation_masks_are_the_prefixes_of_each_order():
    orders, masks = shapley_permutations(4, 3, seed=1)
    for order, row in zip(orders, masks):
        assert row[0] == 0 and row[-1] == 0b1111
        assert [int(row[j + 1] ^ row[j]) for j in range(4)] == [1 << int(p) for p in order]


@pytest.mark.parametrize("seed", [0, 1])
def test_monte_carlo_shapley_is_efficient_and_converges_to_exact(seed):
    rng = np.random.default_rng(seed)
    values = _random_game(rng, 6)
    orders, masks = shapley_permutations(6, 4000, seed=seed)
    phi, stderr = shapley_monte_carlo(orders, values[masks])
    # every order's marginals sum to v(N) - v({}): efficiency holds exactly, sampled or not
    assert phi.sum() == pytest.approx(values[-1] - values[0])
    exact = shapley_exact(values)
    assert np.all(np.abs(phi - exact) < 5 * stderr + 1e-12)


def test_monte_carlo_shapley_refuses_mismatched_shapes():
    orders, masks = shapley_permutations(3, 2)
    with pytest.raises(ValueError, match="prefix values"):
        shapley_monte_carlo(orders, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="permutations"):
        shapley_permutations(3, 0)

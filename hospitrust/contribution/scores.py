r"""Contribution scores: pure math on scalars (no Flower, no model tensors).

Notation, for one round with players ``N = {0..n-1}`` (the hospitals whose updates were
aggregated): ``M0`` is the model the round started from, ``U_i`` hospital i's update and
``w_i`` its aggregation weight (FedAvg: ``n_i / sum n``), ``M = M0 + sum_i w_i U_i``. The model
of a coalition ``S`` is the same weighted mean over ``S`` only,
``M_S = M0 + sum_{i in S} w_i U_i / sum_{i in S} w_i`` (``M_{} = M0``), and ``v(S)`` is the
utility of ``M_S`` on a validation set (balanced accuracy or negative loss). So
``v(N) = v(M)``, ``v(N \ {i}) = v(M - U_i)`` (i's update left out and the rest re-weighted)
and ``v({i}) = v(M0 + U_i)``. ``Delta = v(N) - v({})`` is the round's total gain.

Leave-one-out and include-one-in::

    LOO_i = v(N) - v(N \ {i})            IOI_i = v({i}) - v({})

Both need one model only hospital i can build (it alone holds ``U_i``), so i evaluates
them itself; under secure aggregation the server receives the two scalars.

Fair-Private and Everybody-Else follow Jaramillo Velez, Biczok, Graell i Amat, Ostman and
Pejo, "Private and Robust Contribution Evaluation in Federated Learning",
arXiv:2602.21721 (2026). The paper's full text could not be retrieved when this was
written (only its abstract: FP satisfies the fairness axioms, EE removes self-evaluation,
both are computable under secure aggregation), so the normalizations below are this
project's own construction from those stated properties; each docstring says exactly
what is computed and why. Swap in the paper's formulas here if they differ: nothing else
depends on the internals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

MAX_EXACT_SHAPLEY_PLAYERS = 16  # 2^16 coalition models; the issue needs n <= 10


def _vector(name: str, values, n: int | None = None) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of per-hospital scalars, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries, expected {n} (one per hospital)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


def leave_one_out(v_full, v_without) -> np.ndarray:
    r"""``LOO_i = v(N) - v(N \ {i})``. ``v_full`` may be one scalar or one per evaluator.

    Parameters
    ----------
    v_full : float or array-like of float
        ``v(N)``: one value, or one per evaluating hospital.
    v_without : array-like of float
        ``v(N \ {i})`` per hospital.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 LOO scores.
    """
    v_without = _vector("v_without", v_without)
    v_full = np.broadcast_to(np.asarray(v_full, dtype=np.float64), v_without.shape)
    return _vector("v_full", v_full, v_without.shape[0]) - v_without


def include_one_in(v_alone, v_empty) -> np.ndarray:
    """``IOI_i = v({i}) - v({})``. ``v_empty`` may be one scalar or one per evaluator.

    Parameters
    ----------
    v_alone : array-like of float
        ``v({i})`` per hospital.
    v_empty : float or array-like of float
        ``v({})``: one value, or one per evaluating hospital.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 IOI scores.
    """
    v_alone = _vector("v_alone", v_alone)
    v_empty = np.broadcast_to(np.asarray(v_empty, dtype=np.float64), v_alone.shape)
    return v_alone - _vector("v_empty", v_empty, v_alone.shape[0])


def fair_private(loo, ioi, total_gain: float) -> np.ndarray:
    """Fair-Private: the LOO/IOI midpoint, made efficient by sharing the residual by |midpoint|.

    ``m_i = (LOO_i + IOI_i) / 2`` is the two-point (coalition size 0 and n-1) estimate of
    the Shapley value; it is exactly Shapley for n = 2 and for additive games. It is not
    efficient in general, so the residual ``R = Delta - sum_j m_j`` is shared in
    proportion to ``|m_i|``::

        FP_i = m_i + R * |m_i| / sum_j |m_j|

    Axioms: efficiency (``sum FP = Delta``) by construction; null player (``LOO_i = IOI_i
    = 0`` gives ``m_i = 0``, so ``FP_i = 0``); symmetry (interchangeable players have equal
    LOO and IOI, hence equal FP). Why the |m| share and not a plain rescaling
    ``Delta * m_i / sum m``: the rescaling has the same axioms but divides by a signed sum
    that can be near zero (a round where a flipper's negative marginals cancel the honest
    ones), which blows scores up and flips their sign; ``sum |m|`` only vanishes when every
    marginal is zero. In that last case no player can be told apart from a null player and
    ``Delta`` is split equally: efficiency is kept, and null player holds only when some
    hospital has a nonzero midpoint (it fails e.g. for a 3-of-4 majority game, where every
    LOO and IOI is 0 but ``Delta`` = 1).

    Parameters
    ----------
    loo : array-like of float
        ``LOO_i`` per hospital.
    ioi : array-like of float
        ``IOI_i`` per hospital, same length.
    total_gain : float
        ``Delta``, the round's total gain (finite).

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 FP scores summing to ``Delta``.
    """
    loo = _vector("loo", loo)
    ioi = _vector("ioi", ioi, loo.shape[0])
    if not math.isfinite(total_gain):
        raise ValueError(f"total_gain must be finite, got {total_gain}")
    n = loo.shape[0]
    if n == 0:
        return np.zeros(0)
    mid = 0.5 * (loo + ioi)
    residual = float(total_gain) - float(mid.sum())
    mass = np.abs(mid)
    total_mass = float(mass.sum())
    if total_mass <= 1e-15:
        return np.full(n, float(total_gain) / n)
    return mid + residual * mass / total_mass


def everybody_else(loo_reported, ioi_reported, gain_reported) -> np.ndarray:
    r"""Everybody-Else: hospital i's score from the other hospitals' reports only.

    Hospital j reports its own ``LOO_j = v_j(N) - v_j(N \ {j})``, ``IOI_j = v_j({j}) -
    v_j({})`` and the round's gain on its validation set ``Delta_j = v_j(N) - v_j({})``: all
    evaluations of models j can build itself. With ``m_j = (LOO_j + IOI_j) / 2``, j's own
    two-point Shapley estimate (the Fair-Private midpoint)::

        EE_i = mean_{j != i} Delta_j - sum_{j != i} m_j

    i.e. what the round gained minus what everybody else's evaluations say they were
    responsible for; it is Shapley's efficiency ``phi_i = Delta - sum_{j != i} phi_j`` with
    the others' own estimates in place of ``phi_j``. It is exactly Shapley for n = 2 and for
    additive games (``v(S) = v({}) + sum_{k in S} a_k``). With honest reports it equals
    ``m_i + (Delta - sum_j m_j)``: the midpoint plus the whole residual.

    No entry ``[i]`` of the reports enters ``EE_i``, so hospital i cannot move its own score
    by what it reports (only the others'). It keeps symmetry and gives up the null-player
    axiom on purpose: a null hospital gets the residual ``Delta - sum_{j != i} m_j``, not 0
    (and it is not efficient: any efficiency rescaling over all hospitals would bring i's
    own reports back into ``EE_i``). Why the midpoint and not the others' LOO alone: with one
    common evaluator ``Delta - sum_{j != i} LOO_j`` is LOO plus a per-round constant, so it
    ranks hospitals exactly as LOO does and inherits LOO's blindness to substitutes
    (measured in benchmarks/contribution.py). Needs n >= 2.

    Parameters
    ----------
    loo_reported : array-like of float
        ``LOO_j`` as each hospital reports it.
    ioi_reported : array-like of float
        ``IOI_j`` as each hospital reports it, same length.
    gain_reported : array-like of float
        ``Delta_j``, the round's gain on each hospital's validation set, same length.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 EE scores.
    """
    loo = _vector("loo_reported", loo_reported)
    ioi = _vector("ioi_reported", ioi_reported, loo.shape[0])
    gain = _vector("gain_reported", gain_reported, loo.shape[0])
    n = loo.shape[0]
    if n < 2:
        raise ValueError(f"everybody-else needs at least 2 hospitals in the round (the others' reports), got {n}")
    mid = 0.5 * (loo + ioi)
    others_gain = (gain.sum() - gain) / (n - 1)
    others_mid = mid.sum() - mid
    return others_gain - others_mid


def _published_marginal(loo: np.ndarray, ioi: np.ndarray, loo_weight: float) -> np.ndarray:
    if not 0.0 <= loo_weight <= 1.0:
        raise ValueError(f"loo_weight must be in [0, 1], got {loo_weight}")
    return loo_weight * loo + (1.0 - loo_weight) * ioi


def _share_out(raw: np.ndarray, total_gain: float) -> np.ndarray:
    """``Delta * raw_i / sum_j raw_j``; ``Delta / n`` each when the sum vanishes (so efficiency holds)."""
    total = float(raw.sum())
    if abs(total) <= 1e-15:
        return np.full(raw.shape[0], float(total_gain) / raw.shape[0])
    return float(total_gain) * raw / total


def fair_private_published(loo, ioi, total_gain: float, loo_weight: float = 0.5) -> np.ndarray:
    r"""Fair-Private as described: a weighted average of LOO and IOI, normalized so the scores sum to
    the total value::

        phi_i = lambda LOO_i + (1 - lambda) IOI_i          FP_i = Delta phi_i / sum_j phi_j

    ``lambda`` = ``loo_weight``. Efficiency (``sum FP = Delta``), null player (``LOO_i = IOI_i = 0``
    gives ``phi_i = 0``, so ``FP_i = 0``, whenever some ``phi_j != 0``) and symmetry hold by
    construction. The paper's text could not be read here, so the weight is an option; 1/2 by default.
    When ``sum phi = 0`` (every marginal zero, or positive and negative ones cancelling) ``Delta`` is
    split equally. :func:`fair_private` (hospitrust's ``fp``) shares only the residual
    ``Delta - sum phi``, in proportion to ``|phi|``, because the signed sum here can be near zero and
    then blows the scores up and flips their sign.

    Parameters
    ----------
    loo : array-like of float
        ``LOO_i`` per hospital.
    ioi : array-like of float
        ``IOI_i`` per hospital, same length.
    total_gain : float
        ``Delta``, the round's total gain (finite).
    loo_weight : float
        ``lambda`` in [0, 1], the weight of LOO (IOI gets ``1 - lambda``).

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 scores summing to ``Delta``.
    """
    loo = _vector("loo", loo)
    ioi = _vector("ioi", ioi, loo.shape[0])
    if not math.isfinite(total_gain):
        raise ValueError(f"total_gain must be finite, got {total_gain}")
    if loo.shape[0] == 0:
        return np.zeros(0)
    return _share_out(_published_marginal(loo, ioi, loo_weight), total_gain)


def everybody_else_published(loo_reported, ioi_reported, gain_reported, loo_weight: float = 0.5) -> np.ndarray:
    r"""Everybody-Else as described: hospital i scored by the normalized mean of what the other
    hospitals' own evaluations say about everybody else.

    Hospital j evaluates its own marginal contribution ``phi_j = lambda LOO_j + (1 - lambda) IOI_j``
    and the round's gain ``Delta_j`` on its validation set; what it does not claim for itself,
    ``r_j = Delta_j - phi_j``, it credits to everybody else, i among them. Then::

        EE_i = Delta r_bar_i / sum_k r_bar_k,     r_bar_i = mean_{j != i} r_j,     Delta = mean_j Delta_j

    so the scores sum to ``Delta`` (efficiency). No report of i enters ``r_bar_i``; i's reports reach
    its score only through the common factor ``Delta / sum_k r_bar_k`` (``sum_k r_bar_k = sum_j r_j``)
    and through the others' ``r_bar_k``. Symmetric; not null player (a null hospital gets the others'
    credit). With one common evaluator ``r_bar_i = Delta - (sum_j phi_j - phi_i) / (n - 1)``, which
    ranks hospitals as ``phi`` does. :func:`everybody_else` (hospitrust's ``ee``) is the unnormalized
    ``mean_{j != i} Delta_j - sum_{j != i} m_j`` (not efficient). When ``sum_k r_bar_k = 0`` Delta is
    split equally. Needs n >= 2.

    Parameters
    ----------
    loo_reported : array-like of float
        ``LOO_j`` as each hospital reports it.
    ioi_reported : array-like of float
        ``IOI_j`` as each hospital reports it, same length.
    gain_reported : array-like of float
        ``Delta_j``, the round's gain on each hospital's validation set, same length.
    loo_weight : float
        ``lambda`` in [0, 1], the weight of LOO in each hospital's own marginal.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 scores summing to ``mean_j Delta_j``.
    """
    loo = _vector("loo_reported", loo_reported)
    ioi = _vector("ioi_reported", ioi_reported, loo.shape[0])
    gain = _vector("gain_reported", gain_reported, loo.shape[0])
    n = loo.shape[0]
    if n < 2:
        raise ValueError(f"everybody-else needs at least 2 hospitals in the round (the others' reports), got {n}")
    credit = gain - _published_marginal(loo, ioi, loo_weight)
    others = (credit.sum() - credit) / (n - 1)
    return _share_out(others, float(gain.mean()))


def cosine_to_aggregate(update, aggregate) -> float:
    """COS baseline: cosine similarity of one update with the aggregate update ``M - M0``.

    Hospital i computes it itself (it holds ``U_i`` and ``M - M0``); 0 for a zero vector.

    Parameters
    ----------
    update : array-like of float
        The hospital's update ``U_i`` (flattened).
    aggregate : array-like of float
        The aggregate update ``M - M0``, same size.

    Returns
    -------
    float
        The cosine in [-1, 1].
    """
    u = np.asarray(update, dtype=np.float64).reshape(-1)
    g = np.asarray(aggregate, dtype=np.float64).reshape(-1)
    if u.shape != g.shape:
        raise ValueError(f"update and aggregate must have the same size, got {u.size} and {g.size}")
    nu, ng = float(np.linalg.norm(u)), float(np.linalg.norm(g))
    if nu == 0.0 or ng == 0.0:
        return 0.0
    return float(np.dot(u, g) / (nu * ng))


# ---- ground truth: exact Shapley over all 2^n coalition models -----------------------------
def coalition_weights(weights, mask: int) -> np.ndarray:
    """Aggregation weights of coalition ``mask`` (bit i = hospital i), renormalized to sum 1.

    Parameters
    ----------
    weights : array-like of float
        Every hospital's aggregation weight ``w_i``.
    mask : int
        The coalition ``S`` as a bitmask.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64: the members' weights over their sum, 0 for the others (all 0 for the
        empty coalition).
    """
    w = _vector("weights", weights)
    members = np.array([(mask >> i) & 1 for i in range(w.shape[0])], dtype=bool)
    out = np.where(members, w, 0.0)
    total = out.sum()
    if not members.any():
        return out
    if total <= 0:
        raise ValueError(f"coalition {mask:#b} has non-positive total weight {total}")
    return out / total


def coalition_values(n: int, value_of: Callable[[int], float]) -> np.ndarray:
    """``v(S)`` for every coalition, indexed by bitmask (bit i = hospital i); ``value_of(0)`` is v({}).

    Parameters
    ----------
    n : int
        The number of hospitals, ``1 <= n <= MAX_EXACT_SHAPLEY_PLAYERS``.
    value_of : Callable[[int], float]
        ``v(S)`` of a coalition bitmask.

    Returns
    -------
    numpy.ndarray
        ``(2^n,)`` float64 values, indexed by bitmask.
    """
    if not 1 <= n <= MAX_EXACT_SHAPLEY_PLAYERS:
        raise ValueError(f"exact Shapley needs 1 <= n <= {MAX_EXACT_SHAPLEY_PLAYERS} hospitals (2^n models), got {n}")
    values = np.array([float(value_of(mask)) for mask in range(1 << n)], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("coalition values must be finite")
    return values


def _n_from_table(values: np.ndarray) -> int:
    size = values.shape[0]
    n = size.bit_length() - 1
    if size < 2 or (1 << n) != size:
        raise ValueError(f"a coalition value table has 2^n entries, got {size}")
    return n


def shapley_exact(values) -> np.ndarray:
    """Exact Shapley value from the ``2^n`` table of ``v(S)`` (bitmask-indexed)::

    phi_i = sum_{S not containing i} |S|! (n - |S| - 1)! / n! * (v(S + i) - v(S))

    Parameters
    ----------
    values : array-like of float
        The ``2^n`` coalition values ``v(S)``, indexed by bitmask (:func:`coalition_values`).

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 Shapley values.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    n = _n_from_table(values)
    if n > MAX_EXACT_SHAPLEY_PLAYERS:
        raise ValueError(f"exact Shapley needs n <= {MAX_EXACT_SHAPLEY_PLAYERS}, got {n}")
    masks = np.arange(1 << n)
    sizes = np.array([bin(m).count("1") for m in masks])
    coef = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) if s < n else 0.0
                     for s in range(n + 1)])
    phi = np.zeros(n)
    for i in range(n):
        without = masks[(masks >> i) & 1 == 0]
        phi[i] = float(np.sum(coef[sizes[without]] * (values[without | (1 << i)] - values[without])))
    return phi


def shapley_permutations(n: int, permutations: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random orders of ``n`` players for :func:`shapley_monte_carlo`, and the coalition masks
    their prefixes form.

    Parameters
    ----------
    n : int
        Players (at most 62: a coalition is an int64 bitmask).
    permutations : int
        Orders to draw.
    seed : int
        Seed of the draw.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        ``(permutations, n)`` orders and ``(permutations, n + 1)`` masks, where ``masks[k, j]`` is
        the coalition of the first ``j`` players of order ``k`` (``masks[k, 0] = 0``).
    """
    if not 1 <= n <= 62 or permutations < 1:
        raise ValueError(f"Monte-Carlo Shapley needs 1 <= n <= 62 and permutations >= 1, got n={n}, permutations={permutations}")
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(n) for _ in range(permutations)])
    masks = np.zeros((permutations, n + 1), dtype=np.int64)
    masks[:, 1:] = np.cumsum(np.left_shift(np.int64(1), orders.astype(np.int64)), axis=1)
    return orders, masks


def shapley_monte_carlo(orders: np.ndarray, prefix_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Permutation-sampling Shapley (Castro et al. 2009): player i's value is the mean over the
    sampled orders of ``v(prefix + i) - v(prefix)``; unbiased, with the standard error of that mean.

    Parameters
    ----------
    orders : numpy.ndarray
        ``(P, n)`` sampled orders (:func:`shapley_permutations`).
    prefix_values : numpy.ndarray
        ``(P, n + 1)``: ``v`` of each order's prefixes, the empty coalition first.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        ``(n,)`` estimates and ``(n,)`` standard errors (0 with a single order).
    """
    orders = np.asarray(orders)
    values = np.asarray(prefix_values, dtype=np.float64)
    p, n = orders.shape
    if values.shape != (p, n + 1):
        raise ValueError(f"prefix values must be (orders, n + 1) = {(p, n + 1)}, got {values.shape}")
    marginal = np.zeros((p, n))
    np.put_along_axis(marginal, orders, np.diff(values, axis=1), axis=1)
    stderr = marginal.std(axis=0, ddof=1) / np.sqrt(p) if p > 1 else np.zeros(n)
    return marginal.mean(axis=0), stderr


def marginals_from_table(values) -> tuple[np.ndarray, np.ndarray, float]:
    """(LOO, IOI, Delta) of every player from a coalition value table (one common evaluator).

    Parameters
    ----------
    values : array-like of float
        The ``2^n`` coalition values ``v(S)``, indexed by bitmask.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray, float]
        ``(n,)`` LOO, ``(n,)`` IOI and ``Delta = v(N) - v({})``.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    n = _n_from_table(values)
    full = (1 << n) - 1
    loo = np.array([values[full] - values[full & ~(1 << i)] for i in range(n)])
    ioi = np.array([values[1 << i] - values[0] for i in range(n)])
    return loo, ioi, float(values[full] - values[0])


def multi_round_shapley(per_round: Sequence[Sequence[float]], round_weights: Sequence[float] | None = None) -> np.ndarray:
    """Multi-round Shapley: the (optionally weighted) sum over rounds of each round's exact
    Shapley value (the per-round reconstruction of Song et al., "Profit allocation for
    federated learning", IEEE BigData 2019). Rows are rounds, columns hospitals (a hospital
    absent from a round scores 0 there).

    Parameters
    ----------
    per_round : Sequence[Sequence[float]]
        ``(rounds, hospitals)`` table of each round's Shapley values.
    round_weights : Sequence[float] or None
        One weight per round; None: a plain sum.

    Returns
    -------
    numpy.ndarray
        ``(hospitals,)`` float64 totals.
    """
    table = np.asarray(per_round, dtype=np.float64)
    if table.ndim != 2:
        raise ValueError(f"per-round Shapley values must be a (rounds, hospitals) table, got shape {table.shape}")
    if round_weights is None:
        return table.sum(axis=0)
    rw = _vector("round_weights", round_weights, table.shape[0])
    return (rw[:, None] * table).sum(axis=0)


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties); nan when either side is constant.

    Parameters
    ----------
    a : array-like of float
        1-D sample.
    b : array-like of float
        1-D sample, same length.

    Returns
    -------
    float
        The rank correlation in [-1, 1], or NaN.
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"spearman needs two 1-D arrays of the same length, got {a.shape} and {b.shape}")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)

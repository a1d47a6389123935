"""Rules that average a subset of the updates chosen from their Gram matrix: MDA, SMEA, MoNNA
and CAF (the ByzFL family). One pass over the data for the Gram matrix (or the distances to a
trusted row), the choice on ``(n, n)`` numbers, one weighted sum of the rows: two passes.
"""

from __future__ import annotations

import itertools
import math

import torch

from ._validation import check_f, check_updates, check_vector
from .kernels import gram, row_distances, weighted_row_sum
from .records import RuleRecord

__all__ = ["MAX_SUBSETS", "mda", "smea", "monna", "monna_around", "caf"]

#: Most subsets MDA and SMEA enumerate (C(n, f)); beyond, they refuse rather than run for hours.
MAX_SUBSETS = 200_000
#: Subsets scored per batch (bounds the memory of the batched eigenvalue and diameter passes).
SUBSET_BATCH = 4096


def _check_half(n: int, f: int, rule: str) -> int:
    f = check_f(f)
    if 2 * f >= n:
        raise ValueError(f"{rule} requires 2f < n; got n={n}, f={f}")
    return f


def _subsets(n: int, f: int, rule: str):
    total = math.comb(n, f)
    if total > MAX_SUBSETS:
        raise ValueError(f"{rule} enumerates every subset of n - f = {n - f} of the n = {n} updates: "
                         f"C({n}, {f}) = {total} subsets, more than MAX_SUBSETS = {MAX_SUBSETS}; "
                         f"use a smaller f or another rule")
    it = itertools.combinations(range(n), n - f)
    while True:
        batch = list(itertools.islice(it, SUBSET_BATCH))
        if not batch:
            return
        yield torch.tensor(batch, dtype=torch.long)


def _record(n: int, chosen: list[int], detail: dict) -> tuple[torch.Tensor, RuleRecord]:
    w = torch.zeros(n, dtype=torch.float64)
    w[chosen] = 1.0 / len(chosen)
    return w, RuleRecord(w > 0, w, detail)


def mda(x: torch.Tensor, f: int) -> tuple[torch.Tensor, RuleRecord]:
    r"""Minimum-diameter averaging: the mean of the ``n - f`` updates with the smallest diameter.

    .. math:: S^\star = \arg\min_{|S| = n - f} \max_{i, j \in S} \lVert x_i - x_j\rVert,\qquad
              \mathrm{MDA}(x) = \frac{1}{n - f}\sum_{i \in S^\star} x_i

    El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in
    Byzantium", ICML 2018 (after Rousseeuw's minimum-volume estimators, 1985); ByzFL ``MDA``.
    Every subset is enumerated (C(n, f) of them, at most ``MAX_SUBSETS``); ties go to the first
    subset in lexicographic order, as ByzFL's strict comparison does.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``2f < n``.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record (``detail``: ``subset``, ``diameter``).
    """
    n, _ = check_updates(x)
    f = _check_half(n, f, "mda")
    g = gram(x).cpu()
    diag = torch.diagonal(g)
    dist = (diag[:, None] + diag[None, :] - 2.0 * g).clamp_min(0.0).sqrt()
    best, best_subset = math.inf, list(range(n - f))
    for idx in _subsets(n, f, "mda"):
        diam = dist[idx[:, :, None], idx[:, None, :]].flatten(1).amax(1)
        i = int(torch.argmin(diam))  # first minimum in this batch
        if float(diam[i]) < best:
            best, best_subset = float(diam[i]), idx[i].tolist()
    w, rec = _record(n, best_subset, {"subset": best_subset, "diameter": best})
    return weighted_row_sum(x, w), rec


def smea(x: torch.Tensor, f: int) -> tuple[torch.Tensor, RuleRecord]:
    r"""Smallest maximum eigenvalue averaging: the mean of the ``n - f`` updates whose empirical
    covariance has the smallest largest eigenvalue.

    .. math:: S^\star = \arg\min_{|S| = n - f} \lambda_{\max}\Bigl(\frac{1}{|S|}\sum_{i \in S}
              (x_i - \mu_S)(x_i - \mu_S)^\top\Bigr),\qquad
              \mathrm{SMEA}(x) = \mu_{S^\star}

    Allouah, Guerraoui, Gupta, Pinot, Stephan, "On the Privacy-Robustness-Utility Trilemma in
    Distributed Learning", ICML 2023; ByzFL ``SMEA``. The non-zero eigenvalues of the covariance
    are those of the centred Gram matrix :math:`C G_{SS} C / |S|` (:math:`C = I - \mathbf 1
    \mathbf 1^\top / |S|`), so each subset costs an ``(n-f, n-f)`` symmetric eigenvalue problem,
    exact. ByzFL instead estimates :math:`\lambda_{\max}` with one power-iteration step from a
    random vector, a random lower bound that can pick another subset; in one dimension both are
    exact (the test against ByzFL runs there). Ties: the first subset in lexicographic order.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``2f < n``; C(n, f) at most ``MAX_SUBSETS``.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record (``detail``: ``subset``, ``max_eigenvalue``).
    """
    n, _ = check_updates(x)
    f = _check_half(n, f, "smea")
    g = gram(x).cpu()
    m = n - f
    center = torch.eye(m, dtype=torch.float64) - 1.0 / m
    best, best_subset = math.inf, list(range(m))
    for idx in _subsets(n, f, "smea"):
        sub = g[idx[:, :, None], idx[:, None, :]]
        lam = torch.linalg.eigvalsh(center @ sub @ center)[:, -1] / m
        i = int(torch.argmin(lam))
        if float(lam[i]) < best:
            best, best_subset = float(lam[i]), idx[i].tolist()
    w, rec = _record(n, best_subset, {"subset": best_subset, "max_eigenvalue": best})
    return weighted_row_sum(x, w), rec


def monna(x: torch.Tensor, f: int, trusted_index: int = 0) -> tuple[torch.Tensor, RuleRecord]:
    r"""MoNNA: the mean of the ``n - f`` updates nearest to a trusted one.

    .. math:: \mathrm{MoNNA}(x) = \frac{1}{n - f}\sum_{i \in N_t} x_i,\qquad
              N_t = \text{the } n - f \text{ rows nearest to } x_t

    Farhadkhani, Guerraoui, Gupta, Hoang, Pinot, Stephan, "Robust Collaborative Learning with
    Linear Gradient Overhead", ICML 2023; ByzFL ``MoNNA`` (``idx`` there). The trusted row is
    its own nearest neighbour; ties in distance go to the lower index.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``2f < n``.
    trusted_index : int
        Row of the trusted update ``t`` (e.g. the server's own, stacked with the others).

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record (``detail``: ``distances`` to the trusted row).
    """
    n, _ = check_updates(x)
    f = _check_half(n, f, "monna")
    if isinstance(trusted_index, bool) or not isinstance(trusted_index, int) or not 0 <= trusted_index < n:
        raise ValueError(f"monna requires 0 <= trusted_index < n = {n}; got {trusted_index!r}")
    dist = row_distances(x, x[trusted_index]).cpu()
    dist[trusted_index] = -1.0
    chosen = torch.sort(dist, stable=True).indices[: n - f].tolist()
    dist[trusted_index] = 0.0
    w, rec = _record(n, chosen, {"distances": dist})
    return weighted_row_sum(x, w), rec


def monna_around(x: torch.Tensor, trusted: torch.Tensor, f: int) -> tuple[torch.Tensor, RuleRecord]:
    r"""MoNNA with the trusted vector apart from the stack (the server's own update): the mean of
    ``trusted`` and the ``n - f`` rows of ``x`` nearest to it.

    The same as :func:`monna` on ``x`` with ``trusted`` stacked on top as row 0 (``n + 1`` rows,
    ``2f < n + 1``), without the copy of the stack that stacking costs. Ties in distance go to the
    lower index.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    trusted : torch.Tensor
        ``(d,)`` the trusted update.
    f : int
        Assumed number of Byzantine updates among the ``n + 1``, ``2f < n + 1``.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record of the rows of ``x`` (``weights`` sum to
        ``(n - f) / (n + 1 - f)``; ``detail``: ``distances`` to ``trusted``, ``trusted_weight``
        ``1 / (n + 1 - f)``).
    """
    n, d = check_updates(x)
    f = _check_half(n + 1, f, "monna")
    v = check_vector(trusted, d, "trusted", x).to(x.dtype)
    dist = row_distances(x, v).cpu()
    chosen = torch.sort(dist, stable=True).indices[: n - f].tolist()
    share = 1.0 / (n + 1 - f)
    w = torch.zeros(n, dtype=torch.float64)
    w[chosen] = share
    out = weighted_row_sum(x, w) + v * share
    return out, RuleRecord(w > 0, w, {"distances": dist, "trusted_weight": share})


def _top_eigen(h: torch.Tensor, c: torch.Tensor) -> tuple[float, torch.Tensor]:
    r"""Largest eigenvalue of the weighted covariance and every row's projection on its eigenvector.

    ``h`` is the Gram matrix of the rows centred on the weighted mean, ``c`` the weights: the
    covariance :math:`\Sigma = \sum_i c_i u_i u_i^\top / \sum c` shares its non-zero spectrum
    with :math:`D^{1/2} H D^{1/2} / \sum c`; for its eigenvector :math:`a`,
    :math:`v \propto \sum_j \sqrt{c_j} a_j u_j` and :math:`u_i \cdot v = (H D^{1/2} a)_i / \sqrt{\lambda \sum c}`.
    """
    total = float(c.sum())
    root = c.clamp_min(0.0).sqrt()
    vals, vecs = torch.linalg.eigh(root[:, None] * h * root[None, :] / total)
    lam, a = float(vals[-1]), vecs[:, -1]
    if lam <= 0:
        return 0.0, torch.zeros_like(c)
    return lam, (h @ (root * a)) / math.sqrt(lam * total)


def caf(x: torch.Tensor, f: int) -> tuple[torch.Tensor, RuleRecord]:
    r"""Covariance-bound agnostic filter (CAF): down-weight the updates along the covariance's top
    eigenvector until the weights sum to ``n - 2f``; return the weighted mean whose covariance
    had the smallest top eigenvalue.

    Start with :math:`c_i = 1`. While :math:`\sum_i c_i > n - 2f`:
    :math:`\mu_c = \sum_i c_i x_i / \sum_i c_i`,
    :math:`\Sigma_c = \sum_i c_i (x_i - \mu_c)(x_i - \mu_c)^\top / \sum_i c_i` with top
    eigenpair :math:`(\lambda, v)`, keep :math:`\mu_c` if :math:`\lambda` is the smallest so far,
    :math:`\tau_i = ((x_i - \mu_c)^\top v)^2`, :math:`c_i \leftarrow c_i (1 - \tau_i / \max_j \tau_j)`.

    Allouah, Guerraoui, Stephan, "Towards Trustworthy Federated Learning with Untrusted
    Participants", ICML 2025; ByzFL ``CAF``. Everything runs on the Gram matrix (the exact top
    eigenpair of the ``(n, n)`` weighted centred Gram matrix); ByzFL uses one power-iteration step
    from a random vector, exact only in one dimension (where the test against ByzFL runs).
    Edge cases ByzFL leaves open: f = 0 (the loop never runs; ByzFL returns None) gives the
    mean, and a covariance of zero (all updates equal along every direction) stops with its mean.
    As in ByzFL the largest :math:`\tau_j` runs over every update, weight 0 included: once far
    outliers are at 0 the others shrink slowly (thousands of iterations, all on ``(n, n)`` numbers).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``2f < n``.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record (``weights``: the chosen :math:`c / \sum c`;
        ``detail``: ``max_eigenvalue``, ``iterations``).
    """
    n, _ = check_updates(x)
    f = _check_half(n, f, "caf")
    g = gram(x).cpu()
    c = torch.ones(n, dtype=torch.float64)
    best_lam, best_w = math.inf, c / n
    iterations = 0
    while float(c.sum()) > n - 2 * f:
        iterations += 1
        w = c / c.sum()
        centre = torch.eye(n, dtype=torch.float64) - w[None, :]  # row i: e_i - w
        h = centre @ g @ centre.T
        lam, proj = _top_eigen(h, c)
        if lam < best_lam:
            best_lam, best_w = lam, w
        tau = proj.square()
        if lam <= 0 or float(tau.max()) <= 0:
            break
        c = c * (1.0 - tau / tau.max())
    rec = RuleRecord(best_w > 0, best_w, {"max_eigenvalue": 0.0 if best_lam == math.inf else best_lam,
                                          "iterations": iterations})
    return weighted_row_sum(x, best_w), rec

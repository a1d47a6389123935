"""EARN: Earned, Audited, Rare-class-aware per-class-row trust (pure math).

The classifier row of class c (its weight row and bias) is where a hospital that holds c
leaves its mark. Per rare class, each hospital earns trust slowly (+gain when its row
agrees) and loses it fast (x decay when not); the row is averaged with FedAvg weight plus
trust x evidence share, and no hospital may hold more than ``cap`` of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .hta import median_norm_clip

__all__ = [
    "average_ranks",
    "spearman",
    "mean_class_spearman",
    "update_evidence",
    "holder_mask",
    "peer_reliability",
    "nonholder_factor",
    "row_agreement",
    "row_audit",
    "trust_step",
    "capped_weights",
    "rare_row_weights",
    "class_rows",
    "RareRowStep",
    "rare_row_step",
    "history_means",
    "extend_history",
    "lost_trust_flags",
]


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of a 1-D tensor, ties given their average rank (as scipy.stats.rankdata).

    Parameters
    ----------
    x : torch.Tensor
        Values to rank (flattened).

    Returns
    -------
    torch.Tensor
        float64 ranks, same length as ``x``.
    """
    x = torch.as_tensor(x, dtype=torch.float64).flatten()
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    sorted_x = x[order]
    n = x.numel()
    i = 0
    while i < n:
        j = i
        while j + 1 < n and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when either side is constant.

    Parameters
    ----------
    a : torch.Tensor
        First sample (flattened).
    b : torch.Tensor
        Second sample, same length as ``a``.

    Returns
    -------
    float
        The rank correlation in [-1, 1], or NaN.
    """
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.numel() != rb.numel():
        raise ValueError(f"spearman needs equal lengths, got {ra.numel()} and {rb.numel()}")
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(torch.linalg.vector_norm(ra) * torch.linalg.vector_norm(rb))
    return float(ra @ rb) / den if den > 0 else math.nan


def mean_class_spearman(evidence: torch.Tensor, counts: torch.Tensor) -> float:
    """Per class, Spearman across hospitals of evidence vs true counts; the mean over classes
    where both are non-constant (NaN if none).

    Parameters
    ----------
    evidence : torch.Tensor
        ``(n, C)`` per-hospital class evidence.
    counts : torch.Tensor
        ``(n, C)`` the hospitals' true (reported) class counts.

    Returns
    -------
    float
        The mean per-class Spearman correlation, or NaN.
    """
    e = torch.as_tensor(evidence, dtype=torch.float64)
    k = torch.as_tensor(counts, dtype=torch.float64)
    vals = [spearman(e[:, c], k[:, c]) for c in range(e.shape[1])]
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def update_evidence(bias_updates: torch.Tensor) -> torch.Tensor:
    r"""Update-derived evidence that hospital k holds class c: :math:`e_{kc} = \max(0, \Delta b_{kc})`.

    Why the bias: with softmax cross-entropy, :math:`\partial L / \partial b_c = \bar p_c - \bar y_c`
    over a batch, so local SGD moves :math:`b_c` by about
    :math:`\eta\,(\#\{y = c\} - \sum_x p_c(x)) / B` per epoch: up when the hospital holds
    more of c than the global model expects, down when it holds none. The sign separates
    holders from non-holders; the positive part ranks holders by how much of c they hold.
    Magnitudes of whole rows (which also carry the body's drift) do not.

    Parameters
    ----------
    bias_updates : torch.Tensor
        ``(n, C)`` the hospitals' updates of the classifier bias.

    Returns
    -------
    torch.Tensor
        ``(n, C)`` float64 evidence, >= 0.
    """
    return torch.as_tensor(bias_updates, dtype=torch.float64).clamp_min(0.0)


def update_count_evidence(
    bias_updates: torch.Tensor,
    num_examples: torch.Tensor,
    global_bias: torch.Tensor,
    *,
    learning_rate: float,
    batch_size: int,
    local_epochs: int,
) -> torch.Tensor:
    r"""Update-derived class counts: :math:`\hat n_{kc} = n_k\,\mathrm{clip}(\pi_c + \Delta b_{kc} / (\eta S_k), 0, 1)`.

    Each SGD step moves :math:`b_c` by :math:`-\eta(\bar p_c - \bar y_c)`, so over
    :math:`S_k = E \lceil n_k / B\rceil` steps :math:`\Delta b_{kc} / (\eta S_k)` estimates
    how far the hospital's share of class c lies above or below what the model predicts,
    :math:`\bar p_c`, here taken as :math:`\pi = \mathrm{softmax}(b)` of the global bias.
    Normalizing by the step count is what the positive part of :math:`\Delta b` lacks: a big
    hospital takes many steps, so its raw bias update mixes size with class share. Measured
    on PneumoniaMNIST (10 hospitals, Dirichlet 0.5): :math:`\Delta b / S` ranks the
    hospitals' class shares at Spearman 0.84-0.96 per round, and :math:`\hat n` their counts
    at 0.93, where :math:`\max(0, \Delta b)` reached 0.18-0.31. ``num_examples`` is what each
    reply reports (the same number FedAvg weighs by).

    Parameters
    ----------
    bias_updates : torch.Tensor
        ``(n, C)`` the hospitals' updates of the classifier bias, :math:`\Delta b`.
    num_examples : torch.Tensor
        ``(n,)`` each hospital's reported number of training examples, :math:`n_k`.
    global_bias : torch.Tensor
        ``(C,)`` the global model's classifier bias :math:`b`.
    learning_rate : float
        The local learning rate :math:`\eta`.
    batch_size : int
        The local minibatch size ``B``.
    local_epochs : int
        The local epochs ``E``.

    Returns
    -------
    torch.Tensor
        ``(n, C)`` float64 estimated class counts :math:`\hat n_{kc}`.
    """
    db = torch.as_tensor(bias_updates, dtype=torch.float64)
    n = torch.as_tensor(num_examples, dtype=torch.float64).reshape(-1, 1)
    steps = max(1, int(local_epochs)) * torch.ceil(n / max(1, int(batch_size))).clamp_min(1.0)
    prior = torch.softmax(torch.as_tensor(global_bias, dtype=torch.float64), dim=0).reshape(1, -1)
    share = (prior + db / (float(learning_rate) * steps)).clamp(0.0, 1.0)
    return n * share


def holder_mask(evidence: torch.Tensor, min_count: float = 0) -> torch.Tensor:
    """Hospital k holds class c when its evidence for c is positive (``min_count`` 0), or at least
    ``min_count`` (evidence in images: the published EARN's 20 training images): ``(n, C)`` bool.

    Parameters
    ----------
    evidence : torch.Tensor
        ``(n, C)`` per-hospital class evidence.
    min_count : float
        0: positive evidence holds; otherwise the least evidence (images) that holds.

    Returns
    -------
    torch.Tensor
        ``(n, C)`` bool.
    """
    e = torch.as_tensor(evidence, dtype=torch.float64)
    if min_count < 0:
        raise ValueError(f"min_count must be >= 0, got {min_count}")
    return e > 0 if min_count == 0 else e >= float(min_count)


def peer_reliability(num_holders: torch.Tensor | int) -> torch.Tensor:
    r""":math:`p(c) = \mathrm{clip}((n(c) - 1) / 4, 0, 1)`: one holder, no peers to check with; five or more, full trust in the peer check.

    Parameters
    ----------
    num_holders : torch.Tensor or int
        :math:`n(c)`, the number of hospitals holding the class (one per class if a tensor).

    Returns
    -------
    torch.Tensor
        float64 :math:`p(c)` in [0, 1], ``num_holders``' shape.
    """
    n = torch.as_tensor(num_holders, dtype=torch.float64)
    return ((n - 1.0) / 4.0).clamp(0.0, 1.0)


def nonholder_factor(num_holders: int, weight: float = 1.0, *, by_peers: bool = False) -> float:
    r"""Factor on a non-holder's base weight in a rare-class row: ``weight``, times
    :math:`1 - p(c)` with ``by_peers``.

    Why :math:`1 - p(c)`: the non-holders are what dilutes a faker in a row with one or two
    holders (the peer check cannot vouch for them there), and what lets hospitals that relabel
    the class push its logit down unchecked in a row with many holders (where the holders can
    check each other). With one holder the row is as specified; with five or more it is
    learned from its holders alone.

    Parameters
    ----------
    num_holders : int
        The number of hospitals holding the class.
    weight : float
        The non-holders' factor in [0, 1] (``earn.nonholder-weight``).
    by_peers : bool
        Also multiply by :math:`1 - p(c)`.

    Returns
    -------
    float
        The factor on a non-holder's base weight.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    return float(weight) * (1.0 - float(peer_reliability(num_holders))) if by_peers else float(weight)


def _cos_pos(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    den = torch.linalg.vector_norm(x, dim=-1) * torch.linalg.vector_norm(ref, dim=-1)
    cos = (x * ref).sum(-1) / den.clamp_min(1e-300)
    return torch.where(den > 0, cos.clamp(0.0, 1.0), torch.zeros_like(cos))


def row_agreement(
    rows: torch.Tensor,
    holders: torch.Tensor,
    history: torch.Tensor | None,
    history_known: torch.Tensor | None,
    *,
    mode: str = "blend",
) -> dict[str, torch.Tensor]:
    r"""Agreement of each hospital's class-c row update, in [0, 1].

    .. math::

        \mathrm{peer}_k = \max(0, \cos(r_k, \mathrm{med}_{j \in H \setminus k}\, r_j)),\quad
        \mathrm{hist}_k = \max(0, \cos(r_k, \bar r_k)),\quad
        a_k = p\,\mathrm{peer}_k + (1 - p)\,\mathrm{hist}_k

    with H the holders of c, p = :func:`peer_reliability` of |H| (mode ``blend``), p = 1
    (``peer``: no blend) or p = 0 (``history``), and :math:`\bar r_k` the hospital's own
    locked history row. A missing term (no other holder; no history yet) drops out and the
    other gets all the weight; with neither, ``a`` is NaN (nothing to judge by).

    Parameters
    ----------
    rows : (n, R) the row updates of class c (weight row and bias).
    holders : (n,) bool.
    history : (n, R) or None; history_known : (n,) bool or None.
    """
    rows = rows.double()
    n = rows.shape[0]
    holders = torch.as_tensor(holders, dtype=torch.bool).flatten()
    nh = int(holders.sum())
    peer = torch.full((n,), math.nan, dtype=torch.float64)
    for k in range(n):
        others = holders.clone()
        others[k] = False
        if bool(others.any()):
            ref = torch.quantile(rows[others], 0.5, dim=0)
            peer[k] = _cos_pos(rows[k], ref)
    hist = torch.full((n,), math.nan, dtype=torch.float64)
    if history is not None and history_known is not None:
        known = torch.as_tensor(history_known, dtype=torch.bool).flatten()
        hist = torch.where(known, _cos_pos(rows, history.double()), hist)
    if mode == "blend":
        p = float(peer_reliability(nh))
    elif mode == "peer":
        p = 1.0
    elif mode == "history":
        p = 0.0
    else:
        raise ValueError(f"mode must be 'blend', 'peer' or 'history', got {mode!r}")
    wp = torch.where(torch.isnan(peer), torch.zeros(n, dtype=torch.float64), torch.full((n,), p, dtype=torch.float64))
    wh = torch.where(torch.isnan(hist), torch.zeros(n, dtype=torch.float64), torch.full((n,), 1.0 - p, dtype=torch.float64))
    total = wp + wh
    a = (wp * torch.nan_to_num(peer) + wh * torch.nan_to_num(hist)) / total.clamp_min(1e-300)
    a = torch.where(total > 0, a, torch.full_like(a, math.nan))
    return {"peer": peer, "history": hist, "agreement": a, "p": torch.tensor(p, dtype=torch.float64)}


def row_audit(weight_rows: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, c: int,
              *, shift_free: bool = False) -> torch.Tensor:
    r"""Does a row update make class c's logit rise more on class-c reference images than on the rest?

    .. math::

        \mathrm{audit}_k = \overline{\Delta w_{kc} \cdot h(x)}_{y = c} - \overline{\Delta w_{kc} \cdot h(x)}_{y \ne c}

    :math:`h(x)` are the global model's inputs to its last layer on the server's reference
    cohort (the bias update shifts every logit alike and cancels). First order in the row
    update: cheap (one product per hospital) and not fakeable by the hospital. NaN for all
    when the cohort lacks class c or has only class c.

    ``shift_free``: first remove from each row update its component along the cohort's mean
    feature :math:`\bar h`, :math:`\Delta w_\perp = \Delta w - (\Delta w \cdot \hat h)\hat h`.
    Why: ReLU features are non-negative, so a row update that raises (or lowers) class c's
    logit on every image moves mostly along :math:`\bar h`, and its plain audit then has the
    sign of :math:`\|h\|` on class-c images minus the rest, not of any discrimination. On
    RetinaMNIST the grade-4 images have the smaller features: the honest grade-4 specialist,
    which raises grade 4 everywhere, scored negative and the non-holders, which lower it,
    positive.

    Parameters
    ----------
    weight_rows : torch.Tensor
        ``(n, H)`` the hospitals' updates of class c's weight row :math:`\Delta w_{kc}`.
    features : torch.Tensor
        ``(m, H)`` the global model's last-layer inputs :math:`h(x)` on the reference cohort.
    labels : torch.Tensor
        ``(m,)`` the cohort's labels.
    c : int
        The class audited.
    shift_free : bool
        Remove each row update's component along the mean feature first.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 audit scores (NaN as above).
    """
    w = weight_rows.double()
    h = features.double()
    if shift_free:
        mean = h.mean(dim=0)
        norm = torch.linalg.vector_norm(mean)
        if float(norm) > 0:
            unit = mean / norm
            w = w - (w @ unit).unsqueeze(1) * unit.unsqueeze(0)
    y = torch.as_tensor(labels).flatten()
    pos, neg = y == c, y != c
    if not bool(pos.any()) or not bool(neg.any()):
        return torch.full((w.shape[0],), math.nan, dtype=torch.float64)
    dz = w @ h.T  # (n, m)
    return dz[:, pos].mean(dim=1) - dz[:, neg].mean(dim=1)


def model_audit(candidate_logits: torch.Tensor, global_logits: torch.Tensor, labels: torch.Tensor, c: int) -> torch.Tensor:
    r"""Does hospital k's whole candidate model (global + its update) separate class c better
    than the global model on the server's reference cohort?

    .. math::

        \mathrm{audit}_k = m_c(\theta + u_k) - m_c(\theta),\qquad
        m_c = \overline{z_c(x)}_{y = c} - \overline{z_c(x)}_{y \ne c}

    with :math:`z_c` the class-c logit. Unlike :func:`row_audit` it reads the row with the body
    the hospital trained it on. A faker that relabels other images as c raises :math:`z_c` on
    those images too, so its margin does not grow. ``candidate_logits`` ``(n, m, C)``,
    ``global_logits`` ``(m, C)``; NaN for all when the cohort lacks class c or has only class c.

    Parameters
    ----------
    candidate_logits : torch.Tensor
        ``(n, m, C)`` logits of each candidate model :math:`\theta + u_k` on the reference cohort.
    global_logits : torch.Tensor
        ``(m, C)`` logits of the global model :math:`\theta` on the cohort.
    labels : torch.Tensor
        ``(m,)`` the cohort's labels.
    c : int
        The class audited.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 margin gains (NaN as above).
    """
    z = torch.as_tensor(candidate_logits, dtype=torch.float64)[..., c]
    g = torch.as_tensor(global_logits, dtype=torch.float64)[..., c]
    y = torch.as_tensor(labels).flatten()
    pos, neg = y == c, y != c
    if not bool(pos.any()) or not bool(neg.any()):
        return torch.full((z.shape[0],), math.nan, dtype=torch.float64)
    margin = z[:, pos].mean(dim=1) - z[:, neg].mean(dim=1)
    return margin - (g[pos].mean() - g[neg].mean())


def trust_step(trust: torch.Tensor, agrees: torch.Tensor, *, gain: float = 0.1, decay: float = 0.5) -> torch.Tensor:
    r"""Slow to earn, quick to lose: :math:`T \leftarrow \min(1, T + g)` when it agrees, :math:`T \leftarrow d\,T` when not.

    Parameters
    ----------
    trust : torch.Tensor
        ``(n,)`` current trust :math:`T` in [0, 1].
    agrees : torch.Tensor
        ``(n,)`` bool: the hospital's row agreed this round.
    gain : float
        ``g``, added on agreement.
    decay : float
        ``d``, the factor on disagreement.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 new trust.
    """
    t = torch.as_tensor(trust, dtype=torch.float64)
    ok = torch.as_tensor(agrees, dtype=torch.bool)
    return torch.where(ok, (t + gain).clamp_max(1.0), t * decay)


def capped_weights(w: torch.Tensor, cap: float = 0.5) -> torch.Tensor:
    r"""Normalize ``w`` to sum 1 with no entry above ``cap`` (water filling: capped entries sit
    at the cap, the rest share what is left in proportion to ``w``). ``cap >= 1`` only
    normalizes; a cap below 1/n is raised to 1/n (the only feasible cap).

    Parameters
    ----------
    w : torch.Tensor
        ``(n,)`` non-negative raw weights (negatives count as 0; all 0: uniform).
    cap : float
        The largest share any entry may hold.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 weights summing to 1.
    """
    w = torch.as_tensor(w, dtype=torch.float64).clamp_min(0.0)
    n = w.numel()
    if float(w.sum()) <= 0:
        w = torch.ones_like(w)
    w = w / w.sum()
    if cap >= 1.0:
        return w
    cap = max(cap, 1.0 / n)
    fixed = torch.zeros(n, dtype=torch.bool)
    out = w.clone()
    for _ in range(n):
        free = ~fixed
        left = 1.0 - cap * int(fixed.sum())
        base = w[free]
        share = base / base.sum() if float(base.sum()) > 0 else torch.full_like(base, 1.0 / base.numel())
        out = torch.where(fixed, torch.full_like(w, cap), torch.zeros_like(w))
        out[free] = left * share
        over = (out > cap + 1e-12) & free
        if not bool(over.any()):
            break
        fixed |= over
    return out


def rare_row_clip(rows: torch.Tensor, holders: torch.Tensor, update_clip: torch.Tensor) -> torch.Tensor:
    r"""Scale of each hospital's update of one rare-class row: the larger of ``update_clip`` (the
    factor that clips its whole update to the median norm) and
    :math:`\min(1, \tilde r / \lVert r_k\rVert)`, :math:`\tilde r` the median row norm over the
    class's holders (over everyone if none). A row is shrunk only when both its whole update and
    the row itself are larger than is typical, so a specialist whose whole update is large because
    it trains on the rare class keeps its row, while a scaled update is clipped. ``(n,)`` float64.

    Parameters
    ----------
    rows : torch.Tensor
        ``(n, R)`` the hospitals' updates of one rare-class row (weight row and bias).
    holders : torch.Tensor
        ``(n,)`` bool: the hospitals holding the class.
    update_clip : torch.Tensor
        ``(n,)`` each hospital's whole-update clip factor (:func:`median_norm_clip`).

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 scale factors in ``(0, 1]``.
    """
    h = torch.as_tensor(holders, dtype=torch.bool).flatten()
    row = median_norm_clip(torch.as_tensor(rows, dtype=torch.float64), h if bool(h.any()) else None)
    return torch.maximum(torch.as_tensor(update_clip, dtype=torch.float64).cpu(), row)


def rare_row_weights(
    fedavg: torch.Tensor, trust: torch.Tensor, evidence: torch.Tensor, *, cap: float = 0.5
) -> torch.Tensor:
    r"""Weights of a rare-class row: :math:`w_k \propto n_k / \sum n + T_k\, e_k / \sum e`, capped
    (:func:`capped_weights`). With every trust at 0 this is FedAvg with the cap.

    Parameters
    ----------
    fedavg : torch.Tensor
        ``(n,)`` the base weights :math:`n_k` (normalized here).
    trust : torch.Tensor
        ``(n,)`` the hospitals' trust :math:`T_k` for the class.
    evidence : torch.Tensor
        ``(n,)`` their evidence :math:`e_k` for the class (negatives count as 0).
    cap : float
        The largest share one hospital may hold (:func:`capped_weights`).

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 row weights summing to 1.
    """
    f = torch.as_tensor(fedavg, dtype=torch.float64)
    f = f / f.sum()
    e = torch.as_tensor(evidence, dtype=torch.float64).clamp_min(0.0)
    share = e / e.sum() if float(e.sum()) > 0 else torch.zeros_like(e)
    return capped_weights(f + torch.as_tensor(trust, dtype=torch.float64) * share, cap)


def class_rows(weight_update: torch.Tensor, bias_update: torch.Tensor) -> torch.Tensor:
    """Each hospital's classifier rows: the weight row of class c followed by its bias.

    Parameters
    ----------
    weight_update : torch.Tensor
        ``(n, C, H)`` the hospitals' updates of the last layer's weight.
    bias_update : torch.Tensor
        ``(n, C)`` their updates of its bias.

    Returns
    -------
    torch.Tensor
        ``(n, C, H + 1)``: row ``[i, c]`` is hospital i's row of class c (weight row, then bias).
    """
    return torch.cat([weight_update, bias_update.unsqueeze(-1)], dim=-1)


@dataclass
class RareRowStep:
    """One rare class's row in one round (:func:`rare_row_step`); every tensor ``(n,)`` float64.

    Parameters
    ----------
    agreement : torch.Tensor
        Each hospital's row agreement (:func:`row_agreement`; NaN: nothing to judge it by).
    audit : torch.Tensor or None
        Its audit score (> 0 passes, NaN: no verdict), None when the row was not audited.
    trust : torch.Tensor
        Its trust for the class after the round.
    weight : torch.Tensor
        Its weight in the row (:func:`rare_row_weights`, sums to 1).
    clip : torch.Tensor
        The scale on its row update (:func:`rare_row_clip` or the whole-update clip).
    """

    agreement: torch.Tensor
    audit: torch.Tensor | None
    trust: torch.Tensor
    weight: torch.Tensor
    clip: torch.Tensor


def rare_row_step(
    rows: torch.Tensor,
    holders: torch.Tensor,
    history: torch.Tensor,
    history_known: torch.Tensor,
    trust: torch.Tensor,
    base_weights: torch.Tensor,
    evidence: torch.Tensor,
    update_clip: torch.Tensor,
    *,
    group_size: torch.Tensor | None = None,
    audit: torch.Tensor | None = None,
    mode: str = "blend",
    agree_threshold: float = 0.1,
    gain: float = 0.1,
    decay: float = 0.5,
    nonholder_weight: float = 1.0,
    nonholder_by_peers: bool = False,
    cap: float = 0.5,
    clip_holders: bool = False,
) -> RareRowStep:
    r"""One round of EARN on the row of one rare class c: who agrees, the new trust, the row's weights.

    A holder of c agrees when its agreement (:func:`row_agreement`) is at least ``agree_threshold``
    and, audited, its audit score is positive (or NaN); its trust takes :func:`trust_step`; a hospital
    that is no holder, or that nothing judges (NaN agreement), keeps its trust. The row's weights are
    :func:`rare_row_weights` of the base weights (a non-holder's times :func:`nonholder_factor`; the
    base weights as they are when no holder has any) and the trust shared by near-duplicate groups
    (``trust / group_size``).

    Parameters
    ----------
    rows : torch.Tensor
        ``(n, R)`` the hospitals' updates of the class's row (:func:`class_rows` ``[:, c]``).
    holders : torch.Tensor
        ``(n,)`` bool: who holds the class.
    history : torch.Tensor
        ``(n, R)`` each hospital's mean row over its first rounds (:func:`history_means`).
    history_known : torch.Tensor
        ``(n,)`` bool: whether that history has a round yet.
    trust : torch.Tensor
        ``(n,)`` each hospital's trust for the class before the round.
    base_weights : torch.Tensor
        ``(n,)`` float64 the base rule's weights.
    evidence : torch.Tensor
        ``(n,)`` each hospital's evidence of holding the class.
    update_clip : torch.Tensor
        ``(n,)`` the factor that clips each hospital's whole update (ones: unclipped).
    group_size : torch.Tensor or None
        ``(n,)`` the size of each hospital's near-duplicate group (None: all 1).
    audit : torch.Tensor or None
        ``(n,)`` audit scores (:func:`row_audit`, :func:`model_audit`), None unaudited.
    mode : str
        :func:`row_agreement`'s mode.
    agree_threshold : float
        The least agreement that counts as agreeing.
    gain : float
        :func:`trust_step`'s gain.
    decay : float
        :func:`trust_step`'s decay.
    nonholder_weight : float
        :func:`nonholder_factor`'s weight.
    nonholder_by_peers : bool
        :func:`nonholder_factor`'s ``by_peers``.
    cap : float
        The largest share one hospital may hold of the row.
    clip_holders : bool
        True: the row's scale is :func:`rare_row_clip` (the larger of the whole-update clip and the
        holders' median row norm's); False: the whole-update clip.

    Returns
    -------
    RareRowStep
        The round's agreement, audit, trust, weights and clip of the row.
    """
    a = row_agreement(rows, holders, history, history_known, mode=mode)["agreement"]
    agrees = torch.nan_to_num(a, nan=-1.0) >= agree_threshold
    if audit is not None:
        agrees &= torch.isnan(audit) | (audit > 0)
    judged = holders & ~torch.isnan(a)
    new = torch.where(judged, trust_step(trust, agrees, gain=gain, decay=decay), trust)
    nh = nonholder_factor(int(holders.sum()), nonholder_weight, by_peers=nonholder_by_peers)
    row_base = base_weights * torch.where(holders, 1.0, nh)
    if float(row_base.sum()) <= 0:  # no holder with base weight: the base weights as they are
        row_base = base_weights
    shared = new if group_size is None else new / group_size
    weight = rare_row_weights(row_base, shared, evidence, cap=cap)
    clip = rare_row_clip(rows, holders, update_clip) if clip_holders else update_clip
    return RareRowStep(a, audit, new, weight, clip)


def history_means(sums: Mapping[str, torch.Tensor], rounds: Mapping[str, int], names: Sequence[str],
                  shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each hospital's history row: the mean of its rows over the rounds counted so far.

    Parameters
    ----------
    sums : Mapping[str, torch.Tensor]
        Hospital name -> the sum of its rows (``shape``) over its counted rounds.
    rounds : Mapping[str, int]
        Hospital name -> how many rounds that sum holds.
    names : Sequence[str]
        The round's hospitals, in row order.
    shape : tuple[int, ...]
        One hospital's rows' shape (``(C, H + 1)``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(n,)`` bool whether a hospital has a history, and ``(n, *shape)`` float64 the means
        (zeros without one).
    """
    known = torch.tensor([rounds.get(nm, 0) > 0 for nm in names])
    means = torch.stack([sums[nm] / rounds[nm] if rounds.get(nm, 0) > 0 else torch.zeros(shape, dtype=torch.float64)
                         for nm in names])
    return known, means


def extend_history(sums: Mapping[str, torch.Tensor], rounds: Mapping[str, int], names: Sequence[str],
                   rows: torch.Tensor, limit: int) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Add the round's rows to the history of each hospital that has fewer than ``limit`` rounds in it
    (after ``limit`` rounds its history is locked).

    Parameters
    ----------
    sums : Mapping[str, torch.Tensor]
        Hospital name -> the sum of its rows so far.
    rounds : Mapping[str, int]
        Hospital name -> how many rounds that sum holds.
    names : Sequence[str]
        The round's hospitals, in row order.
    rows : torch.Tensor
        ``(n, C, H + 1)`` their rows this round (:func:`class_rows`).
    limit : int
        The rounds a history holds before it is locked.

    Returns
    -------
    tuple[dict[str, torch.Tensor], dict[str, int]]
        The new sums and round counts (the inputs are left as they were).
    """
    new_sums, new_rounds = dict(sums), dict(rounds)
    for i, nm in enumerate(names):
        if new_rounds.get(nm, 0) < limit:
            new_sums[nm] = new_sums.get(nm, torch.zeros_like(rows[i])) + rows[i]
            new_rounds[nm] = new_rounds.get(nm, 0) + 1
    return new_sums, new_rounds


def lost_trust_flags(locked: Sequence[bool], holders: torch.Tensor, trust: Mapping[int, torch.Tensor],
                     threshold: float) -> list[bool]:
    """Which hospitals, their history locked, hold a rare class whose trust they have below ``threshold``.

    Parameters
    ----------
    locked : Sequence[bool]
        Per hospital: its history is locked.
    holders : torch.Tensor
        ``(n, C)`` bool: who holds each class.
    trust : Mapping[int, torch.Tensor]
        Rare class -> ``(n,)`` the hospitals' trust for it after the round.
    threshold : float
        The trust below which a holder is flagged.

    Returns
    -------
    list[bool]
        One flag per hospital.
    """
    return [bool(locked[i] and any(bool(holders[i, c]) and float(t[i]) < threshold for c, t in trust.items()))
            for i in range(len(locked))]

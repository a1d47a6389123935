"""FoolsGold (Fung, Yoon, Beschastnikh, RAID 2020): historical cosine similarity, pardoning, logit."""

from __future__ import annotations

import torch

from ._validation import check_updates
from .kernels import gram, weighted_row_sum
from .records import RuleRecord

__all__ = ["foolsgold_weights", "foolsgold", "ALPHA_ZERO"]

#: Learning rates below this are 0 before the rescaling by the largest. Exact copies have cosine 1 up to one
#: rounding (2 / (sqrt(2) sqrt(2)) = 0.9999999999999998 on one CPU, 1.0 on another), so their alpha is 0 or 2e-16
#: by the CPU's rounding; without the threshold, ``alpha / max(alpha)`` turns 2e-16 into 1 and the copies get
#: full weight. 1e-12 is far above float64's rounding (1e-16) and far below any similarity a real pair of
#: histories has short of a copy (1 - 1e-12 is a cosine no two independent updates reach).
ALPHA_ZERO = 1e-12


def foolsgold_weights(history_gram: torch.Tensor, confidence: float = 1.0) -> dict[str, torch.Tensor]:
    r"""FoolsGold's learning rates from the Gram matrix of the clients' histories.

    .. math::

        cs_{ij} = \cos(H_i, H_j)\ (i \ne j),\ cs_{ii} = 0,\quad v_i = \max_j cs_{ij},\quad
        cs_{ij} \leftarrow cs_{ij}\, v_i / v_j \text{ if } v_j > v_i \text{ (pardoning)},

        \alpha_i = \mathrm{clip}(1 - \max_j cs_{ij}, 0, 1),\quad
        \alpha \leftarrow \alpha / \max_j \alpha_j \ (\alpha_i = 1 \to 0.99),\quad
        \alpha_i \leftarrow \mathrm{clip}\bigl(\kappa(\ln\tfrac{\alpha_i}{1 - \alpha_i} + 0.5), 0, 1\bigr)

    (Fung et al., Algorithm 1, with the authors' code's zero diagonal and clips). An :math:`\alpha` below
    ``ALPHA_ZERO`` (1e-12) is 0 before the rescaling, so that copies get 0 on every CPU, not 0 or 1 by one
    rounding. All :math:`\alpha = 0` before the rescaling (every history identical to another) gives all
    weights 0. A zero history has cosine 0 with everything.

    Parameters
    ----------
    history_gram : torch.Tensor
        ``(n, n)`` Gram matrix of the histories :math:`H_i`.
    confidence : float
        :math:`\kappa > 0`.

    Returns
    -------
    dict of torch.Tensor
        ``weights`` :math:`\alpha` ``(n,)``, ``max_similarity`` :math:`v` ``(n,)`` and the pardoned
        ``similarity`` ``(n, n)``, float64 CPU.
    """
    g = torch.as_tensor(history_gram, dtype=torch.float64).cpu()
    if not confidence > 0:
        raise ValueError(f"foolsgold requires confidence > 0; got {confidence!r}")
    n = g.shape[0]
    norms = torch.diagonal(g).clamp_min(0.0).sqrt()
    den = norms[:, None] * norms[None, :]
    cs = torch.where(den > 0, g / den.clamp_min(1e-300), torch.zeros_like(g))
    cs.fill_diagonal_(0.0)  # the authors' code: cos - I, so v_i >= 0
    v = cs.amax(1)
    pardon = v[None, :] > v[:, None]  # [i, j]: v_j > v_i (> 0)
    cs = torch.where(pardon, cs * v[:, None] / v.clamp_min(1e-300)[None, :], cs)
    alpha = (1.0 - cs.amax(1)).clamp(0.0, 1.0)
    alpha = torch.where(alpha < ALPHA_ZERO, torch.zeros_like(alpha), alpha)  # a copy up to rounding is a copy
    if float(alpha.max()) <= 0:
        return {"weights": torch.zeros(n, dtype=torch.float64), "max_similarity": v, "similarity": cs}
    alpha = alpha / alpha.max()
    alpha = torch.where(alpha >= 1.0, torch.full_like(alpha, 0.99), alpha)
    logit = confidence * (torch.log(alpha / (1.0 - alpha)) + 0.5)
    weights = torch.where(torch.isinf(logit) & (logit > 0), 1.0, logit).nan_to_num(0.0).clamp(0.0, 1.0)
    return {"weights": weights, "max_similarity": v, "similarity": cs}


def foolsgold(x: torch.Tensor, history: torch.Tensor | None = None, *, confidence: float = 1.0,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, RuleRecord]:
    r"""FoolsGold: every client's history :math:`H_i \leftarrow H_i + u_i`; clients whose histories
    point the same way as another's (Sybils) get a learning rate near 0; the aggregate is the
    :math:`\alpha`-weighted mean :math:`\sum_i \alpha_i u_i / \sum_i \alpha_i` (zero if every
    :math:`\alpha_i = 0`).

    Fung, Yoon, Beschastnikh, "The Limitations of Federated Learning in Sybil Settings", RAID
    2020 (:func:`foolsgold_weights` has the weights). The paper's optional importance weighting
    of the output layer's features is not applied. The paper's Algorithm 1 applies
    :math:`\sum_i \alpha_i u_i`; hospitrust divides by :math:`\sum_i \alpha_i` so the step size does
    not grow with the number of clients it trusts.

    The history is state, in and out: row ``i`` of ``history`` must be the same client as row
    ``i`` of ``x`` (a new client starts at zeros). Passes: the history update (reads ``x`` and the
    history, writes the new one; ``out=history`` writes in place), the Gram matrix of the new
    history, the weighted sum of ``x``: about five reads of an ``(n, d)`` stack, because the rule
    keeps a second one.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    history : torch.Tensor or None
        ``(n, d)`` the clients' summed past updates; None: zeros (the first round).
    confidence : float
        :math:`\kappa > 0` of the logit.
    out : torch.Tensor or None
        Where the new history goes (``history`` itself for an in-place update); None: a new tensor.

    Returns
    -------
    tuple
        The ``(d,)`` aggregate, the new ``(n, d)`` history and the record (``weights``:
        :math:`\alpha / \sum\alpha`; ``detail``: ``learning_rates`` :math:`\alpha`, ``max_similarity``).
    """
    n, d = check_updates(x)
    if history is None:
        new = x.clone() if out is None else out.copy_(x)
    else:
        if not isinstance(history, torch.Tensor) or tuple(history.shape) != (n, d):
            raise ValueError(f"history must have the updates' shape ({n}, {d}); got "
                             f"{tuple(history.shape) if isinstance(history, torch.Tensor) else type(history).__name__}")
        new = torch.add(history, x.to(history.dtype), out=out) if out is not None else history + x
    parts = foolsgold_weights(gram(new), confidence)
    alpha = parts["weights"]
    total = float(alpha.sum())
    coef = alpha / total if total > 0 else torch.zeros(n, dtype=torch.float64)
    rec = RuleRecord(alpha > 0, coef, {"learning_rates": alpha, "max_similarity": parts["max_similarity"]})
    return weighted_row_sum(x, coef), new, rec

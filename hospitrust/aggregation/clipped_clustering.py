"""Clipped clustering (Li, Ngai, Voigt, 2023; Blades' ``Clippedclustering``)."""

from __future__ import annotations

import torch

from ._validation import check_updates
from .kernels import gram, weighted_row_sum
from .records import RuleRecord

__all__ = ["clipped_clustering"]


def clipped_clustering(x: torch.Tensor, norm_history: torch.Tensor | None = None, *, max_tau: float = 1e5,
                       linkage: str = "average") -> tuple[torch.Tensor, torch.Tensor, RuleRecord]:
    r"""Clipped clustering: clip every update to the median of all update norms seen so far, split
    the updates in two by agglomerative clustering on cosine distance, average the larger group.

    .. math::

        \tau = \min(\mathrm{med}(\nu_{1..t}), \tau_{\max}),\quad
        \tilde u_i = u_i \min(1, \tau / \lVert u_i\rVert),\quad
        c_{ij} = 1 - \cos(u_i, u_j),

        \mathrm{CC}(u) = \frac{1}{|A|}\sum_{i \in A} \tilde u_i,\quad
        A = \text{the larger of the two clusters of } c

    :math:`\nu_{1..t}` are the norms of every update of this and all earlier rounds. Li, Ngai,
    Voigt, "An Experimental Study of Byzantine-Robust Aggregation Schemes in Federated
    Learning", IEEE Transactions on Big Data 2023; the definition is Blades' ``Clippedclustering``
    (its defaults: average linkage, :math:`\tau_{\max} = 10^5`; cluster 1 is taken when it holds
    more than :math:`\lfloor n/2\rfloor` updates, else cluster 0, as Blades decides it). Clipping
    does not change a cosine, so the clustering reads the Gram matrix of the raw updates.

    Two passes: the Gram matrix, the weighted sum. The norm history is state, in and out.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    norm_history : torch.Tensor or None
        1-D float64: the norms of every earlier update; None: none (the first round).
    max_tau : float
        :math:`\tau_{\max} > 0`.
    linkage : str
        scikit-learn's ``AgglomerativeClustering`` linkage (``average``, ``complete``, ``single``).

    Returns
    -------
    tuple
        The ``(d,)`` aggregate, the new norm history (old + this round's norms) and the record
        (``detail``: ``labels``, ``clip_bound``, ``clip_factors``).
    """
    n, _ = check_updates(x)
    if not max_tau > 0:
        raise ValueError(f"clipped_clustering requires max_tau > 0; got {max_tau!r}")
    if linkage not in ("average", "complete", "single"):
        raise ValueError(f"linkage must be 'average', 'complete' or 'single'; got {linkage!r}")
    g = gram(x).cpu()
    norms = torch.diagonal(g).clamp_min(0.0).sqrt()
    past = torch.zeros(0, dtype=torch.float64) if norm_history is None else torch.as_tensor(
        norm_history, dtype=torch.float64).flatten().cpu()
    history = torch.cat([past, norms])
    tau = min(float(torch.quantile(history, 0.5)), float(max_tau))
    factors = torch.where(norms > tau, tau / norms.clamp_min(1e-300), torch.ones_like(norms))
    if n < 2:
        labels = torch.zeros(n, dtype=torch.long)
        selected = torch.ones(n, dtype=torch.bool)
    else:
        den = norms[:, None] * norms[None, :]
        cos = torch.where(den > 0, g / den.clamp_min(1e-300), torch.zeros_like(g))
        dist = (1.0 - cos).clamp(0.0, 2.0)
        dist.fill_diagonal_(0.0)
        from sklearn.cluster import AgglomerativeClustering  # local: scikit-learn loads only for this rule

        labels = torch.as_tensor(AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage=linkage)
                                 .fit(((dist + dist.T) / 2).numpy()).labels_, dtype=torch.long)
        flag = 1 if int(labels.sum()) > n // 2 else 0
        selected = labels == flag
    w = torch.where(selected, factors / int(selected.sum()), torch.zeros_like(factors))
    rec = RuleRecord(selected, w, {"labels": labels, "clip_bound": tau, "clip_factors": factors})
    return weighted_row_sum(x, w), history, rec

"""Near-duplicate updates: hospitals whose updates point the same way count as one voice.

Colluding attacks (ALIE, IPM, min-max, min-sum) send one crafted update from every
attacker. Three copies pull the coordinate median toward the copy and take three
hospitals' weight; hospitals that train on their own data never send the same update
(FoolsGold, Fung et al. 2020, builds on the same observation). Grouping updates whose
pairwise cosine reaches a threshold and sharing one hospital's say among each group
takes both away without judging anyone's data.
"""

from __future__ import annotations

import torch

from ._validation import check_updates
from .kernels import gram

__all__ = ["pairwise_cosine", "duplicate_groups", "group_representatives"]


def pairwise_cosine(x: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` float64 CPU cosine similarities of the rows of ``x``, from one Gram matrix
    (no copy of ``x``); a zero row has cosine 0 with every other row (it has no direction) and
    1 with itself.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``, one row per hospital.

    Returns
    -------
    torch.Tensor
        ``(n, n)`` float64 cosine similarities on the CPU.
    """
    check_updates(x)
    g = gram(x).cpu()
    norms = g.diagonal().clamp_min(0.0).sqrt()
    cos = (g / (norms[:, None] * norms[None, :]).clamp_min(1e-300)).clamp(-1.0, 1.0)
    cos = torch.where((norms[:, None] > 0) & (norms[None, :] > 0), cos, torch.zeros_like(cos))
    cos.fill_diagonal_(1.0)
    return cos


def duplicate_groups(x: torch.Tensor, threshold: float = 0.999) -> dict[str, torch.Tensor]:
    r"""Groups of near-duplicate updates: the connected components of the graph with an edge
    between h and j when :math:`\cos(u_h, u_j) \ge` ``threshold``. Zero updates (free-riders
    returning the global model) have no direction and stay alone; HTA's magnitude signal
    already scores them 0.

    Returns ``group`` (n,) int64 (the smallest member index of each hospital's group),
    ``size`` (n,) int64 (its group's size, 1 for a hospital alone) and ``max_cosine`` (n,)
    float64 (each hospital's largest cosine with another hospital; -1 when n = 1).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``, one row per hospital.
    threshold : float
        Cosine in ``(0, 1]`` at or above which two updates are linked as near-duplicates.

    Returns
    -------
    dict[str, torch.Tensor]
        ``group``, ``size`` and ``max_cosine``, each ``(n,)``, as above.
    """
    n, _ = check_updates(x)
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"duplicate threshold must be a cosine in (0, 1], got {threshold}")
    cos = pairwise_cosine(x)
    off = cos.clone()
    off.fill_diagonal_(-1.0)
    max_cos = off.max(dim=1).values if n > 1 else torch.full((1,), -1.0, dtype=torch.float64)
    linked = off >= threshold
    # union-find over the linked pairs (n is the number of hospitals: small)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in linked.nonzero().tolist():
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    group = torch.tensor([root(i) for i in range(n)], dtype=torch.int64)
    size = torch.bincount(group, minlength=n)[group]
    return {"group": group, "size": size, "max_cosine": max_cos}


def group_representatives(x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """One row per group, the mean of its members, in order of first member: ``(g, d)`` on
    ``x``'s device and dtype. With every hospital alone it is ``x`` itself.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``, one row per hospital.
    group : torch.Tensor
        ``(n,)`` group id of each row (``duplicate_groups(x)["group"]``).

    Returns
    -------
    torch.Tensor
        ``(g, d)`` group means, or ``x`` itself when every group has one member.
    """
    check_updates(x)
    group = torch.as_tensor(group, dtype=torch.int64).flatten().cpu()
    if group.numel() != x.shape[0]:
        raise ValueError(f"group must have one entry per update (n={x.shape[0]}), got {group.numel()}")
    ids = torch.unique(group, sorted=True)
    if ids.numel() == x.shape[0]:
        return x
    return torch.stack([x[(group == g).to(x.device)].mean(dim=0) for g in ids.tolist()])

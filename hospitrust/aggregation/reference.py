"""Reference implementations the fast paths are tested against.

The ``torch.sort``-based order statistics define the exact semantics the
networks in :mod:`hospitrust.aggregation.order_statistics` must reproduce (up
to float rounding of the final sums). The distance and weighting rules are kept
as they were before the compiled one-pass kernels of
:mod:`hospitrust.aggregation.kernels` (batched-product Gram, matrix-vector
combining passes). All are slow and do no argument checking.
"""

from __future__ import annotations

import torch

__all__ = [
    "reference_coordinate_median",
    "reference_trimmed_mean",
    "reference_bulyan_coordinate",
    "reference_gram",
    "reference_pairwise_sq_distances",
    "reference_krum",
    "reference_multi_krum",
    "reference_bulyan",
    "reference_fltrust",
    "reference_geometric_median",
    "reference_centered_clipping",
]


def reference_coordinate_median(x: torch.Tensor) -> torch.Tensor:
    """Median per column; even ``n``: mean of the two middle values.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    s = torch.sort(x, dim=0).values
    n = x.shape[0]
    k = n // 2
    return s[k] if n % 2 else (s[k - 1] + s[k]) * 0.5


def reference_trimmed_mean(x: torch.Tensor, f: int) -> torch.Tensor:
    """Mean per column after dropping the ``f`` smallest and ``f`` largest.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Values dropped at each end of every column.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    s = torch.sort(x, dim=0).values
    n = x.shape[0]
    return s[f : n - f].mean(0)


def reference_bulyan_coordinate(x: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan coordinate phase over all rows of ``x`` (``theta`` rows).

    Per column: sort, take the median ``m`` (even: mean of the middle two),
    order the sorted values by ``|s - m|`` with a *stable* sort (ties prefer
    the smaller value) and average the first ``beta = theta - 2f``.

    Parameters
    ----------
    x : torch.Tensor
        The ``theta`` selected rows ``(theta, d)``.
    f : int
        Assumed number of Byzantine clients.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    theta = x.shape[0]
    beta = theta - 2 * f
    s = torch.sort(x, dim=0).values
    k = theta // 2
    m = s[k] if theta % 2 else (s[k - 1] + s[k]) * 0.5
    dist = (s - m).abs()
    order = torch.sort(dist, dim=0, stable=True).indices[:beta]
    return torch.gather(s, 0, order).mean(0)


# --------------------------------------------------------------------------
# The rules as they were before the compiled one-pass kernels (2026-12-01): kept verbatim
# (minus argument checks) so the tests can hold the fast paths to them.
# --------------------------------------------------------------------------
_REF_GRAM_BLOCK = 65_536


def reference_gram(x: torch.Tensor) -> torch.Tensor:
    """Gram matrix ``x @ x.T`` as float64: per-block batched products (``torch.bmm``) summed.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.

    Returns
    -------
    torch.Tensor
        ``(n, n)`` float64.
    """
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    n, d = work.shape
    if work.device.type != "cpu" or d <= _REF_GRAM_BLOCK:
        return (work @ work.T).double()
    work = work.contiguous()
    blocks = d // _REF_GRAM_BLOCK
    body = work[:, : blocks * _REF_GRAM_BLOCK].unflatten(1, (blocks, _REF_GRAM_BLOCK)).transpose(0, 1)
    g = torch.bmm(body, body.transpose(1, 2)).sum(0, dtype=work.dtype)
    tail = work[:, blocks * _REF_GRAM_BLOCK :]
    if tail.shape[1]:
        g = g + tail @ tail.T
    return g.double()


def reference_pairwise_sq_distances(x: torch.Tensor) -> torch.Tensor:
    """Squared distances from :func:`reference_gram` (clamped at 0, zero diagonal).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.

    Returns
    -------
    torch.Tensor
        ``(n, n)`` float64.
    """
    g = reference_gram(x)
    sq = torch.diagonal(g)
    dist = (sq[:, None] + sq[None, :] - 2.0 * g).clamp_min_(0.0)
    dist.fill_diagonal_(0.0)
    return dist


def _reference_scores(dist: torch.Tensor, k: int) -> torch.Tensor:
    n = dist.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=dist.dtype, device=dist.device)
    d = dist.clone()
    d.fill_diagonal_(float("inf"))
    k = max(1, min(k, n - 1))
    return torch.sort(d, dim=1).values[:, :k].sum(1)


def reference_krum(x: torch.Tensor, f: int) -> torch.Tensor:
    """Krum: the row with the lowest score (``n - f - 2`` nearest neighbours; ties: lowest index).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    scores = _reference_scores(reference_pairwise_sq_distances(x), x.shape[0] - f - 2)
    return x[int(torch.sort(scores, stable=True).indices[0])].clone()


def reference_multi_krum(x: torch.Tensor, f: int, m: int | None = None) -> torch.Tensor:
    """Multi-Krum: the mean of the ``m`` (default ``n - f``) rows with the lowest scores.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients.
    m : int or None
        Rows averaged; None: ``n - f``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    m = n - f if m is None else m
    scores = _reference_scores(reference_pairwise_sq_distances(x), n - f - 2)
    idx = torch.sort(scores, stable=True).indices[:m]
    if idx.numel() == 1:
        return x[int(idx[0])].clone()
    w = torch.zeros(n, dtype=x.dtype, device=x.device)
    w[idx.to(x.device)] = 1.0 / idx.numel()
    return w @ x


def reference_bulyan(x: torch.Tensor, f: int, selection: str = "krum") -> torch.Tensor:
    """Bulyan: iterated Krum (or one Multi-Krum pass) selects ``n - 2f`` rows, then
    :func:`reference_bulyan_coordinate` on them.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients.
    selection : {"krum", "multi_krum"}
        Selection phase.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    theta = n - 2 * f
    dist = reference_pairwise_sq_distances(x).cpu()
    if selection == "multi_krum":
        idx = torch.sort(_reference_scores(dist, n - f - 2), stable=True).indices[:theta]
    else:
        remaining = torch.arange(n)
        chosen: list[int] = []
        for _ in range(theta):
            sub = dist[remaining][:, remaining]
            scores = _reference_scores(sub, remaining.numel() - f - 2)
            pos = int(torch.sort(scores, stable=True).indices[0])
            chosen.append(int(remaining[pos]))
            remaining = torch.cat([remaining[:pos], remaining[pos + 1 :]])
        idx = torch.tensor(chosen, dtype=torch.long)
    return reference_bulyan_coordinate(x[idx.to(x.device)], f)


def reference_fltrust(x: torch.Tensor, server_update: torch.Tensor) -> torch.Tensor:
    """FLTrust: rows rescaled to ``||g||`` and averaged with weights ``ReLU(cos(x_i, g))``.

    Parameters
    ----------
    x : torch.Tensor
        Stacked client updates ``(n, d)``.
    server_update : torch.Tensor
        ``(d,)`` server update ``g``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    g = server_update
    dots, norms = (x @ g).double(), torch.linalg.vector_norm(x, dim=1).double()
    gnorm = float(torch.linalg.vector_norm(g))
    denom = norms * gnorm
    cos = torch.where(denom > 0, dots / denom.clamp_min(1e-300), torch.zeros_like(dots))
    trust = torch.relu(cos)
    total = float(trust.sum())
    if total <= 0:
        return torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    coef = trust * gnorm / norms.clamp_min(1e-300) / total
    coef = torch.where(trust > 0, coef, torch.zeros_like(coef))
    return coef.to(dtype=x.dtype, device=x.device) @ x


def reference_geometric_median(x: torch.Tensor, eps: float = 1e-6, iters: int = 100,
                               weights: torch.Tensor | None = None) -> torch.Tensor:
    """Smoothed Weiszfeld on the Gram matrix from the weighted mean (stopping rule as the rule's).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    eps : float
        Smoothing and relative stopping tolerance.
    iters : int
        Maximum number of steps.
    weights : torch.Tensor or None
        Non-negative weights (normalised here); None: uniform.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    if weights is None:
        alpha = torch.full((n,), 1.0 / n, dtype=torch.float64)
    else:
        alpha = torch.as_tensor(weights, dtype=torch.float64).cpu()
        alpha = alpha / alpha.sum()
    g = reference_gram(x).cpu()
    diag = torch.diagonal(g)

    def dists(c: torch.Tensor) -> torch.Tensor:
        gc = g @ c
        return (diag - 2.0 * gc + c @ gc).clamp_min(0.0).sqrt()

    c = alpha.clone()
    dist = dists(c)
    for _ in range(iters):
        beta = alpha / dist.clamp_min(eps)
        c_new = beta / beta.sum()
        delta = c_new - c
        step = float(delta @ (g @ delta)) ** 0.5 if float(delta @ (g @ delta)) > 0 else 0.0
        c = c_new
        dist = dists(c)
        if step <= eps * max(float(alpha @ dist), 1e-300):
            break
    return c.to(dtype=x.dtype, device=x.device) @ x


def _reference_distances_to(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if x.dtype not in (torch.float32, torch.float64):
        return torch.linalg.vector_norm(x.float() - v.float(), dim=1).double()
    n, d = x.shape
    if x.device.type != "cpu" or d <= _REF_GRAM_BLOCK:
        return torch.linalg.vector_norm(x - v, dim=1).double()
    acc = torch.zeros(n, dtype=torch.float64)
    buf = torch.empty(n, _REF_GRAM_BLOCK, dtype=x.dtype)
    for start in range(0, d, _REF_GRAM_BLOCK):
        block = x[:, start : start + _REF_GRAM_BLOCK]
        diff = buf[:, : block.shape[1]]
        torch.sub(block, v[start : start + _REF_GRAM_BLOCK], out=diff)
        acc += torch.linalg.vector_norm(diff, dim=1).double().square_()
    return acc.sqrt_()


def reference_centered_clipping(x: torch.Tensor, center: torch.Tensor, tau: float, iters: int = 1) -> torch.Tensor:
    """Centered clipping with exact distances (float32 differences, float64 sums) every step.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    center : torch.Tensor
        ``(d,)`` starting point.
    tau : float
        Clipping radius.
    iters : int
        Number of iterations.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    v = center.to(dtype=x.dtype, device=x.device)
    for _ in range(iters):
        dist = _reference_distances_to(x, v).cpu()
        scale = torch.where(dist > tau, tau / dist.clamp_min(1e-300), torch.ones_like(dist))
        coef = scale / n
        v = coef.to(dtype=x.dtype, device=x.device) @ x + (1.0 - float(coef.sum())) * v
    return v

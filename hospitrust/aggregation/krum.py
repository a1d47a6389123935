"""Pairwise distances, Krum and Multi-Krum (Blanchard et al., 2017)."""

from __future__ import annotations

import torch

from ._validation import check_f, check_updates
from .kernels import checked_distances, nearest_neighbour_scores, weighted_row_sum

__all__ = [
    "krum_scores",
    "krum_select",
    "krum",
    "multi_krum_select",
    "multi_krum",
]

def _check_krum(n: int, f: int, rule: str = "krum") -> None:
    if n < 2 * f + 3:
        raise ValueError(
            f"{rule} requires n >= 2f + 3 clients; got n={n}, f={f} "
            f"(need n >= {2 * f + 3}, or f <= {(n - 3) // 2})"
        )


def krum_scores(
    x: torch.Tensor, f: int, distances: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Krum score of every update.

    .. math:: s(i) = \sum_{j \in N_i} \lVert x_i - x_j \rVert^2

    where :math:`N_i` are the :math:`n - f - 2` nearest neighbours of
    :math:`x_i` (excluding itself). Blanchard, El Mhamdi, Guerraoui, Stainer,
    "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent",
    NeurIPS 2017. ByzFL's ``Krum`` counts :math:`n - f - 1` neighbours instead
    (docs/rules/krum.md).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients; requires ``n >= 2f + 3``.
    distances : torch.Tensor, optional
        Precomputed :func:`pairwise_sq_distances` (``(n, n)``).

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 scores (lower is better).
    """
    n, _ = check_updates(x)
    f = check_f(f)
    _check_krum(n, f)
    # n - f - 2 neighbours, the paper's count; ByzFL 0.0.11's Krum takes n - f - 1 (its rows' columns
    # 1 .. n - f - 1 after sorting): docs/rules/krum.md
    return nearest_neighbour_scores(checked_distances(x, distances), n - f - 2)


def krum_select(x: torch.Tensor, f: int, distances: torch.Tensor | None = None) -> int:
    """Index of the Krum-selected update (lowest score; ties -> lowest index).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients, ``n >= 2f + 3``.
    distances : torch.Tensor or None
        Precomputed ``(n, n)`` squared distances of the rows of ``x``; None computes them.

    Returns
    -------
    int
        The row index of the selected update.
    """
    scores = krum_scores(x, f, distances)
    return int(torch.sort(scores, stable=True).indices[0])


def krum(x: torch.Tensor, f: int) -> torch.Tensor:
    r"""Krum: the update with the smallest Krum score.

    .. math:: \mathrm{Krum}(x) = x_{i^*},\quad
              i^* = \arg\min_i \sum_{j \in N_i} \lVert x_i - x_j\rVert^2

    with :math:`N_i` the :math:`n-f-2` nearest neighbours of :math:`x_i`.
    Blanchard et al., NeurIPS 2017. Matches Flower's ``Krum`` (which uses
    ``max(1, n - f - 2)`` neighbours and does not check ``n >= 2f + 3``).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients, ``n >= 2f + 3``.

    Returns
    -------
    torch.Tensor
        ``(d,)`` copy of the selected row. Use :func:`krum_select` /
        :func:`krum_scores` to record which client was chosen.
    """
    return x[krum_select(x, f)].clone()


def multi_krum_select(
    x: torch.Tensor,
    f: int,
    m: int | None = None,
    distances: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indices of the ``m`` updates with the lowest Krum scores (best first).

    Ties are broken by the lower index. ``m`` defaults to ``n - f``.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients, ``n >= 2f + 3``.
    m : int or None
        Updates selected, ``1 <= m <= n``; None: ``n - f``.
    distances : torch.Tensor or None
        Precomputed ``(n, n)`` squared distances of the rows of ``x``; None computes them.

    Returns
    -------
    torch.Tensor
        int64 indices of shape ``(m,)``.
    """
    n, _ = check_updates(x)
    f = check_f(f)
    _check_krum(n, f, "multi_krum")
    if m is None:
        m = n - f
    m = check_f(m, "m")
    if not 1 <= m <= n:
        raise ValueError(f"multi_krum requires 1 <= m <= n; got m={m}, n={n}")
    scores = nearest_neighbour_scores(checked_distances(x, distances), n - f - 2)
    return torch.sort(scores, stable=True).indices[:m]


def multi_krum(x: torch.Tensor, f: int, m: int | None = None) -> torch.Tensor:
    r"""Multi-Krum: the mean of the ``m`` updates with the best Krum scores.

    .. math:: \mathrm{MultiKrum}_m(x) = \frac1m \sum_{i \in S_m} x_i

    where :math:`S_m` are the ``m`` indices with the smallest Krum scores
    (:func:`krum_scores`, computed once). Blanchard et al., NeurIPS 2017
    (Multi-Krum; El Mhamdi et al. 2018 for ``m = n - f``). Flower's
    ``MultiKrum(num_nodes_to_select=m)`` selects the same set but averages it
    weighted by each reply's ``num-examples``; with equal weights they agree.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients, ``n >= 2f + 3``.
    m : int, optional
        Number of updates averaged, ``1 <= m <= n``; default ``n - f``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n, _ = check_updates(x)
    idx = multi_krum_select(x, f, m)
    if idx.numel() == 1:
        return x[int(idx[0])].clone()
    # one weighted sum of the selected rows (the compiled kernel reads only those rows; a GEMV
    # reads all of them): with the one-pass Gram of the selection, two passes in all. Summing the
    # columns during the Gram pass to subtract the left-out rows was not done: it needs the
    # column sum (a (d,) output the Gram loop cannot produce) and loses accuracy to a huge
    # left-out row.
    w = torch.zeros(n, dtype=torch.float64)
    w[idx.cpu()] = 1.0 / idx.numel()
    return weighted_row_sum(x, w)

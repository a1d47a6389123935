"""Bulyan (El Mhamdi, Guerraoui, Rouault, 2018)."""

from __future__ import annotations

import torch

from ._validation import check_f, check_updates
from .kernels import checked_distances, nearest_neighbour_scores
from .order_statistics import bulyan_coordinate_kernel

__all__ = ["bulyan_select", "bulyan"]

_SELECTIONS = ("krum", "multi_krum")


def _check_bulyan(n: int, f: int) -> None:
    if n < 4 * f + 3:
        raise ValueError(
            f"bulyan requires n >= 4f + 3 clients; got n={n}, f={f} "
            f"(need n >= {4 * f + 3}, or f <= {(n - 3) // 4})"
        )


def bulyan_select(
    x: torch.Tensor,
    f: int,
    distances: torch.Tensor | None = None,
    selection: str = "krum",
) -> torch.Tensor:
    r"""Bulyan's selection phase: indices of the ``theta = n - 2f`` chosen updates.

    ``selection="krum"`` (the paper): apply Krum recursively -- pick the
    update with the lowest Krum score among the remaining set ``R`` (with
    :math:`\max(1, |R| - f - 2)` neighbours), remove it from ``R``, repeat
    ``theta`` times. The pairwise distances are computed once and every step
    uses the sub-matrix of the remaining rows.

    Ties in score go to the lower index. In the last steps (``|R|`` down to
    ``2f + 1``, i.e. ``max(1, f - 1)`` neighbours) two mutual nearest
    neighbours can tie exactly when only one neighbour is counted, so for
    ``f <= 2`` the selection may depend on the client order.

    ``selection="multi_krum"``: one Multi-Krum pass, the ``theta`` lowest
    Krum scores on the full set (what Flower's ``Bulyan`` does by default via
    ``select_multikrum``).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``, one row per client; needs ``n >= 4f + 3``.
    f : int
        Assumed number of Byzantine clients.
    distances : torch.Tensor or None
        Precomputed ``(n, n)`` squared Euclidean distances of the rows of ``x``; None computes them.
    selection : {"krum", "multi_krum"}
        Iterated Krum (the paper) or a single Multi-Krum pass.

    Returns
    -------
    torch.Tensor
        int64 indices of shape ``(theta,)``, in selection order.
    """
    n, _ = check_updates(x)
    f = check_f(f)
    _check_bulyan(n, f)
    if selection not in _SELECTIONS:
        raise ValueError(f"selection must be one of {_SELECTIONS}; got {selection!r}")
    theta = n - 2 * f
    dist = checked_distances(x, distances).cpu()
    if selection == "multi_krum":
        scores = nearest_neighbour_scores(dist, n - f - 2)
        return torch.sort(scores, stable=True).indices[:theta]
    remaining = torch.arange(n)
    chosen: list[int] = []
    for _ in range(theta):
        sub = dist[remaining][:, remaining]
        scores = nearest_neighbour_scores(sub, remaining.numel() - f - 2)
        pos = int(torch.sort(scores, stable=True).indices[0])
        chosen.append(int(remaining[pos]))
        remaining = torch.cat([remaining[:pos], remaining[pos + 1 :]])
    return torch.tensor(chosen, dtype=torch.long)


def bulyan(x: torch.Tensor, f: int, selection: str = "krum") -> torch.Tensor:
    r"""Bulyan aggregation.

    1. Selection: :math:`S` = ``theta = n - 2f`` updates chosen by iterated
       Krum (:func:`bulyan_select`).
    2. Coordinate phase, with :math:`\beta = \theta - 2f`: for every
       coordinate ``j``, with :math:`m_j` the median of
       :math:`\{x_{i,j}\}_{i\in S}` (even :math:`\theta`: mean of the two
       middle values),

       .. math:: \mathrm{Bulyan}(x)_j = \frac1\beta \sum_{i \in B_j} x_{i,j}

       where :math:`B_j \subset S` are the :math:`\beta` indices with the
       smallest :math:`|x_{i,j} - m_j|` (a tie in distance keeps the smaller
       value).

    El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed
    Learning in Byzantium", ICML 2018. Requires ``n >= 4f + 3``.

    Differences with Flower's ``Bulyan``: Flower selects with a single
    Multi-Krum pass (``selection="multi_krum"`` here reproduces it) and
    breaks distance ties arbitrarily (``np.argpartition``); the coordinate
    phase is otherwise identical.

    The coordinate phase runs in one fused pass over the selected rows (sorting
    network + window selection, see
    :mod:`hospitrust.aggregation.order_statistics`): the ``beta`` closest
    values are the sorted window :math:`[k, k+\beta)` with
    :math:`k = 1 + \max\{t < 2f : |s_t - m| > |s_{t+\beta} - m|\}`.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine clients.
    selection : {"krum", "multi_krum"}
        Selection phase (see :func:`bulyan_select`).

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    idx = bulyan_select(x, f, selection=selection)
    return bulyan_coordinate_kernel(x, idx, f)

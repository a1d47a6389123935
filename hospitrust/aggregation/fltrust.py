"""FLTrust (Cao, Fang, Liu, Gong, NDSS 2021)."""

from __future__ import annotations

import torch

from ._validation import check_updates, check_vector
from .kernels import row_dots, weighted_row_sum

__all__ = ["fltrust_trust", "fltrust"]

def _dots_and_norms(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x @ g`` and ``||x_i||`` as float64: one pass (:func:`~hospitrust.aggregation.kernels.row_dots`)."""
    return row_dots(x, g)


def _trust(x: torch.Tensor, g: torch.Tensor):
    dots, norms = _dots_and_norms(x, g)
    gnorm = float(torch.linalg.vector_norm(g))
    denom = norms * gnorm
    cos = torch.where(denom > 0, dots / denom.clamp_min(1e-300), torch.zeros_like(dots))
    return torch.relu(cos), norms, gnorm


def fltrust_trust(x: torch.Tensor, server_update: torch.Tensor) -> torch.Tensor:
    r"""FLTrust trust scores :math:`TS_i = \mathrm{ReLU}(\cos(x_i, g_0))`.

    A zero update (or a zero server update) gets trust 0.

    Parameters
    ----------
    x : torch.Tensor
        Stacked client updates ``(n, d)``.
    server_update : torch.Tensor
        ``(d,)`` server (root-dataset) update :math:`g_0`.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 on CPU.
    """
    _, d = check_updates(x)
    g = check_vector(server_update, d, "server_update", x)
    return _trust(x, g)[0].cpu()


def fltrust(x: torch.Tensor, server_update: torch.Tensor) -> torch.Tensor:
    r"""FLTrust aggregation.

    .. math::

        TS_i = \mathrm{ReLU}\Bigl(\frac{\langle x_i, g_0\rangle}
                                  {\lVert x_i\rVert\,\lVert g_0\rVert}\Bigr),\qquad
        \mathrm{FLTrust}(x) = \frac{1}{\sum_i TS_i} \sum_i TS_i\,
            \frac{\lVert g_0\rVert}{\lVert x_i\rVert}\, x_i

    where :math:`g_0` is the server's update on its small root dataset. If
    every trust score is 0 the result is the zero vector. Cao, Fang, Liu,
    Gong, "FLTrust: Byzantine-robust Federated Learning via Trust
    Bootstrapping", NDSS 2021.

    Two passes over the data on the CPU for large ``d`` (dot products and norms together in
    one compiled pass, then the weighted sum of the rows with positive trust); otherwise three
    (a matrix-vector product, a norm pass and the weighted sum).

    Parameters
    ----------
    x : torch.Tensor
        Stacked client updates ``(n, d)``.
    server_update : torch.Tensor
        ``(d,)`` server (root-dataset) update :math:`g_0`.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n, d = check_updates(x)
    g = check_vector(server_update, d, "server_update", x)
    trust, norms, gnorm = _trust(x, g)
    total = float(trust.sum())
    if total <= 0:
        return torch.zeros(d, dtype=x.dtype, device=x.device)
    coef = trust * gnorm / norms.clamp_min(1e-300) / total
    coef = torch.where(trust > 0, coef, torch.zeros_like(coef))
    return weighted_row_sum(x, coef)

"""Per-update L2 norm clipping (norm bounding) and the mean of the clipped updates."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._validation import check_updates, check_weights
from .kernels import weighted_row_sum

__all__ = ["norm_clip", "clip_factors", "clip_rows"]


def _check_max_norm(max_norm: float) -> None:
    if isinstance(max_norm, bool) or not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"norm_clip requires max_norm > 0; got max_norm={max_norm!r}")


def clip_factors(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    r"""``(n,)`` float64 factors :math:`\min(1, C / \lVert x_i\rVert_2)`: one pass over ``x``.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        Clipping bound ``C > 0``.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 factors in ``(0, 1]`` on ``x.device``.
    """
    check_updates(x)
    _check_max_norm(max_norm)
    norms = torch.linalg.vector_norm(x, dim=1).double()  # dtype=float64 here would copy x to float64 first
    return torch.where(norms > max_norm, max_norm / norms.clamp_min(1e-300), torch.ones_like(norms))


def norm_clip(
    x: torch.Tensor, max_norm: float, weights: torch.Tensor | Sequence[float] | None = None
) -> torch.Tensor:
    r"""Norm-bounded mean: every update scaled down to L2 norm at most ``max_norm``, then
    averaged (weighted by ``weights`` when given, else uniformly).

    .. math:: \tilde x_i = x_i \cdot \min\!\Bigl(1, \frac{C}{\lVert x_i\rVert_2}\Bigr),
              \qquad \mathrm{NormClip}(x) = \frac{\sum_i w_i \tilde x_i}{\sum_i w_i}

    Two passes over the data (the norms, then one weighted sum with the clip factors
    folded into the weights); the clipped ``(n, d)`` updates are never materialized
    (:func:`clip_rows` gives them when another rule needs them). Sun, Kairouz, Suresh,
    McMahan, "Can You Really Backdoor Federated Learning?", 2019 (norm bounding); also the
    clipping step of DP-FedAvg (McMahan et al., ICLR 2018).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        Clipping bound ``C > 0``.
    weights : array-like of shape (n,), optional
        Non-negative weights with positive sum (e.g. num-examples); default uniform.

    Returns
    -------
    torch.Tensor
        ``(d,)``, same dtype/device as ``x``.
    """
    n, _ = check_updates(x)
    factors = clip_factors(x, max_norm)
    w = (torch.full((n,), 1.0 / n, dtype=torch.float64) if weights is None
         else check_weights(weights, n, x).to(device="cpu", dtype=torch.float64))
    coef = factors.cpu() * (w / w.sum())
    return weighted_row_sum(x, coef)


def clip_rows(x: torch.Tensor, max_norm: float, out: torch.Tensor | None = None) -> torch.Tensor:
    r"""The clipped updates :math:`\tilde x_i` themselves, ``(n, d)``: a new tensor unless
    ``out`` is given (``out=x`` clips in place). Writing a fresh ``(n, d)`` tensor is
    dominated by page-faulting new memory for large models: pass a reusable ``out``.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        Clipping bound ``C > 0``.
    out : torch.Tensor or None
        Where to write the result (same shape, dtype and device as ``x``); None: a new tensor.

    Returns
    -------
    torch.Tensor
        ``(n, d)`` clipped updates (``out`` when given).
    """
    factor = clip_factors(x, max_norm).to(dtype=x.dtype, device=x.device)[:, None]
    if out is None:
        return x * factor
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x (shape {tuple(x.shape)}, {x.dtype}, {x.device}); "
            f"got shape {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    return torch.mul(x, factor, out=out)

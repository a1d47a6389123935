"""Per-update L2 norm clipping."""

from __future__ import annotations

import torch

from ._validation import check_updates

__all__ = ["norm_clip"]


def norm_clip(
    x: torch.Tensor, max_norm: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Scale every update down to L2 norm at most ``max_norm``.

    .. math:: \tilde x_i = x_i \cdot \min\!\Bigl(1, \frac{C}{\lVert x_i\rVert_2}\Bigr)

    Unlike the other rules this **returns the clipped ``(n, d)`` tensor** (a
    new tensor unless ``out`` is given; ``x`` is not modified unless
    ``out is x``) -- combine it with any aggregation rule, e.g.
    ``mean(norm_clip(x, C))``. Writing a fresh ``(n, d)`` tensor is dominated
    by page-faulting new memory for large models; pass a reusable ``out``
    (or ``out=x`` to clip in place) to avoid it. Sun, Kairouz, Suresh, McMahan,
    "Can You Really Backdoor Federated Learning?", 2019 (norm bounding);
    also the clipping step of DP-FedAvg (McMahan et al., ICLR 2018).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        Clipping bound ``C > 0``.
    out : torch.Tensor, optional
        ``(n, d)`` tensor (same dtype/device as ``x``) to write into; may be
        ``x`` itself.

    Returns
    -------
    torch.Tensor
        ``(n, d)`` clipped updates (same dtype/device as ``x``).
    """
    check_updates(x)
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"norm_clip requires max_norm > 0; got max_norm={max_norm!r}")
    norms = torch.linalg.vector_norm(x, dim=1).double()
    factor = torch.where(
        norms > max_norm, max_norm / norms.clamp_min(1e-300), torch.ones_like(norms)
    )
    factor = factor.to(dtype=x.dtype, device=x.device)[:, None]
    if out is None:
        return x * factor
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x (shape {tuple(x.shape)}, {x.dtype}, {x.device}); "
            f"got shape {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    return torch.mul(x, factor, out=out)

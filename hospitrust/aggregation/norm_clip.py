"""Per-update L2 norm clipping."""

from __future__ import annotations

import torch

from ._validation import check_updates

__all__ = ["norm_clip"]


def norm_clip(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    r"""Scale every update down to L2 norm at most ``max_norm``.

    .. math:: \tilde x_i = x_i \cdot \min\!\Bigl(1, \frac{C}{\lVert x_i\rVert_2}\Bigr)

    Unlike the other rules this **returns the clipped ``(n, d)`` tensor** (a
    new tensor; ``x`` is not modified) -- combine it with any aggregation
    rule, e.g. ``mean(norm_clip(x, C))``. Sun, Kairouz, Suresh, McMahan,
    "Can You Really Backdoor Federated Learning?", 2019 (norm bounding);
    also the clipping step of DP-FedAvg (McMahan et al., ICLR 2018).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        Clipping bound ``C > 0``.

    Returns
    -------
    torch.Tensor
        ``(n, d)`` clipped updates (same dtype/device as ``x``).
    """
    check_updates(x)
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"norm_clip requires max_norm > 0; got max_norm={max_norm!r}")
    norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)
    factor = torch.where(
        norms > max_norm, max_norm / norms.clamp_min(1e-300), torch.ones_like(norms)
    )
    return x * factor.to(x.dtype)[:, None]

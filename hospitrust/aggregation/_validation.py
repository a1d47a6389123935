"""Argument checks shared by the aggregation rules.

Every check raises :class:`ValueError` (or :class:`TypeError` for a wrong
type) with a message that names what was received and what is required.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "check_updates",
    "check_f",
    "check_weights",
    "check_vector",
]


def check_updates(x: torch.Tensor, name: str = "x") -> tuple[int, int]:
    """Check that ``x`` is a non-empty 2-D floating tensor ``(n, d)``.

    Returns
    -------
    tuple of int
        ``(n, d)``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape (n, d); got {type(x).__name__}"
        )
    if x.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D with shape (n, d) (one row per client update); "
            f"got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype; got {x.dtype}")
    n, d = x.shape
    if n < 1:
        raise ValueError(f"{name} must contain at least one update (n >= 1); got n={n}")
    return int(n), int(d)


def check_f(f: int, name: str = "f") -> int:
    """Check that ``f`` (number of Byzantine clients) is a non-negative int."""
    if isinstance(f, bool) or not isinstance(f, int):
        try:
            import numpy as np  # local: only for numpy integer scalars

            if isinstance(f, np.integer):
                f = int(f)
            else:
                raise TypeError
        except TypeError:
            raise TypeError(f"{name} must be an int; got {type(f).__name__} ({f!r})") from None
    if f < 0:
        raise ValueError(f"{name} must be >= 0; got {name}={f}")
    return int(f)


def check_weights(
    weights: torch.Tensor | Sequence[float], n: int, like: torch.Tensor
) -> torch.Tensor:
    """Check client weights: length ``n``, finite, non-negative, positive sum.

    Returns the weights as a 1-D tensor with the dtype and device of ``like``.
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.dim() != 1 or w.shape[0] != n:
        raise ValueError(
            f"weights must be 1-D with length n={n} (one per update); "
            f"got shape {tuple(w.shape)}"
        )
    if not torch.isfinite(w).all():
        raise ValueError(f"weights must be finite; got {w.tolist()}")
    if (w < 0).any():
        raise ValueError(f"weights must be non-negative; got {w.tolist()}")
    total = float(w.sum())
    if not total > 0:
        raise ValueError(f"weights must have a positive sum; got sum={total}")
    return w.to(dtype=like.dtype, device=like.device)


def check_vector(v: torch.Tensor, d: int, name: str, like: torch.Tensor) -> torch.Tensor:
    """Check that ``v`` is a 1-D floating tensor of length ``d``."""
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({d},); got {type(v).__name__}")
    if v.dim() != 1 or v.shape[0] != d:
        raise ValueError(
            f"{name} must be 1-D with length d={d} (same as the updates); "
            f"got shape {tuple(v.shape)}"
        )
    if not v.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype; got {v.dtype}")
    return v.to(dtype=like.dtype, device=like.device)

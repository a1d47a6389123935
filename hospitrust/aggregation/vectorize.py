"""Flatten model state dicts into vectors and back (no Flower dependency).

Only floating-point tensors take part in the aggregation math; integer
buffers (e.g. BatchNorm ``num_batches_tracked``) are left out of the vector
and copied back from a template. A Flower ``ArrayRecord`` converts with
``.to_torch_state_dict()`` before calling these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["FlatSpec", "flatten_state", "unflatten_state", "stack_updates"]


@dataclass(frozen=True)
class FlatSpec:
    """Layout of the float tensors inside a flat vector.

    Parameters
    ----------
    keys : tuple of str
        Key of every float tensor, in the order they appear in the vector.
    shapes : tuple of torch.Size
        Original shape of every float tensor, in the same order.
    dtypes : tuple of torch.dtype
        Original dtype of every float tensor, in the same order.
    offsets : tuple of int
        Start of every tensor in the vector.
    numel : int
        The total length of the vector.
    """

    keys: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    offsets: tuple[int, ...]
    numel: int


def _spec(state: Mapping[str, torch.Tensor]) -> FlatSpec:
    keys, shapes, dtypes, offsets = [], [], [], []
    off = 0
    for k, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state[{k!r}] must be a torch.Tensor; got {type(t).__name__}")
        if t.is_floating_point():
            keys.append(k)
            shapes.append(t.shape)
            dtypes.append(t.dtype)
            offsets.append(off)
            off += t.numel()
    return FlatSpec(tuple(keys), tuple(shapes), tuple(dtypes), tuple(offsets), off)


def flatten_state(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, FlatSpec]:
    """Concatenate the floating-point tensors of ``state`` into one vector.

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        A model ``state_dict``.
    dtype : torch.dtype
        dtype of the returned vector (default float32).

    Returns
    -------
    vector : torch.Tensor
        ``(d,)`` with ``d`` the total number of floating-point elements, on the
        device of the first float tensor (CPU if none).
    spec : FlatSpec
        Layout needed by :func:`unflatten_state`.
    """
    spec = _spec(state)
    device = state[spec.keys[0]].device if spec.keys else torch.device("cpu")
    out = torch.empty(spec.numel, dtype=dtype, device=device)
    for k, off in zip(spec.keys, spec.offsets):
        t = state[k]
        out[off : off + t.numel()] = t.detach().reshape(-1)
    return out, spec


def unflatten_state(
    vector: torch.Tensor, spec: FlatSpec, template: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Rebuild a state dict from a flat vector.

    Float tensors come from ``vector`` (original shapes and dtypes, on the
    device of ``vector``); every other entry (integer buffers) is a copy of
    the one in ``template``. Keys follow the order of ``template``.

    Parameters
    ----------
    vector : torch.Tensor
        ``(d,)`` flat vector laid out as ``spec``.
    spec : FlatSpec
        The layout, from :func:`flatten_state`.
    template : Mapping[str, torch.Tensor]
        A state dict with every key of ``spec``: gives the key order and the non-float entries.

    Returns
    -------
    dict[str, torch.Tensor]
        The rebuilt state dict.
    """
    if vector.dim() != 1 or vector.numel() != spec.numel:
        raise ValueError(
            f"vector must be 1-D with {spec.numel} elements (from spec); "
            f"got shape {tuple(vector.shape)}"
        )
    floats = {
        k: (shape, dt, off)
        for k, shape, dt, off in zip(spec.keys, spec.shapes, spec.dtypes, spec.offsets)
    }
    missing = [k for k in spec.keys if k not in template]
    if missing:
        raise ValueError(f"template is missing float keys from spec: {missing}")
    out: dict[str, torch.Tensor] = {}
    for k, t in template.items():
        if k in floats:
            shape, dt, off = floats[k]
            n = 1
            for s in shape:
                n *= s
            out[k] = vector[off : off + n].reshape(shape).to(dt).clone()
        else:
            out[k] = t.detach().clone()
    return out


def stack_updates(
    states: Sequence[Mapping[str, torch.Tensor]],
    global_state: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """Stack client updates ``client - global`` over the float keys.

    Parameters
    ----------
    states : sequence of state dicts
        One per client; each must hold every float key of ``global_state``
        with the same shape.
    global_state : Mapping[str, torch.Tensor]
        The model the clients started from.

    Returns
    -------
    torch.Tensor
        ``(n, d)`` float32 on the device of ``global_state``'s tensors, rows
        in the order of ``states`` and columns in the layout of
        ``flatten_state(global_state)``.
    """
    if len(states) == 0:
        raise ValueError("stack_updates requires at least one client state; got 0")
    spec = _spec(global_state)
    device = global_state[spec.keys[0]].device if spec.keys else torch.device("cpu")
    out = torch.empty(len(states), spec.numel, dtype=torch.float32, device=device)
    for i, st in enumerate(states):
        for k, shape, off in zip(spec.keys, spec.shapes, spec.offsets):
            if k not in st:
                raise ValueError(f"client state {i} is missing key {k!r}")
            t = st[k]
            if t.shape != shape:
                raise ValueError(
                    f"client state {i}: {k!r} has shape {tuple(t.shape)}, "
                    f"global has {tuple(shape)}"
                )
            n = t.numel()
            torch.sub(
                t.detach().reshape(-1).to(device=device, dtype=torch.float32),
                global_state[k].detach().reshape(-1).to(torch.float32),
                out=out[i, off : off + n],
            )
    return out

"""Model state <-> one flat vector, for the aggregation math.

Only floating-point tensors enter the vector: integer buffers (BatchNorm's
``num_batches_tracked``) are counters, not parameters, and are copied, never averaged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatSpec:
    """Where each float tensor lives in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    offsets: tuple[int, ...]  # start of each tensor; the last entry is the total length

    @property
    def size(self) -> int:
        return self.offsets[-1]


def flatten_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, FlatSpec]:
    """Concatenate the floating-point tensors of ``state`` (in its order) into one ``(d,)`` vector."""
    names, shapes, dtypes, offsets, parts = [], [], [], [0], []
    for name, t in state.items():
        if not t.is_floating_point():
            continue
        names.append(name)
        shapes.append(tuple(t.shape))
        dtypes.append(t.dtype)
        offsets.append(offsets[-1] + t.numel())
        parts.append(t.detach().reshape(-1).to(dtype))
    vector = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
    return vector, FlatSpec(tuple(names), tuple(shapes), tuple(dtypes), tuple(offsets))


def unflatten_state(
    vector: torch.Tensor, spec: FlatSpec, template: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A state dict in ``template``'s key order: float tensors from ``vector`` (original shapes and
    dtypes), every other tensor copied from ``template``."""
    if vector.ndim != 1 or vector.numel() != spec.size:
        raise ValueError(f"vector has shape {tuple(vector.shape)}, expected ({spec.size},)")
    position = {name: i for i, name in enumerate(spec.names)}
    out: dict[str, torch.Tensor] = {}
    for name, ref in template.items():
        i = position.get(name)
        if i is None:
            out[name] = ref.detach().clone()
        else:
            chunk = vector[spec.offsets[i] : spec.offsets[i + 1]]
            out[name] = chunk.reshape(spec.shapes[i]).to(spec.dtypes[i]).clone()
    missing = set(spec.names) - set(template)
    if missing:
        raise ValueError(f"template lacks float tensors {sorted(missing)[:5]}")
    return out


def stack_updates(
    states: Sequence[Mapping[str, torch.Tensor]], global_state: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """``(n, d)`` float32 stack of (client - global) over the float tensors."""
    global_vector, _ = flatten_state(global_state)
    return torch.stack([flatten_state(s)[0] - global_vector for s in states])

"""Applying an attack where it runs: to the server's stacked updates (a simulation step) or to a
hospital's state dict (its ClientApp).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import torch

from hospitrust.attacks.interfaces import ColludingAttack, UpdateAttack, attack_kind
from hospitrust.attacks.math import update as U


def attack_update_stack(
    attack: UpdateAttack | ColludingAttack,
    updates: torch.Tensor,
    malicious_rows: Iterable[int],
    *,
    server_round: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Server-side (simulation) step between reply collection and aggregation.

    ``updates`` is the ``(n, d)`` stack of *all* replies' updates (returned - global),
    ``malicious_rows`` the rows sent by malicious hospitals. Returns a new ``(n, d)``
    stack whose malicious rows are replaced:

    * :class:`ColludingAttack`: rows = ``attack.craft(honest rows, m)``, where the honest
      rows are all rows not in ``malicious_rows`` (full knowledge of benign updates);
    * :class:`UpdateAttack`: each malicious row = ``attack.apply(its own row)`` (handy in
      an in-process loop that keeps attacks off the ClientApp);
    * inactive attack (``not attack.active(server_round)``), or no malicious rows: the
      stack is returned unchanged (a copy), so inactive colluders send their own
      honest updates.

    Parameters
    ----------
    attack : UpdateAttack or ColludingAttack
        The attack (possibly in a schedule).
    updates : torch.Tensor
        ``(n, d)`` stack of all replies' updates.
    malicious_rows : Iterable[int]
        Rows of ``updates`` sent by malicious hospitals.
    server_round : int
        The 1-based Flower round (schedules gate on it).
    generator : torch.Generator or None
        Randomness for attacks that draw (noise, Fang's draws).

    Returns
    -------
    torch.Tensor
        A new ``(n, d)`` stack.
    """
    updates = U.check_stack(updates)
    n = updates.shape[0]
    rows = sorted({int(r) for r in malicious_rows})
    if any(not 0 <= r < n for r in rows):
        raise ValueError(f"malicious rows {rows} out of range for {n} updates")
    out = updates.clone()
    if not rows or not attack.active(server_round):
        return out
    kind = attack_kind(attack)
    if kind == "update":
        for r in rows:
            out[r] = cast(UpdateAttack, attack).apply(updates[r], server_round=server_round, generator=generator)
        return out
    if kind != "colluding":
        raise TypeError(f"attack_update_stack needs an UpdateAttack or ColludingAttack, got a {kind} attack")
    honest_rows = [i for i in range(n) if i not in set(rows)]
    if not honest_rows:
        raise ValueError("every reply is malicious: a colluding attack needs at least one honest update")
    crafted = cast(ColludingAttack, attack).craft(updates[honest_rows], len(rows), server_round=server_round, generator=generator)
    if tuple(crafted.shape) != (len(rows), updates.shape[1]):
        raise ValueError(f"{attack!r} crafted shape {tuple(crafted.shape)}, expected {(len(rows), updates.shape[1])}")
    out[rows] = crafted.to(dtype=updates.dtype, device=updates.device)
    return out


def attack_state_dict(
    attack: UpdateAttack,
    global_state: Mapping[str, torch.Tensor],
    local_state: Mapping[str, torch.Tensor],
    *,
    server_round: int,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """ClientApp helper: ``global + attack.apply(local - global)`` over the floating-point
    entries of two state dicts (same keys, same shapes), flattened in key order.
    Non-float entries (e.g. BatchNorm's ``num_batches_tracked``) keep their local values.
    Returns the state dict to send; inactive attacks return the local weights.

    Parameters
    ----------
    attack : UpdateAttack
        The attack applied to the hospital's flattened update.
    global_state : Mapping[str, torch.Tensor]
        The global model the hospital received.
    local_state : Mapping[str, torch.Tensor]
        Its model after local training.
    server_round : int
        The 1-based Flower round (schedules gate on it).
    generator : torch.Generator or None
        Randomness for attacks that draw.

    Returns
    -------
    dict[str, torch.Tensor]
        The state dict to send.
    """
    if set(global_state) != set(local_state):
        raise ValueError("global and local state dicts have different keys")
    keys = [k for k in local_state if torch.is_floating_point(local_state[k])]
    out = {k: v.detach().clone() for k, v in local_state.items()}
    if not keys or not attack.active(server_round):
        return out
    for k in keys:
        if global_state[k].shape != local_state[k].shape:
            raise ValueError(f"{k}: global shape {tuple(global_state[k].shape)} != local {tuple(local_state[k].shape)}")
    g = torch.cat([global_state[k].detach().reshape(-1).to(torch.float32).cpu() for k in keys])
    w = torch.cat([local_state[k].detach().reshape(-1).to(torch.float32).cpu() for k in keys])
    attacked = attack.apply(w - g, server_round=server_round, generator=generator)
    if tuple(attacked.shape) != tuple(g.shape):
        raise ValueError(f"{attack!r} returned shape {tuple(attacked.shape)}, expected {tuple(g.shape)}")
    new = g + attacked.to(torch.float32).cpu()
    offset = 0
    for k in keys:
        ref = local_state[k]
        size = ref.numel()
        out[k] = new[offset : offset + size].reshape(ref.shape).to(dtype=ref.dtype, device=ref.device)
        offset += size
    return out

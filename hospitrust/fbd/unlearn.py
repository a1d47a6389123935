"""Unlearning a hospital from a FED-FBD warehouse: a set operation, not retraining.

Every block version that carries hospital H's information (H is in its trail: H wrote it;
or in its influences: a writer distilled from a color H had written) is replaced by the
average of the same block position over the *donor* colors, the colors H never reached.
Donors hold nothing of H by construction, so the result is exact: the replaced blocks and
everything else in the warehouse are the same as if H had never taken part, for every
color H's information had not reached. Where H reached every color there is nothing to
average from and unlearning refuses, naming why.

Integer buffers (BatchNorm's ``num_batches_tracked``) are copied from the donors (the
largest counter), never averaged. Averaged BatchNorm running statistics need not match
the averaged weights; ``recalibrate`` re-estimates them, only in the replaced blocks, on the
server's reference cohort (class-balanced images no hospital holds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from hospitrust.fbd.plan import ShippingPlan
from hospitrust.fbd.stamps import block_hash
from hospitrust.fbd.warehouse import Warehouse
from hospitrust.models.training import pick_device, to_batch


class UnlearningError(ValueError):
    """A hospital cannot be unlearned from this warehouse; the message says why."""


@dataclass
class UnlearningRecord:
    """What unlearning a hospital did (``unlearning.json``).

    Parameters
    ----------
    hospital : str
        The hospital unlearned.
    method : str
        How (``"aggregate"``: the donor colors' average).
    donor_colors : list[int]
        The colors the hospital never reached.
    replaced : list[dict[str, Any]]
        One entry per replaced block version: color, block, reason, old and new hash, donors.
    untouched_blocks : int
        Block versions left as they were.
    exact : bool
        Whether no block version carries the hospital afterwards.
    seconds : float
        Time the replacement took.
    bn_recalibrated : list[str]
        The ``'color/block'`` names whose BatchNorm statistics were re-estimated.
    recalibration_seconds : float
        Time the recalibration took.
    stamps : list[dict[str, Any]]
        The new block versions, for the stamp log.
    """

    hospital: str
    method: str
    donor_colors: list[int]
    replaced: list[dict[str, Any]]
    untouched_blocks: int
    exact: bool
    seconds: float
    bn_recalibrated: list[str] = field(default_factory=list)
    recalibration_seconds: float = 0.0
    stamps: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _mean_block(warehouse: Warehouse, block: str, donors: list[int]) -> dict[str, torch.Tensor]:
    out = {}
    for k in warehouse.block_keys[block]:
        tensors = [warehouse.states[m][k] for m in donors]
        if tensors[0].is_floating_point():
            acc = torch.add(tensors[0], tensors[1]) if len(tensors) > 1 else tensors[0].clone()
            for t in tensors[2:]:
                acc.add_(t)
            out[k] = acc.div_(len(tensors))
        else:  # counters: copied (the largest), never averaged
            out[k] = torch.stack(tensors).amax(dim=0)
    return out


def unlearn_hospital(warehouse: Warehouse, hospital: str, plan: ShippingPlan | None = None, *,
                     reference_images: np.ndarray | None = None, device: torch.device | None = None
                     ) -> tuple[Warehouse, UnlearningRecord]:
    """A new warehouse without ``hospital``; the input warehouse is left as it was.

    Parameters
    ----------
    warehouse : Warehouse
        The run's warehouse.
    hospital : str
        The hospital to remove.
    plan : ShippingPlan or None
        The run's plan: checks that the hospital wrote no color it was not allowed to; None: no check.
    reference_images : numpy.ndarray or None
        Images to recalibrate the replaced blocks' BatchNorm statistics on; None: no recalibration.
    device : torch.device or None
        Where the recalibration runs; None: :func:`pick_device`.

    Returns
    -------
    tuple[Warehouse, UnlearningRecord]
        The new warehouse and the record (UnlearningError when it cannot be done).
    """
    started = time.perf_counter()
    reached = warehouse.reached_by(hospital)
    written = warehouse.written_by(hospital)
    if plan is not None:
        outside = sorted({m for m, _ in written} - set(plan.colors_of.get(hospital, ())))
        if outside:  # provenance audit: a write the plan never allowed must not exist
            raise UnlearningError(f"audit failure: {hospital} appears as writer of colors {outside}, which the plan "
                                  f"never let it write (its colors: {list(plan.colors_of.get(hospital, ()))})")
    if not reached:
        known = sorted({h for v in warehouse.meta.values() for h in v.trail})
        raise UnlearningError(f"{hospital!r} wrote no block of this warehouse and reached none; hospitals that wrote: {known}")
    tainted = sorted({m for m, _ in reached})
    donors = [m for m in range(warehouse.num_colors) if m not in tainted]
    if not donors:
        raise UnlearningError(
            f"{hospital}'s information reached every color ({warehouse.num_colors}); there is no color to average "
            "from. Unlearning needs a plan that leaves colors beyond the hospital's reach (fewer colors per hospital, "
            "or groups of hospitals sharing colors, as generated plans with colors x redundancy = hospitals x k do)")
    new = warehouse.copy()
    written_set = set(written)
    replaced, stamps = [], []
    # one replacement per block position, shared by every color it replaces
    replacement = {b: _mean_block(warehouse, b, donors) for b in sorted({b for _, b in reached})}
    replacement_hash = {b: block_hash(t) for b, t in replacement.items()}
    for m, b in reached:
        old = warehouse.meta[(m, b)]
        donor_trail: list[str] = []
        donor_influences: set[str] = set()
        for d in donors:
            dv = warehouse.meta[(d, b)]
            donor_trail += [h for h in dv.trail if h not in donor_trail]
            donor_influences |= set(dv.influences)
        stamp = new.write_block(m, b, replacement[b], writer=f"unlearn:{hospital}", server_round=old.round,
                                trail=donor_trail, influences=donor_influences, copy=False,
                                content_hash=replacement_hash[b])
        stamps.append({"event": "unlearn", **stamp})
        replaced.append({"color": m, "block": b, "reason": "wrote" if (m, b) in written_set else "distilled",
                         "old_hash": old.hash, "new_hash": stamp["hash"], "donors": donors})
    seconds = time.perf_counter() - started
    recal_blocks, recal_seconds = [], 0.0
    if reference_images is not None:
        t0 = time.perf_counter()
        recal_blocks = recalibrate_batchnorm(new, reached, reference_images, device=device)
        recal_seconds = time.perf_counter() - t0
        for m, b in reached:  # the recalibrated versions are the ones on record
            v = new.meta[(m, b)]
            stamps = [s for s in stamps if not (s["color"] == m and s["block"] == b)] + [
                {"event": "unlearn", "round": v.round, "color": m, "block": b, "hash": v.hash,
                 "previous_hash": warehouse.meta[(m, b)].hash, "writer": v.writer, "trail": v.trail,
                 "influences": v.influences, "bn_recalibrated": True}]
            for r in replaced:
                if r["color"] == m and r["block"] == b:
                    r["new_hash"] = v.hash
    exact = all(hospital not in new.meta[k].trail and hospital not in new.meta[k].influences for k in new.meta)
    record = UnlearningRecord(hospital=hospital, method="aggregate", donor_colors=donors, replaced=replaced,
                              untouched_blocks=len(new.meta) - len(replaced), exact=exact, seconds=seconds,
                              bn_recalibrated=recal_blocks, recalibration_seconds=recal_seconds, stamps=stamps)
    return new, record


@torch.no_grad()
def recalibrate_batchnorm(warehouse: Warehouse, blocks: list[tuple[int, str]], images: np.ndarray, *,
                          batch_size: int = 256, device: torch.device | None = None) -> list[str]:
    """Re-estimate BatchNorm running mean/var of the listed (color, block)s from ``images``
    (cumulative average over one pass); other blocks, and the counters, keep their values.
    Returns the recalibrated ``'color/block'`` names (none for a model without BatchNorm).

    Parameters
    ----------
    warehouse : Warehouse
        The warehouse, updated in place.
    blocks : list[tuple[int, str]]
        The (color, block) pairs to recalibrate.
    images : numpy.ndarray
        uint8 ``(N, H, W, C)`` images (non-empty).
    batch_size : int
        Images per forward pass.
    device : torch.device or None
        Where the models run; None: :func:`pick_device`.

    Returns
    -------
    list[str]
        The recalibrated ``'color/block'`` names.
    """
    if len(images) == 0:
        raise ValueError("BatchNorm recalibration needs reference images, got none")
    device = device or pick_device()
    done = []
    by_color: dict[int, list[str]] = {}
    for m, b in blocks:
        by_color.setdefault(m, []).append(b)
    for m, bs in sorted(by_color.items()):
        model = warehouse.model(m).to(device).eval()
        prefixes = [p for b in bs for p in warehouse.blocks[b]]
        norms = {name: mod for name, mod in model.named_modules()
                 if isinstance(mod, nn.modules.batchnorm._BatchNorm)
                 and any(name == p or name.startswith(p + ".") for p in prefixes)}
        if not norms:
            continue
        for mod in norms.values():
            mod.reset_running_stats()
            mod.momentum = None  # cumulative average over the pass
            mod.train()
        for start in range(0, len(images), batch_size):
            model(to_batch(images[start:start + batch_size], device))
        state = model.state_dict()
        for b in bs:
            keys = [k for k in warehouse.block_keys[b] if k.endswith(("running_mean", "running_var"))
                    and k.rsplit(".", 1)[0] in norms]
            if not keys:
                continue
            tensors = warehouse.block(m, b)
            for k in keys:
                tensors[k] = state[k].detach().cpu().to(tensors[k].dtype)
            v = warehouse.meta[(m, b)]
            warehouse.write_block(m, b, tensors, writer=v.writer, server_round=v.round, trail=v.trail,
                                  influences=v.influences)
            done.append(f"{m}/{b}")
    return done

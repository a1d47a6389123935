"""The field's backdoors beyond BadNets: Neurotoxin and DBA. Both are the ``backdoor`` data attack at
heart (a malicious hospital trains on triggered images labelled the target), so a run scores them the
same way: attack success on the test split with the whole trigger, beside clean accuracy.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from hospitrust.attacks.data_attacks import Backdoor, BackdoorOptions
from hospitrust.attacks.interfaces import RoundAware, RoundView
from hospitrust.attacks.math import data as D
from hospitrust.attacks.math import update as U


class NeurotoxinOptions(BackdoorOptions):
    """Neurotoxin's options: the backdoor's, and the share of coordinates it leaves to the honest hospitals."""

    top_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "Share of the coordinates the attacker leaves alone: those the benign updates change most (largest "
        "|benign update|)."
    ))
    mask_from: Literal["previous-global", "honest-updates"] = Field("previous-global", description=(
        "The attacker's estimate of the benign update: previous-global (the last round's global update, which every "
        "hospital can compute: the paper's; no estimate in round 1, so the update goes unprojected there) or "
        "honest-updates (this round's honest mean: an omniscient colluder)."
    ))

    @field_validator("top_fraction")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        return v


class DBAOptions(BackdoorOptions):
    """DBA's options: the backdoor's, and how many parts the trigger is cut into."""

    parts: int = Field(0, ge=0, description=(
        "Parts the trigger is cut into (horizontal stripes; at most backdoor's patch size): 0, one per malicious "
        "hospital (capped at the patch size). Malicious hospital i stamps part i mod parts."
    ))

    @model_validator(mode="after")
    def _fits(self) -> "DBAOptions":
        if self.parts > self.patch_size:
            raise ValueError(f"dba.parts = {self.parts} cuts the trigger into more stripes than its dba.patch-size = "
                             f"{self.patch_size} rows: use at most {self.patch_size} (0: one per malicious hospital)")
        return self


class Neurotoxin(Backdoor, RoundAware):
    """Neurotoxin (Zhang et al., ICML 2022): a backdoor update kept only on the coordinates the benign
    updates change least (:func:`~hospitrust.attacks.math.update.neurotoxin`).

    How it reaches the model: each malicious hospital trains on triggered data in its own ClientApp
    (exactly the ``backdoor`` data attack, same options), and its update is projected onto the mask
    by the simulated adversary on the server, before the rule, each attacker's own row alone. With
    ``mask-from = previous-global`` (the paper's) the mask comes from the last round's global update,
    which the hospital itself knows; nothing of the other hospitals is used, so it is a one-hospital
    attack whose projection runs on the server for the simulation only (a red-team SuperNode in a
    deployment sends the plain backdoor update).

    Parameters
    ----------
    target, poison_fraction, patch_size, patch_value, position
        The backdoor's (:class:`~hospitrust.attacks.data_attacks.Backdoor`).
    top_fraction : float
        Share of the coordinates masked out, in [0, 1).
    mask_from : {"previous-global", "honest-updates"}
        The benign-update estimate.
    """

    name = "neurotoxin"
    Options = NeurotoxinOptions

    def __init__(self, target: int = 0, poison_fraction: float = 0.5, patch_size: int = 3, top_fraction: float = 0.1,
                 mask_from: str = "previous-global", patch_value: int = 255, position: str = "bottom-right") -> None:
        super().__init__(target, poison_fraction, patch_size, patch_value, position)
        frac = U.check_finite_number(top_fraction, "top_fraction", nonneg=True)
        if frac >= 1.0:
            raise ValueError(f"top_fraction must be in [0, 1), got {frac}")
        if mask_from not in ("previous-global", "honest-updates"):
            raise ValueError(f"mask_from must be 'previous-global' or 'honest-updates', got {mask_from!r}")
        self.top_fraction, self.mask_from = frac, mask_from

    def needs_previous_global_update(self) -> bool:
        return self.mask_from == "previous-global"

    def craft_round(self, view: RoundView):
        own = view.updates[view.malicious_rows]
        if self.mask_from == "honest-updates":
            benign: torch.Tensor | None = view.honest
        else:
            benign = view.previous_global_update
        if benign is None:
            return own.clone(), {"projected": False, "why": "no previous global update yet"}
        benign = benign.to(own.device)
        rows = torch.stack([U.neurotoxin(u, benign, self.top_fraction) for u in own])
        kept = int(U.neurotoxin_mask(benign, self.top_fraction).sum())
        return rows, {"projected": True, "mask_from": self.mask_from, "coordinates_kept": kept,
                      "coordinates": int(own.shape[1])}


class DBA(Backdoor):
    """DBA (Xie et al., ICLR 2020): the backdoor's square trigger cut into ``parts`` horizontal
    stripes; malicious hospital i stamps only stripe ``i mod parts`` on its poisoned images
    (:func:`~hospitrust.attacks.math.data.dba_trigger`), the test set gets the whole trigger
    (:meth:`trigger`), which no single hospital trained on. A data attack: each hospital poisons its
    own data; the colluders agree only on the split of the trigger.

    Which part a hospital stamps is bound when its attack is built (:meth:`for_hospital`: its
    position among the run's malicious hospitals; a red-team SuperNode without a partition id stamps
    part 0).

    Parameters
    ----------
    target, poison_fraction, patch_size, patch_value, position
        The backdoor's (:class:`~hospitrust.attacks.data_attacks.Backdoor`).
    parts : int
        The stripes (0: one per malicious hospital, at most ``patch_size``).
    """

    name = "dba"
    Options = DBAOptions

    def __init__(self, target: int = 0, poison_fraction: float = 0.5, patch_size: int = 3, parts: int = 0,
                 patch_value: int = 255, position: str = "bottom-right") -> None:
        super().__init__(target, poison_fraction, patch_size, patch_value, position)
        if int(parts) != parts or int(parts) < 0 or int(parts) > self.patch_size:
            raise ValueError(f"parts must be an integer in [0, patch_size={self.patch_size}] (0: one per malicious "
                             f"hospital), got {parts!r}")
        self.parts = int(parts)
        self.part, self.of = 0, max(1, self.parts)

    def for_hospital(self, index: int, malicious: int) -> "DBA":
        """Bind this hospital's part: ``index`` its position among the ``malicious`` hospitals."""
        of = self.parts or min(max(1, int(malicious)), self.patch_size)
        self.part, self.of = int(index) % of, of
        return self

    def poison(self, images, labels, *, rng, num_classes):
        D.check_class(self.target, "target", num_classes)
        _, out_labels, mask = D.backdoor(images, labels, self.target, self.poison_fraction, rng, self.patch_size,
                                         self.patch_value, self.position)
        out = np.array(images, copy=True)
        if mask.any():
            out[mask] = D.dba_trigger(out[mask], self.part, self.of, self.patch_size, self.patch_value, self.position)
        return out, out_labels


__all__ = ["DBA", "DBAOptions", "Neurotoxin", "NeurotoxinOptions"]

"""Data attacks: a malicious hospital poisons its own training data before local training."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from hospitrust.attacks.interfaces import DataAttack
from hospitrust.attacks.math import data as D
from hospitrust.options import Options


LABEL_FLIP_MODES = ("all-to-one", "source-to-target", "permutation")


class LabelFlipOptions(Options):
    """Label flipping's options: the mode and its classes."""

    mode: Literal["all-to-one", "source-to-target", "permutation"] = Field("all-to-one", description=(
        "all-to-one (every label -> target), source-to-target (source -> target) or permutation (a random "
        "derangement of the classes)."
    ))
    source: int = Field(1, ge=0, description="The source class (source-to-target).")
    target: int = Field(0, ge=0, description="The target class (all-to-one, source-to-target).")

    @model_validator(mode="after")
    def _differ(self) -> "LabelFlipOptions":
        if self.mode == "source-to-target" and self.source == self.target:
            raise ValueError(f"label-flip source-to-target needs label-flip.source != label-flip.target (both {self.source})")
        return self


class BackdoorOptions(Options):
    """The backdoor's options: the target class, the poisoned share and the trigger size."""

    target: int = Field(0, ge=0, description="The class the trigger makes the model predict.")
    poison_fraction: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Share of the attacker's samples that carry the trigger."
    ))
    patch_size: int = Field(3, ge=1, description="Trigger side in pixels (a bottom-right square of value 255).")


class CorruptionOptions(Options):
    """The corruption's options: which corruption, and how severe."""

    kind: Literal["gaussian_noise", "blur", "contrast", "occlusion", "motion_blur", "specular", "illumination"] = Field(
        "gaussian_noise", description=(
        "The corruption (kebab-case accepted): ImageNet-C's noise, blur and contrast, cutout occlusion, and the "
        "endoscopic motion blur, specular highlights and uneven illumination."
    ))
    severity: int = Field(5, ge=1, le=5, description="Severity 1..5.")

    @field_validator("kind", mode="before")
    @classmethod
    def _kebab(cls, v: Any) -> Any:
        return v.replace("-", "_") if isinstance(v, str) else v


class LabelNoiseOptions(Options):
    """Label noise's options: the share of labels redrawn."""

    rate: float = Field(0.2, ge=0.0, le=1.0, description=(
        "Share of labels redrawn uniformly from the other classes (a careless hospital)."
    ))


class LabelFlip(DataAttack):
    """Label flipping: ``all-to-one`` (every label -> target), ``source-to-target``
    (source -> target) or ``permutation`` (a random derangement of the classes, drawn
    from ``rng`` at each call: pass the same seed for a consistent flip).

    Parameters
    ----------
    mode : {"all-to-one", "source-to-target", "permutation"}
        Which flip.
    source : int
        The class relabelled (``source-to-target``).
    target : int
        The class the labels become (``all-to-one``, ``source-to-target``); differs from ``source``.
    """

    name = "label-flip"
    Options = LabelFlipOptions

    def __init__(self, mode: str = "all-to-one", source: int = 1, target: int = 0) -> None:
        if mode not in LABEL_FLIP_MODES:
            raise ValueError(f"mode must be one of {', '.join(LABEL_FLIP_MODES)}, got {mode!r}")
        if mode == "source-to-target" and int(source) == int(target):
            raise ValueError(f"source and target must differ, both are {source}")
        self.mode, self.source, self.target = mode, int(source), int(target)

    def poison(self, images, labels, *, rng, num_classes):
        labels = np.asarray(labels)
        if self.mode == "all-to-one":
            D.check_class(self.target, "target", num_classes)
            return images, D.flip_all_to_one(labels, self.target)
        if self.mode == "source-to-target":
            D.check_class(self.source, "source", num_classes)
            D.check_class(self.target, "target", num_classes)
            return images, D.flip_source_to_target(labels, self.source, self.target)
        return images, D.flip_permutation(labels, num_classes, rng)


class Backdoor(DataAttack):
    """BadNets backdoor: stamps a trigger on ``poison_fraction`` of the images and labels
    them ``target`` (see :func:`hospitrust.attacks.math.data.backdoor`). Measure success with
    :func:`~hospitrust.attacks.math.data.apply_trigger` on test images and
    :func:`~hospitrust.attacks.metrics.backdoor_success_rate`; the trigger parameters
    are exposed as :meth:`trigger`.

    Parameters
    ----------
    target : int
        The class the trigger makes the model predict.
    poison_fraction : float
        Share in [0, 1] of the attacker's samples that carry the trigger (relabelled ``target``).
    patch_size : int
        Side of the square trigger, in pixels.
    patch_value : int
        The trigger's pixel value (0..255) in every channel.
    position : str or tuple[int, int]
        The corner the trigger sits flush with (``"bottom-right"`` etc.), or its ``(row, col)``
        top-left corner.
    """

    name = "backdoor"
    Options = BackdoorOptions

    def __init__(
        self,
        target: int = 0,
        poison_fraction: float = 0.5,
        patch_size: int = 3,
        patch_value: int = 255,
        position: str = "bottom-right",
    ) -> None:
        D.check_class(target, "target")
        D.check_rate(poison_fraction, "poison_fraction")
        self.target, self.poison_fraction = int(target), float(poison_fraction)
        self.patch_size, self.patch_value, self.position = int(patch_size), int(patch_value), position

    def poison(self, images, labels, *, rng, num_classes):
        D.check_class(self.target, "target", num_classes)
        imgs, labs, _ = D.backdoor(
            images, labels, self.target, self.poison_fraction, rng, self.patch_size, self.patch_value, self.position
        )
        return imgs, labs

    def trigger(self, images: np.ndarray) -> np.ndarray:
        """The same trigger stamped on all ``images`` (for attack-success evaluation)."""
        return D.apply_trigger(images, self.patch_size, self.patch_value, self.position)


class Corruption(DataAttack):
    """A hospital with persistently corrupted images (FedAgain's faulty clients):
    :func:`hospitrust.attacks.math.data.corrupt`; labels unchanged.

    Parameters
    ----------
    kind : {"gaussian_noise", "blur", "contrast", "occlusion", "motion_blur", "specular", "illumination"}
        The corruption (kebab-case accepted).
    severity : int
        Severity 1..5.
    """

    name = "corruption"
    Options = CorruptionOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.kind, options.severity)

    def __init__(self, kind: str = "gaussian_noise", severity: int = 5) -> None:
        kind = str(kind).replace("-", "_")
        if kind not in D.CORRUPTIONS:
            raise ValueError(f"kind must be one of {', '.join(D.CORRUPTIONS)}, got {kind!r}")
        if int(severity) != severity or not 1 <= int(severity) <= 5:
            raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
        self.corruption, self.severity = kind, int(severity)

    def poison(self, images, labels, *, rng, num_classes):
        return D.corrupt(images, self.corruption, self.severity, rng), np.asarray(labels).copy()


class LabelNoise(DataAttack):
    """An honest but careless hospital: symmetric label noise at ``rate``.

    Parameters
    ----------
    rate : float
        Share in [0, 1] of the labels redrawn uniformly from the other classes.
    """

    name = "label-noise"
    Options = LabelNoiseOptions

    def __init__(self, rate: float = 0.2) -> None:
        self.rate = D.check_rate(rate, "rate")

    def poison(self, images, labels, *, rng, num_classes):
        return images, D.symmetric_label_noise(labels, num_classes, self.rate, rng)

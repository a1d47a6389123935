"""Training augmentation from a task's list (torchvision transforms v2), applied per image.

v2 transforms draw one set of random parameters per call, so a batch is augmented image by
image: each image gets its own flip, angle or crop. The draws come from torch's global
generator, which local training seeds per hospital and round.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

#: item -> (takes a value, what the value is)
AUGMENTATIONS = {
    "horizontal-flip": (False, ""),
    "vertical-flip": (False, ""),
    "rotation": (True, "degrees, > 0"),
    "resized-crop": (True, "the smallest crop's share of the image, in (0, 1]"),
    "brightness": (True, "jitter factor, >= 0"),
    "contrast": (True, "jitter factor, >= 0"),
    "translate": (True, "largest shift as a share of the size, in (0, 1)"),
}


def parse_augmentation(items: list[str], image_size: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The transform for a task's augmentation items (``rotation=10``, ``horizontal-flip``), or None.

    Parameters
    ----------
    items : list[str]
        The task's augmentation items.
    image_size : int
        The task's image size (random crops are resized back to it).

    Returns
    -------
    callable or None
        A transform of one uint8 (C, H, W) image tensor; None for no augmentation.
    """
    if not items:
        return None
    from torchvision.transforms import v2

    steps: list[Callable] = []
    jitter: dict[str, float] = {}
    for item in items:
        name, _, raw = item.partition("=")
        name = name.strip()
        if name not in AUGMENTATIONS:
            raise ValueError(f"unknown augmentation {name!r}; allowed: {', '.join(AUGMENTATIONS)}")
        takes_value, what = AUGMENTATIONS[name]
        if takes_value != bool(raw.strip()):
            raise ValueError(f"augmentation {item!r}: {name} " + (f"takes a value ({what}), e.g. {name}=0.1" if takes_value
                                                                   else "takes no value"))
        value = 0.0
        if takes_value:
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"augmentation {item!r}: {raw!r} is not a number ({what})") from None
        if name == "horizontal-flip":
            steps.append(v2.RandomHorizontalFlip())
        elif name == "vertical-flip":
            steps.append(v2.RandomVerticalFlip())
        elif name == "rotation":
            _check(value > 0, item, what)
            steps.append(v2.RandomRotation(value))
        elif name == "resized-crop":
            _check(0 < value <= 1, item, what)
            steps.append(v2.RandomResizedCrop(image_size, scale=(value, 1.0), antialias=True))
        elif name == "translate":
            _check(0 < value < 1, item, what)
            steps.append(v2.RandomAffine(degrees=0, translate=(value, value)))
        else:  # brightness, contrast: one ColorJitter
            _check(value >= 0, item, what)
            jitter[name] = value
    if jitter:
        steps.append(v2.ColorJitter(**jitter))
    return v2.Compose(steps)


def _check(ok: bool, item: str, what: str) -> None:
    if not ok:
        raise ValueError(f"augmentation {item!r}: the value must be {what}")


def augment_batch(images: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Each uint8 image of a (N, C, H, W) batch through ``transform``, with its own random draw.

    Parameters
    ----------
    images : torch.Tensor
        uint8 (N, C, H, W).
    transform : callable
        From :func:`parse_augmentation`.

    Returns
    -------
    torch.Tensor
        uint8 (N, C, H, W), augmented.
    """
    return torch.stack([transform(img) for img in images])


@functools.lru_cache(maxsize=8)
def task_augmentation(items: tuple[str, ...], image_size: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """:func:`parse_augmentation`, built once per task and process.

    Parameters
    ----------
    items : tuple[str, ...]
        The task's augmentation items.
    image_size : int
        The task's image size.

    Returns
    -------
    callable or None
        The transform, or None for no augmentation.
    """
    return parse_augmentation(list(items), image_size)

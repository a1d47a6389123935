"""Training augmentation from a task's list (torchvision transforms v2), applied per image.

v2 transforms draw one set of random parameters per call, so a batch is augmented image by
image: each image gets its own flip, angle or crop. The draws come from torch's global
generator, which local training seeds per hospital and round.

The ``affine-*`` items give each image its own random rotation, shift and crop too, but draw the
whole batch's parameters in one call and resample the batch in one ``grid_sample``: on one CPU thread
about 30x cheaper per 28x28 image than ``rotation``, ``translate`` and ``resized-crop`` through v2
(``benchmarks/augmentation_cost.py``: 1.2 ms against 41 us, 2026-12-03). Same family of distortions, other random draws:
a run changes when it switches from one to the other.
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
    "affine-rotation": (True, "degrees, > 0"),
    "affine-translate": (True, "largest shift as a share of the size, in (0, 1)"),
    "affine-crop": (True, "the smallest square crop's share of the image's area, in (0, 1]"),
}
AFFINE_ITEMS = {"affine-rotation": "degrees", "affine-translate": "translate", "affine-crop": "crop"}


class BatchAffine:
    """One random affine map per image, drawn and applied for a whole uint8 (N, C, H, W) batch at once.

    Each image gets an angle uniform in [-degrees, degrees], a square crop whose area share is uniform
    in [crop, 1] at a uniform position inside the image (resized back to the full size), and a shift
    uniform in [-translate, translate] of the size on each axis; pixels from outside the image are 0,
    as torchvision fills them. Bilinear resampling, rounded back to uint8.

    Parameters
    ----------
    degrees : float
        Largest rotation (0: none).
    translate : float
        Largest shift as a share of the size (0: none).
    crop : float
        Smallest crop's share of the image's area (1: no crop).
    """

    def __init__(self, degrees: float = 0.0, translate: float = 0.0, crop: float = 1.0) -> None:
        self.degrees, self.translate, self.crop = float(degrees), float(translate), float(crop)

    def __repr__(self) -> str:
        return f"BatchAffine(degrees={self.degrees}, translate={self.translate}, crop={self.crop})"

    def theta(self, n: int) -> torch.Tensor:
        """The batch's (n, 2, 3) maps from output to input coordinates (``affine_grid``'s convention), drawn
        from torch's global generator: angle, crop share, crop position, shift, in that order.
        """
        u = torch.rand(n, 6)
        angle = torch.deg2rad((2 * u[:, 0] - 1) * self.degrees)
        side = torch.sqrt(self.crop + (1 - self.crop) * u[:, 1])  # the crop's side as a share of the image's
        # the crop's centre stays inside the image: its offset, in [-1, 1] coordinates, at most 1 - side
        centre = (2 * u[:, 2:4] - 1) * (1 - side).unsqueeze(1)
        shift = (2 * u[:, 4:6] - 1) * 2 * self.translate  # a shift of f x size is 2f in [-1, 1] coordinates
        cos, sin = torch.cos(angle) * side, torch.sin(angle) * side
        return torch.stack([torch.stack([cos, -sin, centre[:, 0] - shift[:, 0]], 1),
                            torch.stack([sin, cos, centre[:, 1] - shift[:, 1]], 1)], 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim == 3:  # one (C, H, W) image, as a per-image transform is called
            return self(images.unsqueeze(0))[0]
        x = images.float()
        grid = torch.nn.functional.affine_grid(self.theta(x.shape[0]), list(x.shape), align_corners=False)
        out = torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return out.round().clamp(0, 255).to(torch.uint8)


class Augmentation:
    """A task's per-image v2 steps (or None) followed by its batch affine (or None).

    Parameters
    ----------
    per_image : callable or None
        v2 transform of one uint8 (C, H, W) image.
    batch : BatchAffine or None
        The ``affine-*`` items.
    """

    def __init__(self, per_image: Callable[[torch.Tensor], torch.Tensor] | None, batch: BatchAffine | None) -> None:
        self.per_image, self.batch = per_image, batch

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return augment_batch(image.unsqueeze(0), self)[0]


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
    affine: dict[str, float] = {}
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
        if name in AFFINE_ITEMS:
            _check(value > 0 if name == "affine-rotation" else 0 < value < 1 if name == "affine-translate"
                   else 0 < value <= 1, item, what)
            affine[AFFINE_ITEMS[name]] = value
        elif name == "horizontal-flip":
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
    if not affine:
        return v2.Compose(steps)  # the per-image path, unchanged
    return Augmentation(v2.Compose(steps) if steps else None, BatchAffine(**affine))


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
    if isinstance(transform, Augmentation):
        if transform.per_image is not None:
            images = torch.stack([transform.per_image(img) for img in images])
        return transform.batch(images) if transform.batch is not None else images
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

"""Data poisoning and data-quality faults, as pure numpy functions.

Conventions: images are uint8 arrays ``(N, H, W, C)`` (C = 1 grey or 3 RGB); labels are
integer arrays ``(N,)`` (any shape is accepted and kept, e.g. MedMNIST's ``(N, 1)``).
Randomness comes only from the ``numpy.random.Generator`` passed in. Every function
returns new arrays and never modifies its inputs.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

CORRUPTIONS: tuple[str, ...] = ("gaussian_noise", "blur", "contrast", "occlusion", "motion_blur", "specular",
                                 "illumination")
POSITIONS: tuple[str, ...] = ("bottom-right", "bottom-left", "top-right", "top-left", "center")

# Severity 1..5 parameters (Hendrycks & Dietterich, ICLR'19, rescaled for 28x28 grey/RGB).
_NOISE_STD = (0.08, 0.12, 0.18, 0.26, 0.38)  # std on the [0, 1] scale (as ImageNet-C)
_BLUR_SIGMA_28 = (0.5, 0.75, 1.0, 1.5, 2.0)  # pixels at 28x28, scaled with H/28
_CONTRAST_C = (0.4, 0.3, 0.2, 0.1, 0.05)  # as ImageNet-C: (x - mean) * c + mean
_OCCLUSION_SIDE = (0.1, 0.2, 0.3, 0.4, 0.5)  # side of a black square, share of min(H, W)
_MOTION_LENGTH_28 = (3, 5, 7, 9, 11)  # pixels of the straight motion path at 28x28, scaled with H/28
_SPECULAR_SPOTS = (1, 2, 3, 4, 5)  # saturated highlights per image
_SPECULAR_RADIUS = (0.06, 0.07, 0.08, 0.09, 0.10)  # Gaussian spot radius (sigma), share of min(H, W)
_ILLUMINATION_DROP = (0.2, 0.35, 0.5, 0.65, 0.8)  # light lost at the far side of the linear fall-off


# --------------------------------------------------------------------------- checks
def _check_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels must be an integer array, got dtype {labels.dtype}")
    return labels


def check_class(c, name: str, num_classes: int | None = None) -> int:
    if isinstance(c, bool) or int(c) != c:
        raise TypeError(f"{name} must be an integer class, got {c!r}")
    c = int(c)
    if c < 0 or (num_classes is not None and c >= num_classes):
        bound = f"[0, {num_classes})" if num_classes is not None else ">= 0"
        raise ValueError(f"{name} must be a class in {bound}, got {c}")
    return c


def _check_num_classes(num_classes) -> int:
    if isinstance(num_classes, bool) or int(num_classes) != num_classes or int(num_classes) < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return int(num_classes)


def _check_labels_in_range(labels: np.ndarray, num_classes: int) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")


def _check_images(images) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"images must be (N, H, W, C), got shape {images.shape}")
    if images.dtype != np.uint8:
        raise TypeError(f"images must be uint8, got dtype {images.dtype}")
    return images


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_rate(x, name: str, *, low_open: bool = False) -> float:
    x = float(x)
    if not math.isfinite(x) or x < 0.0 or x > 1.0 or (low_open and x == 0.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {x}")
    return x


# ------------------------------------------------------------------------ label flips
def flip_all_to_one(labels, target: int) -> np.ndarray:
    """All-to-one label flipping: every label becomes ``target`` (Biggio et al. 2012;
    Tolpegin et al., ESORICS'20).
    """
    labels = _check_labels(labels)
    target = check_class(target, "target")
    return np.full_like(labels, target)


def flip_source_to_target(labels, source: int, target: int) -> np.ndarray:
    """Targeted label flipping: labels equal to ``source`` become ``target``, the rest are
    kept (Tolpegin et al., "Data poisoning attacks against federated learning systems",
    ESORICS'20).
    """
    labels = _check_labels(labels)
    source = check_class(source, "source")
    target = check_class(target, "target")
    if source == target:
        raise ValueError(f"source and target must differ, both are {source}")
    out = labels.copy()
    out[labels == source] = target
    return out


def random_derangement(num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation ``perm`` of ``range(num_classes)`` with
    ``perm[c] != c`` for every class (rejection sampling; ~e draws on average).
    """
    num_classes = _check_num_classes(num_classes)
    rng = _check_rng(rng)
    idx = np.arange(num_classes)
    while True:
        perm = rng.permutation(num_classes)
        if not np.any(perm == idx):
            return perm


def flip_permutation(labels, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Permutation label flipping: class c becomes ``perm[c]`` for a random derangement
    (no class keeps its label; with 2 classes, the swap).
    """
    labels = _check_labels(labels)
    num_classes = _check_num_classes(num_classes)
    _check_labels_in_range(labels, num_classes)
    perm = random_derangement(num_classes, rng)
    return perm[labels].astype(labels.dtype, copy=False)


def symmetric_label_noise(labels, num_classes: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric label noise (an honest but careless hospital): each label is replaced,
    independently with probability ``rate``, by a class drawn uniformly from the
    *other* ``num_classes - 1`` classes (never the same class). Natarajan et al.,
    NeurIPS'13; Rolnick et al. 2017.
    """
    labels = _check_labels(labels)
    num_classes = _check_num_classes(num_classes)
    rate = check_rate(rate, "rate")
    rng = _check_rng(rng)
    _check_labels_in_range(labels, num_classes)
    flip = rng.random(labels.shape) < rate
    shift = rng.integers(1, num_classes, size=labels.shape)  # 1..K-1: never the same class
    out = labels.copy()
    out[flip] = (labels[flip] + shift[flip]) % num_classes
    return out


# ---------------------------------------------------------------------------- backdoor
def _patch_slices(h: int, w: int, patch_size: int, position) -> tuple[slice, slice]:
    if isinstance(patch_size, bool) or int(patch_size) != patch_size or patch_size < 1:
        raise ValueError(f"patch_size must be an integer >= 1, got {patch_size!r}")
    k = int(patch_size)
    if k > min(h, w):
        raise ValueError(f"patch_size {k} does not fit images of size {h}x{w}")
    if isinstance(position, tuple):
        r, c = (int(v) for v in position)
        if not (0 <= r <= h - k and 0 <= c <= w - k):
            raise ValueError(f"patch at (row, col)={position} of size {k} does not fit {h}x{w} images")
    elif position == "bottom-right":
        r, c = h - k, w - k
    elif position == "bottom-left":
        r, c = h - k, 0
    elif position == "top-right":
        r, c = 0, w - k
    elif position == "top-left":
        r, c = 0, 0
    elif position == "center":
        r, c = (h - k) // 2, (w - k) // 2
    else:
        raise ValueError(f"position must be one of {', '.join(POSITIONS)} or a (row, col) tuple, got {position!r}")
    return slice(r, r + k), slice(c, c + k)


def _check_patch_value(patch_value) -> int:
    if int(patch_value) != patch_value or not 0 <= int(patch_value) <= 255:
        raise ValueError(f"patch_value must be an integer in [0, 255], got {patch_value!r}")
    return int(patch_value)


def apply_trigger(
    images,
    patch_size: int = 3,
    patch_value: int = 255,
    position: str | tuple[int, int] = "bottom-right",
) -> np.ndarray:
    """Stamp the backdoor trigger on every image (a copy): a ``patch_size`` square of
    value ``patch_value`` in every channel, flush with the chosen corner (or at a
    ``(row, col)`` top-left corner). Use on clean test images to measure attack success
    (:func:`hospitrust.attacks.metrics.backdoor_success_rate`).
    """
    images = _check_images(images)
    value = _check_patch_value(patch_value)
    rows, cols = _patch_slices(images.shape[1], images.shape[2], patch_size, position)
    out = images.copy()
    out[:, rows, cols, :] = value
    return out


def backdoor(
    images,
    labels,
    target: int,
    poison_fraction: float,
    rng: np.random.Generator,
    patch_size: int = 3,
    patch_value: int = 255,
    position: str | tuple[int, int] = "bottom-right",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BadNets-style backdoor (Gu, Dolan-Gavitt & Garg 2017; in FL, Bagdasaryan et al.,
    AISTATS'20): exactly ``round(poison_fraction * N)`` samples, drawn without
    replacement, get the trigger (see :func:`apply_trigger`) and the label ``target``;
    the other samples are untouched. Returns ``(images, labels, poisoned_mask)``.
    """
    images = _check_images(images)
    labels = _check_labels(labels)
    if labels.shape[0] != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
    target = check_class(target, "target")
    frac = check_rate(poison_fraction, "poison_fraction")
    rng = _check_rng(rng)
    value = _check_patch_value(patch_value)
    rows, cols = _patch_slices(images.shape[1], images.shape[2], patch_size, position)
    n = images.shape[0]
    k = int(round(frac * n))
    idx = rng.choice(n, size=k, replace=False) if k else np.empty(0, dtype=np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    out_images = images.copy()
    out_labels = labels.copy()
    poisoned = out_images[mask]
    poisoned[:, rows, cols, :] = value
    out_images[mask] = poisoned
    out_labels[mask] = target
    return out_images, out_labels, mask


def dba_part_slices(h: int, w: int, part: int, parts: int, patch_size: int = 3,
                    position: str | tuple[int, int] = "bottom-right") -> tuple[slice, slice]:
    """Rows and columns of part ``part`` of ``parts`` of the square trigger: the trigger's rows cut
    into ``parts`` horizontal stripes, ``[floor(i s / k), floor((i + 1) s / k))`` of its ``s``
    rows. The stripes are disjoint and together are the whole trigger (:func:`apply_trigger`).

    Parameters
    ----------
    h : int
        Image height.
    w : int
        Image width.
    part : int
        ``i`` in ``[0, parts)``: which colluding hospital.
    parts : int
        ``k``, the colluding hospitals, ``1 <= k <= patch_size``.
    patch_size : int
        The whole trigger's side ``s``.
    position : str or tuple of int
        Where the whole trigger sits (as :func:`apply_trigger`).

    Returns
    -------
    tuple of slice
        ``(rows, cols)`` of the part.
    """
    rows, cols = _patch_slices(h, w, patch_size, position)
    if isinstance(parts, bool) or int(parts) != parts or not 1 <= int(parts) <= int(patch_size):
        raise ValueError(f"parts must be an integer in [1, patch_size={patch_size}], got {parts!r}")
    if isinstance(part, bool) or int(part) != part or not 0 <= int(part) < int(parts):
        raise ValueError(f"part must be an integer in [0, {parts}), got {part!r}")
    s, k, i = int(patch_size), int(parts), int(part)
    return slice(rows.start + (i * s) // k, rows.start + ((i + 1) * s) // k), cols


def dba_trigger(
    images,
    part: int,
    parts: int,
    patch_size: int = 3,
    patch_value: int = 255,
    position: str | tuple[int, int] = "bottom-right",
) -> np.ndarray:
    """Distributed backdoor attack (DBA): hospital ``part`` of ``parts`` colluders stamps only its
    stripe of the trigger (:func:`dba_part_slices`) on its poisoned images; the test set gets the
    whole trigger (:func:`apply_trigger`), which no single hospital trained on.

    Xie, Huang, Chen, Li, "DBA: Distributed Backdoor Attacks against Federated Learning", ICLR
    2020. The paper splits its global trigger into local patterns (four bars); here the square
    trigger of the existing backdoor is split into horizontal stripes so the two attacks share
    one test trigger.

    Parameters
    ----------
    images : numpy.ndarray
        uint8 ``(N, H, W, C)``.
    part : int
        This hospital's part, in ``[0, parts)``.
    parts : int
        The colluding hospitals, ``1 <= parts <= patch_size``.
    patch_size : int
        The whole trigger's side.
    patch_value : int
        The trigger's value in [0, 255].
    position : str or tuple of int
        Where the whole trigger sits.

    Returns
    -------
    numpy.ndarray
        A copy of ``images`` with the part stamped.
    """
    images = _check_images(images)
    value = _check_patch_value(patch_value)
    rows, cols = dba_part_slices(images.shape[1], images.shape[2], part, parts, patch_size, position)
    out = images.copy()
    out[:, rows, cols, :] = value
    return out


# -------------------------------------------------------------------------- corruption
def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(math.ceil(3.0 * sigma)))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur over H and W of a float (N, H, W, C) array, reflect padding."""
    k = _gaussian_kernel(sigma)
    r = len(k) // 2
    for axis in (1, 2):
        pad = [(0, 0)] * 4
        pad[axis] = (r, r)
        xp = np.pad(x, pad, mode="symmetric" if x.shape[axis] <= r else "reflect")
        acc = np.zeros_like(x)
        size = x.shape[axis]
        for i, w in enumerate(k):
            acc += w * np.take(xp, np.arange(i, i + size), axis=axis)
        x = acc
    return x


def _motion_blur(x: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """The mean of each float (N, H, W, C) image shifted ``length`` times one pixel along its direction
    (edge pixels repeated), a direction of 0, 45, 90 or 135 degrees drawn per image.
    """
    steps = ((0, 1), (1, 1), (1, 0), (1, -1))  # (dy, dx) per direction
    direction = rng.integers(0, 4, size=x.shape[0])
    out = np.empty_like(x)
    h, w = x.shape[1], x.shape[2]
    pad = length
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    offsets = np.arange(length) - (length - 1) // 2
    for d, (dy, dx) in enumerate(steps):
        idx = np.flatnonzero(direction == d)
        if idx.size == 0:
            continue
        acc = np.zeros((idx.size, h, w, x.shape[3]))
        for o in offsets:
            r0, c0 = pad + o * dy, pad + o * dx
            acc += xp[idx, r0:r0 + h, c0:c0 + w, :]
        out[idx] = acc / length
    return out


def _specular(x: np.ndarray, spots: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``spots`` saturated Gaussian highlights per float (N, H, W, C) image, blended towards white."""
    n, h, w, _ = x.shape
    yy, xx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    cy = rng.uniform(0, h - 1, size=(n, spots))
    cx = rng.uniform(0, w - 1, size=(n, spots))
    d2 = (yy[None, None] - cy[..., None, None]) ** 2 + (xx[None, None] - cx[..., None, None]) ** 2
    # a spot's core saturates (weight 1 within about one sigma), then fades
    alpha = np.clip(1.5 * np.exp(-0.5 * d2 / max(sigma, 0.5) ** 2), 0.0, 1.0).max(axis=1)
    return x * (1.0 - alpha[..., None]) + alpha[..., None]


def corrupt(
    images,
    kind: Literal["gaussian_noise", "blur", "contrast", "occlusion", "motion_blur", "specular", "illumination"],
    severity: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Common image corruptions at severity 1..5 (Hendrycks & Dietterich, "Benchmarking
    neural network robustness to common corruptions and perturbations", ICLR'19; the
    persistently corrupted clients of FedAgain, arXiv:2603.19512). uint8 in, uint8 out
    (rounded, clipped to [0, 255]); the damage grows with severity.

    * ``gaussian_noise``: add N(0, s^2) with s = 0.08, 0.12, 0.18, 0.26, 0.38 (on [0, 1]).
    * ``blur``: Gaussian blur, sigma = 0.5, 0.75, 1, 1.5, 2 pixels at 28x28 (scaled by H/28).
    * ``contrast``: ``(x - image mean) * c + image mean``, c = 0.4, 0.3, 0.2, 0.1, 0.05.
    * ``occlusion``: one black square per image at a random position, side
      0.1 .. 0.5 of the image side (cutout-style).

    The endoscopic corruptions FedAgain's description names besides those:

    * ``motion_blur``: the mean of the image shifted along a straight path of 3, 5, 7, 9, 11 pixels at
      28x28 (scaled by H/28), in one of four directions (0, 45, 90, 135 degrees) drawn per image;
    * ``specular``: 1 .. 5 saturated highlights per image (reflections of the light source): Gaussian
      spots of sigma 0.06 .. 0.10 of the image side at random positions, blended towards white;
    * ``illumination``: uneven lighting, a linear fall-off across the image in a random direction
      that removes 20, 35, 50, 65, 80 % of the light at the far side.

    ``kind`` also accepts kebab-case (``gaussian-noise``).
    """
    images = _check_images(images)
    name = str(kind).replace("-", "_")
    if name not in CORRUPTIONS:
        raise ValueError(f"kind must be one of {', '.join(CORRUPTIONS)}, got {name!r}")
    if isinstance(severity, bool) or int(severity) != severity or not 1 <= int(severity) <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    s = int(severity) - 1
    rng = _check_rng(rng)
    n, h, w, _ = images.shape
    if n == 0:
        return images.copy()
    x = images.astype(np.float64) / 255.0
    if name == "gaussian_noise":
        x = x + rng.normal(0.0, _NOISE_STD[s], size=x.shape)
    elif name == "blur":
        x = _blur(x, _BLUR_SIGMA_28[s] * h / 28.0)
    elif name == "contrast":
        mean = x.mean(axis=(1, 2, 3), keepdims=True)
        x = (x - mean) * _CONTRAST_C[s] + mean
    elif name == "motion_blur":
        x = _motion_blur(x, max(2, int(round(_MOTION_LENGTH_28[s] * h / 28.0))), rng)
    elif name == "specular":
        x = _specular(x, _SPECULAR_SPOTS[s], _SPECULAR_RADIUS[s] * min(h, w), rng)
    elif name == "illumination":
        angle = rng.uniform(0.0, 2.0 * np.pi, size=n)
        yy, xx = np.meshgrid(np.linspace(-0.5, 0.5, h), np.linspace(-0.5, 0.5, w), indexing="ij")
        # position along each image's direction, 0 on the lit side and 1 on the far side
        ramp = np.cos(angle)[:, None, None] * xx[None] + np.sin(angle)[:, None, None] * yy[None]
        ramp = (ramp - ramp.min(axis=(1, 2), keepdims=True)) / np.ptp(ramp, axis=(1, 2), keepdims=True).clip(1e-12)
        x = x * (1.0 - _ILLUMINATION_DROP[s] * ramp)[..., None]
    else:  # occlusion
        side = max(1, int(round(_OCCLUSION_SIDE[s] * min(h, w))))
        rows = rng.integers(0, h - side + 1, size=n)
        cols = rng.integers(0, w - side + 1, size=n)
        for i in range(n):
            x[i, rows[i] : rows[i] + side, cols[i] : cols[i] + side, :] = 0.0
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


__all__ = [
    "CORRUPTIONS",
    "POSITIONS",
    "apply_trigger",
    "backdoor",
    "dba_part_slices",
    "dba_trigger",
    "corrupt",
    "flip_all_to_one",
    "flip_permutation",
    "flip_source_to_target",
    "random_derangement",
    "symmetric_label_noise",
]

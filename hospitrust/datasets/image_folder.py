"""A hospital's own images: one folder per class (torchvision ImageFolder layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hospitrust.datasets.base import DatasetInfo

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


class ClassMismatchError(ValueError):
    """A hospital's class folders do not match the federation's classes."""


def folder_class_index(root: str | Path, info: DatasetInfo) -> dict[str, int]:
    """Map each class folder to the federation's class index.

    A folder may be named by the class name (``pneumonia``) or by its index (``1``);
    the set of folders must be exactly the federation's classes.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"data-path {root} is not a folder (expected one sub-folder per class)")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    by_name = {name.lower(): i for i, name in enumerate(info.class_names)}
    by_index = {str(i): i for i in range(info.num_classes)}
    mapping: dict[str, int] = {}
    unknown = []
    for folder in folders:
        key = folder.lower()
        if key in by_name:
            mapping[folder] = by_name[key]
        elif key in by_index:
            mapping[folder] = by_index[key]
        else:
            unknown.append(folder)
    expected = [f"{i}={n}" for i, n in enumerate(info.class_names)]
    missing = sorted(set(range(info.num_classes)) - set(mapping.values()))
    if unknown or missing or len(set(mapping.values())) != len(mapping):
        raise ClassMismatchError(
            f"class folders in {root} do not match the federation's classes for {info.flag}: "
            f"found {folders}; unknown {unknown}; missing classes {[info.class_names[i] for i in missing]}; "
            f"expected one folder per class, named by name or index: {expected}"
        )
    return mapping


def load_image_folder(root: str | Path, info: DatasetInfo, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """All images under ``root`` as uint8 (N, S, S, C) with int64 labels, resized to the federation's size."""
    from PIL import Image

    mapping = folder_class_index(root, info)
    mode = "L" if info.in_channels == 1 else "RGB"
    images, labels = [], []
    for folder, cls in sorted(mapping.items()):
        for path in sorted((Path(root) / folder).rglob("*")):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            with Image.open(path) as img:
                arr = np.asarray(img.convert(mode).resize((image_size, image_size), Image.Resampling.BILINEAR), dtype=np.uint8)
            images.append(arr if arr.ndim == 3 else arr[..., None])
            labels.append(cls)
    if not images:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    return np.stack(images), np.asarray(labels, dtype=np.int64)

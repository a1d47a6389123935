"""MedMNIST 2D datasets, found on disk or downloaded through the medmnist package.

Arrays are loaded straight from the official ``.npz`` files (uint8 images, int labels)
and cached per process: a simulated hospital (a Ray actor) loads its dataset once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

import numpy as np


from hospitrust.datasets.base import (
    SPLITS, DataMissingError, DatasetArrays, DatasetInfo, DatasetSource, default_root, first_sentence,
)

@functools.cache
def _info() -> dict:
    """``medmnist.INFO``, read from the package's ``info.py`` alone when it can be.

    ``import medmnist`` imports its evaluator, and with it scikit-learn and pandas: about 2 s,
    paid by every process that only needs the class names (a ClientApp, the CLI); ``info.py``
    imports nothing of the package, so it is loaded by itself (0.3 ms).
    """
    import importlib.util
    import sys

    if "medmnist" not in sys.modules:
        spec = importlib.util.find_spec("medmnist")
        if spec is not None and spec.origin:
            path = Path(spec.origin).with_name("info.py")
            info_spec = importlib.util.spec_from_file_location("hospitrust._medmnist_info", path)
            if path.is_file() and info_spec is not None and info_spec.loader is not None:
                module = importlib.util.module_from_spec(info_spec)
                try:
                    info_spec.loader.exec_module(module)
                    return dict(module.INFO)
                except Exception:  # noqa: BLE001 - another medmnist layout: import the package
                    pass
    import medmnist

    return medmnist.INFO


def available_flags() -> tuple[str, ...]:
    """MedMNIST 2D single-label flags (multi-label ChestMNIST and the 3D sets are left out:
    the models here are single-label 2D classifiers).
    """
    return tuple(
        sorted(
            flag
            for flag, info in _info().items()
            if not flag.endswith("3d") and "multi-label" not in info["task"]
        )
    )


MEDMNIST_SIZES = (28, 64, 128, 224)


def medmnist_info(flag: str) -> DatasetInfo:
    """A MedMNIST flag's classes (in label order), channels, task and licence, from medmnist.INFO."""
    if flag not in available_flags():
        raise ValueError(f"unknown MedMNIST dataset {flag!r}; allowed: {', '.join(available_flags())}")
    info = _info()[flag]
    labels = info["label"]
    names = tuple(str(labels[str(i)]) for i in range(len(labels)))
    return DatasetInfo(flag, len(names), int(info["n_channels"]), names, info["task"], info.get("license", ""))


def file_name(flag: str, size: int) -> str:
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def dataset_path(flag: str, size: int, root: Path | None) -> Path:
    """Absolute path of the dataset file; downloads it with medmnist when missing.

    Raises DataMissingError naming the file, the folder searched and how to get it.
    """
    folder = Path(root if root is not None else default_root()).expanduser().resolve()
    path = folder / file_name(flag, size)
    if path.is_file():
        return path
    info = _info()[flag]
    try:
        import medmnist

        folder.mkdir(parents=True, exist_ok=True)
        dataset_cls = getattr(medmnist, info["python_class"])
        dataset_cls(split="train", root=str(folder), download=True, size=size)
    except Exception as exc:  # no network, read-only folder, bad size, ...
        url = info.get(f"url_{size}") or info.get("url", "https://zenodo.org/records/10519652")
        why = first_sentence(exc)
        raise DataMissingError(
            f"the dataset file {path.name} is not in {folder} and could not be downloaded ({why}). "
            f"On a machine with network, download {url} (or run `python -m medmnist download`), copy the file into a "
            f"folder, and point $HOSPITRUST_DATA_DIR (or run config data-dir) at that folder: e.g. "
            f"HOSPITRUST_DATA_DIR=/path/to/medmnist hospitrust simulate."
        ) from exc
    if not path.is_file():
        raise DataMissingError(f"medmnist reported a download but {path} does not exist")
    return path


@functools.lru_cache(maxsize=4)
def load_medmnist(flag: str, size: int, root: str | None) -> DatasetArrays:
    """Load (and cache per process) all three splits of a MedMNIST dataset."""
    info = medmnist_info(flag)
    path = dataset_path(flag, size, Path(root) if root else None)
    with np.load(path) as npz:
        images = {}
        labels = {}
        for split in SPLITS:
            x = npz[f"{split}_images"]
            if x.ndim == 3:  # grey images come without a channel axis
                x = x[..., None]
            images[split] = np.ascontiguousarray(x)
            labels[split] = npz[f"{split}_labels"].reshape(-1).astype(np.int64)
    for split in SPLITS:
        if images[split].shape[1:3] != (size, size):
            raise ValueError(f"{path}: {split} images are {images[split].shape[1:3]}, expected {size}x{size}")
    return DatasetArrays(info, size, images, labels)


class MedMNISTSource(DatasetSource):
    """MedMNIST v2's 2D single-label datasets, from the official ``.npz`` files."""

    name: ClassVar[str] = "medmnist"
    title: ClassVar[str] = "MedMNIST"

    def flags(self) -> tuple[str, ...]:
        return available_flags()

    def sizes(self, flag: str) -> tuple[int, ...]:
        return MEDMNIST_SIZES

    def info(self, flag: str) -> DatasetInfo:
        return medmnist_info(flag)

    def ensure(self, flag: str, size: int, root: Path | None) -> None:
        dataset_path(flag, size, root)

    def load(self, flag: str, size: int, root: Path | None) -> DatasetArrays:
        return load_medmnist(flag, size, str(root) if root else None)

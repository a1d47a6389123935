"""MedMNIST 2D datasets, found on disk or downloaded through the medmnist package.

Arrays are loaded straight from the official ``.npz`` files (uint8 images, int labels)
and cached per process: a simulated hospital (a Ray actor) loads its dataset once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLITS = ("train", "val", "test")


class DataMissingError(FileNotFoundError):
    """A dataset file is not on disk and could not be downloaded."""


@functools.cache
def _info() -> dict:
    import medmnist

    return medmnist.INFO


def available_flags() -> tuple[str, ...]:
    """MedMNIST 2D single-label flags (multi-label ChestMNIST and the 3D sets are left out:
    the models here are single-label 2D classifiers)."""
    return tuple(
        sorted(
            flag
            for flag, info in _info().items()
            if not flag.endswith("3d") and "multi-label" not in info["task"]
        )
    )


def dataset_flags() -> tuple[str, ...]:
    """Every dataset a run can name: the MedMNIST 2D flags plus torchvision's MNIST and CIFAR-10."""
    from hospitrust.datasets.torchvision_source import TORCHVISION_DATASETS

    return tuple(sorted(available_flags() + tuple(TORCHVISION_DATASETS)))


MEDMNIST_SIZES = (28, 64, 128, 224)


@dataclass(frozen=True)
class DatasetInfo:
    flag: str
    num_classes: int
    in_channels: int
    class_names: tuple[str, ...]
    task: str
    license: str

    @classmethod
    def of(cls, flag: str) -> "DatasetInfo":
        from hospitrust.datasets.torchvision_source import TORCHVISION_DATASETS

        if flag in TORCHVISION_DATASETS:
            spec = TORCHVISION_DATASETS[flag]
            return cls(flag, spec.num_classes, spec.in_channels, spec.class_names, "multi-class", spec.license)
        if flag not in available_flags():
            raise ValueError(f"unknown dataset {flag!r}; allowed: {', '.join(dataset_flags())}")
        info = _info()[flag]
        labels = info["label"]
        names = tuple(str(labels[str(i)]) for i in range(len(labels)))
        return cls(flag, len(names), int(info["n_channels"]), names, info["task"], info.get("license", ""))


def default_root() -> Path:
    from medmnist.info import DEFAULT_ROOT

    return Path(DEFAULT_ROOT)


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
        raise DataMissingError(
            f"dataset file {path.name!r} is not in {folder} and could not be downloaded ({type(exc).__name__}: {exc}).\n"
            f"  Get it on a machine with network: `python -m medmnist download` or "
            f"`python -c \"import medmnist; medmnist.{info['python_class']}(split='train', root='{folder}', "
            f"download=True, size={size})\"`, or download {url} ,\n"
            f"  then copy it to {folder} (or point run config data-dir / $HOSPITRUST_DATA_DIR at the folder that holds it)."
        ) from exc
    if not path.is_file():
        raise DataMissingError(f"medmnist reported a download but {path} does not exist")
    return path


@dataclass(frozen=True)
class MedMNISTArrays:
    """One dataset file in memory: uint8 images (N, H, W, C) and int64 labels (N,) per split."""

    info: DatasetInfo
    image_size: int
    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]


@functools.lru_cache(maxsize=4)
def load_medmnist(flag: str, size: int, root: str | None) -> MedMNISTArrays:
    """Load (and cache per process) all three splits of a MedMNIST dataset."""
    info = DatasetInfo.of(flag)
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
    return MedMNISTArrays(info, size, images, labels)

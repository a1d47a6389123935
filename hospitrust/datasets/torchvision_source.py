"""torchvision's MNIST and CIFAR-10 (FedAgain's public benchmarks) as hospitrust datasets.

The files are read straight from torchvision's on-disk layout (MNIST's idx files under
``ROOT/MNIST/raw``, CIFAR-10's pickled batches under ``ROOT/cifar-10-batches-py``) and
downloaded with torchvision when missing. Both ship a train and a test split only; the
val split (the server's reference cohort comes from it) is a fixed, class-stratified 10 %
of the official train split, the same for every run and seed. Images are resampled to the
run's ``image-size`` when it differs from the native size (28 for MNIST, 32 for CIFAR-10).
"""

from __future__ import annotations

import functools
import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from hospitrust.datasets.base import DataMissingError, DatasetArrays, DatasetInfo, DatasetSource, default_root, first_sentence

VAL_FRACTION = 0.1
VAL_SEED = 20_260_606  # fixed: the val split must not move with the run's seed


@dataclass(frozen=True)
class TorchvisionSpec:
    flag: str
    python_class: str  # torchvision.datasets.<python_class>
    num_classes: int
    in_channels: int
    native_size: int
    class_names: tuple[str, ...]
    folder: str  # below the data directory
    files: tuple[str, ...]  # what must be in that folder
    license: str


TORCHVISION_DATASETS: dict[str, TorchvisionSpec] = {
    "mnist": TorchvisionSpec(
        "mnist", "MNIST", 10, 1, 28, tuple(str(i) for i in range(10)), "MNIST/raw",
        ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        "CC BY-SA 3.0 (LeCun, Cortes, Burges)",
    ),
    "cifar10": TorchvisionSpec(
        "cifar10", "CIFAR10", 10, 3, 32,
        ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
        "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",),
        "see https://www.cs.toronto.edu/~kriz/cifar.html (Krizhevsky 2009)",
    ),
}


def _missing(spec: TorchvisionSpec, folder: Path) -> list[str]:
    """Files of the dataset not in ``folder`` (MNIST's may also be gzipped)."""
    return [f for f in spec.files if not (folder / f).is_file() and not (folder / f"{f}.gz").is_file()]


def _download(spec: TorchvisionSpec, root: Path) -> None:
    """Fetch with torchvision (both splits); raises whatever torchvision raises."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, spec.python_class)
    for train in (True, False):
        cls(root=str(root), train=train, download=True)


def dataset_folder(flag: str, root: Path | None) -> Path:
    """The folder holding the dataset's files, downloading them when missing.

    Raises DataMissingError naming the missing files, the folder searched and how to get them.
    """
    spec = TORCHVISION_DATASETS[flag]
    base = Path(root if root is not None else default_root()).expanduser().resolve()
    folder = base / spec.folder
    missing = _missing(spec, folder)
    if not missing:
        return folder
    try:
        base.mkdir(parents=True, exist_ok=True)
        _download(spec, base)
    except Exception as exc:  # no network, read-only folder, ...
        raise DataMissingError(
            f"dataset {flag!r}: {', '.join(missing)} not in {folder} and could not be downloaded ({first_sentence(exc)}). "
            f"On a machine with network run `python -c \"import torchvision; "
            f"torchvision.datasets.{spec.python_class}(root='{base}', download=True); "
            f"torchvision.datasets.{spec.python_class}(root='{base}', train=False, download=True)\"`, "
            f"then copy the folder {spec.folder.split('/')[0]}/ into {base} (or point run config data-dir / "
            f"$HOSPITRUST_DATA_DIR at the folder that holds it)."
        ) from exc
    still = _missing(spec, folder)
    if still:
        raise DataMissingError(f"torchvision reported a download but {', '.join(still)} are not in {folder}")
    return folder


def _open(path: Path):
    return path.open("rb") if path.is_file() else gzip.open(path.with_name(path.name + ".gz"), "rb")


def read_idx(path: Path) -> np.ndarray:
    """An idx file (MNIST's format): magic (0, 0, dtype 0x08 = uint8, ndim), big-endian
    int32 dimensions, then the data.
    """
    with _open(path) as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not a uint8 idx file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = tuple(int(v) for v in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} values), file holds {data.size}")
    return data.reshape(dims).copy()  # frombuffer is read-only


def _read_mnist(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(folder / f"{prefix}-images-idx3-ubyte")
        labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte").astype(np.int64)
        out[split] = (images[..., None], labels)
    return out


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as fh:
        batch = pickle.load(fh, encoding="bytes")
    # rows are 3072 bytes: the red plane (32 x 32), then green, then blue
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(data), np.asarray(batch[b"labels"], dtype=np.int64)


def _read_cifar10(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    train = [_read_cifar_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    return {
        "train": (np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])),
        "test": _read_cifar_batch(folder / "test_batch"),
    }


def carve_val(labels: np.ndarray, fraction: float = VAL_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices: a fixed class-stratified share of each class goes to val."""
    rng = np.random.default_rng(VAL_SEED)
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        take = int(round(fraction * idx.size)) if idx.size > 1 else 0
        val.append(rng.choice(idx, size=take, replace=False))
    val_idx = np.sort(np.concatenate(val)).astype(np.int64)
    train_idx = np.setdiff1d(np.arange(labels.size), val_idx)
    return train_idx, val_idx


def resample(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, C) images resized to size x size (bilinear, antialiased)."""
    if images.shape[1:3] == (size, size):
        return images
    import torch
    import torch.nn.functional as F

    out = np.empty((images.shape[0], size, size, images.shape[3]), dtype=np.uint8)
    for start in range(0, images.shape[0], 4096):
        chunk = torch.from_numpy(images[start : start + 4096]).permute(0, 3, 1, 2).float()
        resized = F.interpolate(chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[start : start + 4096] = resized.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out


@functools.lru_cache(maxsize=4)
def load_torchvision(flag: str, size: int, root: str | None):
    """All three splits (train, the carved val, test)."""
    folder = dataset_folder(flag, Path(root) if root else None)
    raw = _read_mnist(folder) if flag == "mnist" else _read_cifar10(folder)
    train_x, train_y = raw["train"]
    train_idx, val_idx = carve_val(train_y)
    splits = {"train": (train_x[train_idx], train_y[train_idx]), "val": (train_x[val_idx], train_y[val_idx]),
              "test": raw["test"]}
    images = {k: np.ascontiguousarray(resample(x, size)) for k, (x, _) in splits.items()}
    labels = {k: y for k, (_, y) in splits.items()}
    return DatasetArrays(torchvision_info(flag), size, images, labels)


def torchvision_info(flag: str) -> DatasetInfo:
    spec = TORCHVISION_DATASETS[flag]
    return DatasetInfo(flag, spec.num_classes, spec.in_channels, spec.class_names, "multi-class", spec.license)


class TorchvisionSource(DatasetSource):
    """torchvision's MNIST and CIFAR-10, from torchvision's on-disk layout; any image size
    (resampled), and CIFAR-10's native 32.
    """

    name: ClassVar[str] = "torchvision"
    title: ClassVar[str] = "torchvision"

    def flags(self) -> tuple[str, ...]:
        return tuple(TORCHVISION_DATASETS)

    def sizes(self, flag: str) -> tuple[int, ...]:
        return (28, 32, 64, 128, 224)

    def info(self, flag: str) -> DatasetInfo:
        return torchvision_info(flag)

    def ensure(self, flag: str, size: int, root: Path | None) -> None:
        dataset_folder(flag, root)

    def load(self, flag: str, size: int, root: Path | None) -> DatasetArrays:
        return load_torchvision(flag, size, str(root) if root else None)

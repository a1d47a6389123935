"""Dataset sources by name, and every dataset flag they serve: a run config's ``dataset``.

A source is a :class:`~hospitrust.datasets.base.DatasetSource`; the built-in ones are
MedMNIST and torchvision's MNIST / CIFAR-10. A flag is looked up in the sources in order.
"""

from __future__ import annotations

from pathlib import Path

from hospitrust.datasets.base import DatasetArrays, DatasetInfo, DatasetSource
from hospitrust.datasets.medmnist_source import MedMNISTSource
from hospitrust.datasets.torchvision_source import TorchvisionSource

SOURCES: dict[str, DatasetSource] = {s.name: s for s in (MedMNISTSource(), TorchvisionSource())}


def dataset_flags() -> tuple[str, ...]:
    """Every dataset a run can name."""
    return tuple(sorted(flag for source in SOURCES.values() for flag in source.flags()))


def source_of(flag: str) -> DatasetSource:
    """The source serving ``flag``; ValueError listing the flags when none does."""
    for source in SOURCES.values():
        if flag in source.flags():
            return source
    raise ValueError(f"unknown dataset {flag!r}; allowed (MedMNIST 2D flags, mnist, cifar10): {', '.join(dataset_flags())}")


def dataset_info(flag: str) -> DatasetInfo:
    """What dataset ``flag`` is (classes, channels, licence)."""
    return source_of(flag).info(flag)


def load_dataset(flag: str, size: int, root: Path | None) -> DatasetArrays:
    """The dataset's three splits (cached per process by the source)."""
    return source_of(flag).load(flag, size, root)


def ensure_dataset(flag: str, size: int, root: Path | None) -> None:
    """Make sure the dataset's files are on disk (downloading them where a network exists), without
    loading them; DataMissingError names the missing file and how to get it.
    """
    source_of(flag).ensure(flag, size, root)

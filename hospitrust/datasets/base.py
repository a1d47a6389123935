"""What every dataset source shares: the dataset's description, its arrays, the missing-data
error, and the interface a source implements (``DatasetSource``). The sources register
themselves in ``hospitrust.datasets.registry``.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

SPLITS = ("train", "val", "test")


class DataMissingError(FileNotFoundError):
    """A dataset file is not on disk and could not be downloaded; the message says how to get it."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is: its flag, classes (in label order), image channels, task kind and licence."""

    flag: str
    num_classes: int
    in_channels: int
    class_names: tuple[str, ...]
    task: str
    license: str


@dataclass(frozen=True)
class DatasetArrays:
    """One dataset in memory: uint8 images (N, H, W, C) and int64 labels (N,) per split."""

    info: DatasetInfo
    image_size: int
    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]


def first_sentence(exc: BaseException, limit: int = 120) -> str:
    """An exception's first sentence on one line: why a download failed, without the library's manual."""
    text = " ".join(str(exc).split())
    return (re.split(r"(?<=[.!?])\s", text)[0][:limit] if text else "") or type(exc).__name__


DATA_DIR_ENV = "HOSPITRUST_DATA_DIR"  # where the datasets are when the run config names no data-dir


def default_root() -> Path:
    """Where datasets are looked for when neither data-dir nor $HOSPITRUST_DATA_DIR is set: medmnist's default."""
    from medmnist.info import DEFAULT_ROOT

    return Path(DEFAULT_ROOT)


class DatasetSource(abc.ABC):
    """A family of labelled image datasets (MedMNIST, torchvision's): which flags it serves,
    at which image sizes, what each is, and its three splits (train, val, test) as arrays.
    """

    name: ClassVar[str]  # registry name
    title: ClassVar[str]  # how messages name it

    @abc.abstractmethod
    def flags(self) -> tuple[str, ...]:
        """The dataset flags this source serves."""

    @abc.abstractmethod
    def sizes(self, flag: str) -> tuple[int, ...]:
        """The image sizes ``flag`` can be loaded at."""

    @abc.abstractmethod
    def info(self, flag: str) -> DatasetInfo:
        """What ``flag`` is."""

    @abc.abstractmethod
    def ensure(self, flag: str, size: int, root: Path | None) -> None:
        """Fetch the files when missing and a network allows; DataMissingError otherwise."""

    @abc.abstractmethod
    def load(self, flag: str, size: int, root: Path | None) -> DatasetArrays:
        """The three splits, found under ``root`` (default: :func:`default_root`) or downloaded;
        raises DataMissingError naming the missing file and how to get it.
        """

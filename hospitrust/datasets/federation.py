"""Who holds which images: the simulated hospitals' shares, and the server's own sets.

Deterministic from the run config's seed. Every training sample lands in exactly one
hospital; each hospital splits its share into local train and local validation. The
server keeps the test split (central evaluation) and a reference cohort: a small
class-balanced sample of the val split, which no hospital holds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hospitrust.datasets.base import DatasetArrays
from hospitrust.datasets.registry import load_dataset
from hospitrust.datasets.partitioners import Partitioner, reference_cohort, split_train_val


@dataclass(frozen=True)
class LabelledImages:
    """uint8 images (N, H, W, C) with int64 labels (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def class_counts(self, num_classes: int) -> list[int]:
        return [int(c) for c in np.bincount(self.labels, minlength=num_classes)[:num_classes]]


@dataclass(frozen=True)
class HospitalData:
    name: str
    train: LabelledImages
    val: LabelledImages


@dataclass(frozen=True)
class SimulatedFederation:
    """What the data side of a simulated federation depends on (and nothing else of the run config)."""

    dataset: str
    image_size: int
    data_dir: Path | None
    partitioner: Partitioner
    train_subsample: float
    val_fraction: float
    seed: int
    reference_cohort_per_class: int

    def __hash__(self) -> int:  # the partitioner is identified by its name and (frozen) options
        return hash((self.dataset, self.image_size, self.data_dir, self.partitioner.name, self.partitioner.options,
                     self.train_subsample, self.val_fraction, self.seed, self.reference_cohort_per_class))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimulatedFederation) and hash(self) == hash(other)


def load_arrays(fed: SimulatedFederation) -> DatasetArrays:
    """The federation's dataset, three splits, from its source (MedMNIST, torchvision)."""
    return load_dataset(fed.dataset, fed.image_size, fed.data_dir)


def _stratified_subsample(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a per-class share of the training split (every class keeps >= 1 sample)."""
    if fraction >= 1.0:
        return np.arange(labels.shape[0], dtype=np.int64)
    rng = np.random.default_rng([seed, 7])
    keep = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n = max(1, int(round(fraction * idx.size)))
        keep.append(rng.choice(idx, size=n, replace=False))
    return np.sort(np.concatenate(keep)).astype(np.int64)


@functools.lru_cache(maxsize=8)
def _partitions_cached(fed: SimulatedFederation, num_hospitals: int) -> tuple[np.ndarray, ...]:
    arrays = load_arrays(fed)
    labels = arrays.labels["train"]
    pool = _stratified_subsample(labels, fed.train_subsample, fed.seed)
    if num_hospitals > pool.size:
        raise ValueError(
            f"{num_hospitals} hospitals but only {pool.size} training samples "
            f"(dataset {fed.dataset}, train-subsample {fed.train_subsample}); use fewer hospitals or more data"
        )
    parts = fed.partitioner.split(labels[pool], num_hospitals, seed=fed.seed)
    return tuple(pool[p] for p in parts)


def partitions(fed: SimulatedFederation, num_hospitals: int) -> list[np.ndarray]:
    """Per hospital, indices into the training split (cached per process)."""
    return list(_partitions_cached(fed, num_hospitals))


def simulated_hospital(fed: SimulatedFederation, partition_id: int, num_partitions: int) -> HospitalData:
    """A simulated hospital's local train and validation sets."""
    arrays = load_arrays(fed)
    share = partitions(fed, num_partitions)[partition_id]
    train_idx, val_idx = split_train_val(share, fed.val_fraction, seed=fed.seed * 1000 + partition_id)
    x, y = arrays.images["train"], arrays.labels["train"]
    return HospitalData(
        name=f"hospital-{partition_id}",
        train=LabelledImages(x[train_idx], y[train_idx]),
        val=LabelledImages(x[val_idx], y[val_idx]),
    )


def test_set(fed: SimulatedFederation) -> LabelledImages:
    """The server's test split (central evaluation)."""
    arrays = load_arrays(fed)
    return LabelledImages(arrays.images["test"], arrays.labels["test"])


def validation_set(fed: SimulatedFederation) -> LabelledImages:
    """The val split's images outside the reference cohort: a held-out set for choosing hyperparameters
    (learning rates, rounds) that is neither the test split nor what a rule judges updates on.
    """
    arrays = load_arrays(fed)
    cohort = reference_cohort(arrays.labels["val"], fed.reference_cohort_per_class, seed=fed.seed)
    keep = np.setdiff1d(np.arange(len(arrays.labels["val"])), cohort)
    return LabelledImages(arrays.images["val"][keep], arrays.labels["val"][keep])


def reference_set(fed: SimulatedFederation) -> LabelledImages:
    """The server's reference cohort: class-balanced, from the val split (no hospital holds it)."""
    arrays = load_arrays(fed)
    idx = reference_cohort(arrays.labels["val"], fed.reference_cohort_per_class, seed=fed.seed)
    return LabelledImages(arrays.images["val"][idx], arrays.labels["val"][idx])

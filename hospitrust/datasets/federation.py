"""Who holds which images: the simulated hospitals' shares, and the server's own sets.

Deterministic from the run config's seed. Every training sample lands in exactly one
hospital; each hospital splits its share into local train and local validation. The
server keeps the test split (central evaluation) and a reference cohort: a small
class-balanced sample of the val split, which no hospital holds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hospitrust.config import RunConfig
from hospitrust.datasets.base import DatasetArrays
from hospitrust.datasets.registry import load_dataset
from hospitrust.datasets.partitioners import (
    PARTITIONERS,
    parse_specialist_classes,
    reference_cohort,
    split_train_val,
)


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


def load_arrays(cfg: RunConfig) -> DatasetArrays:
    """The configured dataset's three splits, from its source (MedMNIST, torchvision)."""
    return load_dataset(cfg.dataset, cfg.image_size, cfg.resolved_data_dir())


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


def partitioner_params(cfg: RunConfig) -> dict:
    """The keyword arguments of the configured partitioner."""
    name = cfg.partitioner
    if name == "dirichlet":
        return {"alpha": cfg.dirichlet_alpha}
    if name == "quantity-skew":
        return {"alpha": cfg.quantity_skew_alpha}
    if name == "pathological":
        return {"classes_per_hospital": cfg.classes_per_hospital}
    if name == "specialist":
        return {"specialist_classes": parse_specialist_classes(cfg.specialist_classes), "alpha": cfg.dirichlet_alpha}
    return {}


@functools.lru_cache(maxsize=8)
def _partitions_cached(cfg: RunConfig, num_hospitals: int) -> tuple[np.ndarray, ...]:
    arrays = load_arrays(cfg)
    labels = arrays.labels["train"]
    pool = _stratified_subsample(labels, cfg.train_subsample, cfg.seed)
    if num_hospitals > pool.size:
        raise ValueError(
            f"{num_hospitals} hospitals but only {pool.size} training samples "
            f"(dataset {cfg.dataset}, train-subsample {cfg.train_subsample}); use fewer hospitals or more data"
        )
    parts = PARTITIONERS[cfg.partitioner](labels[pool], num_hospitals, seed=cfg.seed, **partitioner_params(cfg))
    return tuple(pool[p] for p in parts)


def partitions(cfg: RunConfig, num_hospitals: int) -> list[np.ndarray]:
    """Per hospital, indices into the training split (cached per process)."""
    return list(_partitions_cached(cfg, num_hospitals))


def simulated_hospital(cfg: RunConfig, partition_id: int, num_partitions: int) -> HospitalData:
    """A simulated hospital's local train and validation sets."""
    arrays = load_arrays(cfg)
    share = partitions(cfg, num_partitions)[partition_id]
    train_idx, val_idx = split_train_val(share, cfg.val_fraction, seed=cfg.seed * 1000 + partition_id)
    x, y = arrays.images["train"], arrays.labels["train"]
    return HospitalData(
        name=f"hospital-{partition_id}",
        train=LabelledImages(x[train_idx], y[train_idx]),
        val=LabelledImages(x[val_idx], y[val_idx]),
    )


def test_set(cfg: RunConfig) -> LabelledImages:
    arrays = load_arrays(cfg)
    return LabelledImages(arrays.images["test"], arrays.labels["test"])


def reference_set(cfg: RunConfig) -> LabelledImages:
    """The server's reference cohort: class-balanced, from the val split (no hospital holds it)."""
    arrays = load_arrays(cfg)
    idx = reference_cohort(arrays.labels["val"], cfg.reference_cohort_per_class, seed=cfg.seed)
    return LabelledImages(arrays.images["val"][idx], arrays.labels["val"][idx])

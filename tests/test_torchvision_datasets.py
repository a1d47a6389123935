"""torchvision's MNIST and CIFAR-10 as datasets: read from torchvision's on-disk layout
(fake files written here, no network), val carved from train, resampling, a clear error
when the files are missing, and a real in-process run on MNIST-format data."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest

from hospitrust.config import ConfigError, RunConfig, parse_run_config
from hospitrust.datasets.base import DataMissingError
from hospitrust.datasets.registry import dataset_info
from hospitrust.datasets import torchvision_source as tvs
from hospitrust.datasets import federation


def _write_idx(path, array: np.ndarray, gz: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


def fake_mnist(root, n_train=200, n_test=60, gz=False) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-format files whose images encode their label (pixel value 20 x label + noise)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    out = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = (labels[:, None, None] * 20 + rng.integers(0, 5, size=(n, 28, 28))).astype(np.uint8)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images, gz)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, gz)
        out.append((images, labels))
    return out[0]


def fake_cifar(root, per_batch=20) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = list(np.arange(per_batch) % 10)
        planes = np.zeros((per_batch, 3, 32, 32), dtype=np.uint8)
        planes[:, 0] = 200  # red plane
        planes[:, 1] = 100  # green
        planes[:, 2] = 7  # blue
        with (folder / name).open("wb") as fh:
            pickle.dump({b"data": planes.reshape(per_batch, 3072), b"labels": labels}, fh)


def _cfg(tmp_path, dataset, **extra) -> RunConfig:
    tvs.load_torchvision.cache_clear()
    return parse_run_config({"dataset": dataset, "data-dir": str(tmp_path), **extra})


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_splits_from_idx_files(tmp_path, gz):
    images, labels = fake_mnist(tmp_path, gz=gz)
    arrays = federation.load_arrays(_cfg(tmp_path, "mnist"))
    assert arrays.info.num_classes == 10 and arrays.info.in_channels == 1
    assert arrays.images["test"].shape == (60, 28, 28, 1)
    # val is a class-stratified 10 % of train; together they are the official train split
    assert len(arrays.labels["val"]) == 20 and len(arrays.labels["train"]) == 180
    assert np.bincount(arrays.labels["val"], minlength=10).tolist() == [2] * 10
    merged = np.concatenate([arrays.images["train"], arrays.images["val"]])[..., 0]
    assert sorted(map(bytes, merged)) == sorted(map(bytes, images))
    # labels travel with their images
    for split in ("train", "val", "test"):
        assert np.array_equal(arrays.images[split][:, 0, 0, 0] // 20, arrays.labels[split])


def test_val_split_does_not_move_with_the_seed(tmp_path):
    fake_mnist(tmp_path)
    a = federation.load_arrays(_cfg(tmp_path, "mnist", seed=1))
    b = federation.load_arrays(_cfg(tmp_path, "mnist", seed=2))
    assert np.array_equal(a.images["val"], b.images["val"])


def test_cifar10_channel_layout_and_resampling(tmp_path):
    fake_cifar(tmp_path)
    arrays = federation.load_arrays(_cfg(tmp_path, "cifar10", **{"image-size": 32}))
    assert arrays.images["train"].shape == (90, 32, 32, 3)  # 100 minus the 10 % val
    assert arrays.images["test"].shape == (20, 32, 32, 3)
    assert arrays.images["test"][0, 5, 5].tolist() == [200, 100, 7]  # planes -> HWC
    assert dataset_info("cifar10").class_names[0] == "airplane"
    small = federation.load_arrays(_cfg(tmp_path, "cifar10"))  # default image-size 28: resampled
    assert small.images["test"].shape == (20, 28, 28, 3)
    assert small.images["test"][0, 10, 10].tolist() == [200, 100, 7]  # a flat image stays flat


def test_missing_files_name_the_folder_and_the_fix(tmp_path, monkeypatch):
    def offline(spec, root):
        raise OSError("network unreachable")

    monkeypatch.setattr(tvs, "_download", offline)
    with pytest.raises(DataMissingError) as err:
        federation.load_arrays(_cfg(tmp_path, "cifar10"))
    text = str(err.value)
    assert "data_batch_1" in text and str(tmp_path) in text
    assert "torchvision.datasets.CIFAR10" in text and "network unreachable" in text


def test_corrupt_idx_file_is_refused(tmp_path):
    fake_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x0d\x01junk")
    with pytest.raises(ValueError, match="not a uint8 idx file"):
        federation.load_arrays(_cfg(tmp_path, "mnist"))


def test_config_checks_sizes_and_names():
    with pytest.raises(ConfigError, match="MedMNIST ships"):
        parse_run_config({"dataset": "pneumoniamnist", "image-size": 32})
    with pytest.raises(ConfigError, match="mnist, cifar10"):
        parse_run_config({"dataset": "cifar100"})
    assert parse_run_config({"dataset": "cifar10", "image-size": 32}).image_size == 32


def test_hospitals_and_server_sets_on_mnist(tmp_path):
    fake_mnist(tmp_path, n_train=400)
    cfg = _cfg(tmp_path, "mnist", **{"partitioner": "iid", "reference-cohort-per-class": 2})
    shares = [federation.simulated_hospital(cfg.federation, i, 4) for i in range(4)]
    assert sum(len(h.train) + len(h.val) for h in shares) == 360
    assert len(federation.test_set(cfg.federation)) == 60
    assert np.bincount(federation.reference_set(cfg.federation).labels, minlength=10).tolist() == [2] * 10


def test_inprocess_run_on_mnist(tmp_path):
    """The real ServerApp and ClientApps train on MNIST-format data and write the run."""
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records, read_summary

    fake_mnist(tmp_path / "data", n_train=300)
    tvs.load_torchvision.cache_clear()
    run_inprocess(
        {"dataset": "mnist", "data-dir": str(tmp_path / "data"), "num-server-rounds": 2, "local-epochs": 1,
         "partitioner": "iid", "output-dir": str(tmp_path / "runs"), "run-name": "mnist", "checkpoint": False},
        3,
    )
    summary = read_summary(tmp_path / "runs" / "mnist")
    assert summary["dataset"] == "mnist"
    assert len(summary["final"]["per_class_recall"]) == 10
    assert 0.0 <= summary["final"]["balanced_accuracy"] <= 1.0
    rounds = read_round_records(tmp_path / "runs" / "mnist")
    assert len(rounds) == 2 and all(len(r.clients) == 3 for r in rounds)

"""Data sources: MedMNIST files (present, missing), a hospital's own image folders, federation splits."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import small_run_config
from hospitrust.config import parse_node_config, parse_run_config
from hospitrust.client_app.context import load_hospital
from hospitrust.datasets.federation import partitions, reference_set, simulated_hospital, validation_set
from hospitrust.datasets.federation import test_set as central_test_set
from hospitrust.datasets.local import HospitalDataError, load_local
from hospitrust.datasets.medmnist_source import dataset_path, load_medmnist
from hospitrust.datasets.base import DataMissingError
from hospitrust.datasets.registry import dataset_info


def test_missing_file_names_file_folder_and_remedy(tmp_path, monkeypatch):
    # no network here, and none needed for the check: make any download attempt fail at once
    import medmnist

    def no_download(*args, **kwargs):
        raise RuntimeError("network unreachable")

    monkeypatch.setattr(medmnist, "DermaMNIST", no_download)
    with pytest.raises(DataMissingError) as err:
        dataset_path("dermamnist", 28, tmp_path)
    msg = str(err.value)
    assert "dermamnist.npz" in msg and str(tmp_path) in msg and "HOSPITRUST_DATA_DIR" in msg
    assert "network unreachable" in msg


def test_larger_image_sizes_use_their_own_file_name(tmp_path, monkeypatch):
    import medmnist

    monkeypatch.setattr(medmnist, "PneumoniaMNIST", lambda **kw: (_ for _ in ()).throw(RuntimeError("offline")))
    with pytest.raises(DataMissingError, match="pneumoniamnist_64.npz"):
        dataset_path("pneumoniamnist", 64, tmp_path)


def test_official_files_load(data_dir):
    a = load_medmnist("retinamnist", 28, str(data_dir))
    assert a.images["train"].shape == (1080, 28, 28, 3) and a.labels["test"].shape == (400,)
    assert np.bincount(a.labels["test"]).tolist() == [174, 46, 92, 68, 20]
    p = load_medmnist("pneumoniamnist", 28, str(data_dir))
    assert p.images["train"].shape == (4708, 28, 28, 1)
    assert dataset_info("pneumoniamnist").class_names == ("normal", "pneumonia")


def test_simulated_hospitals_cover_the_training_pool_once(tmp_path, data_dir):
    cfg = parse_run_config(small_run_config(tmp_path, **{"train-subsample": 1.0}))
    parts = partitions(cfg.federation, 10)
    allidx = np.concatenate(parts)
    assert allidx.size == 4708 and np.unique(allidx).size == 4708
    h = simulated_hospital(cfg.federation, 3, 10)
    assert len(h.train) + len(h.val) == parts[3].size and len(h.val) >= 1
    # the reference cohort is class-balanced and from the val split (no hospital holds it)
    ref = reference_set(cfg.federation)
    assert np.bincount(ref.labels).tolist() == [20, 20]
    assert len(central_test_set(cfg.federation)) == 624


def test_the_validation_split_for_tuning_is_the_val_split_without_the_cohort(tmp_path, data_dir):
    from hospitrust.datasets.server import server_sets
    from hospitrust.tasks.task import resolve_task

    cfg = parse_run_config(small_run_config(tmp_path, **{"server-data.test-split": "val"}))
    val, ref = validation_set(cfg.federation), reference_set(cfg.federation)
    assert len(val) == 524 - 40  # PneumoniaMNIST's val split, less the 20-per-class cohort
    flat = {img.tobytes() for img in val.images}
    assert not any(img.tobytes() in flat for img in ref.images)  # disjoint: tuning never sees the cohort
    sets = server_sets(cfg.server_data, resolve_task(cfg), cfg.federation, False)
    assert len(sets.test) == 484 and "val split without the reference cohort" in sets.test_source
    with pytest.raises(Exception, match="test-split"):
        parse_run_config(small_run_config(tmp_path, **{"server-data.test-split": "train"}))


def test_more_hospitals_than_samples_is_a_clear_error(tmp_path, data_dir):
    cfg = parse_run_config(small_run_config(tmp_path, **{"train-subsample": 0.001}))
    with pytest.raises(ValueError, match="hospitals but only"):
        partitions(cfg.federation, 50)


def _write_folder(root, classes, per_class=3, size=(40, 30), mode="L"):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray((np.random.default_rng(i).random((size[1], size[0])) * 255).astype(np.uint8)).convert(mode) \
                .save(root / c / f"img{i}.png")


def _task(flag: str):
    from hospitrust.tasks.task import resolve_task

    return resolve_task(parse_run_config({"dataset": flag}))


def test_hospital_image_folders_load_resized_and_mapped(tmp_path, data_dir):
    root = tmp_path / "stmarys"
    _write_folder(root, ["normal", "pneumonia"], per_class=4, mode="RGB")
    data = load_local(root, "auto", _task("pneumoniamnist"), tmp_path / "cache")
    assert data.images.shape == (8, 28, 28, 1) and data.images.dtype == np.uint8
    assert sorted(data.labels.tolist()) == [0] * 4 + [1] * 4
    cfg = parse_run_config(small_run_config(tmp_path))
    node = parse_node_config({"data-path": str(root), "hospital": "st-marys", "cache-dir": str(tmp_path / "cache")})
    hospital, card = load_hospital(cfg, node, _task("pneumoniamnist"))
    assert hospital.name == "st-marys" and len(hospital.train) + len(hospital.val) == 8
    assert card["format"] == "folder (png)" and card["images"] == 8


def test_folders_may_be_named_by_index(tmp_path):
    root = tmp_path / "h"
    _write_folder(root, ["0", "1", "2", "3", "4"], per_class=1, mode="RGB")
    data = load_local(root, "folder", _task("retinamnist"), tmp_path / "cache")
    assert data.images.shape == (5, 28, 28, 3) and sorted(data.labels.tolist()) == [0, 1, 2, 3, 4]


def test_class_folders_must_match_the_federation(tmp_path):
    root = tmp_path / "h"
    _write_folder(root, ["normal", "covid"], per_class=1)
    with pytest.raises(HospitalDataError) as err:
        load_local(root, "auto", _task("pneumoniamnist"), tmp_path / "cache")
    msg = err.value.detail  # the hospital's own log: names the folder
    assert "unknown class folder(s) ['covid']" in msg and "no folder for class(es) ['pneumonia']" in msg
    assert "0=normal" in msg
    public = str(err.value)  # what may leave the hospital: a folder the task does not name is counted, not named
    assert "class folder 1 of 2: unknown class" in public and "no folder for class(es) ['pneumonia']" in public
    assert "covid" not in public and str(tmp_path) not in public


def test_missing_data_path_is_a_clear_error(tmp_path):
    with pytest.raises(HospitalDataError, match="does not exist"):
        load_local(tmp_path / "nope", "auto", _task("pneumoniamnist"), tmp_path / "cache")

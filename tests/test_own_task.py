"""A consortium's own task and data: task files, hospital formats (folder, CSV, DICOM, npz), the
decode-once cache, patient-level splits, the server's own sets, federated evaluation, a hospital
whose data does not fit, and the pretrained checkpoint. In-process runs on synthetic images:
no MedMNIST file needed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hospitrust.config import parse_run_config
from hospitrust.datasets.dicom import write_dicom
from hospitrust.datasets.local import HospitalDataError, RowView, data_card, load_local, split_local
from hospitrust.errors import ConfigError
from hospitrust.ops.inprocess import run_inprocess
from hospitrust.server_app.results import read_round_records
from hospitrust.models.augment import augment_batch, parse_augmentation
from hospitrust.tasks.model import load_pretrained, task_model
from hospitrust.tasks.task import Task, resolve_task

CLASSES = ("healthy", "lesion")


def _task(**kw) -> Task:
    raw = {"task.classes": ",".join(CLASSES), "strategy": "fedavg", **kw}
    return resolve_task(parse_run_config(raw))


def _images(n: int, seed: int, size: int = 28, rgb: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic learnable images: class 1 has a bright square in the middle."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    x = rng.integers(0, 90, (n, size, size, 3 if rgb else 1)).astype(np.uint8)
    x[labels == 1, size // 4: 3 * size // 4, size // 4: 3 * size // 4] += 140
    return x, labels


def _write(root: Path, fmt: str, images: np.ndarray, labels: np.ndarray, patients=None, splits=None) -> Path:
    """The same images in one of the formats (as a hospital exports them)."""
    root.mkdir(parents=True, exist_ok=True)
    squeeze = images.shape[-1] == 1
    pix = [img[..., 0] if squeeze else img for img in images]
    if fmt == "npz":
        extra = {} if patients is None else {"patient_ids": np.asarray(patients)}
        np.savez(root / "h.npz", images=images, labels=labels, **extra)
        return root / "h.npz"
    if fmt == "csv":
        (root / "img").mkdir(exist_ok=True)
        with (root / "manifest.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "label"] + (["patient_id"] if patients is not None else [])
                       + (["split"] if splits is not None else []))
            for i, (p, y) in enumerate(zip(pix, labels)):
                Image.fromarray(p).save(root / "img" / f"{i}.png")
                row = [f"img/{i}.png", CLASSES[y]]
                row += [patients[i]] if patients is not None else []
                row += [splits[i]] if splits is not None else []
                w.writerow(row)
        return root / "manifest.csv"
    for c in CLASSES:
        (root / c).mkdir(exist_ok=True)
    for i, (p, y) in enumerate(zip(pix, labels)):
        if fmt == "dicom":
            write_dicom(root / CLASSES[y] / f"{i}.dcm", p, patient_id=f"p{i}")
        else:
            Image.fromarray(p).save(root / CLASSES[y] / f"{i}.png")
    return root


# ---- tasks ---------------------------------------------------------------------------------
def test_a_task_from_the_run_config_and_from_a_file(tmp_path):
    t = _task(**{"task.rare-classes": "lesion", "task.augmentation": "horizontal-flip, rotation=10"})
    assert t.class_names == CLASSES and t.channels == 1 and t.dataset == "" and t.rare_classes == (1,)
    assert t.augmentation == ("horizontal-flip", "rotation=10") and t.default_normalization
    f = tmp_path / "task.toml"
    f.write_text('name = "skin"\nclasses = ["benign", "melanoma", "nevus"]\nchannels = 3\nimage-size = 64\n'
                 'mean = [0.485, 0.456, 0.406]\nstd = [0.229, 0.224, 0.225]\n')
    t = resolve_task(parse_run_config({"task.file": str(f), "strategy": "fedavg"}))
    assert (t.name, t.num_classes, t.channels, t.image_size) == ("skin", 3, 3, 64)
    assert t.normalization() == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) and not t.default_normalization
    assert Task.from_json(t.to_json()) == t  # what travels to the hospitals with every message


def test_a_built_in_dataset_is_a_task():
    t = resolve_task(parse_run_config({"dataset": "retinamnist"}))
    assert t.dataset == "retinamnist" and t.num_classes == 5 and t.channels == 3 and t.source == "dataset retinamnist"


@pytest.mark.parametrize("raw, expected", [
    ({"task.classes": "only-one"}, "at least two classes"),
    ({"task.classes": "a,A"}, "distinct"),
    ({"task.classes": "a,b", "task.rare-classes": "c"}, "'c' is not one of the task's classes"),
    ({"task.classes": "a,b", "task.channels": 3, "task.mean": "0.5,0.5"}, "task.mean has 2 values for 3 channels"),
    ({"task.file": "/nonexistent/task.toml"}, "task.file '/nonexistent/task.toml' not found"),
])
def test_bad_tasks_are_refused_naming_the_key(raw, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        resolve_task(parse_run_config({"strategy": "fedavg", **raw}))


def test_bad_augmentation_is_refused_at_parse_time():
    with pytest.raises(ConfigError, match="unknown augmentation 'blur'"):
        parse_run_config({"task.augmentation": "blur"})
    with pytest.raises(ConfigError, match="rotation takes a value"):
        parse_run_config({"task.augmentation": "rotation"})


def test_a_task_file_and_task_keys_together_are_a_conflict(tmp_path):
    f = tmp_path / "task.toml"
    f.write_text('classes = ["a", "b"]\nimage-size = 64\n')
    with pytest.raises(ConfigError, match="put them in the task file"):
        resolve_task(parse_run_config({"task.file": str(f), "task.rare-classes": "a"}))
    with pytest.raises(ConfigError, match="sets image-size = 64 but the run config sets image-size = 32"):
        resolve_task(parse_run_config({"task.file": str(f), "image-size": 32}))


def test_a_rule_needing_a_cohort_refuses_a_task_without_one_naming_its_cohort_free_setting():
    with pytest.raises(ConfigError) as err:
        parse_run_config({"task.classes": "a,b", "strategy": "hta"})
    msg = str(err.value)
    assert "strategy hta needs the server's reference cohort" in msg and "server-data.cohort-path" in msg
    assert "hta.validation-exponent = 0" in msg
    parse_run_config({"task.classes": "a,b", "strategy": "hta", "hta.validation-exponent": 0.0})  # cohort-free
    with pytest.raises(ConfigError, match="fltrust has no cohort-free setting"):
        parse_run_config({"task.classes": "a,b", "strategy": "fltrust"})
    with pytest.raises(ConfigError, match="earn.audit = false"):
        parse_run_config({"task.classes": "a,b", "strategy": "earn"})
    with pytest.raises(ConfigError, match="strategy fbd evaluates"):
        parse_run_config({"task.classes": "a,b", "strategy": "fbd"})
    parse_run_config({"task.classes": "a,b", "strategy": "hta", "server-data.cohort-path": "/srv/cohort"})


def test_normalization_and_augmentation_math():
    t = _task(**{"task.mean": "0.25", "task.std": "0.5"})
    model = task_model(t)
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))  # after the task's own hook
    model(torch.full((1, 1, 28, 28), 0.0))  # a [-1, 1] batch value 0 is 0.5 on [0, 1]
    assert torch.allclose(seen[0], torch.full((1, 1, 28, 28), (0.5 - 0.25) / 0.5))
    flip = parse_augmentation(["horizontal-flip"], 28)
    x = torch.arange(2 * 28 * 28, dtype=torch.uint8).reshape(2, 1, 28, 28)
    torch.manual_seed(0)
    out = augment_batch(x, flip)
    # each image its own draw: flipped or not, and nothing else
    for i in range(2):
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(-1))


# ---- hospital formats, cache, splits ---------------------------------------------------------
def test_every_format_gives_the_same_arrays_and_the_cache_decodes_once(tmp_path):
    images, labels = _images(24, seed=1)
    task = _task()
    loaded = {}
    for fmt in ("png", "csv", "dicom", "npz"):
        path = _write(tmp_path / fmt, fmt, images, labels)
        first = load_local(path, "auto", task, tmp_path / "cache")
        second = load_local(path, "auto", task, tmp_path / "cache")
        assert first.decoded and not second.decoded, fmt
        assert np.array_equal(np.asarray(first.images), np.asarray(second.images))
        loaded[fmt] = first
    assert {f: d.format for f, d in loaded.items()} == {"png": "folder (png)", "csv": "csv (png)",
                                                          "dicom": "folder (dicom)", "npz": "npz (arrays)"}
    for fmt in ("csv", "dicom", "npz"):
        assert np.array_equal(np.asarray(loaded[fmt].images), np.asarray(loaded["png"].images)), fmt
        assert np.array_equal(loaded[fmt].labels, loaded["png"].labels), fmt
    # a changed file is decoded again
    png = tmp_path / "png" / CLASSES[int(labels[0])] / "0.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(png)
    assert load_local(tmp_path / "png", "auto", task, tmp_path / "cache").decoded


def test_images_are_resized_to_the_task_and_rgb_becomes_grey(tmp_path):
    images, labels = _images(4, seed=2, size=40, rgb=True)
    data = load_local(_write(tmp_path / "h", "png", images, labels), "folder", _task(), tmp_path / "c")
    assert data.images.shape == (4, 28, 28, 1) and data.images.dtype == np.uint8


def test_patients_never_straddle_the_split_and_a_given_split_is_kept(tmp_path):
    images, labels = _images(60, seed=3)
    patients = [f"p{i // 3}" for i in range(60)]  # three images per patient
    data = load_local(_write(tmp_path / "h", "csv", images, labels, patients=patients), "auto", _task(), tmp_path / "c")
    train, val = split_local(data, 0.2, seed=5)
    assert len(train) + len(val) == 60 and len(val) >= 12
    assert not set(data.patients[train]) & set(data.patients[val])
    card = data_card(data, train, val, 2)
    assert card["patients"] == 20 and card["images"] == 60 and sum(card["val-class-counts"]) == len(val)
    assert "p0" not in json.dumps(card)  # counts and pixel statistics only
    splits = ["val" if i % 5 == 0 else "train" for i in range(60)]
    given = load_local(_write(tmp_path / "g", "csv", images, labels, splits=splits), "auto", _task(), tmp_path / "c")
    train, val = split_local(given, 0.5, seed=0)
    assert len(val) == 12 and len(train) == 48


@pytest.mark.parametrize("problem, detail, public", [
    ("missing-file", "row 3: img/1.png (file not found)", "file not found (row 3 of the manifest)"),
    ("bad-label", "label(s) outside the task's classes (0=healthy, 1=lesion): row 2: 'tumour'",
     "1 label(s) outside the task's classes (0=healthy, 1=lesion) (row 2 of the manifest)"),
    ("wrong-classes", "no folder for class(es) ['lesion']", "no folder for class(es) ['lesion']"),
    ("dicom-without-pixels", "no pixel data", "a DICOM file without pixel data (file "),
])
def test_data_that_does_not_fit_names_the_file_and_what_was_expected(tmp_path, problem, detail, public):
    """The detail (the hospital's own log) names the file; the public text names the problem and where by index."""
    images, labels = _images(6, seed=4)
    if problem in ("missing-file", "bad-label"):
        path = _write(tmp_path / "h", "csv", images, labels)
        rows = path.read_text().splitlines()
        if problem == "missing-file":
            (tmp_path / "h" / "img" / "1.png").unlink()
        else:
            rows[1] = "img/0.png,tumour"
            path.write_text("\n".join(rows) + "\n")
    elif problem == "wrong-classes":
        path = _write(tmp_path / "h", "png", images, labels)
        for f in (path / "lesion").iterdir():
            f.unlink()
        (path / "lesion").rmdir()
    else:
        import pydicom

        path = _write(tmp_path / "h", "dicom", images, labels)
        bad = next((path / "healthy").iterdir()) if any((path / "healthy").iterdir()) else next((path / "lesion").iterdir())
        ds = pydicom.dcmread(bad)
        del ds.PixelData
        ds.save_as(bad)
    with pytest.raises(HospitalDataError) as err:
        load_local(path, "auto", _task(), tmp_path / "c")
    assert detail in err.value.detail and public in str(err.value) and err.value.public == str(err.value)
    assert str(tmp_path) not in str(err.value) and ".png" not in str(err.value) and ".dcm" not in str(err.value)


def test_row_view_reads_rows_in_any_order():
    base = np.arange(10 * 2).reshape(10, 2)
    view = RowView(base, np.array([7, 2, 5]))
    assert view.shape == (3, 2) and len(view) == 3
    assert np.array_equal(view[np.array([2, 0])], base[[5, 7]]) and np.array_equal(view[1:], base[[2, 5]])
    assert np.array_equal(np.asarray(view), base[[7, 2, 5]])


# ---- whole runs ---------------------------------------------------------------------------
def _federation(tmp_path: Path, formats=("png", "csv", "dicom")) -> list[dict]:
    nodes = []
    for i, fmt in enumerate(formats):
        images, labels = _images(60, seed=10 + i)
        path = _write(tmp_path / "hospitals" / f"h{i}", fmt, images, labels)
        nodes.append({"data-path": str(path), "hospital": f"hospital-{i}", "cache-dir": str(tmp_path / "cache")})
    return nodes


def _server_sets(tmp_path: Path) -> dict:
    test, ty = _images(40, seed=99)
    cohort, cy = _images(20, seed=98)
    return {"server-data.test-path": str(_write(tmp_path / "server" / "test", "png", test, ty)),
            "server-data.cohort-path": str(_write(tmp_path / "server" / "cohort", "npz", cohort, cy)),
            "server-data.cache-dir": str(tmp_path / "cache")}


def _run(tmp_path: Path, name: str, nodes: list[dict], **cfg) -> Path:
    raw = {"num-server-rounds": 2, "local-epochs": 1, "batch-size": 16, "output-dir": str(tmp_path / "runs"),
           "run-name": name, "task.classes": ",".join(CLASSES), **cfg}
    run_inprocess(raw, len(nodes), node_configs=nodes)
    return tmp_path / "runs" / name


def test_hta_on_the_consortiums_own_task_and_server_sets(tmp_path, caplog):
    run = _run(tmp_path, "hta", _federation(tmp_path), strategy="hta", **_server_sets(tmp_path))
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert summary["rounds"] == 2 and summary["evaluation"] == "central" and summary["dataset"] == ""
    assert summary["final"]["num_examples"] == 40  # the operator's test set
    assert config["reference-cohort-size"] == 20 and config["task-resolved"]["class_names"] == list(CLASSES)
    assert {h: d["format"] for h, d in config["hospital-data"].items()} == {
        "hospital-0": "folder (png)", "hospital-1": "csv (png)", "hospital-2": "folder (dicom)"}
    assert all(len(d["pixel-mean"]) == 1 for d in config["hospital-data"].values())
    text = caplog.text
    assert "task task (run config)" in text and "partitioner" not in text


def test_no_test_set_means_federated_evaluation_pooled_over_hospitals(tmp_path):
    nodes = _federation(tmp_path)
    run = _run(tmp_path, "fed", nodes, strategy="fedavg")
    rounds = read_round_records(run)
    assert all(r.evaluation == "federated" for r in rounds)
    with (run / "class_counts.csv").open() as f:
        val_total = sum(int(r["total"]) for r in csv.DictReader(f) if r["split"] == "val")
    # every hospital's held-out images, pooled: the counts sum to the validation splits
    assert rounds[-1].central["num_examples"] == val_total > 0
    assert set(rounds[-1].hospital_accuracy) == {"hospital-0", "hospital-1", "hospital-2"}


def test_a_hospital_whose_data_does_not_fit_is_recorded_and_the_run_goes_on(tmp_path):
    nodes = _federation(tmp_path)
    bad = tmp_path / "bad"
    images, labels = _images(6, seed=7)
    path = _write(bad, "csv", images, labels)
    (bad / "img" / "2.png").unlink()  # a manifest row whose file is missing
    nodes.append({"data-path": str(path), "hospital": "st-broken", "cache-dir": str(tmp_path / "cache")})
    run = _run(tmp_path, "bad", nodes, strategy="fedavg", **_server_sets(tmp_path))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["hospitals"] == 3 and summary["rounds"] == 2
    failed = summary["failed_hospitals"]
    assert [f["hospital"] for f in failed] == ["st-broken"]
    assert failed[0]["reason"] == ("1 of 6 images cannot be used: file not found (row 4 of the manifest); hospitrust "
                                   "data check on the hospital's machine names the files"), failed[0]["reason"]


def test_a_pretrained_checkpoint_starts_round_one_and_code_in_a_pickle_is_refused(tmp_path):
    task = _task()
    source = task_model(task)
    with torch.no_grad():
        for p in source.parameters():
            p.fill_(0.01)
    state = source.state_dict()
    state["classifier.4.weight"] = torch.zeros(1000, 128)  # another head (e.g. ImageNet's): left out
    torch.save({"state_dict": state}, tmp_path / "pretrained.pt")
    target = task_model(task)
    loaded, skipped = load_pretrained(target, str(tmp_path / "pretrained.pt"))
    assert "classifier.4.weight" in skipped and "features.0.weight" in loaded
    assert torch.all(target.state_dict()["features.0.weight"] == 0.01)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"state_dict": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ConfigError, match="weights_only=True"):
        load_pretrained(task_model(task), str(tmp_path / "evil.pt"))
    with pytest.raises(ConfigError, match="no such file"):
        load_pretrained(task_model(task), str(tmp_path / "missing.pt"))


def test_dicom_headers_patient_ids_split_a_folder_by_patient(tmp_path):
    images, labels = _images(40, seed=6)
    root = tmp_path / "dicom"
    for i, (img, y) in enumerate(zip(images, labels)):
        (root / CLASSES[y]).mkdir(parents=True, exist_ok=True)
        write_dicom(root / CLASSES[y] / f"{i}.dcm", img[..., 0], patient_id=f"patient-{i // 4}")  # 4 images each
    data = load_local(root, "auto", _task(), tmp_path / "c")
    assert sorted(set(data.patients.tolist())) == [f"patient-{k}" for k in range(10)]
    train, val = split_local(data, 0.25, seed=1)
    assert len(val) >= 8 and not set(data.patients[train]) & set(data.patients[val])


def test_simulate_refuses_a_task_of_its_own_before_starting_flower(tmp_path):
    from hospitrust.ops.simulate import simulate

    with pytest.raises(ConfigError, match="makes its hospitals from a dataset"):
        simulate(hospitals=2, overrides=["task.classes=a,b"], app_dir=Path(__file__).resolve().parent.parent)


def test_the_task_modules_run_defaults_are_the_run_configs():
    from hospitrust.config import CoreOptions
    from hospitrust.tasks.task import RUN_DEFAULTS

    core = CoreOptions()
    assert RUN_DEFAULTS == {"image-size": core.image_size, "model": core.model}


def test_the_example_task_file_ships_in_the_app_folder():
    t = resolve_task(parse_run_config({"task.file": "tasks/chest-xray.toml", "strategy": "fedavg"}))
    assert t.name == "chest-xray" and t.class_names == ("normal", "pneumonia") and t.image_size == 64
    assert t.source.endswith("tasks/chest-xray.toml")

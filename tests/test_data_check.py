"""`hospitrust data check`: a hospital's data (class folders, CSV manifest, .npz) against the task.

Every test builds real files in tmp_path (PNG with Pillow, DICOM with hospitrust's write_dicom and
pydicom) and asserts on what the report says about them.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.uid import RLELossless

from hospitrust.datasets.dicom import write_dicom
from hospitrust.cli.main import main as cli_main
from hospitrust.datacheck.check import check_folder, check_path, main
from hospitrust.tasks.task import Task

PNEUMONIA = Task(name="pneumoniamnist", class_names=("normal", "pneumonia"), channels=1, image_size=28, model="small-cnn",
                 dataset="pneumoniamnist", source="dataset pneumoniamnist")


def _pixels(size=(28, 28), value: int = 128) -> np.ndarray:
    """A (h, w) uint8 ramp offset by ``value``: not blank, and different for every value."""
    w, h = size
    return ((np.add.outer(np.arange(h), np.arange(w)) * 3 + value) % 256).astype(np.uint8)


def _png(path: Path, size=(28, 28), value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_pixels(size, value)).save(path)
    return path


def _good(root: Path, per_class: int = 3, classes=("normal", "pneumonia")) -> Path:
    # every image differs from every other (the same image under two classes is a problem)
    for k, name in enumerate(classes):
        for i in range(per_class):
            _png(root / name / f"{i}.png", value=40 * i + 11 * k)
    return root


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(list(args))
    return rc, out.getvalue(), err.getvalue()


def _check(root: Path, *extra: str) -> tuple[int, str]:
    rc, out, _ = _cli("data", "check", str(root), *extra)
    return rc, out


def _manifest(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _dicom(path: Path, value: int = 0, *, patient: str = "p1", bits: int = 8, size=(28, 28)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_dicom(path, _pixels(size, value), patient_id=patient, bits=bits)
    return path


# --- class folders (the tests of the first version, kept) --------------------------------------


def test_good_folder_passes(tmp_path):
    """A folder per class of readable, distinct, square 28x28 PNGs is ready; the report shows the task and counts."""
    rc, out = _check(_good(tmp_path / "h"))
    assert rc == 0, out
    assert "OK: ready to join the federation" in out
    assert "28x28: 6" in out
    assert "normal" in out and "pneumonia" in out
    assert "2 classes (0=normal, 1=pneumonia), image size 28x28, 1 channel (grey)" in out
    assert "layout: folder of class folders (png 6)" in out
    assert "colour modes: L: 6" in out
    assert "local split: by image" in out
    assert "WARNING" not in out and "PROBLEM" not in out


def test_folders_named_by_index_pass(tmp_path):
    """Folders may be named by class index."""
    rc, out = _check(_good(tmp_path / "h", classes=("0", "1")))
    assert rc == 0, out
    assert "0=normal" in out and "1=pneumonia" in out


def test_missing_class_fails(tmp_path):
    """A class without a folder is named."""
    root = _good(tmp_path / "h", classes=("normal",))
    rc, out = _check(root)
    assert rc == 1
    assert "missing class 1=pneumonia" in out
    assert "NOT READY: 1 problem(s)" in out


def test_unknown_class_folder_fails(tmp_path):
    """A folder that is no class of the task is named, and the rest is still checked."""
    root = _good(tmp_path / "h")
    _png(root / "covid" / "0.png")
    (root / "normal" / "bad.png").write_bytes(b"not a png")
    rc, out = _check(root)
    assert rc == 1
    assert "unknown class folder 'covid'" in out
    assert "1 unreadable image(s) in 'normal': normal/bad.png" in out
    assert "NOT READY: 2 problem(s)" in out


def test_unreadable_image_fails_and_is_named(tmp_path):
    """An image file that does not decode is named with its folder."""
    root = _good(tmp_path / "h")
    (root / "pneumonia" / "x.png").write_bytes(b"this is not a png \x00\x01\x02" * 10)
    rc, out = _check(root)
    assert rc == 1
    assert "unreadable" in out and "pneumonia/x.png" in out
    assert "1 unreadable image(s) in 'pneumonia': pneumonia/x.png (not a readable image (UnidentifiedImageError" in out


def test_empty_class_fails(tmp_path):
    """A class folder with no readable image is a problem; its non-image file is a warning."""
    root = _good(tmp_path / "h", classes=("normal",))
    (root / "pneumonia").mkdir()
    (root / "pneumonia" / "notes.txt").write_text("no images here")
    rc, out = _check(root)
    assert rc == 1
    assert "empty class: folder 'pneumonia'" in out
    assert "missing class" not in out
    assert "WARNING: 1 non-image file(s) in 'pneumonia' are ignored" in out and "pneumonia/notes.txt" in out


def test_odd_sizes_are_flagged_with_the_size_distribution(tmp_path):
    """Non-square and too-small images are problems (warnings with --allow-odd-sizes); sizes are counted."""
    root = _good(tmp_path / "h")
    _png(root / "normal" / "wide.png", size=(64, 32))
    _png(root / "normal" / "tiny.png", size=(16, 16))
    report = check_folder(root, "pneumoniamnist", 28)
    assert not report.ok
    text = report.format()
    assert "not square" in text and "wide.png (64x32)" in text
    assert "smaller than the federation's image-size 28" in text and "tiny.png (16x16)" in text
    assert "64x32: 1" in text and "16x16: 1" in text and "28x28: 6" in text
    assert report.sizes[(64, 32)] == 1 and report.sizes[(28, 28)] == 6
    # an operator may accept them (the ClientApp resizes): warnings, exit 0
    rc, out = _check(root, "--allow-odd-sizes")
    assert rc == 0, out
    assert "WARNING" in out


def test_bigger_federation_image_size_flags_small_images(tmp_path):
    """--image-size sets the task's size that images are compared with."""
    rc, out = _check(_good(tmp_path / "h"), "--image-size", "64")
    assert rc == 1
    assert "smaller than the federation's image-size 64" in out
    assert "image size 64x64" in out


def test_not_a_folder(tmp_path):
    """A path that does not exist is reported, not raised."""
    rc, out = _check(tmp_path / "nope")
    assert rc == 1
    assert "is not a folder" in out and "does not exist" in out
    rc, out = _check(tmp_path / "nope.csv", "--format", "csv")
    assert rc == 1 and "manifest" in out and "not found" in out


@pytest.mark.parametrize("dataset", ["retinamnist"])
def test_other_dataset_classes(tmp_path, dataset):
    """The compatibility wrapper builds the dataset's built-in task (retinamnist: classes 0..4, RGB)."""
    from hospitrust.datasets.registry import dataset_info

    info = dataset_info(dataset)
    root = _good(tmp_path / "h", classes=tuple(str(i) for i in range(info.num_classes)))
    report = check_folder(root, dataset, 28)
    assert report.ok, report.format()
    assert report.task.channels == 3 and report.task.num_classes == 5
    # grey PNGs for an RGB task: converted, said as a warning
    assert any("grey image(s): the task is RGB" in w for w in report.warnings)


# --- class folders: the rest of what the ClientApp reads ----------------------------------------


def test_same_png_under_two_classes_is_a_problem_and_twice_in_one_class_a_warning(tmp_path):
    """The same file bytes in two classes is label noise (problem); twice in one class is a warning."""
    root = _good(tmp_path / "h")
    shutil.copy(root / "normal" / "0.png", root / "normal" / "0-again.png")
    report = check_path(root, PNEUMONIA)
    assert report.ok, report.format()
    assert any("appear twice or more in one class (the same file bytes)" in w and "normal/0-again.png (normal) = "
               "normal/0.png (normal)" in w for w in report.warnings)
    shutil.copy(root / "normal" / "1.png", root / "pneumonia" / "copy.png")
    report = check_path(root, PNEUMONIA)
    assert not report.ok
    [problem] = report.problems
    assert "1 image(s) appear under two or more classes (the same file bytes" in problem
    assert "normal/1.png (normal) = pneumonia/copy.png (pneumonia)" in problem


def test_loose_images_and_non_images_are_warnings_and_uid_named_dicom_is_read(tmp_path):
    """Images in the root folder and files the ClientApp ignores are warnings; a DICOM file named by its UID
    (a suffix such as '.7') is found by its marker and read; the folder stays ready.
    """
    root = _good(tmp_path / "h")
    _png(root / "stray.png", value=3)
    (root / "normal" / "README.md").write_text("exported 2024")
    # a PACS export named by its SOP instance UID: a suffix ('.7'), read by its DICM marker
    _dicom(root / "pneumonia" / "1.2.840.113619.2.55.7", value=9)
    (root / ".DS_Store").write_bytes(b"\0")
    Image.fromarray(np.dstack([_pixels(value=90), _pixels(value=91), _pixels(value=92)])).save(root / "normal" / "colour.jpg")
    report = check_path(root, PNEUMONIA)
    assert report.ok, report.format()
    text = report.format()
    assert "1 colour image(s): the task is grey (1 channel), so the ClientApp converts them to grey" in text
    assert report.modes == {"L": 6, "RGB": 1, "DICOM grey": 1}
    assert "WARNING: 1 image(s) directly in" in text and "stray.png" in text
    assert "1 non-image file(s) in 'normal' are ignored" in text and "normal/README.md" in text
    assert "does not read as DICOM" not in text
    assert report.class_counts == {"normal": 4, "pneumonia": 4}


def test_16_bit_png_is_scaled_over_its_range_and_named_in_a_warning(tmp_path):
    """A 16-bit grey PNG is scaled over its own range by the ClientApp (PIL's plain conversion would clip it
    white at 255): the check passes and names it in a warning, since no window is applied.
    """
    from hospitrust.datasets.local import decode_file

    root = _good(tmp_path / "h")
    wide = (np.arange(28 * 28, dtype=np.uint16).reshape(28, 28) * 80)  # values up to 62640
    Image.fromarray(wide).save(root / "normal" / "ct16.png")
    Image.fromarray((wide // 300).astype(np.uint16)).save(root / "pneumonia" / "fits8.png")  # 16-bit file, values <= 208
    report = check_path(root, PNEUMONIA)
    assert report.ok, report.format()
    [warning] = [w for w in report.warnings if "more than 8 bits" in w]
    assert "normal/ct16.png (I;16, values up to 62640)" in warning and "fits8" not in warning
    assert report.modes["I;16"] == 2
    decoded = decode_file(root / "normal" / "ct16.png", 28, 1)[..., 0]
    # min-max over the image: 0 -> 0, 62640 -> 255, the middle value 31360 -> round(31360 / 62640 * 255) = 128
    assert decoded[0, 0] == 0 and decoded[27, 27] == 255 and decoded[14, 0] == round(14 * 28 * 80 / 62640 * 255)


def test_dicom_folder_with_and_without_suffix_passes_and_reports_headers(tmp_path):
    """DICOM files (.dcm, .DICOM and suffix-less) in class folders: decoded, header distributions reported."""
    root = tmp_path / "h"
    _dicom(root / "normal" / "a.dcm", 1, patient="p1")
    _dicom(root / "normal" / "IM0001", 2, patient="p2")  # no suffix: found by the DICM marker
    _dicom(root / "pneumonia" / "b.DICOM", 3, patient="p3", bits=12)
    _dicom(root / "pneumonia" / "c.dcm", 4, patient="p3", bits=12)
    _png(root / "pneumonia" / "d.png", value=5)
    rc, out = _check(root)
    assert rc == 0, out
    assert "layout: folder of class folders (dicom 4, png 1)" in out
    assert "colour modes: DICOM grey: 4, L: 1" in out
    assert "DICOM photometric interpretations: MONOCHROME2: 4" in out
    assert "DICOM bits stored: 8: 2, 12: 2" in out
    assert "DICOM transfer syntaxes: Explicit VR Little Endian: 4" in out
    # one PNG among them: the headers' patient ids are not used, and the report says why
    assert ("local split: by image, at random (val-fraction 0.1): images of one patient may land on both sides; the "
            "DICOM headers name patients, but not every image is a DICOM file with a PatientID") in out
    assert "28x28: 5" in out
    (root / "pneumonia" / "d.png").unlink()
    rc, out = _check(root)
    assert rc == 0 and "local split: by patient (the DICOM headers' PatientID: 3 patients)" in out, out


def test_dicom_problems_are_each_named_with_the_file(tmp_path):
    """No pixel data, YBR_ICT on uncompressed data, HSV and 32 bits stored: read_dicom's reason, with the file."""
    root = _good(tmp_path / "h")
    folder = root / "pneumonia"

    ds = pydicom.dcmread(_dicom(folder / "nopixels.dcm", 20))
    del ds.PixelData
    ds.save_as(folder / "nopixels.dcm")
    for name, photometric in (("ict.dcm", "YBR_ICT"), ("hsv.dcm", "HSV")):
        ds = pydicom.dcmread(_dicom(folder / name, 21))
        ds.PhotometricInterpretation = photometric
        ds.save_as(folder / name)
    ds = pydicom.dcmread(_dicom(folder / "deep.dcm", 22))
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31
    ds.PixelData = np.arange(28 * 28, dtype="<u4").tobytes()
    ds["PixelData"].VR = "OW"
    ds.save_as(folder / "deep.dcm")
    _dicom(root / "normal" / "export.png", 23)  # a DICOM file named as a PNG: the ClientApp opens it with PIL

    rc, out = _check(root)
    assert rc == 1
    assert "PROBLEM: 1 DICOM file(s) cannot be used: no pixel data (no (7FE0,0010) Pixel Data element" in out
    assert "expected an image: pneumonia/nopixels.dcm" in out
    assert "1 DICOM file(s) cannot be used: photometric interpretation 'YBR_ICT'; supported: MONOCHROME1" in out
    assert "PALETTE COLOR: pneumonia/ict.dcm" in out
    assert "photometric interpretation 'HSV'" in out and "pneumonia/hsv.dcm" in out
    assert "32-bit pixels (Bits Stored 32); the federation reads up to 16 bits: pneumonia/deep.dcm" in out
    assert "1 unreadable image(s) in 'normal': normal/export.png (not a readable image (UnidentifiedImageError" in out
    assert "it is a DICOM file named .png: rename it to .dcm" in out
    assert "NOT READY: 5 problem(s)" in out
    # the headers of every DICOM file, readable or not
    assert "YBR_ICT: 1" in out and "HSV: 1" in out and "MONOCHROME2: 2" in out
    assert "32: 1" in out
    # the table counts them as unreadable in their folder; the three PNGs are still there
    report = check_path(root, PNEUMONIA)
    row = next(r for r in report.rows if r.name == "pneumonia")
    assert (row.images, row.unreadable) == (3, 4)


def test_dicom_with_a_compressed_syntax_and_no_decoder_is_named(tmp_path, monkeypatch):
    """RLE Lossless pixel data on a machine without an RLE plugin: the syntax and the install hint are named."""
    from pydicom.pixels import get_decoder

    root = _good(tmp_path / "h")
    path = _dicom(root / "normal" / "rle.dcm", 30)
    ds = pydicom.dcmread(path)
    ds.compress(RLELossless)
    ds.save_as(path)
    assert check_path(root, PNEUMONIA).ok  # pydicom decodes RLE itself
    monkeypatch.setattr(get_decoder(RLELossless), "_available", {})  # as with no plugin installed
    report = check_path(root, PNEUMONIA)
    [problem] = report.problems
    assert "pixel data compressed in transfer syntax RLE Lossless (1.2.840.10008.1.2.5)" in problem
    assert "pip install 'hospitrust[dicom]'" in problem and problem.endswith(": normal/rle.dcm")
    assert report.dicom_syntaxes["RLE Lossless"] == 1


def test_multi_frame_dicom_needs_the_task_dicom_frame(tmp_path):
    """A multi-frame file is refused without dicom-frame, accepted with a task file that sets dicom-frame = 0."""
    root = tmp_path / "h"
    for k, name in enumerate(("a", "b")):
        path = _dicom(root / name / "series.dcm", 50 + k)
        ds = pydicom.dcmread(path)
        ds.set_pixel_data(np.stack([_pixels(value=60 * k + f) for f in range(3)]), "MONOCHROME2", 8)
        ds.save_as(path)
    rc, out = _check(root, "--classes", "a,b")
    assert rc == 1
    assert "2 DICOM file(s) cannot be used: multi-frame (3 frames); set the task's dicom-frame to choose one (0 to 2): " \
           "a/series.dcm, b/series.dcm" in out
    task_file = tmp_path / "task.toml"
    task_file.write_text('classes = ["a", "b"]\ndicom-frame = 0\n')
    rc, out = _check(root, "--task", str(task_file))
    assert rc == 0, out
    assert f"task: task ({task_file.resolve()}): 2 classes (0=a, 1=b)" in out and "dicom-frame 0" in out
    # the same with a Task built in code; a frame out of range is named
    task = Task(name="t", class_names=("a", "b"), channels=1, image_size=28, model="small-cnn", dicom_frame=5)
    report = check_path(root, task)
    assert "dicom-frame 5 is out of range; the file has 3 frame(s), 0 to 2" in report.problems[0]


# --- CSV manifests -----------------------------------------------------------------------------


def test_manifest_names_the_missing_file_and_the_bad_label_rows(tmp_path):
    """Rows whose file is missing or whose label is not a class are named by row; the other rows are checked."""
    _png(tmp_path / "img" / "a.png", value=1)
    _png(tmp_path / "img" / "b.png", value=2)
    _png(tmp_path / "img" / "c.png", value=3)
    (tmp_path / "img" / "broken.png").write_bytes(b"nope")
    csv = _manifest(tmp_path / "m.csv", "path,label", ["img/a.png,normal", "img/b.png,1", "img/gone.png,normal",
                                                      "img/c.png,covid", "img/broken.png,pneumonia"])
    rc, out = _check(csv)
    assert rc == 1
    assert "layout: CSV manifest (png 3)" in out
    assert "manifest m.csv: 1 file(s) not found: row 4: img/gone.png" in out
    assert "manifest m.csv: 1 label(s) outside the task's classes (0=normal, 1=pneumonia): row 5: 'covid'" in out
    assert "1 unreadable image(s) of class 1=pneumonia: img/broken.png" in out
    assert "NOT READY: 3 problem(s)" in out
    report = check_path(csv, PNEUMONIA)
    assert report.class_counts == {"normal": 1, "pneumonia": 1}


def test_manifest_with_a_patient_on_both_sides_of_the_split(tmp_path):
    """A given split with a patient in train and val leaks: the patient is named with its counts."""
    for i in range(5):
        _png(tmp_path / f"{i}.png", value=10 * i)
    rows = ["0.png,normal,p1,train", "1.png,pneumonia,p1,val", "2.png,normal,p2,train", "3.png,pneumonia,p3,val",
            "4.png,normal,p4,train"]
    csv = _manifest(tmp_path / "m.csv", "path,label,patient_id,split", rows)
    report = check_path(csv, PNEUMONIA)
    assert report.problems == ["1 patient(s) have images on both sides of the split (train and val), so local "
                               "validation sees patients it trained on: p1 (1 train, 1 val)"]
    assert report.split_given and report.patients == 4
    assert report.split_counts == {"train": {"normal": 3, "pneumonia": 0}, "val": {"normal": 0, "pneumonia": 2}}
    text = report.format()
    assert "class        images  unreadable  train  val  patients  not-square  too-small" in text
    assert "patients: 4" in text and "local split: the split column (train / val) as given" in text
    # the leak fixed: ready
    csv.write_text(csv.read_text().replace("1.png,pneumonia,p1,val", "1.png,pneumonia,p5,val"))
    assert check_path(csv, PNEUMONIA).ok


def test_manifest_split_and_patient_ids_on_some_rows_only_and_bad_split_values(tmp_path):
    """Split values or patient ids on some rows only are problems (the ClientApp refuses them); so is 'test'."""
    for i in range(4):
        _png(tmp_path / f"{i}.png", value=10 * i)
    csv = _manifest(tmp_path / "m.csv", "path,label,patient_id,split",
                    ["0.png,normal,p1,train", "1.png,pneumonia,,val", "2.png,normal,p2,", "3.png,pneumonia,p3,test"])
    report = check_path(csv, PNEUMONIA)
    text = "\n".join(report.problems)
    assert "1 split value(s) not 'train' or 'val': row 5: 'test'" in text
    assert "patient_id is set for 2 of 3 images only" in text and "without one: 1.png" in text
    assert "the split column is set for 2 of 3 images only (the ClientApp refuses this)" in text and "without one: 2.png" in text


def test_manifest_with_patients_and_no_split_is_split_by_patient(tmp_path):
    """Patient ids without a split column: ready, and the report says the ClientApp splits by patient."""
    for i in range(4):
        _png(tmp_path / "x" / f"{i}.dcm.png", value=10 * i)
    csv = _manifest(tmp_path / "m.csv", "path,label,patient_id",
                    ["x/0.dcm.png,0,p1", "x/1.dcm.png,1,p1", "x/2.dcm.png,0,p2", f"{tmp_path / 'x' / '3.dcm.png'},1,p3"])
    rc, out = _check(csv)
    assert rc == 0, out
    assert "the ClientApp splits by patient" in out and "no patient lands on both sides" in out
    assert "patients: 3" in out


def test_manifest_without_a_path_column_is_one_problem_and_a_byte_order_mark_is_fine(tmp_path):
    """A manifest the ClientApp cannot read at all is one problem; Excel's 'CSV UTF-8' byte-order mark is read."""
    _png(tmp_path / "a.png", value=10)
    _png(tmp_path / "b.png", value=200)
    csv = tmp_path / "m.csv"
    csv.write_bytes(b"\xef\xbb\xbfpath,label\na.png,normal\nb.png,pneumonia\n")
    rc, out = _check(csv)
    assert rc == 0, out
    csv.write_bytes(b"file,label\na.png,normal\n")
    rc, out = _check(csv)
    assert rc == 1 and "no 'path' column" in out


# --- .npz archives -----------------------------------------------------------------------------


def _npz(path: Path, n: int = 6, **arrays: object) -> Path:
    images = np.stack([_pixels(value=17 * i) for i in range(n)])
    labels = np.arange(n) % 2
    np.savez(path, **{"images": images, "labels": labels, **arrays})
    return path


def test_npz_archive_good_with_patients_and_split(tmp_path):
    """A good archive: counts per class and split, patients, sizes; ready."""
    path = _npz(tmp_path / "d.npz", patient_ids=np.array(["p1", "p1", "p2", "p2", "p3", "p3"]),
                split=np.array(["train"] * 4 + ["val"] * 2))
    rc, out = _check(path)
    assert rc == 0, out
    assert "layout: .npz archive (arrays 6)" in out
    assert "28x28: 6" in out and "colour modes: grey: 6" in out and "patients: 3" in out
    report = check_path(path, PNEUMONIA)
    assert report.class_counts == {"normal": 3, "pneumonia": 3}
    assert report.split_counts["val"] == {"normal": 1, "pneumonia": 1}


def test_npz_archive_with_labels_outside_the_task_and_a_repeated_image(tmp_path):
    """Labels outside the task are named by image index; the same image under two labels is a problem."""
    images = np.stack([_pixels(value=17 * i) for i in range(5)])
    images[4] = images[0]
    np.savez(tmp_path / "d.npz", images=images, labels=np.array([0, 1, 5, -1, 1]),
             patient_ids=np.array(["p1", "p2", "p3"]))
    rc, out = _check(tmp_path / "d.npz")
    assert rc == 1
    assert "2 label(s) outside the task's classes (0=normal, 1=pneumonia): image 2: 5, image 3: -1" in out
    assert "'patient_ids' has 3 entries for 5 images" in out
    assert "image(s) appear under two or more classes (the same image array" in out
    assert "image 0 (normal) = image 4 (pneumonia)" in out


def test_npz_archive_that_is_not_one(tmp_path):
    """Wrong arrays or dtype are one problem each, not an exception."""
    np.savez(tmp_path / "a.npz", pixels=np.zeros((2, 28, 28), np.uint8), labels=np.zeros(2))
    rc, out = _check(tmp_path / "a.npz")
    assert rc == 1 and "no 'images' array (arrays: ['labels', 'pixels'])" in out
    np.savez(tmp_path / "b.npz", images=np.zeros((2, 28, 28), np.float32), labels=np.zeros(2))
    rc, out = _check(tmp_path / "b.npz")
    assert rc == 1 and "images must be uint8 (N, H, W[, C])" in out and "float32" in out
    np.savez(tmp_path / "s.npz", images=np.zeros((2, 28, 28), np.uint8), labels=np.array(["normal", "1"]))
    rc, out = _check(tmp_path / "s.npz")
    assert rc == 1 and "1 label(s) are not class indices" in out and "image 0: 'normal'" in out
    (tmp_path / "c.npz").write_bytes(b"not a zip")
    rc, out = _check(tmp_path / "c.npz")
    assert rc == 1 and "not a readable .npz archive" in out


# --- the task on the command line ----------------------------------------------------------------


def test_custom_task_by_classes_and_by_task_file(tmp_path):
    """--classes and --task FILE define the task the folders are checked against."""
    root = _good(tmp_path / "h", classes=("cat", "dog"))
    rc, out = _check(root)
    assert rc == 1 and "unknown class folder 'cat'" in out and "missing class 0=normal" in out
    rc, out = _check(root, "--classes", "cat,dog")
    assert rc == 0, out
    assert "2 classes (0=cat, 1=dog)" in out
    task_file = tmp_path / "pets.toml"
    task_file.write_text('[task]\nname = "pets"\nclasses = ["cat", "dog", "bird"]\nchannels = 3\n')
    rc, out = _check(root, "--task", str(task_file), "--image-size", "32")
    assert rc == 1
    assert "task: pets" in out and "3 classes (0=cat, 1=dog, 2=bird), image size 32x32, 3 channels (RGB)" in out
    assert "missing class 2=bird" in out and "smaller than the federation's image-size 32" in out


def test_bad_task_option_is_one_line_and_exit_2(tmp_path):
    """A task option that is wrong is not a data problem: one line on stderr, exit 2."""
    root = _good(tmp_path / "h")
    rc, out, err = _cli("data", "check", str(root), "--classes", "only-one")
    assert rc == 2 and out == ""
    assert err.strip() == "hospitrust data check: task.classes 'only-one': a classifier needs at least two classes"
    rc, out, err = _cli("data", "check", str(root), "--image-size", "3")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "image-size 3" in err


def test_main_and_format_choice(tmp_path):
    """main() prints the report to the given stream; --format names the layout instead of detecting it."""
    root = _good(tmp_path / "h")
    buf = io.StringIO()
    assert main(root, PNEUMONIA, "folder", False, out=buf) == 0
    assert buf.getvalue().rstrip().endswith("OK: ready to join the federation")
    rc, out = _check(root, "--format", "npz")
    assert rc == 1 and "archive" in out and "not found (it is a folder)" in out

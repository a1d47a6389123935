"""`hospitrust data check`: a hospital's class-per-folder images against the federation's classes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hospitrust.ops.cli import main as cli_main
from hospitrust.ops.data_check import check_folder


def _png(path: Path, size=(28, 28), value: int = 128) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0]), value, dtype=np.uint8)).save(path)


def _good(root: Path, per_class: int = 3, classes=("normal", "pneumonia")) -> Path:
    for name in classes:
        for i in range(per_class):
            _png(root / name / f"{i}.png", value=40 * i)
    return root


def _check(root: Path, *extra: str) -> tuple[int, str]:
    import contextlib

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(["data", "check", str(root), *extra])
    return rc, buf.getvalue()


def test_good_folder_passes(tmp_path):
    rc, out = _check(_good(tmp_path / "h"))
    assert rc == 0, out
    assert "OK: ready to join the federation" in out
    assert "28x28: 6" in out
    assert "normal" in out and "pneumonia" in out


def test_folders_named_by_index_pass(tmp_path):
    rc, out = _check(_good(tmp_path / "h", classes=("0", "1")))
    assert rc == 0, out


def test_missing_class_fails(tmp_path):
    root = _good(tmp_path / "h", classes=("normal",))
    rc, out = _check(root)
    assert rc == 1
    assert "missing class 1=pneumonia" in out


def test_unknown_class_folder_fails(tmp_path):
    root = _good(tmp_path / "h")
    _png(root / "covid" / "0.png")
    rc, out = _check(root)
    assert rc == 1
    assert "unknown class folder 'covid'" in out


def test_unreadable_image_fails_and_is_named(tmp_path):
    root = _good(tmp_path / "h")
    (root / "pneumonia" / "x.png").write_bytes(b"this is not a png \x00\x01\x02" * 10)
    rc, out = _check(root)
    assert rc == 1
    assert "unreadable" in out and "pneumonia/x.png" in out


def test_empty_class_fails(tmp_path):
    root = _good(tmp_path / "h", classes=("normal",))
    (root / "pneumonia").mkdir()
    (root / "pneumonia" / "notes.txt").write_text("no images here")
    rc, out = _check(root)
    assert rc == 1
    assert "empty class: folder 'pneumonia'" in out
    assert "missing class" not in out


def test_odd_sizes_are_flagged_with_the_size_distribution(tmp_path):
    root = _good(tmp_path / "h")
    _png(root / "normal" / "wide.png", size=(64, 32))
    _png(root / "normal" / "tiny.png", size=(16, 16))
    report = check_folder(root, "pneumoniamnist", 28)
    assert not report.ok
    text = report.format()
    assert "not square" in text and "wide.png (64x32)" in text
    assert "smaller than the federation's image-size 28" in text and "tiny.png (16x16)" in text
    assert "64x32: 1" in text and "16x16: 1" in text and "28x28: 6" in text
    # an operator may accept them (the ClientApp resizes): warnings, exit 0
    rc, out = _check(root, "--allow-odd-sizes")
    assert rc == 0, out
    assert "WARNING" in out


def test_bigger_federation_image_size_flags_small_images(tmp_path):
    rc, out = _check(_good(tmp_path / "h"), "--image-size", "64")
    assert rc == 1
    assert "smaller than the federation's image-size 64" in out


def test_not_a_folder(tmp_path):
    rc, out = _check(tmp_path / "nope")
    assert rc == 1
    assert "is not a folder" in out


@pytest.mark.parametrize("dataset", ["retinamnist"])
def test_other_dataset_classes(tmp_path, dataset):
    from hospitrust.datasets.registry import dataset_info

    info = dataset_info(dataset)
    root = _good(tmp_path / "h", classes=tuple(str(i) for i in range(info.num_classes)))
    report = check_folder(root, dataset, 28)
    assert report.ok, report.format()

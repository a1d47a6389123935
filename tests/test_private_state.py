"""A hospital's local state is its own: the decode cache (patient ids included) and the privacy
ledger are 0600 files in 0700 folders whatever the umask; ``hospitrust data check`` writes no
cache unless asked; ``skip-unreadable`` skips a few unreadable files, and not one more.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hospitrust.config import parse_run_config
from hospitrust.datasets.dicom import write_dicom
from hospitrust.datasets.local import HospitalDataError, data_card, load_local, split_local
from hospitrust.cli.main import main as cli_main
from hospitrust.datacheck.check import check_path
from hospitrust.privacy.ledger import PrivacyLedger, content_hash
from hospitrust.privacy.local import PrivacyEvent
from hospitrust.tasks.task import resolve_task

CLASSES = ("healthy", "lesion")
TASK = resolve_task(parse_run_config({"task.classes": ",".join(CLASSES), "strategy": "fedavg"}))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _folder(root: Path, n: int, dicom: bool = False) -> Path:
    """``n`` distinct 28x28 images in class folders (DICOM with patient ids, or PNG)."""
    for c in CLASSES:
        (root / c).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    for i in range(n):
        pixels = rng.integers(0, 256, (28, 28)).astype(np.uint8)  # noise: a cut file cannot decode
        if dicom:
            write_dicom(root / CLASSES[i % 2] / f"{i:03d}.dcm", pixels, patient_id=f"PID-{i // 2:04d}")
        else:
            Image.fromarray(pixels).save(root / CLASSES[i % 2] / f"{i:03d}.png")
    return root


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[:300])
    return path


def _tree_modes(top: Path) -> dict[str, int]:
    return {str(p.relative_to(top)): _mode(p) for p in [top, *top.rglob("*")]}


def test_cache_and_ledger_are_0600_files_in_0700_folders_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HOSPITRUST_CACHE_DIR", raising=False)
    monkeypatch.delenv("HOSPITRUST_PRIVACY_LEDGER", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / "share"))
    data = _folder(tmp_path / "pacs", 8, dicom=True)
    with _umask(0):  # the most permissive umask: the modes must not come from it
        loaded = load_local(data, "auto", TASK, tmp_path / "new" / "cache")
        assert set(loaded.patients.tolist()) == {f"PID-{i:04d}" for i in range(4)}  # the file that holds patient ids
        modes = _tree_modes(tmp_path / "new")
        assert {m for name, m in modes.items() if (tmp_path / "new" / name).is_dir()} == {0o700}, modes
        files = {name: m for name, m in modes.items() if (tmp_path / "new" / name).is_file()}
        assert {Path(n).name for n in files} >= {"images.npy", "patients.npy", "meta.json", "complete"}
        assert set(files.values()) == {0o600}, files

        # an entry written before caches were private (0755 / 0644) is tightened when it is read
        entry = loaded.cache
        assert entry is not None
        os.chmod(entry, 0o755)
        for f in entry.iterdir():
            os.chmod(f, 0o644)
        again = load_local(data, "auto", TASK, tmp_path / "new" / "cache")
        assert not again.decoded and _mode(entry) == 0o700 and {_mode(f) for f in entry.iterdir()} == {0o600}

        # the default cache folder is hospitrust's own: made 0700, and tightened if it was not; the home
        # folder and ~/.cache above it are the user's and keep their modes
        home_cache = tmp_path / "home" / ".cache"
        (home_cache / "hospitrust" / "images").mkdir(parents=True)
        for folder in (tmp_path / "home", home_cache, home_cache / "hospitrust", home_cache / "hospitrust" / "images"):
            os.chmod(folder, 0o755)
        load_local(data, "auto", TASK)
        assert _mode(home_cache / "hospitrust" / "images") == 0o700
        assert _mode(tmp_path / "home") == 0o755 and _mode(home_cache) == 0o755

        # the ledger: a chosen path's new folder 0700, the ledger and its lock 0600
        ledger = PrivacyLedger(tmp_path / "keep" / "ledger.json")
        ledger.record("k" * 64, PrivacyEvent(1.1, 0.1, 10), hospital="h", delta=1e-5, server_round=1)
        assert _mode(tmp_path / "keep") == 0o700
        assert _mode(tmp_path / "keep" / "ledger.json") == 0o600 and _mode(tmp_path / "keep" / "ledger.json.lock") == 0o600
        # the default ledger folder (~/.local/share/hospitrust here under XDG_DATA_HOME) is tightened; its parent is not
        own = tmp_path / "home" / "share" / "hospitrust"
        own.mkdir(parents=True)
        os.chmod(own, 0o755)
        os.chmod(own.parent, 0o755)
        default = PrivacyLedger(own / "privacy-ledger.json")
        default.record("k" * 64, PrivacyEvent(1.1, 0.1, 10), hospital="h", delta=1e-5, server_round=1)
        assert _mode(own) == 0o700 and _mode(own.parent) == 0o755 and _mode(own / "privacy-ledger.json") == 0o600


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(list(args))
    return rc, out.getvalue(), err.getvalue()


def test_data_check_writes_no_cache_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HOSPITRUST_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOSPITRUST_PRIVACY_LEDGER", str(tmp_path / "ledger.json"))
    data = _folder(tmp_path / "site", 6)
    task = ["--classes", ",".join(CLASSES)]
    rc, out, err = _cli("data", "check", str(data), *task)
    assert rc == 0, out + err
    assert "privacy budget: nothing spent on this data yet" in out and "decoded image cache" not in out
    rc, out, err = _cli("data", "check", str(data), *task, "--cache-dir", str(tmp_path / "cache"))
    assert rc == 0, out + err
    # nothing written: no cache (default or given), no ledger
    assert not (tmp_path / "home").exists() and not (tmp_path / "cache").exists()
    assert not (tmp_path / "ledger.json").exists()

    rc, out, err = _cli("data", "check", str(data), *task, "--cache-dir", str(tmp_path / "cache"), "--warm-cache")
    assert rc == 0, out + err
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and f"decoded image cache: {entries[0]} (6 images, decoded now" in out
    assert _mode(tmp_path / "cache") == 0o700 and _mode(entries[0]) == 0o700
    # the ClientApp then reads it without decoding, and keys its privacy ledger as the check did without a cache
    cached = load_local(data, "auto", TASK, tmp_path / "cache")
    in_memory = load_local(data, "auto", TASK, tmp_path / "other", write_cache=False)
    assert not cached.decoded and in_memory.cache is None and not (tmp_path / "other").exists()
    assert content_hash(in_memory.images, in_memory.labels, in_memory.digests) == \
        content_hash(cached.images, cached.labels, cached.digests)


def test_skip_unreadable_skips_up_to_its_share_and_refuses_above_it(tmp_path):
    data = _folder(tmp_path / "site", 20)
    bad = _truncate(data / "lesion" / "005.png")  # the 3rd file of 10 in lesion/; 20 listed files in all
    cache = tmp_path / "cache"
    with pytest.raises(HospitalDataError) as err:  # default 0: one unreadable file leaves the hospital out
        load_local(data, "auto", TASK, cache)
    assert str(err.value) == ("1 of 20 images cannot be used: not a readable image (file 3 in the folder of class "
                              "'lesion'); hospitrust data check on the hospital's machine names the files")
    assert str(bad) in err.value.detail and not cache.exists()

    loaded = load_local(data, "auto", TASK, cache, skip_unreadable=0.05)  # 5 % of 20: 1 file may be skipped
    assert len(loaded) == 19 and loaded.skipped == 1
    train, val = split_local(loaded, 0.2, seed=0)
    assert data_card(loaded, train, val, 2)["skipped-files"] == 1
    # the cache remembers the unreadable file: another share decides again, without decoding
    with pytest.raises(HospitalDataError, match="1 of 20 images cannot be used"):
        load_local(data, "auto", TASK, cache)
    with pytest.raises(HospitalDataError) as err:
        load_local(data, "auto", TASK, cache, skip_unreadable=0.04)
    assert "(skip-unreadable = 0.04 allows 0)" in str(err.value)

    _truncate(data / "healthy" / "000.png")  # a second one: 2 of 20 is more than 5 %
    with pytest.raises(HospitalDataError) as err:
        load_local(data, "auto", TASK, cache, skip_unreadable=0.05)
    assert str(err.value).startswith("2 of 20 images cannot be used (skip-unreadable = 0.05 allows 1): not a readable "
                                     "image (file 1 in the folder of class 'healthy'; file 3 in the folder of class "
                                     "'lesion')"), str(err.value)
    assert load_local(data, "auto", TASK, cache, skip_unreadable=0.1).skipped == 2

    # the data check says the same on the hospital's terminal, with the names
    report = check_path(data, TASK, skip_unreadable=0.1)
    assert report.ok and any("lesion/005.png" in w and "the ClientApp skips them" in w for w in report.warnings)
    report = check_path(data, TASK, skip_unreadable=0.05)
    assert not report.ok and "2 of 20 files cannot be used: more than skip-unreadable 0.05 allows (1)" in report.problems


def test_skip_unreadable_covers_a_manifest_row_whose_file_is_missing(tmp_path):
    data = _folder(tmp_path / "site", 10)
    rows = [f"{c}/{p.name},{c}" for c in CLASSES for p in sorted((data / c).iterdir())]
    manifest = tmp_path / "site" / "list.csv"
    manifest.write_text("\n".join(["path,label", *rows, "lesion/gone.png,lesion"]) + "\n")  # row 12: missing
    with pytest.raises(HospitalDataError) as err:
        load_local(manifest, "auto", TASK, tmp_path / "cache")
    assert str(err.value).startswith("1 of 11 images cannot be used: file not found (row 12 of the manifest)")
    loaded = load_local(manifest, "auto", TASK, tmp_path / "cache", skip_unreadable=0.1)
    assert len(loaded) == 10 and loaded.skipped == 1
    rc, out, _ = _cli("data", "check", str(manifest), "--classes", ",".join(CLASSES), "--skip-unreadable", "0.1",
                      "--privacy-ledger", str(tmp_path / "l.json"))
    assert rc == 0 and "manifest list.csv: 1 file(s) not found: row 12: lesion/gone.png" in out, out


def test_the_data_clis_formats_are_the_readers():
    """The CLI repeats the formats so that building its parser imports no numpy."""
    import subprocess
    import sys

    from hospitrust.datasets.local import FORMATS
    from hospitrust.cli import data as data_cli

    assert data_cli.FORMATS == FORMATS
    code = ("import sys, argparse; from hospitrust.cli.data import add_data_parser; "
            "add_data_parser(argparse.ArgumentParser().add_subparsers()); print('numpy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"

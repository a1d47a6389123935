"""A fresh clone without the MedMNIST files and without network: the first failure says what is missing.

The suite runs in a subprocess with ``$HOSPITRUST_DATA_DIR`` unset and an empty home, its downloads sent to a
closed local port so that they fail at once, as they do without network. A data
test (the ``data_dir`` fixture) and a test on the deployed federation (the ``federation`` fixture) must each fail
with the same one line naming the files, the folder, ``$HOSPITRUST_DATA_DIR`` and ``~/.medmnist``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from conftest import REPO

SELECTED = ["test_control_plane.py::test_a_stranger_with_only_ca_crt_can_neither_register_nor_run_nor_read",
            "test_presets.py::test_a_preset_with_an_override_in_a_real_inprocess_run"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_the_files_each_data_fixture_fails_with_one_line_naming_what_is_missing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("HOSPITRUST_DATA_DIR", "HOSPITRUST_DATA_DIR_GIVEN")}
    env.update(HOME=str(home), https_proxy=proxy, http_proxy=proxy, HTTPS_PROXY=proxy, HTTP_PROXY=proxy,
               no_proxy="", NO_PROXY="", PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                          "--basetemp", str(tmp_path / "t"), *SELECTED],
                         cwd=REPO / "tests", env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("MedMNIST files missing")]
    assert len(lines) == 2 and lines[0] == lines[1], out[-3000:]  # the federation's fixture and a data test alike
    line = lines[0]
    assert "pneumoniamnist.npz, retinamnist.npz" in line and f"not in {home / '.medmnist'} " in line
    assert "$HOSPITRUST_DATA_DIR" in line and "~/.medmnist" in line
    assert "Traceback" not in out and "2 errors" in out, out[-3000:]


def test_the_line_says_where_the_folder_came_from(monkeypatch):
    from conftest import missing_data_line

    monkeypatch.setenv("HOSPITRUST_DATA_DIR_GIVEN", "1")
    assert "($HOSPITRUST_DATA_DIR)" in missing_data_line(["pneumoniamnist.npz"])
    monkeypatch.setenv("HOSPITRUST_DATA_DIR_GIVEN", "0")
    assert "(the default ~/.medmnist, as $HOSPITRUST_DATA_DIR is unset)" in missing_data_line(["pneumoniamnist.npz"])

"""`hospitrust doctor` and the torch/torchvision check before simulate, bench and the ResNet models.

A mismatched pair (one CPU build, one CUDA build of the same version) cannot be installed here, so
the tests break the pair the way it breaks for real: torchvision's compiled operators missing from
``torch.ops`` (the lookup raises), or ``import torchvision`` failing (as it does in
``_meta_registrations`` with ``operator torchvision::nms does not exist``).
"""

from __future__ import annotations

import sys

import pytest
import torch

from hospitrust import envcheck
from hospitrust.cli import main as cli
from hospitrust.ops import flwr


class _NoTorchvisionOps:
    def __getattr__(self, name):
        raise RuntimeError(f"operator torchvision::{name} does not exist")


@pytest.fixture
def mismatched_pair(monkeypatch):
    """torch without torchvision's operators, as a torchvision of another build leaves it."""
    monkeypatch.setattr(torch.ops, "torchvision", _NoTorchvisionOps())


@pytest.fixture
def no_flower(monkeypatch):
    """Any Flower process started fails the test (simulate checks the pair after the run config, before Flower)."""
    def refuse(*args, **kwargs):
        raise AssertionError("Flower was started despite the broken torch/torchvision pair")

    monkeypatch.setattr(flwr, "start", refuse)


def test_the_installed_pair_loads_together():
    assert envcheck.torch_pair_problem() is None
    check = envcheck.check_torch()
    assert check.ok and torch.__version__ in check.detail


def test_doctor_names_a_mismatched_pair_in_one_line_and_exits_1(mismatched_pair, capsys):
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    bad = [line for line in out if line.startswith("PROBLEM")]
    assert len(bad) == 1, out
    assert "torch + torchvision" in bad[0] and "operator torchvision::nms does not exist" in bad[0]
    assert "same index" in bad[0] and "--index-url" in bad[0]


def test_a_torchvision_that_does_not_import_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision -> ImportError
    problem = envcheck.torch_pair_problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith("torchvision does not load with torch") and "same index" in problem


def test_simulate_stops_with_one_line_before_flower_starts(mismatched_pair, no_flower, capsys):
    assert cli.main(["simulate", "-c", "model=resnet18"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hospitrust simulate: torchvision") and "same index" in err[0]


def test_bench_stops_with_one_line_before_a_cell_starts(mismatched_pair, no_flower, monkeypatch, capsys, tmp_path):
    import hospitrust.bench.runner as runner

    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: pytest.fail("a cell ran"))
    assert cli.main(["bench", str(cli_repo() / "benchmarks" / "smoke.toml"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hospitrust bench: torchvision")


def test_the_resnet_refuses_to_build_on_a_mismatched_pair(mismatched_pair):
    from hospitrust.models import build_model

    with pytest.raises(envcheck.EnvironmentProblem, match="does not fit torch"):
        build_model("resnet18", 1, 2, 28)
    build_model("small-cnn", 1, 2, 28)  # the small CNN needs no torchvision operator


def test_a_flower_of_another_series_is_named(monkeypatch):
    monkeypatch.setattr(envcheck.metadata, "version", lambda name: "1.21.0")
    check = envcheck.check_flower()
    assert not check.ok and "flwr 1.21.0" in check.detail and "==1.42.*" in check.detail


def test_the_data_check_lists_the_files_where_the_product_looks(monkeypatch, tmp_path):
    monkeypatch.setenv("HOSPITRUST_DATA_DIR", str(tmp_path))
    empty = envcheck.check_data()
    assert not empty.ok and not empty.required and str(tmp_path) in empty.detail
    (tmp_path / "retinamnist.npz").write_bytes(b"")
    found = envcheck.check_data()
    assert found.ok and "retinamnist.npz" in found.detail and "$HOSPITRUST_DATA_DIR" in found.detail
    monkeypatch.delenv("HOSPITRUST_DATA_DIR")
    from hospitrust.datasets.base import default_root

    assert envcheck.data_folder()[0] == default_root().expanduser().resolve()


def test_the_browser_check_says_how_to_install_chromium(monkeypatch, tmp_path):
    monkeypatch.setenv("HOSPITRUST_CHROMIUM", str(tmp_path / "no-chromium"))
    check = envcheck.check_browser()
    assert not check.ok and "apt-get install chromium chromium-driver" in check.detail


def cli_repo():
    from conftest import REPO

    return REPO

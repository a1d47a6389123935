"""Shared test setup: the offline MedMNIST folder, small run configs, the in-process Grid."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hospitrust.ops import flwr


def pytest_sessionstart(session):
    # a test run stopped with SIGTERM stops every Flower process it started (Ctrl-C: the
    # tests' own teardown and the exit handler do it)
    flwr.stop_on_signals()


def pytest_sessionfinish(session, exitstatus):
    flwr.stop_all()

REPO = Path(__file__).resolve().parent.parent
_default_data = REPO.parent / "shared" / "data" / "medmnist"
if not os.environ.get("HOSPITRUST_DATA_DIR") and _default_data.is_dir():
    os.environ["HOSPITRUST_DATA_DIR"] = str(_default_data)
DATA_DIR = Path(os.environ.get("HOSPITRUST_DATA_DIR", _default_data))


def small_run_config(tmp_path: Path, **overrides) -> dict:
    """A complete, quick run config (kebab-case, as Flower passes it)."""
    from hospitrust.config import RunConfig

    cfg = RunConfig().to_flat()
    cfg.update(
        {
            "num-server-rounds": 2,
            "train-subsample": 0.05,
            "local-epochs": 1,
            "batch-size": 64,
            "output-dir": str(tmp_path / "runs"),
            "run-name": "test-run",
            "data-dir": str(DATA_DIR),
            "reply-timeout": 60.0,
        }
    )
    cfg.update(overrides)
    return cfg


@pytest.fixture
def data_dir() -> Path:
    if not (DATA_DIR / "pneumoniamnist.npz").is_file():
        pytest.skip(f"MedMNIST files not found in {DATA_DIR}")
    return DATA_DIR

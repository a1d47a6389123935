"""Shared test setup: the MedMNIST files, small run configs, Flower processes stopped on exit.

The data tests (marker ``data``: every test that takes the ``data_dir`` fixture) read
PneumoniaMNIST and RetinaMNIST from ``$HOSPITRUST_DATA_DIR``; when it is unset, from the folder
``hospitrust simulate`` uses too (medmnist's default, ``~/.medmnist``), into which medmnist
downloads them on the first run. Where the files can be had neither way, each
data test fails with one line saying what is missing and how to provide it (never a skip);
``python -m pytest -m "not data"`` runs the rest.

With ``HOSPITRUST_TEST_WORKERS=2`` (default 1: one process) the whole suite (no test path named on the
command line) runs on that many pytest-xdist workers, one test module per unit of work: the real-process tests that share the deployed
federation (the modules in ``FEDERATION_MODULES``) are one unit, started first on one worker,
since they share one set of processes and mostly wait on Flower's polling; the other worker runs
the CPU-bound rest, and both share what is left. A file or test named on the command line runs in
one process, as do ``-n 0`` and ``-p no:xdist``; ``-n N`` distributes any selection module by module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hospitrust.ops import flwr

REPO = Path(__file__).resolve().parent.parent
DATA_FILES = ("pneumoniamnist", "retinamnist")  # the MedMNIST flags the tests use, at 28 x 28
# Workers for the whole suite. One by default: on a 2-core machine two workers were only about 8 % faster
# (CPU-bound: 1285 s for 1177 tests, 2026-12-02) and the federation's timing-sensitive tests then share
# the cores with CPU-heavy simulations; 2 gives the federation's tests one worker, the rest the other.
SUITE_WORKERS = int(os.environ.get("HOSPITRUST_TEST_WORKERS", "1"))
# the modules whose tests take the `federation` fixture (checked at collection): one unit of work under xdist
FEDERATION_MODULES = frozenset(f"tests/test_{name}.py" for name in
                               ("control_plane", "deploy", "hospital_control", "run_supervisor", "unattended"))


def _data_folder() -> Path:
    """Where the product looks when no data-dir is given: one default for the tests and simulate."""
    from hospitrust.envcheck import data_folder

    return data_folder()[0]


DATA_DIR = _data_folder()
os.environ["HOSPITRUST_DATA_DIR"] = str(DATA_DIR)  # what the product (and every process a test starts) reads


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite on ``SUITE_WORKERS`` workers, module by module (``--dist loadfile``) unless told otherwise."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if (config.option.numprocesses is None and whole_suite and SUITE_WORKERS > 1 and not config.option.collectonly
            and not config.option.usepdb):
        config.option.numprocesses = SUITE_WORKERS
        config.option.tx = ["popen"] * SUITE_WORKERS  # what xdist derives from -n, whichever hook runs first
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadfile"


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own (the first answer is taken)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (a test module is one unit of work, so its module-scoped fixtures, such as a
    real run its tests share, are built once), with the federation's modules together as one unit, sent
    out first as it is the longest.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndFederation(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "federation" if module in FEDERATION_MODULES else module

        def _assign_work_unit(self, node) -> None:
            if "federation" in self.workqueue:  # then the units with the most tests, as xdist orders them
                self.workqueue.move_to_end("federation", last=False)
            super()._assign_work_unit(node)

    return FilesAndFederation(config, log)


def pytest_sessionstart(session):
    # a test run stopped with SIGTERM stops every Flower process it started (Ctrl-C: the
    # tests' own teardown and the exit handler do it)
    flwr.stop_on_signals()


def pytest_sessionfinish(session, exitstatus):
    flwr.stop_all()


def pytest_collection_modifyitems(config, items):
    # the docs commands (marker docs, tests/test_docs_commands.py) run only when -m names them: .ci/run runs
    # them after the suite with `python -m pytest -q -m docs`
    if "docs" not in (config.getoption("markexpr") or ""):
        kept = [item for item in items if item.get_closest_marker("docs") is None]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("docs") is not None])
            items[:] = kept
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "_medmnist_problem" in fixtures:  # data_dir, or a fixture built on it
            item.add_marker(pytest.mark.data)
        if "browser" in fixtures:  # headless Chromium (tests/browser.py)
            item.add_marker(pytest.mark.browser)


def pytest_terminal_summary(terminalreporter):
    docs = sys.modules.get("test_docs_commands")
    if docs is None or not docs.RECORDS:
        return
    ran = [r for r in docs.RECORDS if r[1] == "ran"]
    exempt = [r for r in docs.RECORDS if r[1] == "exempt"]
    write = terminalreporter.write_line
    terminalreporter.section("docs commands")
    for where, _, seconds, text, _ in ran:
        write(f"ran     {seconds:6.1f} s  {where}  {' '.join(text.split())[:160]}")
    for where, _, _, text, reason in exempt:
        write(f"exempt  {where}  ({reason})  {' '.join(text.split())[:120]}")
    over = [r for r in ran if r[2] > 60]
    reasons = dict.fromkeys(r[4] for r in exempt)
    write(f"docs commands: {len(ran)} ran in {sum(r[2] for r in ran):.0f} s ({len(over)} of them over 60 s here), {len(exempt)} exempt"
          + (": " + ", ".join(f"{sum(1 for r in exempt if r[4] == why)} {why}" for why in reasons) if reasons else ""))

@pytest.fixture(scope="session")
def _medmnist_problem() -> str | None:
    """None when the files are there (downloaded now if needed), else the one-line reason."""
    from hospitrust.datasets.base import DataMissingError
    from hospitrust.datasets.medmnist_source import dataset_path

    missing = []
    for flag in DATA_FILES:
        try:
            dataset_path(flag, 28, DATA_DIR)
        except DataMissingError:
            missing.append(f"{flag}.npz")
    if not missing:
        return None
    return (f"MedMNIST files missing: {', '.join(missing)} not in {DATA_DIR} and not downloadable here; "
            f"set HOSPITRUST_DATA_DIR to a folder holding them, run once with network access, "
            f"or run the offline tests with -m 'not data'")


@pytest.fixture
def data_dir(_medmnist_problem) -> Path:
    """The folder with the MedMNIST files; a data test fails with one line when they cannot be had."""
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    return DATA_DIR


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


def pytest_runtest_setup(item):
    if "federation" in getattr(item, "fixturenames", ()) and item.nodeid.split("::", 1)[0] not in FEDERATION_MODULES:
        pytest.fail(f"{item.nodeid} takes the federation fixture: add its module to FEDERATION_MODULES in "
                    f"tests/conftest.py, so that xdist runs it on the federation's worker", pytrace=False)


@pytest.fixture(scope="session")
def federation(tmp_path_factory, _medmnist_problem):
    """The deployed federation the real-process tests share (tests/federation.py): started on first use."""
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    from federation import start_federation

    gen = start_federation(tmp_path_factory.mktemp("deploy"))
    yield next(gen)
    gen.close()

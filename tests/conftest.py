"""Shared test setup: the MedMNIST files, small run configs, Flower processes stopped on exit.

The data tests (marker ``data``: every test that takes the ``data_dir`` fixture) read
PneumoniaMNIST and RetinaMNIST from ``$HOSPITRUST_DATA_DIR``; when it is unset, from the folder
``hospitrust simulate`` uses too (medmnist's default, ``~/.medmnist``), into which medmnist
downloads them on the first run. Where the files can be had neither way, each
data test fails with one line saying what is missing and how to provide it (never a skip);
``python -m pytest -m "not data"`` runs the rest.

With ``HOSPITRUST_TEST_WORKERS`` workers (default 3; 1: one process) the whole suite (no test path named on the
command line) runs on that many pytest-xdist workers, one test module per unit of work: the real-process tests that share the deployed
federation (the modules in ``FEDERATION_MODULES``) are one unit, started first on one worker,
since they share one set of processes and mostly wait on Flower's polling; the other workers run
the CPU-bound rest, taking the CPU the federation leaves. A file or test named on the command line runs in
one process, as do ``-n 0`` and ``-p no:xdist``; ``-n N`` distributes any selection module by module.

The manual's commands (``-m docs``, tests/test_docs_commands.py) run on ``HOSPITRUST_DOCS_WORKERS`` workers
(default 2), page by page (``--dist loadscope`` with the pages whose servers take the same fixed port as one unit):
each page runs in its own temporary copy with its own free ports, and a page spends much of its time
waiting on process starts and Flower's polling, so two pages share two cores well.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from hospitrust.ops import flwr

REPO = Path(__file__).resolve().parent.parent
# the studies' own code (benchmarks/study: the leaderboard's tables and budget; not in the wheel), for their tests
STUDY = REPO / "benchmarks" / "study"
if str(STUDY) not in sys.path:
    sys.path.append(str(STUDY))
DATA_FILES = ("pneumoniamnist", "retinamnist")  # the MedMNIST flags the tests use, at 28 x 28
# Workers for the whole suite: three by default, the federation's tests (which mostly wait on Flower's polling) on
# one, the CPU-bound rest on the other two, which take the CPU the federation's waits leave. Idle on 2 cores
# (2026-12-07, docs/experiments/2026-12-07-suite-three-workers.md): 727 s on two workers (the suite's processes used
# 1.41 cores), 680-685 s on three in a working copy (1.52), 631-652 s on fresh clones. HOSPITRUST_TEST_WORKERS=2 runs it
# on two, HOSPITRUST_TEST_WORKERS=1 in one process.
SUITE_WORKERS = int(os.environ.get("HOSPITRUST_TEST_WORKERS", "3"))
# Workers for the manual's commands (-m docs): two pages at once (docs/experiments/2026-12-02-suite-time.md)
DOCS_WORKERS = int(os.environ.get("HOSPITRUST_DOCS_WORKERS", "2"))
DOCS_RECORDS: list[list] = []  # what the docs pages ran and left out, gathered from the reports (also a worker's)
# the modules whose tests take the `federation` fixture (checked at collection): one unit of work under xdist
FEDERATION_MODULES = frozenset(f"tests/test_{name}.py" for name in
                               ("control_plane", "deploy", "hospital_control", "run_supervisor", "unattended"))
# HOSPITRUST_FEDERATION_UNITS=2 splits them into two units of about equal time (suite of 2026-12-04: 500 s and
# 580 s), each starting its own federation on its own free ports on its own worker: run_supervisor stays with
# deploy, whose first run's model is its reference. Default 1: one federation for all of them (two on 3 workers were
# slower on 2 cores, 1,334 s against 1,161: docs/experiments/2026-12-04-suite-federation-units.md).
FEDERATION_UNITS = int(os.environ.get("HOSPITRUST_FEDERATION_UNITS", "1"))
_FEDERATION_SPLIT = {"tests/test_deploy.py": 1, "tests/test_run_supervisor.py": 1}


def federation_unit(module: str) -> str | None:
    """The unit of work of a federation module (None for any other module)."""
    if module not in FEDERATION_MODULES:
        return None
    return "federation" if FEDERATION_UNITS < 2 else f"federation-{_FEDERATION_SPLIT.get(module, 2)}"


def _data_folder() -> Path:
    """Where the product looks when no data-dir is given: one default for the tests and simulate."""
    from hospitrust.envcheck import data_folder

    return data_folder()[0]


# The suite starts hundreds of Python processes (CLIs, SuperLinks, SuperNodes, ServerApps, ClientApps); with
# PYTHONDONTWRITEBYTECODE set (some images set it) each one compiles hospitrust's sources again: 3.4 s against 2.3 s
# to import the ServerApp and ClientApp, and the suite took 945 s with it against 797 s without (docs/testing.md).
# The gate sets sys.dont_write_bytecode in a gated ClientApp itself, whatever the environment says.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# whether the user gave the folder, decided once before the line below sets it for every process (xdist workers too)
os.environ.setdefault("HOSPITRUST_DATA_DIR_GIVEN", "1" if os.environ.get("HOSPITRUST_DATA_DIR") else "0")
DATA_DIR = _data_folder()
os.environ["HOSPITRUST_DATA_DIR"] = str(DATA_DIR)  # what the product (and every process a test starts) reads
# the audit log's state files (hospitrust.ops.deploy.audit) go to a folder of this session, not the user's
# ~/.local/state, for the tests and every launcher they start; a worker's own folder keeps workers apart
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hospitrust-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)  # this process made it: gone with it


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite on ``SUITE_WORKERS`` workers, module by module (``--dist loadfile``) unless told otherwise."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput"):
        return
    docs = _selects_docs(config.option.markexpr)
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    plain = config.option.numprocesses is None and not config.option.collectonly and not config.option.usepdb
    if plain and docs and DOCS_WORKERS > 1:
        config.option.numprocesses = DOCS_WORKERS
        config.option.tx = ["popen"] * DOCS_WORKERS
    elif plain and whole_suite and SUITE_WORKERS > 1:
        config.option.numprocesses = SUITE_WORKERS
        config.option.tx = ["popen"] * SUITE_WORKERS  # what xdist derives from -n, whichever hook runs first
    if config.option.numprocesses and config.option.dist == "no":
        # docs: page by page, the pages whose servers take the same fixed port on one worker (pytest_xdist_make_scheduler)
        config.option.dist = "loadscope" if docs else "loadfile"
    workers = config.option.numprocesses
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # the cores shared out among the workers, inherited by every process they start (ServerApps, Ray's actors, the
        # manual's commands): torch's default of one OpenMP thread per core in each of two workers on two cores spins
        # threads against each other. Idle on 2 cores, six torch-heavy modules on two workers took 141 s (241 CPU s)
        # with torch's default and 84 s (139 CPU s) with one thread each (docs/experiments/2026-12-06-suite-threads.md)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


def _selects_docs(markexpr: str | None) -> bool:
    """Whether ``-m`` selects the docs tests (``docs``, ``docs and ...``), not ``not docs``."""
    import re

    return bool(markexpr) and re.search(r"(?<!not )\bdocs\b", markexpr) is not None


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own (the first answer is taken)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (a test module is one unit of work, so its module-scoped fixtures, such as a
    real run its tests share, are built once), with the federation's modules together as one unit, sent
    out first as it is the longest.
    """
    if config.getvalue("dist") == "loadscope" and _selects_docs(config.option.markexpr):
        return _docs_scheduler(config, log)
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndFederation(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return federation_unit(module) or module

        def _assign_work_unit(self, node) -> None:
            for unit in ("federation-2", "federation-1", "federation"):  # first, then the units with the most tests
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return FilesAndFederation(config, log)


def _docs_scheduler(config, log):
    """The docs pages one by one, except the pages whose servers take the same fixed port (README.md's and
    docs/console.md's `hospitrust console` on 8080): one unit of work, so they never run at once. (xdist's
    ``loadgroup`` would do it with marks, but with pytest 9 it no longer renames the node ids it groups by.)"""
    from xdist.scheduler import LoadScopeScheduling

    from docs_commands import port_groups

    groups = port_groups()

    class DocsPages(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            page = nodeid.rpartition("[")[2].rstrip("]")
            return f"pages sharing a port with {groups[page]}" if page in groups else nodeid

    return DocsPages(config, log)


def pytest_sessionstart(session):
    # a test run stopped with SIGTERM stops every Flower process it started (Ctrl-C: the
    # tests' own teardown and the exit handler do it). An xdist controller signals its workers (and what they
    # started) and goes on without waiting: an interrupted worker reports to its controller before it exits, and
    # one whose controller waited in its handler hung until killed 10 s later (test_interrupt's sigterm-xdist)
    controller = session.config.pluginmanager.hasplugin("dsession")
    flwr.stop_on_signals(wait=not controller)


def pytest_sessionfinish(session, exitstatus):
    flwr.stop_all()


def pytest_unconfigure(config):
    flwr.reap_signalled()  # a controller's interrupted workers (and their processes) are gone before it exits


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


def pytest_runtest_logreport(report):
    # a docs page's records travel in its report, so that the controller of an xdist run has them too
    if report.when == "call":
        DOCS_RECORDS.extend(value for name, values in report.user_properties if name == "docs-records" for value in values)


def pytest_terminal_summary(terminalreporter):
    if not DOCS_RECORDS:
        return
    ran = [r for r in DOCS_RECORDS if r[1] == "ran"]
    exempt = [r for r in DOCS_RECORDS if r[1] == "exempt"]
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
    return missing_data_line(missing)


def missing_data_line(missing: list[str]) -> str:
    """The one line every data-dependent test and fixture fails with: what is missing, where it was looked for
    ($HOSPITRUST_DATA_DIR, else ~/.medmnist) and the remedies."""
    where = ("$HOSPITRUST_DATA_DIR" if os.environ["HOSPITRUST_DATA_DIR_GIVEN"] == "1"
             else "the default ~/.medmnist, as $HOSPITRUST_DATA_DIR is unset")
    return (f"MedMNIST files missing: {', '.join(missing)} not in {DATA_DIR} ({where}) and not downloadable here; "
            f"set $HOSPITRUST_DATA_DIR to a folder holding them (or copy them into ~/.medmnist, or run once with "
            f"network access), or run the offline tests with -m 'not data'")


@pytest.fixture
def data_dir(_medmnist_problem) -> Path:
    """The folder with the MedMNIST files; a data test fails with one line when they cannot be had."""
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    return DATA_DIR


#: the run config's defaults as of 2026-12-06 (``RunConfig().to_flat()`` then), pinned so that the golden runs and the
#: tests built on small_run_config keep their numbers when a default changes (the issues that change the defaults
#: rerun their own checks); a key added since takes its default, but for round-norm-bound.over-median, pinned at 0,
#: its value before it became a default (2026-12-07)
PINNED_DEFAULTS = REPO / "tests" / "golden" / "run_defaults.json"


def small_run_config(tmp_path: Path, **overrides) -> dict:
    """A complete, quick run config (kebab-case, as Flower passes it), from the pinned defaults."""
    import json

    from hospitrust.config import RunConfig

    cfg = {**RunConfig().to_flat(), **json.loads(PINNED_DEFAULTS.read_text())}
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


# ---- recorded numbers on any CPU -------------------------------------------------------------------
#: Relative tolerance for float32 results compared with numbers recorded on another machine: each float32
#: operation rounds at 6e-8 relative, and another CPU's kernels (AVX-512 against AVX2, another summation
#: order) move a rule's output by up to about 3e-7 relative (measured, issue 42); a rule's few dozen
#: accumulations stay well inside 1e-5, while a deliberate change of 1e-4 does not.
RECORDED_RTOL = 1e-5
#: The guard's input jitter: about one float32 rounding, the size of what another CPU's kernels change.
JITTER = 1e-7


def jitter(t, rel: float, seed: int = 0):
    """``t`` with every element moved by ``rel`` times a seeded standard normal, relative to itself (float64
    arithmetic, returned in ``t``'s dtype); ``rel = 0`` returns ``t`` unchanged."""
    import torch

    if not rel:
        return t
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (t.double() * (1.0 + rel * noise)).to(t.dtype)


@pytest.fixture(scope="session")
def byzfl():
    """ByzFL 0.0.11 (the test extra), the reference the field's rules and attacks are compared with; imported by
    the tests that use it, not at collection: its import takes about 4 s (its benchmark package, torchvision) in
    every worker that collects the suite."""
    return pytest.importorskip("byzfl", reason="byzfl==0.0.11 is in the test extra (pip install -e .[test])")


@pytest.fixture(params=[0.0, JITTER], ids=["as-recorded", "jittered"])
def input_jitter(request) -> float:
    """The guard that does not depend on CI's CPU: a recorded-number test runs once on its inputs as recorded
    and once with them jittered by about one float32 rounding (``jitter``); both must pass, so a tolerance
    tighter than the arithmetic, or a decision on a knife edge, fails on every machine, not only on another CPU."""
    return request.param


def assert_close_by_norm(got, want, what: str, rtol: float = RECORDED_RTOL, floor: float = 1e-12) -> None:
    """``||got - want|| <= rtol * ||want|| + floor`` (``floor``: the recorded numbers' rounding), naming the
    relative difference found."""
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, recorded {want.shape}"
    err, scale = float(np.linalg.norm(got - want)), float(np.linalg.norm(want))
    assert err <= rtol * scale + floor, (f"{what}: differs from the record by {err:.3g} ({err / max(scale, 1e-300):.3g} "
                                         f"relative to its norm {scale:.3g}; tolerance {rtol:g} relative)")


def flat_entry(entry) -> dict:
    """A hospital record (a ``HospitalRecord``, or its entry in a rounds.jsonl line) as one flat dict: the
    common fields and every source's signals side by side (schema 1's shape), for the tests that check a
    rule's math by the signals it records.
    """
    from hospitrust.records import HospitalRecord

    record = entry if isinstance(entry, HospitalRecord) else HospitalRecord.from_json(entry)
    out = {k: v for k, v in record.to_json().items() if k != "signals"}
    for values in record.signals.values():
        out.update(values)
    return out

"""hospitrust's extras: pyproject's optional dependencies and hospitrust/extras.py name the same distributions,
and a command that needs a missing extra says so in one line, with the pip command, before it starts anything.

A missing distribution is simulated by making ``importlib.metadata.distribution`` raise
``PackageNotFoundError`` for it (what the check reads); nothing is uninstalled.
"""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata

import pytest

from conftest import REPO
from hospitrust import envcheck, extras
from hospitrust.cli import main as cli

# what Flower's own extras add (flwr[simulation] and flwr[dp] in pyproject)
FLOWER_EXTRAS = {"simulation": {"ray"}, "dp": {"dp-accounting"}}


def _name(requirement: str) -> tuple[str, set[str]]:
    """(distribution, its extras) of a requirement string such as 'flwr[simulation]>=1.42,<2'."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert m, requirement
    return m.group(1).lower(), {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}


def _expanded(optional: dict[str, list[str]], extra: str) -> set[str]:
    out: set[str] = set()
    for requirement in optional[extra]:
        name, nested = _name(requirement)
        if name == "hospitrust":
            for inner in nested:
                out |= _expanded(optional, inner)
        elif name == "flwr":
            for inner in nested:
                out |= FLOWER_EXTRAS[inner]
        else:
            out.add(name)
    return out


@pytest.fixture(scope="module")
def optional() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_extras_table_names_pyprojects_distributions(optional):
    for name, extra in extras.EXTRAS.items():
        assert set(extra.distributions) == _expanded(optional, name), name
    assert set(optional) - set(extras.EXTRAS) == {"all", "test"}  # every other extra is known to the check
    every = set().union(*(_expanded(optional, name) for name in extras.EXTRAS))
    assert _expanded(optional, "all") == every
    assert every <= _expanded(optional, "test")  # CI installs .[test]: every extra's code is tested


def test_a_hospitals_install_carries_no_simulation_benchmark_or_dp_stack():
    base = {_name(r)[0] for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert "flwr" in base and "pydicom" in base and "psutil" in base
    assert not base & {"ray", "opacus", "dp-accounting", "flwr-datasets", "matplotlib", "pandas", "scipy", "seaborn"}
    flwr = next(r for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
                if _name(r)[0] == "flwr")
    assert _name(flwr)[1] == set(), "flwr's extras (simulation: Ray; dp) belong to hospitrust's extras"


@pytest.fixture
def without(monkeypatch):
    """without(*names): importlib.metadata finds none of these distributions (the rest as installed)."""
    real = metadata.distribution

    def hide(*names: str) -> None:
        hidden = {n.lower() for n in names}

        def distribution(name: str):
            if name.lower() in hidden:
                raise metadata.PackageNotFoundError(name)
            return real(name)

        monkeypatch.setattr(metadata, "distribution", distribution)

    return hide


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert not captured.out.strip(), captured.out
    return lines[0]


def test_the_check_names_the_extra_what_is_missing_and_the_pip_command(without, monkeypatch):
    without("ray", "pandas")
    monkeypatch.setattr(extras, "_installed_from", lambda: (None, False))
    assert extras.missing("bench") == ("ray", "pandas")
    assert extras.missing("dp") == ()
    assert extras.extra_problem("dp", "hospitrust x") is None
    assert extras.extra_problem("bench", "hospitrust bench") == (
        "hospitrust bench: needs the 'bench' extra (not installed: ray, pandas): pip install 'hospitrust[bench]'")
    assert extras.extra_problem("bench", "x", distributions=("matplotlib", "scipy")) is None


def test_the_pip_command_reinstalls_the_folder_hospitrust_came_from(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text("")

    class Installed:
        def __init__(self, info):
            self.info = info

        def read_text(self, name):
            return json.dumps(self.info) if name == "direct_url.json" else None

    real = metadata.distribution
    for info, expected in (({"url": tmp_path.as_uri(), "dir_info": {"editable": True}}, f"pip install -e '{tmp_path}[dp]'"),
                           ({"url": tmp_path.as_uri(), "dir_info": {}}, f"pip install '{tmp_path}[dp]'"),
                           ({"url": (tmp_path / "gone").as_uri(), "dir_info": {}}, "pip install 'hospitrust[dp]'"),
                           ({"url": "https://example.org/h.whl", "archive_info": {}}, "pip install 'hospitrust[dp]'")):
        monkeypatch.setattr(metadata, "distribution",
                            lambda name, info=info: Installed(info) if name == "hospitrust" else real(name))
        assert extras.install_command("dp") == expected


def test_bench_without_its_extra_says_so_in_one_line_before_anything_runs(without, monkeypatch, capsys, tmp_path):
    import hospitrust.bench.runner as runner

    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: pytest.fail("a cell ran"))
    without("ray")
    assert cli.main(["bench", str(REPO / "benchmarks" / "smoke.toml"), "--out", str(tmp_path)]) == 2
    line = _one_line(capsys)
    assert line.startswith("hospitrust bench: needs the 'bench' extra (not installed: ray): pip install ")
    assert line.endswith("[bench]'")
    assert not list(tmp_path.iterdir())


def test_simulate_without_its_extra_says_so_before_flower_starts(without, monkeypatch, capsys):
    from hospitrust.ops import flwr
    import hospitrust.ops.simulate as sim

    monkeypatch.setattr(flwr, "start", lambda *a, **k: pytest.fail("Flower started"))
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("a simulation started"))
    without("ray")
    assert cli.main(["simulate"]) == 2
    line = _one_line(capsys)
    assert line.startswith("hospitrust simulate: needs the 'simulation' extra (not installed: ray)")
    assert line.endswith("[simulation]'")


def test_report_asks_for_the_figures_of_a_run_and_the_tables_of_a_grid(without, capsys, tmp_path):
    run = tmp_path / "grid" / "run"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("")
    without("matplotlib")
    assert cli.main(["report", str(run)]) == 2
    assert "needs the 'plots' extra (not installed: matplotlib)" in _one_line(capsys)
    without("pandas", "ray")  # a grid's report simulates nothing: Ray is not asked for
    assert cli.main(["report", str(run.parent)]) == 2
    line = _one_line(capsys)
    assert line.startswith("hospitrust report: needs the 'bench' extra (not installed: pandas): pip install ")


def test_a_run_with_differential_privacy_without_the_dp_extra_is_refused_in_one_line(without, tmp_path):
    from conftest import small_run_config
    from hospitrust.config import ConfigError, parse_run_config

    without("opacus")
    for mode in ("local", "central"):
        with pytest.raises(ConfigError) as err:
            parse_run_config(small_run_config(tmp_path, **{"privacy.mode": mode}))
        problems = str(err.value).splitlines()[1:]
        assert problems == [f"  - privacy.mode = '{mode}': needs the 'dp' extra (not installed: opacus): "
                            f"{extras.install_command('dp')}"], str(err.value)
    parse_run_config(small_run_config(tmp_path))  # privacy off: no extra asked for


def test_doctor_lists_the_extras_and_does_not_fail_a_hospitals_install(without, monkeypatch, capsys):
    monkeypatch.setattr(envcheck, "check_torch", lambda: envcheck.Check("torch + torchvision", True, "fine"))
    monkeypatch.setattr(envcheck, "check_flower", lambda: envcheck.Check("Flower", True, "fine"))
    without("ray", "opacus")
    check = envcheck.check_extras()
    assert not check.ok and not check.required
    assert "not installed: dp, operator, simulation, bench" in check.detail
    assert "[dp,operator,simulation,bench]" in check.detail
    cli.main(["doctor"])
    assert any(line.startswith("missing  extras: installed: dicom, plots;") for line in capsys.readouterr().out.splitlines())

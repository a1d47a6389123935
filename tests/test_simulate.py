"""Real Flower simulation runs through `hospitrust simulate` (SuperLink + Ray on 127.0.0.1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import DATA_DIR, REPO
from hospitrust.server_app.results import read_round_records, read_summary

pytestmark = pytest.mark.slow

QUICK = "num-server-rounds=2 train-subsample=0.05 batch-size=64"


def _simulate(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOSPITRUST_DATA_DIR=str(DATA_DIR))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "hospitrust.cli.main", "simulate", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_simulate_completes_writes_every_result_file_and_survives_a_nan_hospital(tmp_path, data_dir):
    # hospital-1 sends NaN weights every round (fault injection): rejected, recorded, the run goes on
    out = tmp_path / "runs"
    res = _simulate(["--hospitals", "3", "--app", str(REPO), "-c", QUICK, "-c", f"output-dir={out} run-name=smoke",
                     "-c", "attack=nan-update malicious-hospitals=1", "--timeout", "500"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "run ended finished:completed" in res.stdout
    run_dir = out / "smoke"
    for name in ("config.json", "rounds.jsonl", "summary.json", "model.pt", "class_counts.csv"):
        assert (run_dir / name).is_file(), name
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == [1, 2]
    for r in rounds:
        by_hospital = {c.hospital: c for c in r.clients}
        assert by_hospital["hospital-1"].rejected and "NaN" in by_hospital["hospital-1"].reason
        assert not by_hospital["hospital-0"].rejected and not by_hospital["hospital-2"].rejected
        assert not r.kept_previous_model
    summary = read_summary(run_dir)
    assert summary["hospitals"] == 3 and 0.0 <= summary["final"]["auc"] <= 1.0
    assert "final (pneumoniamnist, fedavg, 2 rounds" in res.stdout
    # Flower's advice on resizing the federation contradicts --hospitals: left out of the stream
    assert "default simulated SuperNodes changed" not in res.stdout and "simulation-config" not in res.stdout
    assert "3 simulated SuperNodes" in res.stdout


def test_a_failing_clientapp_ends_failed_with_nonzero_exit(tmp_path, data_dir):
    # the same app, but a ClientApp whose train handler raises
    app = tmp_path / "brokenapp"
    app.mkdir()
    pyproject = (REPO / "pyproject.toml").read_text()
    pyproject = pyproject.replace('name = "hospitrust"', 'name = "brokenapp"')
    pyproject = pyproject.replace('clientapp = "hospitrust.client_app:app"', 'clientapp = "broken_client:app"')
    # its bundle holds broken_client.py, not the hospitrust package the original's fab-include names
    pyproject = re.sub(r"(?m)^fab-include = .*$", 'fab-include = ["*.py"]', pyproject)
    (app / "pyproject.toml").write_text(pyproject)
    (app / "broken_client.py").write_text(textwrap.dedent('''
        from flwr.clientapp import ClientApp
        from hospitrust.client_app.clientapp import describe

        app = ClientApp()
        app.query()(describe)

        @app.train()
        def train(msg, context):
            raise RuntimeError("this ClientApp is broken on purpose")
    '''))
    res = _simulate(["--hospitals", "2", "--app", str(app), "-c", QUICK, "-c", f"output-dir={tmp_path / 'runs'}",
                     "--timeout", "500"], cwd=tmp_path)
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr[-4000:]
    assert "run ended finished:failed" in res.stdout
    assert "broken on purpose" in res.stdout
    # the failed run's scratch folder (its staged copy of brokenapp among it) is gone without --keep
    removed = re.search(r"removed the run folder (\S+);", res.stdout)
    assert removed and not Path(removed.group(1)).exists()


def test_bad_config_fails_before_starting_anything(tmp_path, monkeypatch, capsys):
    res = _simulate(["--hospitals", "3", "--app", str(REPO), "-c", "strategy=fedbest"], cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "strategy = 'fedbest'" in res.stderr and "fedavg" in res.stderr
    assert "SuperLink" not in res.stdout
    # the same command in this process (the process above showed what a user sees; this shows the same checks)
    from hospitrust.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--hospitals", "3", "--app", str(REPO), "-c", "num-server-round=3"]) == 2
    out = capsys.readouterr()
    assert "unknown key 'num-server-round'; did you mean 'num-server-rounds'?" in out.err
    assert "Traceback" not in out.err and len(out.err.splitlines()) <= 3 and "SuperLink" not in out.out
    # an option of a rule that is not selected, given explicitly, is refused even at its default value
    assert main(["simulate", "--hospitals", "3", "--app", str(REPO), "-c", "strategy=krum hta.exclusion-fraction=0.5"]) == 2
    assert "selected strategy is 'krum'" in capsys.readouterr().err
    # an old flat key still works, with one line naming its new key
    assert main(["simulate", "--hospitals", "3", "--app", str(REPO), "-c", "hta-kappa=0.4 strategy=krum"]) == 2
    out = capsys.readouterr()
    assert "'hta-kappa' is deprecated: it is now 'hta.exclusion-fraction'" in out.out + out.err
    # torch and torchvision that do not load together stop the run before Flower, after the run config's checks
    from hospitrust.cli import simulate as simulate_command

    monkeypatch.setattr(simulate_command, "_environment_problem", lambda: "torchvision 0.1 does not fit torch 9.9")
    assert main(["simulate", "--hospitals", "3", "--app", str(REPO), "-c", "strategy=fedbest"]) == 2
    assert "fedbest" in capsys.readouterr().err
    assert main(["simulate", "--hospitals", "3", "--app", str(REPO)]) == 2
    out = capsys.readouterr()
    assert "hospitrust simulate: torchvision 0.1 does not fit torch 9.9" in out.err and "SuperLink" not in out.out


def test_a_split_that_cannot_be_drawn_stops_before_flower(tmp_path, data_dir):
    # 1,000 Dirichlet(0.5) hospitals over 4,708 images: some would get nothing; every ClientApp would fail
    res = _simulate(["--hospitals", "1000", "--app", str(REPO), "-c", f'data-dir="{data_dir}"'], cwd=tmp_path,
                    timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot split pneumoniamnist over 1000 hospitals" in res.stderr and "increase alpha" in res.stderr
    assert "SuperLink" not in res.stdout and "Traceback" not in res.stderr


def test_missing_data_stops_before_flower_with_one_paragraph(tmp_path):
    """A newcomer without the dataset (no network here): one paragraph, no traceback, before any Flower process."""
    env = dict(os.environ, HOSPITRUST_DATA_DIR=str(tmp_path / "empty"),
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")  # offline, also where a network exists
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "hospitrust.cli.main", "simulate", "--app", str(REPO), "-c", "dataset=dermamnist"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "dermamnist.npz is not in" in res.stderr and "HOSPITRUST_DATA_DIR" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "SuperLink" not in res.stdout


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # Flower's own build, twice
def test_the_staged_app_builds_the_same_bundle_without_the_ignored_folders(tmp_path):
    """``flwr run`` gets a copy without what ``.gitignore`` excludes (a .venv, runs/): Flower's
    own build of the copy is byte-identical to its build of the app, here and for this repo."""
    from flwr.cli.build import build_fab_from_disk

    from hospitrust.ops.flwr import stage_app

    app = tmp_path / "myapp"
    (app / "hospitrust").mkdir(parents=True)
    (app / "tasks").mkdir()
    (app / ".venv" / "lib").mkdir(parents=True)
    (app / "runs" / "a").mkdir(parents=True)
    (app / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (app / ".gitignore").write_text((REPO / ".gitignore").read_text())
    (app / "hospitrust" / "mod.py").write_text("x = 1\n")
    (app / "hospitrust" / "mod.pyc").write_bytes(b"\0")
    (app / "tasks" / "t.toml").write_text("[task]\n")
    (app / ".venv" / "lib" / "big.py").write_text("y = 2\n")
    (app / "runs" / "a" / "summary.json").write_text("{}")
    (app / "hospitrust" / "link.py").symlink_to(app / "hospitrust" / "mod.py")
    staged = stage_app(app, tmp_path / "stage")
    assert staged.name == "myapp"
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) == [
        ".gitignore", "hospitrust/mod.py", "pyproject.toml", "tasks/t.toml"]
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    assert build_fab_from_disk(stage_app(REPO, tmp_path / "repo")) == build_fab_from_disk(REPO)


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # Flower's own build, twice
def test_an_installed_package_finds_its_own_app_from_any_folder_and_bundles_the_same_files(tmp_path, monkeypatch):
    """A wheel carries pyproject.toml and tasks/ in hospitrust/_app (pyproject's force-include): from
    a folder with no project above it, simulate finds that app, and its staged copy (the package's
    source added) builds the bundle a clone builds."""
    from flwr.cli.build import build_fab_from_disk

    from hospitrust.ops import flwr as flwr_ops
    from hospitrust.ops import simulate as sim
    from hospitrust.ops.flwr import stage_app

    packaged = tmp_path / "site" / "hospitrust" / "_app"
    (packaged / "tasks").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", packaged / "pyproject.toml")
    for task in (REPO / "tasks").glob("*.toml"):
        shutil.copy(task, packaged / "tasks" / task.name)
    monkeypatch.setattr(flwr_ops, "PACKAGED_APP", packaged)
    monkeypatch.setattr(sim, "SOURCE_CHECKOUT", tmp_path / "no-clone")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert sim.find_app_dir() == packaged
    assert sim.app_config_defaults()["strategy"] == "fedavg"
    with pytest.raises(sim.SimulationError, match="pass --app PATH"):
        sim.find_app_dir(packaged=False)  # `hospitrust config generate` never writes into an installed copy
    staged = stage_app(packaged, tmp_path / "stage")
    assert (staged / "hospitrust" / "server_app" / "serverapp.py").is_file()
    assert not (staged / "hospitrust" / "_app").exists() and not list(staged.rglob("__pycache__"))
    assert build_fab_from_disk(staged) == build_fab_from_disk(REPO)


class _DeadSuperLink:
    def __init__(self, log_file):
        self.log_file = log_file

    def stop(self):
        pass


@pytest.mark.parametrize("keep", [False, True])
def test_a_failed_simulation_keeps_its_folder_only_with_keep_and_says_where(tmp_path, monkeypatch, data_dir, keep):
    """No Flower here: a SuperLink that never becomes healthy fails the run after the scratch folder was made."""
    import io
    import tempfile

    from hospitrust.ops import flwr as flwr_ops
    from hospitrust.ops import simulate as sim

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(flwr_ops, "start", lambda name, cmd, *, env, cwd, log_file: _DeadSuperLink(log_file))

    def unhealthy(address, proc=None, **kwargs):
        raise flwr_ops.FlowerProcessError(f"{address} did not answer /health")

    monkeypatch.setattr(flwr_ops, "wait_healthy", unhealthy)
    out = io.StringIO()
    with pytest.raises(sim.SimulationError, match="did not answer"):
        sim.simulate(hospitals=2, app_dir=REPO, out=out, keep=keep, overrides=[f"output-dir='{tmp_path / 'runs'}'"])
    left = list(scratch.glob("hospitrust-sim-*"))
    if keep:
        assert len(left) == 1 and f"run folder kept at {left[0]}" in out.getvalue()
    else:
        assert left == [] and "rerun with --keep to keep it" in out.getvalue()

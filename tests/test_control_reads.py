"""Runs submitted, run statuses and online SuperNodes read in process (``hospitrust.ops.flwr.control_client``: Flower's own Control API
client, no ``flwr`` process), against a real local SuperLink: what the run supervisor, the grids' backend and the
console rely on when the answer is not a status. test_control_plane checks the same reads equal the CLI's on the
deployed federation and are refused to a stranger."""

from __future__ import annotations

import pytest

from hospitrust.ops import flwr

TINY_APP = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tiny"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "hospitrust-tests"

[tool.flwr.app.components]
serverapp = "tiny:server"
clientapp = "tiny:client"

[tool.flwr.app.config]
num-server-rounds = 3
"""


def test_a_run_the_superlink_does_not_know_and_a_superlink_gone_read_as_unknown_with_the_reason(tmp_path):
    port = flwr.free_port()
    flwr.write_local_connection(tmp_path, "local", port)
    env = flwr.flower_env(tmp_path)
    superlink = flwr.start("flower-superlink", flwr.simulation_superlink_command(port), env=env, cwd=tmp_path,
                           log_file=tmp_path / "superlink.log")
    try:
        flwr.wait_healthy(f"127.0.0.1:{port}", proc=superlink)
        status, details = flwr.run_status(4242, "local", env=env)
        assert status == "unknown" and "Run ID not found" in details, details
        assert flwr.online_nodes("local", env=env) == []  # a simulation SuperLink has no SuperNode of its own
    finally:
        superlink.stop()
    status, details = flwr.run_status(4242, "local", env=env)
    assert status == "unknown" and "ConnectError" in details, details  # what the supervisor counts as unreachable
    # a connection the config does not name: the reason says so
    status, details = flwr.run_status(1, "nowhere", env=env)
    assert status == "unknown" and "nowhere" in details, details


def test_a_run_is_submitted_in_process_and_a_bad_app_or_a_superlink_gone_is_said(tmp_path):
    """``flwr.start_run``: what `flwr run` does (Flower's bundle builder, its StartRun), without a `flwr` process."""
    app = tmp_path / "tiny"
    app.mkdir()
    (app / "pyproject.toml").write_text(TINY_APP)
    (app / "tiny.py").write_text("server = client = None\n")
    port = flwr.free_port()
    flwr.write_local_connection(tmp_path, "local", port)
    env = flwr.flower_env(tmp_path)
    superlink = flwr.start("flower-superlink", flwr.simulation_superlink_command(port), env=env, cwd=tmp_path,
                           log_file=tmp_path / "superlink.log")
    try:
        flwr.wait_healthy(f"127.0.0.1:{port}", proc=superlink)
        run_id = flwr.start_run(app, "local", run_config="num-server-rounds=1", env=env,
                                federation_config="num-supernodes=2")
        # no simulation process is started beside this SuperLink: the run waits, with its config as submitted
        assert flwr.run_status(run_id, "local", env=env)[0] == "pending"
        with pytest.raises(flwr.FlowerProcessError, match="pyproject.toml"):  # not an app: Flower's own words
            flwr.start_run(tmp_path / "cache", "local", run_config="", env=env)
        (app / "pyproject.toml").write_text(TINY_APP.replace('serverapp = "tiny:server"\n', ""))
        with pytest.raises(flwr.FlowerProcessError, match="serverapp"):
            flwr.start_run(app, "local", run_config="", env=env)
    finally:
        superlink.stop()
    (app / "pyproject.toml").write_text(TINY_APP)
    with pytest.raises(flwr.FlowerProcessError, match="ConnectError"):
        flwr.start_run(app, "local", run_config="", env=env)

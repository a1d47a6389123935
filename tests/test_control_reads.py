"""Run statuses and online SuperNodes read in process (``hospitrust.ops.flwr.control_client``: Flower's own Control API
client, no ``flwr`` process), against a real local SuperLink: what the run supervisor, the grids' backend and the
console rely on when the answer is not a status. test_control_plane checks the same reads equal the CLI's on the
deployed federation and are refused to a stranger."""

from __future__ import annotations

from hospitrust.ops import flwr


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

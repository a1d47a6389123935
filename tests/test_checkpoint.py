"""Server state checkpoint and resume-from: a run stopped after round k and resumed ends
with exactly the model of the unbroken run (same seed), strategy state included."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch
from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.server_app.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint
from hospitrust.client_app import app as client_app
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.server_app.results import read_round_records, read_summary
from hospitrust.server_app import app as server_app
from hospitrust.strategies import STRATEGIES


class ServerStopped(RuntimeError):
    """Stands for the ServerApp process dying between rounds."""


def _serve(cfg: dict, num_nodes: int, first_node_id: int = 7_000_000) -> None:
    grid = InProcessGrid(client_app, num_nodes, cfg, first_node_id=first_node_id)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(cfg)))


def _model_hash(run_dir) -> str:
    state = torch.load(run_dir / "model.pt")
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].contiguous().numpy().tobytes())
    return h.hexdigest()


# rules whose state carries over rounds (reputation, trust and history);
# fraction-train < 1 also puts the sampling RNG in play
@pytest.mark.parametrize("strategy", ["hta", "earn"])
def test_resumed_run_ends_with_the_unbroken_runs_model(tmp_path, data_dir, monkeypatch, strategy):
    common = dict(strategy=strategy, **{"num-server-rounds": 3, "fraction-train": 0.75, "min-hospitals": 2})
    whole = small_run_config(tmp_path, **{**common, "run-name": "whole"})
    _serve(whole, 4)

    stopped = small_run_config(tmp_path, **{**common, "run-name": "stopped"})
    cls = STRATEGIES[strategy]
    original = cls.aggregate_round

    # killed while round 3's replies come in: its hospitals were sampled already (with round 2's
    # evaluation, on this grid), after round 2's checkpoint kept the sampling rng
    def dies_in_round_3(self, server_round, *args, **kwargs):
        if server_round == 3:
            raise ServerStopped("killed")
        return original(self, server_round, *args, **kwargs)

    monkeypatch.setattr(cls, "aggregate_round", dies_in_round_3)
    with pytest.raises(ServerStopped):
        _serve(stopped, 4)
    monkeypatch.setattr(cls, "aggregate_round", original)
    run_dir = tmp_path / "runs" / "stopped"
    assert load_checkpoint(run_dir)["round"] == 2 and not (run_dir / "summary.json").exists()

    # the SuperNodes reconnect with new node ids: state is keyed by hospital name
    _serve({**stopped, "resume-from": str(run_dir)}, 4, first_node_id=9_100_000)
    whole_dir = tmp_path / "runs" / "whole"
    assert _model_hash(run_dir) == _model_hash(whole_dir)
    assert [r.number for r in read_round_records(run_dir)] == [1, 2, 3]
    assert read_round_records(run_dir)[-1].central == read_round_records(whole_dir)[-1].central
    summary = read_summary(run_dir)
    assert summary["resumed_at"] == [2] and summary["rounds"] == 3
    assert read_summary(whole_dir)["resumed_at"] == []


def test_resume_extends_a_finished_run_and_drops_rounds_after_the_checkpoint(tmp_path, data_dir):
    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1})
    _serve(cfg, 3)
    run_dir = tmp_path / "runs" / cfg["run-name"]
    # a round written after the last checkpoint (crash between the two writes) is dropped on resume
    with open(run_dir / "rounds.jsonl", "a") as fh:
        fh.write('{"round": 2, "partial": true}\n')
    _serve({**cfg, "num-server-rounds": 2, "resume-from": str(run_dir / CHECKPOINT_FILE)}, 3)
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == [1, 2] and "partial" not in rounds[1].entries
    assert load_checkpoint(run_dir)["round"] == 2


def test_resume_refuses_a_config_that_changes_the_rounds(tmp_path, data_dir):
    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1})
    _serve(cfg, 3)
    run_dir = tmp_path / "runs" / cfg["run-name"]
    with pytest.raises(CheckpointError, match=r"learning-rate: checkpoint 0\.01 vs now 0\.5"):
        _serve({**cfg, "learning-rate": 0.5, "resume-from": str(run_dir)}, 3)


def test_resume_from_nothing_names_what_was_expected(tmp_path, data_dir):
    cfg = small_run_config(tmp_path, **{"resume-from": str(tmp_path / "no-such-run")})
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*no-such-run \(expected a run directory holding checkpoint.pt"):
        _serve(cfg, 3)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        _serve({**cfg, "resume-from": str(junk)}, 3)


def test_checkpoint_off_writes_none(tmp_path, data_dir):
    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1, "checkpoint": False})
    _serve(cfg, 3)
    assert not (tmp_path / "runs" / cfg["run-name"] / CHECKPOINT_FILE).exists()


def test_strategy_state_round_trip_and_mismatch():
    hta = STRATEGIES["hta"]({1: "a", 2: "b"})
    hta.ema, hta.var, hta.reputation = {"a": 0.7}, {"a": 0.01}, {"a": 0.69}
    hta.rng.random()
    state = hta.state_dict()
    fresh = STRATEGIES["hta"]({5: "a", 6: "b"})
    fresh.load_state_dict(state)
    assert fresh.reputation == {"a": 0.69} and fresh.rng.random() == hta.rng.random()
    state["reputation"]["a"] = 0.0  # a deep copy: later changes to the saved state do not leak in
    assert fresh.reputation == {"a": 0.69}
    with pytest.raises(ValueError, match=r"lacks \['trust', 'history_sum'"):
        STRATEGIES["earn"]({1: "a"}).load_state_dict(state)


def test_a_resume_waits_for_the_stopped_servers_lock_and_then_refuses(tmp_path, data_dir, monkeypatch):
    import hospitrust.server_app.loop as server_module
    from hospitrust.server_app.results import RunDirectory

    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1})
    _serve(cfg, 3)
    run_dir = tmp_path / "runs" / cfg["run-name"]
    monkeypatch.setattr(server_module, "RUN_DIR_LOCK_TIMEOUT", 1.0)
    with RunDirectory(run_dir).exclusive():  # the stopped run's ServerApp, still alive
        with pytest.raises(RuntimeError, match="in use by another ServerApp"):
            _serve({**cfg, "num-server-rounds": 2, "resume-from": str(run_dir)}, 3)
    assert load_checkpoint(run_dir)["round"] == 1  # nothing was written meanwhile
    _serve({**cfg, "num-server-rounds": 2, "resume-from": str(run_dir)}, 3)  # lock released: it goes on
    assert load_checkpoint(run_dir)["round"] == 2


def test_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    """A pickle that would run code on load: refused (weights_only), and nothing ran."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # would create the marker file if unpickled

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"format": 2, "round": 1, "model": {}, "rng": Payload()}, run_dir / CHECKPOINT_FILE)
    with pytest.raises(CheckpointError, match="hospitrust checkpoint upgrade"):
        load_checkpoint(run_dir)
    assert not marker.exists()


def test_an_old_checkpoint_is_refused_then_upgraded_once_trusted(tmp_path):
    """A format-1 checkpoint (numpy RNG state pickled as arrays) is refused; `hospitrust checkpoint upgrade
    --yes` converts it, keeping the original, and it then loads with the same values.
    """
    import random

    import numpy as np

    from hospitrust.cli.main import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = np.random.get_state()
    old = {"format": 1, "round": 3, "model": {"w": torch.ones(2)}, "strategy": "hta",
           "strategy_state": {"rng": random.getstate(), "ema": {"h0": np.float64(0.5)}}, "config": {"seed": 1},
           "history": [], "flags_per_round": [], "resumed_at": [],
           "rng": {"python": random.getstate(), "numpy": state, "torch": torch.get_rng_state()}}
    torch.save(old, run_dir / CHECKPOINT_FILE)
    with pytest.raises(CheckpointError, match=re.escape(f"hospitrust checkpoint upgrade {run_dir / CHECKPOINT_FILE}")):
        load_checkpoint(run_dir)
    assert main(["checkpoint", "upgrade", str(run_dir), "--yes"]) == 0
    assert (run_dir / (CHECKPOINT_FILE + ".v1")).is_file()
    ckpt = load_checkpoint(run_dir)
    assert ckpt["round"] == 3 and ckpt["strategy_state"]["ema"] == {"h0": 0.5}
    assert np.array_equal(ckpt["rng"]["numpy"][1], state[1]) and ckpt["rng"]["numpy"][0] == "MT19937"


def test_a_key_added_since_the_checkpoint_compares_as_its_default():
    from hospitrust.config.run import run_config_defaults
    from hospitrust.server_app.checkpoint import check_compatible

    now = {k: v for k, v in run_config_defaults().items() if "." not in k}
    written_before = {k: v for k, v in now.items() if k != "pre-aggregation"}   # the key did not exist then
    check_compatible(written_before, now)                                       # default now: same rounds
    with pytest.raises(CheckpointError, match=r"pre-aggregation: checkpoint '' vs now 'nnm'"):
        check_compatible(written_before, {**now, "pre-aggregation": "nnm"})

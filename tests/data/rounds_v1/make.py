"""How the v1 rounds.jsonl files here were made: tiny in-process runs of hospitrust at commit 9be135a
(before the per-hospital record had a schema), each run's rounds.jsonl copied as ``<name>.jsonl``.

Run from the repository root of that commit (``PYTHONPATH=. python tests/data/rounds_v1/make.py``);
a later hospitrust writes schema 2 lines, so running it now makes no v1 file.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch
from flwr.app import Context, RecordDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conftest import small_run_config  # noqa: E402  (tests/conftest.py)

from hospitrust.client_app import app as client_app  # noqa: E402
from hospitrust.ops.inprocess import InProcessGrid  # noqa: E402
from hospitrust.server_app import app as server_app  # noqa: E402

HERE = Path(__file__).parent


def _nan_in_round_2(index, incoming, reply):
    """Hospital index 1's train reply of round 2 carries a NaN: rejected with a reason."""
    if index == 1 and incoming.metadata.message_type == "train" and int(incoming.content["config"]["server-round"]) == 2 \
            and reply.has_content() and "arrays" in reply.content.array_records:
        state = reply.content["arrays"].to_torch_state_dict()
        name = next(k for k, v in state.items() if v.is_floating_point())
        state[name] = state[name].clone()
        state[name].view(-1)[0] = float("nan")
        from flwr.app import ArrayRecord
        reply.content["arrays"] = ArrayRecord(state)
    return reply


RUNS = {
    # trust rule, a sign-flip attacker, a NaN reply rejected in round 2, clipping before the rule
    "hta-attack-rejected": (4, {"strategy": "hta", "attack": "sign-flip", "malicious-hospitals": "0",
                                "pre-aggregation": "clipping", "clipping.max-norm": 50.0}, _nan_in_round_2),
    "multi-krum-local-dp": (5, {"strategy": "multi-krum", "privacy.mode": "local", "privacy.target-epsilon": 3.0,
                                "privacy.delta": 1e-3}, None),
    "fbd": (3, {"strategy": "fbd", "fbd.colors": 3, "fbd.redundancy": 2}, None),
}


def main() -> None:
    torch.set_num_threads(1)
    for name, (nodes, overrides, reply_filter) in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            cfg = small_run_config(Path(tmp), **overrides)
            grid = InProcessGrid(client_app, nodes, cfg, reply_filter=reply_filter)
            server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
            shutil.copy(Path(tmp) / "runs" / cfg["run-name"] / "rounds.jsonl", HERE / f"{name}.jsonl")
            print(name, "written")


if __name__ == "__main__":
    main()

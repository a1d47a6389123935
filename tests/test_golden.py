"""Behaviour kept across refactors: the final model of a fixed set of short in-process runs.

Each run's final model is reduced to a sha256 of its tensors (name, dtype, shape, bytes, in
name order) and compared with ``tests/golden/final_models.json``. The hashes hold for the
torch build CI pins (``.ci/run``), on the CPU with one thread. On another torch build the
floating-point results may differ in the last bits, so there the test compares a fixed
sample of each model's parameters (and every tensor's sum) within 1e-6 instead, and says so.

A change that alters one of these runs on purpose re-records its entry in the same commit
(``HOSPITRUST_RECORD_GOLDEN=1 python -m pytest tests/test_golden.py``) and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import small_run_config

GOLDEN = Path(__file__).parent / "golden" / "final_models.json"
RECORD = os.environ.get("HOSPITRUST_RECORD_GOLDEN") == "1"
CI_TORCH = "2.14.1"  # the build the hashes were recorded under (.ci/run pins it)
SAMPLE = 256  # parameters compared one by one on another torch build

# name -> (hospitals, run config overrides in the current key names)
RUNS: dict[str, tuple[int, dict]] = {
    "fedavg": (3, {}),
    "hta": (4, {"strategy": "hta"}),
    "earn": (4, {"strategy": "earn"}),
    "multi-krum": (5, {"strategy": "multi-krum"}),
    "fltrust": (3, {"strategy": "fltrust"}),
    "fbd": (3, {"strategy": "fbd", "fbd.colors": 3, "fbd.redundancy": 2}),
    "contribution-scoring": (3, {"strategy": "contribution", "contribution-scoring.enabled": True, "num-server-rounds": 3}),
    "colluding-alie-median": (4, {"strategy": "median", "attack": "alie", "malicious-hospitals": "0"}),
    "data-label-flip-fedavg": (3, {"attack": "label-flip", "malicious-hospitals": "1"}),
}
RESUMED = "hta-resumed"  # hta stopped after 1 round, resumed to 2


def _tensor_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _fingerprint(state: dict[str, torch.Tensor]) -> dict:
    """sha256, every float tensor's sum, and a fixed sample of the flat float parameters."""
    floats = [state[k].detach().cpu().double().reshape(-1) for k in sorted(state) if state[k].is_floating_point()]
    flat = torch.cat(floats).numpy()
    idx = np.random.default_rng(0).choice(flat.size, size=min(SAMPLE, flat.size), replace=False)
    return {
        "sha256": _tensor_digest(state),
        "sums": {k: float(state[k].double().sum()) for k in sorted(state) if state[k].is_floating_point()},
        "size": int(flat.size),
        "sample": [float(flat[i]) for i in np.sort(idx)],
    }


def _final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    if not (run_dir / "model.pt").is_file():  # FED-FBD keeps a warehouse of colors, not one model
        saved = torch.load(run_dir / "warehouse.pt", map_location="cpu", weights_only=True)
        return {f"{color}/{name}": t for color, state in enumerate(saved["states"]) for name, t in state.items()}
    return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)


def _serve(cfg: dict, hospitals: int) -> Path:
    from hospitrust.ops.inprocess import run_inprocess

    run_inprocess(cfg, hospitals)
    return Path(cfg["output-dir"]) / cfg["run-name"]


def _run(name: str, tmp_path: Path) -> Path:
    if name == RESUMED:
        cfg = small_run_config(tmp_path, strategy="hta", **{"run-name": name, "num-server-rounds": 1})
        run_dir = _serve(cfg, 4)
        return _serve({**cfg, "num-server-rounds": 2, "resume-from": str(run_dir)}, 4)
    hospitals, overrides = RUNS[name]
    return _serve(small_run_config(tmp_path, **{"run-name": name, **overrides}), hospitals)


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS, RESUMED])
def test_final_model_is_unchanged(name, tmp_path, data_dir, one_thread, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, also on a machine with a GPU
    got = _fingerprint(_final_state(_run(name, tmp_path)))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    if RECORD:
        golden[name] = {**got, "torch": torch.__version__.split("+")[0]}
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    assert name in golden, f"no golden entry for {name!r}: record it with HOSPITRUST_RECORD_GOLDEN=1"
    want = golden[name]
    if torch.__version__.split("+")[0] == want.get("torch", CI_TORCH):
        assert got["sha256"] == want["sha256"], f"{name}: the final model changed"
        return
    print(f"{name}: torch {torch.__version__} is not the recording build {want.get('torch')}: "
          f"comparing {len(want['sample'])} parameters and every tensor's sum within 1e-6 instead of the hash")
    assert got["size"] == want["size"]
    np.testing.assert_allclose(got["sample"], want["sample"], atol=1e-6, rtol=0)
    assert got["sums"].keys() == want["sums"].keys()
    np.testing.assert_allclose(list(got["sums"].values()), list(want["sums"].values()), atol=1e-6 * 1e3, rtol=1e-6)

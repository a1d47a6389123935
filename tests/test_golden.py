"""Behaviour kept across refactors: the final model of a fixed set of short in-process runs.

Each run's final model is reduced to a fingerprint (``tests/golden/final_models.json``):

- a sha256 of its tensors (name, dtype, shape, bytes, in name order), recorded **per platform**:
  the bit-exact result depends on the torch build and on the CPU kernels it dispatches to
  (ATen's CPU capability, oneDNN and MKL pick code by instruction set), so a hash is asserted only
  on a platform it was recorded on;
- every float tensor's sum and a fixed sample of the flat parameters, compared everywhere else
  within tolerances far below what a real change moves (``test_a_real_change_fails_the_tolerance_path``
  perturbs a rule's output by 1e-4 and sees this comparison fail).

The test says which comparison it made. All runs are on the CPU with one thread.

The any-CPU guard (``test_final_model_from_a_jittered_start_passes_the_tolerance_path``): every run again with its
initial model moved by about one float32 rounding (what another CPU's kernels do to the first step); it must pass
the comparison used off the recording platforms, so that comparison cannot be tighter than the arithmetic.

A change that alters one of these runs on purpose re-records it in the same commit and says why:
``HOSPITRUST_RECORD_GOLDEN=1 python -m pytest tests/test_golden.py`` (this platform's hashes and the
fingerprints; other platforms' hashes of the re-recorded runs are dropped, they are stale). To add
this platform's hashes without changing behaviour, ``HOSPITRUST_RECORD_GOLDEN=platform``: it records
only runs that already pass the tolerance comparison.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import JITTER, REPO, jitter, small_run_config

GOLDEN = Path(__file__).parent / "golden" / "final_models.json"
RECORD = os.environ.get("HOSPITRUST_RECORD_GOLDEN", "")
SAMPLE = 256  # parameters compared one by one off the recording platforms
SAMPLE_ATOL = 1e-6  # off-platform differences measured: at most 1.9e-9 (samples), 2.4e-6 (sums)
SUM_ATOL, SUM_RTOL = 1e-3, 1e-6
# the instruction-set flags that change which CPU kernels torch, oneDNN and MKL run
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")

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


def platform() -> dict:
    """What decides the bit-exact result on the CPU: the torch build, its kernel libraries, the ISA."""
    config = torch.__config__.show()
    versions = {lib: next((line.split(lib, 1)[1].strip(" v").split()[0] for line in config.splitlines() if lib in line), "")
                for lib in ("MKL-DNN", "Math Kernel Library Version")}
    flags: set[str] = set()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"torch": torch.__version__, "aten-cpu-capability": torch.backends.cpu.get_cpu_capability(),
            "onednn": versions["MKL-DNN"], "mkl": versions["Math Kernel Library Version"],
            "isa": sorted(f for f in ISA_FLAGS if f in flags), "dnnl-max-cpu-isa": os.environ.get("DNNL_MAX_CPU_ISA", "")}


def platform_id(desc: dict) -> str:
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


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


def within_tolerance(name: str, got: dict, want: dict) -> None:
    """Raise AssertionError unless ``got`` matches the recorded sums and sample within the tolerances."""
    assert got["size"] == want["size"], f"{name}: {got['size']} parameters, recorded {want['size']}"
    assert got["sums"].keys() == want["sums"].keys(), f"{name}: other tensors than recorded"
    np.testing.assert_allclose(got["sample"], want["sample"], atol=SAMPLE_ATOL, rtol=0,
                               err_msg=f"{name}: the final model changed (sampled parameters)")
    np.testing.assert_allclose(list(got["sums"].values()), list(want["sums"].values()), atol=SUM_ATOL, rtol=SUM_RTOL,
                               err_msg=f"{name}: the final model changed (tensor sums)")


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


def _record(name: str, got: dict, golden: dict) -> None:
    here = platform()
    pid = platform_id(here)
    fingerprints, platforms = golden.setdefault("fingerprints", {}), golden.setdefault("platforms", {})
    if RECORD == "platform":  # same behaviour, another platform: only what passes the tolerance comparison
        within_tolerance(name, got, fingerprints[name])
    else:  # a deliberate change: new fingerprint, and every other platform's hash of this run is stale
        fingerprints[name] = {k: got[k] for k in ("size", "sums", "sample")}
        for entry in platforms.values():
            entry["sha256"].pop(name, None)
    platforms.setdefault(pid, {"platform": here, "sha256": {}})["sha256"][name] = got["sha256"]
    golden["platforms"] = {k: v for k, v in platforms.items() if v["sha256"]}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS, RESUMED])
def test_final_model_is_unchanged(name, tmp_path, data_dir, one_thread, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, also on a machine with a GPU
    got = _fingerprint(_final_state(_run(name, tmp_path)))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    if RECORD:
        _record(name, got, golden)
        return
    assert name in golden.get("fingerprints", {}), f"no golden entry for {name!r}: record it with HOSPITRUST_RECORD_GOLDEN=1"
    recorded = golden["platforms"].get(platform_id(platform()), {}).get("sha256", {})
    if name in recorded:
        print(f"{name}: bit-exact comparison (this platform was recorded)")
        assert got["sha256"] == recorded[name], f"{name}: the final model changed (sha256 on its recording platform)"
        return
    print(f"{name}: this platform ({platform()}) was not recorded: comparing {SAMPLE} parameters within "
          f"{SAMPLE_ATOL:g} and every tensor's sum instead of the hash")
    within_tolerance(name, got, golden["fingerprints"][name])


def _jittered_initial_models(monkeypatch) -> None:
    """Every model the run builds starts with its float parameters jittered by ``JITTER`` relative (the
    server's initial model, FED-FBD's colors; hospitals and evaluators then take the server's weights)."""
    import hospitrust.fbd.warehouse
    import hospitrust.tasks.model
    from hospitrust.models import build_model

    def jittered(*args, **kwargs):
        model = build_model(*args, **kwargs)
        with torch.no_grad():
            for k, p in enumerate(model.parameters()):
                p.copy_(jitter(p, JITTER, seed=k))
        return model

    for module in (hospitrust.tasks.model, hospitrust.fbd.warehouse):
        monkeypatch.setattr(module, "build_model", jittered)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS, RESUMED])
def test_final_model_from_a_jittered_start_passes_the_tolerance_path(name, tmp_path, data_dir, one_thread, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    _jittered_initial_models(monkeypatch)
    got = _fingerprint(_final_state(_run(name, tmp_path)))
    want = json.loads(GOLDEN.read_text())["fingerprints"][name]
    assert got["sha256"] not in json.dumps(json.loads(GOLDEN.read_text())["platforms"]), "the jitter changed nothing"
    within_tolerance(name, got, want)


@pytest.mark.slow
def test_a_real_change_fails_the_tolerance_path(tmp_path, data_dir, one_thread, monkeypatch):
    """The comparison used off the recording platforms still sees a change of 1e-4 in a rule's output."""
    from hospitrust.strategies.fedavg import FedAvg

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    aggregate = FedAvg.aggregate

    def nudged(self, *args, **kwargs):
        out = aggregate(self, *args, **kwargs)
        out.update.add_(1e-4)
        return out

    monkeypatch.setattr(FedAvg, "aggregate", nudged)
    got = _fingerprint(_final_state(_run("fedavg", tmp_path)))
    want = json.loads(GOLDEN.read_text())["fingerprints"]["fedavg"]
    with pytest.raises(AssertionError, match="the final model changed"):
        within_tolerance("fedavg", got, want)


@pytest.mark.slow
def test_another_platform_passes_by_tolerance(tmp_path, data_dir):
    """ATen's portable kernels (``ATEN_CPU_CAPABILITY=default``) make another platform: the run's hash
    is not this platform's, and the golden test passes there through the tolerance comparison."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", PYTHONUNBUFFERED="1")
    env.pop("HOSPITRUST_RECORD_GOLDEN", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--basetemp", str(tmp_path),
                          f"{Path(__file__).name}::test_final_model_is_unchanged[fedavg]"],
                         cwd=REPO / "tests", env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "'aten-cpu-capability': 'DEFAULT'" in res.stdout and "was not recorded" in res.stdout, res.stdout[-3000:]

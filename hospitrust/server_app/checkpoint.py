"""Server state checkpoint: one file per run, rewritten after every round, so a stopped
run continues where it stopped (run config ``resume-from``).

``<run dir>/checkpoint.pt`` holds the global model, the last finished round, the
strategy's state across rounds (sampling RNG, trust, reputation, history: keyed by
hospital name, since node ids change when SuperNodes reconnect), the round records so
far and the server's RNG states. Everything a round computes is seeded by (seed,
hospital, round), so a resumed run ends with the same model as an unbroken one.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hospitrust.config import legacy
from hospitrust.config.run import run_config_defaults

CHECKPOINT_FILE = "checkpoint.pt"
#: 2: plain types and tensors only, read with ``torch.load(weights_only=True)`` (1 was a pickle)
FORMAT = 2
_NDARRAY = "__ndarray__"  # how a numpy array is stored: a tensor of its bytes, with dtype and shape
# run config keys that may differ between a run and its continuation: everything else
# changes what the rounds compute, so a resume with a different value is refused
MAY_DIFFER = frozenset({
    "num-server-rounds", "resume-from", "output-dir", "run-name", "reply-timeout", "min-hospitals", "data-dir", "app-signature",
    "checkpoint", "aggregation.backend",  # eager and compiled kernels compute the same values
})


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not belong to this run config."""


def to_plain(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` with numpy arrays and scalars turned into what ``weights_only`` loading accepts (tensors,
    plain containers and scalars); TypeError naming the path of anything else.
    """
    if isinstance(obj, np.generic):  # before float: np.float64 is a float subclass, pickled as a numpy scalar
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, np.ndarray):
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(obj).view(np.uint8).reshape(-1).copy()),
                "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int)) else to_plain(k, where): to_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{where}: a {type(obj).__name__} cannot go in a checkpoint (tensors, numpy arrays and plain types only)")


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`."""
    if isinstance(obj, dict):
        if _NDARRAY in obj:
            raw = obj[_NDARRAY].numpy().tobytes()
            return np.frombuffer(raw, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj


def rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_checkpoint(run_dir: str | Path, *, round: int, model_state: dict[str, torch.Tensor], strategy_name: str,
                    strategy_state: dict[str, Any], config: dict[str, Any], history: list[dict[str, Any]],
                    features: dict[str, dict[str, Any]] | None = None, resumed_at: list[int] | None = None) -> Path:
    """Write the checkpoint atomically (a crash mid-write leaves the previous one intact); ``features``:
    each round feature's state by its name.
    """
    target = Path(run_dir) / CHECKPOINT_FILE
    tmp = target.with_suffix(".pt.tmp")
    torch.save(to_plain({
        "format": FORMAT,
        "round": int(round),
        "model": {k: v.detach().cpu().clone() for k, v in model_state.items()},
        "strategy": strategy_name,
        "strategy_state": strategy_state,
        "config": dict(config),
        "history": history,
        "features": dict(features or {}),
        "rng": rng_states(),
        "resumed_at": list(resumed_at or []),
    }), tmp)
    os.replace(tmp, target)
    return target


def checkpoint_path(resume_from: str | Path) -> Path:
    """``resume-from`` names a run directory or the checkpoint file itself."""
    path = Path(resume_from).expanduser().resolve()
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(f"resume-from {str(resume_from)!r}: no checkpoint at {path} "
                              f"(expected a run directory holding {CHECKPOINT_FILE}, or the file itself)")
    return path


def load_checkpoint(resume_from: str | Path) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)``: tensors and plain types only, so a
    crafted file cannot run code. A file that needs more (a checkpoint of an earlier hospitrust,
    or one that holds code) is refused, naming ``hospitrust checkpoint upgrade``.
    """
    path = checkpoint_path(resume_from)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):  # not a pickle at all (truncated, another file)
            raise CheckpointError(f"resume-from: cannot read {path}: not a torch checkpoint ({str(exc).splitlines()[-1][:200]})"
                                  ) from None
        # a global outside the weights-only allowlist: an earlier format's numpy arrays, or code
        raise CheckpointError(
            f"resume-from: {path} holds more than tensors and plain types (written by hospitrust before checkpoint "
            f"format {FORMAT}, or crafted to run code), so it is not loaded. If you trust the file, convert it once "
            f"with `hospitrust checkpoint upgrade {path}`. ({_unsupported(exc)})") from None
    except Exception as exc:  # truncated or not a torch file
        raise CheckpointError(f"resume-from: cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"resume-from: {path} is not a hospitrust checkpoint (format {FORMAT})")
    ckpt = from_plain(raw)
    ckpt["path"] = path
    return ckpt


def _unsupported(exc: Exception) -> str:
    """The global torch refused to unpickle, from its message."""
    lines = [line.strip() for line in str(exc).splitlines() if "Unsupported global" in line]
    return (lines[0].split(" was not")[0] if lines else str(exc).splitlines()[0])[:200]


def upgrade_checkpoint(path: str | Path) -> Path:
    """Convert a format-1 checkpoint (a pickle, read with ``weights_only=False``: only for a file
    the operator trusts) to the current format, in place; the original is kept as ``.v1``.
    """
    path = checkpoint_path(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)  # trusted by the operator's confirmation
    if not isinstance(ckpt, dict) or ckpt.get("format") not in (1, FORMAT):
        raise CheckpointError(f"{path} is not a hospitrust checkpoint")
    if ckpt.get("format") == FORMAT:
        return path
    ckpt["format"] = FORMAT
    backup = path.with_suffix(path.suffix + ".v1")
    os.replace(path, backup)
    torch.save(to_plain(ckpt), path)
    return path


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to continue a run under a config that would compute different rounds (a checkpoint
    written with the old flat keys is read under their new names).
    """
    saved, _ = legacy.translate(saved)
    # a key added since the checkpoint was written compares as its default (it did not exist, so
    # the saved run computed as the default does)
    defaults = run_config_defaults()
    saved = {**{k: defaults[k] for k in set(current) - set(saved) if k in defaults}, **saved}
    keys = (set(saved) | set(current)) - MAY_DIFFER
    differ = sorted(k for k in keys if saved.get(k) != current.get(k))
    if differ:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in differ[:8])
        raise CheckpointError(f"resume-from: the run config differs from the checkpoint's in {len(differ)} key(s) "
                              f"({detail}); only {', '.join(sorted(MAY_DIFFER))} may change on resume")

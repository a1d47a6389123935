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
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hospitrust.config import legacy

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1
# run config keys that may differ between a run and its continuation: everything else
# changes what the rounds compute, so a resume with a different value is refused
MAY_DIFFER = frozenset({
    "num-server-rounds", "resume-from", "output-dir", "run-name", "reply-timeout", "min-hospitals", "data-dir",
    "checkpoint",
})


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not belong to this run config."""


def rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_checkpoint(run_dir: str | Path, *, round: int, model_state: dict[str, torch.Tensor], strategy_name: str,
                    strategy_state: dict[str, Any], config: dict[str, Any], history: list[dict[str, Any]],
                    flags_per_round: list[dict[str, bool]], resumed_at: list[int] | None = None) -> Path:
    """Write the checkpoint atomically (a crash mid-write leaves the previous one intact)."""
    target = Path(run_dir) / CHECKPOINT_FILE
    tmp = target.with_suffix(".pt.tmp")
    torch.save({
        "format": FORMAT,
        "round": int(round),
        "model": {k: v.detach().cpu().clone() for k, v in model_state.items()},
        "strategy": strategy_name,
        "strategy_state": strategy_state,
        "config": dict(config),
        "history": history,
        "flags_per_round": flags_per_round,
        "rng": rng_states(),
        "resumed_at": list(resumed_at or []),
    }, tmp)
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
    path = checkpoint_path(resume_from)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated or not a torch file
        raise CheckpointError(f"resume-from: cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"resume-from: {path} is not a hospitrust checkpoint (format {FORMAT})")
    ckpt["path"] = path
    return ckpt


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to continue a run under a config that would compute different rounds (a checkpoint
    written with the old flat keys is read under their new names).
    """
    saved, _ = legacy.translate(saved)
    keys = (set(saved) | set(current)) - MAY_DIFFER
    differ = sorted(k for k in keys if saved.get(k) != current.get(k))
    if differ:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in differ[:8])
        raise CheckpointError(f"resume-from: the run config differs from the checkpoint's in {len(differ)} key(s) "
                              f"({detail}); only {', '.join(sorted(MAY_DIFFER))} may change on resume")

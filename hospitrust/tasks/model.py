"""The task's model: built from the registry with the task's shape and normalization, and the
optional pretrained checkpoint the ServerApp starts round 1 from.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path

import torch

from hospitrust.errors import ConfigError
from hospitrust.models import build_model
from hospitrust.tasks.task import Task

#: A checkpoint whose matching tensors cover less than this share of the model is refused: it is
#: most likely another architecture.
MIN_PRETRAINED_SHARE = 0.5


def task_model(task: Task) -> torch.nn.Module:
    """A fresh model for ``task`` (random initialization).

    Parameters
    ----------
    task : Task
        The run's task (model name, channels, classes, image size, normalization).

    Returns
    -------
    torch.nn.Module
        The model; a non-default normalization is applied by a forward pre-hook.
    """
    normalization = None if task.default_normalization else task.normalization()
    return build_model(task.model, task.channels, task.num_classes, task.image_size, normalization=normalization)


def load_pretrained(model: torch.nn.Module, path: str) -> tuple[list[str], list[str]]:
    """Load a checkpoint's tensors into ``model`` where name and shape match.

    Read with ``torch.load(weights_only=True)``: a checkpoint cannot run code. It may be a
    state dict, or a dict holding one under ``state_dict`` or ``model`` (as training scripts save
    them). Tensors of another shape (a 1000-class ImageNet head, an RGB stem for grey images) are
    left at their initialization and listed.

    Parameters
    ----------
    model : torch.nn.Module
        The task's model, changed in place.
    path : str
        The checkpoint file on the SuperLink machine.

    Returns
    -------
    tuple[list[str], list[str]]
        The names loaded, and the model's names left as initialized.
    """
    from flwr.common import log

    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task.pretrained {path!r}: no such file on the SuperLink machine")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle with code, a corrupt file, not a torch file
        raise ConfigError(f"task.pretrained {p}: not loadable with torch.load(weights_only=True) ({exc})"[:600]) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"task.pretrained {p}: expected a state dict (parameter name -> tensor)")
    own = model.state_dict()
    loaded = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    params = sum(own[k].numel() for k in own)
    share = sum(own[k].numel() for k in loaded) / max(params, 1)
    if share < MIN_PRETRAINED_SHARE:
        raise ConfigError(f"task.pretrained {p}: only {share:.0%} of model {type(model).__name__}'s values match the "
                          f"checkpoint's names and shapes (e.g. {sorted(state)[:3]} vs {sorted(own)[:3]}): another "
                          "architecture?")
    model.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in loaded.items()}}, strict=True)
    skipped = sorted(k for k in own if k not in loaded)
    log(INFO, "hospitrust: pretrained %s: %d tensors loaded (%.0f%% of the values); left initialized: %s", p,
        len(loaded), 100 * share, ", ".join(skipped) or "none")
    return sorted(loaded), skipped

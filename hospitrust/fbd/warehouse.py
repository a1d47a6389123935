"""The warehouse: N colors, each a complete model assembled from one version of every block.

The server keeps it; hospitals get only their colors' blocks. A write replaces a block
version outright (no averaging) and stamps the new version (hash, trail, influences).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from hospitrust.fbd.blocks import block_of_keys, blocks_for
from hospitrust.fbd.stamps import block_hash
from hospitrust.models import build_model
from hospitrust.models.training import seed_everything

INIT_WRITER = "init"


def color_key(color: int, key: str) -> str:
    """The ArrayRecord key of one tensor of one color: ``color-3/layer1.0.conv1.weight``.

    Parameters
    ----------
    color : int
        The color.
    key : str
        The tensor's state-dict key.

    Returns
    -------
    str
        ``color-<color>/<key>``.
    """
    return f"color-{int(color)}/{key}"


def parse_color_key(name: str) -> tuple[int, str] | None:
    """``'color-3/fc.weight'`` -> ``(3, 'fc.weight')``; anything else -> None.

    Parameters
    ----------
    name : str
        An ArrayRecord key.

    Returns
    -------
    tuple[int, str] or None
        ``(color, state-dict key)``, or None when ``name`` is not a color key.
    """
    head, sep, key = str(name).partition("/")
    if not sep or not head.startswith("color-") or not head[6:].isdigit() or not key:
        return None
    return int(head[6:]), key


@dataclass
class BlockVersion:
    """The stamp of one block version in one color: its hash and provenance.

    Parameters
    ----------
    hash : str
        sha256 of the block's tensors (:func:`~hospitrust.fbd.stamps.block_hash`).
    trail : list[str]
        Hospitals that wrote this block position in this color, oldest first.
    influences : list[str]
        Hospitals whose data reached this version (writes and distillation).
    round : int
        The server round it was written in (0: the initial model).
    writer : str
        Who wrote it: a hospital, ``"init"``, or ``"unlearn:<hospital>"``.
    """

    hash: str
    trail: list[str]  # hospitals that wrote this block position in this color, oldest first
    influences: list[str]  # hospitals whose data reached this version (writes and distillation)
    round: int
    writer: str


class Warehouse:
    """``num_colors`` complete models of one architecture, cut into the same blocks.

    Parameters
    ----------
    model_name : str
        The architecture's registry name (it must have a block cut).
    in_channels : int
        Image channels.
    num_classes : int
        Classes.
    image_size : int
        Image side in pixels.
    states : list[dict[str, torch.Tensor]]
        One full state dict per color (same keys; copied to the CPU).
    meta : dict[tuple[int, str], BlockVersion] or None
        (color, block) -> its stamp; a missing one is stamped as the initial version.
    """

    def __init__(self, model_name: str, in_channels: int, num_classes: int, image_size: int,
                 states: list[dict[str, torch.Tensor]], meta: dict[tuple[int, str], BlockVersion] | None = None) -> None:
        if not states:
            raise ValueError("a warehouse needs at least one color")
        self.model_name, self.in_channels, self.num_classes, self.image_size = model_name, in_channels, num_classes, image_size
        self.blocks = blocks_for(model_name)
        self.keys = list(states[0])
        self.block_keys = block_of_keys(self.keys, self.blocks)
        for m, s in enumerate(states):
            if list(s) != self.keys:
                raise ValueError(f"color {m} has different state-dict keys from color 0")
        self.states = [{k: v.detach().cpu().clone() for k, v in s.items()} for s in states]
        self.meta: dict[tuple[int, str], BlockVersion] = dict(meta or {})
        for m in range(self.num_colors):
            for b in self.block_names:
                if (m, b) not in self.meta:
                    self.meta[(m, b)] = BlockVersion(block_hash(self.block(m, b)), [], [], 0, INIT_WRITER)

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, model_name: str, in_channels: int, num_classes: int, image_size: int, num_colors: int,
               seed: int, shared_init: bool = True) -> "Warehouse":
        """Every color starts from the same initial model (``shared_init``, the default) and
        diverges through its writers' data; unlearning averages colors, and averaging weights
        is only meaningful between models with a common starting point (independently
        initialized networks average to noise). ``shared_init=False`` seeds each color apart.
        """
        states = []
        for m in range(num_colors):
            if m == 0 or not shared_init:
                seed_everything(seed, 0xFBD, 0 if shared_init else m)
                model = build_model(model_name, in_channels, num_classes, image_size)
            states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        return cls(model_name, in_channels, num_classes, image_size, states)

    # ---- views ---------------------------------------------------------------------------------
    @property
    def num_colors(self) -> int:
        return len(self.states)

    @property
    def block_names(self) -> list[str]:
        return list(self.blocks)

    def block(self, color: int, block: str) -> dict[str, torch.Tensor]:
        return {k: self.states[color][k] for k in self.block_keys[block]}

    def color_state(self, color: int) -> dict[str, torch.Tensor]:
        return dict(self.states[color])

    def hashes(self) -> dict[str, str]:
        """``'color/block'`` -> sha256 of the current version."""
        return {f"{m}/{b}": self.meta[(m, b)].hash for m in range(self.num_colors) for b in self.block_names}

    def color_influences(self, color: int) -> set[str]:
        return set().union(*(self.meta[(color, b)].influences for b in self.block_names))

    def written_by(self, hospital: str) -> list[tuple[int, str]]:
        """Block versions whose trail names ``hospital``."""
        return [(m, b) for (m, b), v in sorted(self.meta.items()) if hospital in v.trail]

    def reached_by(self, hospital: str) -> list[tuple[int, str]]:
        """Block versions carrying ``hospital``'s information (written or distilled)."""
        return [(m, b) for (m, b), v in sorted(self.meta.items()) if hospital in v.trail or hospital in v.influences]

    def model(self, color: int) -> torch.nn.Module:
        model = build_model(self.model_name, self.in_channels, self.num_classes, self.image_size)
        model.load_state_dict(self.states[color], strict=True)
        return model

    def to_arrays(self, colors: Iterable[int] | None = None) -> ArrayRecord:
        colors = range(self.num_colors) if colors is None else colors
        return ArrayRecord({color_key(m, k): v for m in colors for k, v in self.states[m].items()})

    # ---- writes ----------------------------------------------------------------------------------
    def write_block(self, color: int, block: str, tensors: Mapping[str, torch.Tensor], *, writer: str, server_round: int,
                    trail: list[str], influences: set[str] | list[str], copy: bool = True,
                    content_hash: str | None = None) -> dict[str, Any]:
        """Direct replacement of one block version; returns its stamp (for the log).

        Stored tensors are never modified in place (a write swaps them), so ``copy=False``
        may hand over fresh tensors, shared between colors; ``content_hash`` skips hashing
        tensors whose hash is known.
        """
        want = self.block_keys[block]
        if set(tensors) != set(want):
            raise ValueError(f"block {block!r} needs keys {want}, got {sorted(tensors)}")
        for k in want:
            t = tensors[k].detach().cpu()
            self.states[color][k] = t.clone() if copy else t
        version = BlockVersion(content_hash or block_hash(self.block(color, block)), list(trail),
                               sorted(set(influences)), int(server_round), writer)
        previous = self.meta[(color, block)].hash
        self.meta[(color, block)] = version
        return {"round": int(server_round), "color": int(color), "block": block, "hash": version.hash,
                "previous_hash": previous, "writer": writer, "trail": version.trail, "influences": version.influences}

    def init_stamps(self) -> list[dict[str, Any]]:
        return [{"round": 0, "color": m, "block": b, "hash": self.meta[(m, b)].hash, "previous_hash": None,
                 "writer": INIT_WRITER, "trail": [], "influences": []}
                for m in range(self.num_colors) for b in self.block_names]

    # ---- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "hospitrust-fbd-warehouse/1",
            "model": self.model_name,
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
            "image_size": self.image_size,
            "states": self.states,
            "meta": {f"{m}/{b}": vars(v) for (m, b), v in self.meta.items()},
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.to_dict(), tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Warehouse":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no warehouse at {path}")
        data = torch.load(path, map_location="cpu", weights_only=True)
        if data.get("format") != "hospitrust-fbd-warehouse/1":
            raise ValueError(f"{path} is not a hospitrust FBD warehouse (format {data.get('format')!r})")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Warehouse":
        """The warehouse :meth:`to_dict` described (a checkpoint's copy).

        Parameters
        ----------
        data : dict
            What :meth:`to_dict` returned.

        Returns
        -------
        Warehouse
            A warehouse with those colors and stamps.
        """
        meta = {}
        for name, v in data["meta"].items():
            m, b = name.split("/", 1)
            meta[(int(m), b)] = BlockVersion(**v)
        return cls(data["model"], int(data["in_channels"]), int(data["num_classes"]), int(data["image_size"]),
                   data["states"], meta)

    def copy(self) -> "Warehouse":
        """A new warehouse sharing the (never mutated in place) tensors: writes to either one
        leave the other as it was.
        """
        new = Warehouse.__new__(Warehouse)
        new.__dict__.update(self.__dict__)
        new.states = [dict(s) for s in self.states]
        new.meta = {k: BlockVersion(v.hash, list(v.trail), list(v.influences), v.round, v.writer)
                    for k, v in self.meta.items()}
        return new

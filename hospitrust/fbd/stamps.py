"""Contributor stamping: a content hash per block version, and an append-only stamp log.

Every version of a block (one block position in one color) carries:

- ``hash``: sha256 over its tensors, in key order, of each key, dtype, shape and raw bytes
  (so a bit-identical block has the same hash on any machine);
- ``trail``: the hospitals that wrote this block position in this color, oldest first
  (a version replaced by unlearning gets its donors' trails);
- ``influences``: every hospital whose data reached this version, directly (a write) or
  through the sibling color a writer distilled from (the KL term).

The log (``fbd_stamps.jsonl`` in the run directory) gets one line per new version and is
only ever appended to, each line flushed to disk before the next write is accepted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

STAMP_LOG = "fbd_stamps.jsonl"


def block_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 of a block's tensors: each key, dtype, shape and the raw bytes, in key order.

    Parameters
    ----------
    tensors : Mapping[str, torch.Tensor]
        The block's entries, key -> tensor.

    Returns
    -------
    str
        The hex digest.
    """
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        # view as bytes: works for every dtype numpy lacks (e.g. bfloat16)
        if t.numel():
            # the buffer itself, no copy (the ignore: numpy's stub declares ndarray.__buffer__ for Python >= 3.12 only)
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    return h.hexdigest()


class StampLog:
    """Append-only JSON-lines log of block versions.

    Parameters
    ----------
    path : str or Path
        The log file (``fbd_stamps.jsonl``); created on the first append.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(dict(entry), sort_keys=True, allow_nan=False)
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def extend(self, entries) -> None:
        lines = [json.dumps(dict(e), sort_keys=True, allow_nan=False) for e in entries]
        if not lines:
            return
        with open(self.path, "a") as fh:
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path) as fh:
            return [json.loads(line) for line in fh if line.strip()]


"""Functional blocks: how a model's state dict is cut into named, separately owned pieces.

A block is a tuple of module-name prefixes; a state-dict key belongs to the block whose
prefix it starts with (``layer1.0.conv1.weight`` -> ``layer1``). Every key of the model
must fall in exactly one block, or the cut is rejected.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hospitrust.models.resnet import RESNET_BLOCKS

# The small CNN is cut too, so that block ownership can be tested and swept in seconds on a
# CPU; ResNet-18 (stem, layer1..layer4, head) is the model of the FED-FBD paper.
SMALL_CNN_BLOCKS: dict[str, tuple[str, ...]] = {
    "stem": ("features.0", "features.1"),
    "conv2": ("features.4", "features.5"),
    "neck": ("classifier.1",),
    "head": ("classifier.4",),
}

MODEL_BLOCKS: dict[str, dict[str, tuple[str, ...]]] = {"resnet18": RESNET_BLOCKS, "resnet18-gn": RESNET_BLOCKS,
                                                     "small-cnn": SMALL_CNN_BLOCKS}


def blocks_for(model_name: str) -> dict[str, tuple[str, ...]]:
    """The block cut of a registered model; a model without one fails with the allowed names.

    Parameters
    ----------
    model_name : str
        A model registry name (``"resnet18"``, ``"small-cnn"``).

    Returns
    -------
    dict[str, tuple[str, ...]]
        Block name -> its module-name prefixes.
    """
    try:
        return MODEL_BLOCKS[model_name]
    except KeyError:
        raise ValueError(
            f"model {model_name!r} has no functional-block cut for strategy fbd; allowed: {', '.join(sorted(MODEL_BLOCKS))}"
        ) from None


def _matches(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def block_of_keys(keys, blocks: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Block name -> its state-dict keys (in the given order). Raises ValueError when a key is
    in no block or in two.

    Parameters
    ----------
    keys : Iterable[str]
        State-dict keys.
    blocks : Mapping[str, tuple[str, ...]]
        Block name -> its module-name prefixes (:func:`blocks_for`).

    Returns
    -------
    dict[str, list[str]]
        Block name -> its keys.
    """
    out: dict[str, list[str]] = {b: [] for b in blocks}
    for key in keys:
        owners = [b for b, prefixes in blocks.items() if any(_matches(key, p) for p in prefixes)]
        if len(owners) != 1:
            what = "no block" if not owners else f"several blocks {owners}"
            raise ValueError(f"state-dict key {key!r} falls in {what}; blocks: {dict(blocks)}")
        out[owners[0]].append(key)
    empty = [b for b, ks in out.items() if not ks]
    if empty:
        raise ValueError(f"blocks {empty} match no state-dict key; check the block prefixes")
    return out


def split_state(state: Mapping[str, torch.Tensor], blocks: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, torch.Tensor]]:
    """A full state dict -> {block: {key: tensor}}.

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        A model's full state dict.
    blocks : Mapping[str, tuple[str, ...]]
        Block name -> its module-name prefixes.

    Returns
    -------
    dict[str, dict[str, torch.Tensor]]
        Block name -> its entries (the same tensors, not copies).
    """
    return {b: {k: state[k] for k in ks} for b, ks in block_of_keys(list(state), blocks).items()}

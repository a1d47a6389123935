"""Model registry: a name in the run config -> a torch module for the dataset's shape."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from hospitrust.models.resnet import resnet18
from hospitrust.models.small_cnn import SmallCNN

ModelFactory = Callable[[int, int, int], nn.Module]

# name -> factory(in_channels, num_classes, image_size)
MODELS: dict[str, ModelFactory] = {
    "small-cnn": lambda c, k, s: SmallCNN(c, k, s),
    "resnet18": lambda c, k, s: resnet18(c, k, s),
}


def build_model(name: str, in_channels: int, num_classes: int, image_size: int = 28) -> nn.Module:
    """Build a registered model; unknown names fail with the allowed list."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}") from None
    return factory(in_channels, num_classes, image_size)


__all__ = ["MODELS", "build_model", "SmallCNN", "resnet18"]

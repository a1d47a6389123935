"""Model registry: a name in the run config -> a torch module for the dataset's shape."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from hospitrust.models.resnet import resnet18, resnet18_groupnorm
from hospitrust.models.small_cnn import SmallCNN

ModelFactory = Callable[[int, int, int], nn.Module]

# name -> factory(in_channels, num_classes, image_size)
MODELS: dict[str, ModelFactory] = {
    "small-cnn": lambda c, k, s: SmallCNN(c, k, s),
    # the same two blocks at a quarter of the widths (about 1/12 of the arithmetic): the leaderboard's grids
    "tiny-cnn": lambda c, k, s: SmallCNN(c, k, s, widths=(8, 16), hidden=32, groups=4),
    "resnet18": lambda c, k, s: resnet18(c, k, s),
    # BatchNorm -> GroupNorm (Opacus's ModuleValidator.fix): the ResNet-18 local differential privacy can train
    "resnet18-gn": lambda c, k, s: resnet18_groupnorm(c, k, s),
}


def build_model(name: str, in_channels: int, num_classes: int, image_size: int = 28,
                normalization: tuple[list[float], list[float]] | None = None) -> nn.Module:
    """Build a registered model; unknown names fail with the allowed list.

    ``normalization`` (mean, std per channel on [0, 1]): the model's input is renormalized from
    the [-1, 1] batches the training code makes (a forward pre-hook: nothing in the state dict).
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}") from None
    model = factory(in_channels, num_classes, image_size)
    if normalization is not None:
        mean, std = normalization
        if len(mean) != in_channels or len(std) != in_channels:
            raise ValueError(f"normalization needs one mean and std per channel ({in_channels}), got {mean} and {std}")
        model.register_forward_pre_hook(_Renormalize(mean, std))
    return model


class _Renormalize:
    """Batches in [-1, 1] -> (x01 - mean) / std per channel: a task's own normalization."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        mean, std = self.mean.to(x.device, x.dtype), self.std.to(x.device, x.dtype)
        return ((x + 1.0) * 0.5 - mean) / std, *args[1:]


__all__ = ["MODELS", "build_model", "SmallCNN", "resnet18", "resnet18_groupnorm"]

"""ResNet-18 from torchvision, with the stem adapted to small MedMNIST images."""

from __future__ import annotations

import torch.nn as nn

# The functional blocks, in forward order (stem, four residual stages, head); block
# ownership (FED-FBD) cuts the model along these names.
RESNET_BLOCKS: dict[str, tuple[str, ...]] = {
    "stem": ("conv1", "bn1"),
    "layer1": ("layer1",),
    "layer2": ("layer2",),
    "layer3": ("layer3",),
    "layer4": ("layer4",),
    "head": ("fc",),
}


def resnet18(in_channels: int, num_classes: int, image_size: int = 28) -> nn.Module:
    """Torchvision ResNet-18, untrained.

    At 28 and 64 pixels the 7x7/stride-2 stem and the max-pool would shrink the image to
    almost nothing before layer1, so (as in MedMNIST v2's ResNet-18 (28)) the stem is a
    3x3/stride-1 convolution without max-pool. At 128 and 224 the ImageNet stem is kept,
    with its input channels set to the dataset's.
    """
    from hospitrust.envcheck import require_torch_pair

    require_torch_pair()  # a torchvision of another build: one line, not "operator torchvision::nms does not exist"
    # imported here: torchvision costs seconds of start-up, and most runs use the small CNN
    from torchvision.models import resnet18 as tv_resnet18

    model = tv_resnet18(weights=None, num_classes=num_classes)
    if image_size <= 64:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def resnet18_groupnorm(in_channels: int, num_classes: int, image_size: int = 28) -> nn.Module:
    """ResNet-18 as above, made trainable with per-sample gradients (local differential privacy):
    Opacus's ``ModuleValidator.fix`` replaces every BatchNorm by a GroupNorm of min(32, C) groups
    (batch statistics mix examples, so a per-example gradient and its clipping are undefined
    under BatchNorm). Its state dict has no running statistics; FED-FBD's blocks keep their names.
    """
    from opacus.validators import ModuleValidator

    return ModuleValidator.fix(resnet18(in_channels, num_classes, image_size))

"""The model registry's architectures: shapes and sizes by hand."""

from __future__ import annotations

import pytest
import torch

from hospitrust.models import MODELS, build_model


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_small_cnn_keeps_its_size():
    # conv 1->32 (3x3): 320; GroupNorm(8, 32): 64; conv 32->64: 18,496; GroupNorm(8, 64): 128;
    # linear 3136->128: 401,536; linear 128->2: 258
    assert _parameters(build_model("small-cnn", 1, 2, 28)) == 320 + 64 + 18_496 + 128 + 401_536 + 258


def test_the_tiny_cnn_is_the_same_chain_at_a_quarter_of_the_widths():
    model = build_model("tiny-cnn", 1, 2, 28)
    # conv 1->8: 80; GroupNorm(4, 8): 16; conv 8->16: 1,168; GroupNorm(4, 16): 32; linear 784->32: 25,120; 32->2: 66
    assert _parameters(model) == 80 + 16 + 1_168 + 32 + 25_120 + 66
    kinds = [type(m).__name__ for m in model.modules() if not list(m.children())]
    small = [type(m).__name__ for m in build_model("small-cnn", 1, 2, 28).modules() if not list(m.children())]
    assert kinds == small
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 2)
    assert model(torch.zeros(2, 3, 64, 64)[:, :1]).shape == (2, 2)  # larger inputs pooled to 7x7 as in the small CNN


def test_an_unknown_model_names_the_registered_ones():
    with pytest.raises(ValueError, match="tiny-cnn"):
        build_model("huge-cnn", 1, 2, 28)
    assert {"small-cnn", "tiny-cnn"} <= set(MODELS)

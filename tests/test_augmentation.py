"""The batch affine augmentation (``affine-*`` items): its maps by hand, its resampling on images whose
result is known, its per-image draws and its errors."""

import math

import pytest
import torch

from hospitrust.models.augment import Augmentation, BatchAffine, augment_batch, parse_augmentation


def _fixed_rand(monkeypatch, rows):
    monkeypatch.setattr(torch, "rand", lambda n, k: torch.tensor(rows, dtype=torch.float32)[:n, :k])


def test_theta_by_hand(monkeypatch):
    # u = (angle 1 -> +30 deg, crop share 0 -> 0.25 so side 0.5, crop centre (1, 1) -> +0.5 each, shift 0.5 -> 0)
    _fixed_rand(monkeypatch, [[1.0, 0.0, 1.0, 1.0, 0.5, 0.5]])
    theta = BatchAffine(degrees=30, translate=0.1, crop=0.25).theta(1)[0]
    c, s = 0.5 * math.cos(math.pi / 6), 0.5 * math.sin(math.pi / 6)
    assert torch.allclose(theta, torch.tensor([[c, -s, 0.5], [s, c, 0.5]]), atol=1e-6)


def test_identity_parameters_return_the_batch_unchanged():
    images = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(BatchAffine()(images), images)


def test_a_shift_of_a_quarter_of_four_pixels_moves_a_pixel_by_one(monkeypatch):
    _fixed_rand(monkeypatch, [[0.5, 0.0, 0.5, 0.5, 1.0, 0.5]])  # shift +0.25 x size on x, none on y
    image = torch.zeros(1, 1, 4, 4, dtype=torch.uint8)
    image[0, 0, 1, 1] = 200
    out = BatchAffine(translate=0.25)(image)
    expected = torch.zeros_like(image)
    expected[0, 0, 1, 2] = 200
    assert torch.equal(out, expected)


def test_a_quarter_turn_is_rot90(monkeypatch):
    _fixed_rand(monkeypatch, [[1.0, 0.0, 0.5, 0.5, 0.5, 0.5]])  # +90 degrees, nothing else
    image = torch.arange(25, dtype=torch.uint8).reshape(1, 1, 5, 5) * 10
    out = BatchAffine(degrees=90)(image)
    assert torch.equal(out, torch.rot90(image, k=1, dims=(2, 3)))


def test_each_image_gets_its_own_draw_and_a_seed_repeats_them():
    images = torch.randint(0, 256, (1, 1, 28, 28), dtype=torch.uint8).repeat(8, 1, 1, 1)
    aug = parse_augmentation(["affine-rotation=15", "affine-translate=0.1", "affine-crop=0.8"], 28)
    torch.manual_seed(3)
    first = augment_batch(images, aug)
    assert len({bytes(img.numpy()) for img in first}) == 8
    torch.manual_seed(3)
    assert torch.equal(augment_batch(images, aug), first)
    assert first.dtype == torch.uint8 and first.shape == images.shape


def test_per_image_items_run_before_the_batch_affine_and_alone_stay_a_v2_transform():
    aug = parse_augmentation(["horizontal-flip", "affine-rotation=5"], 28)
    assert isinstance(aug, Augmentation) and aug.per_image is not None and aug.batch is not None
    assert not isinstance(parse_augmentation(["horizontal-flip", "rotation=5"], 28), Augmentation)
    one = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8)
    assert aug(one).shape == one.shape


@pytest.mark.parametrize("item, says", [("affine-crop=0", "(0, 1]"), ("affine-translate=1", "(0, 1)"),
                                        ("affine-rotation=-2", "> 0"), ("affine-rotation", "takes a value")])
def test_bad_affine_items_say_what_was_expected(item, says):
    with pytest.raises(ValueError, match=item.split("=")[0]) as err:
        parse_augmentation([item], 28)
    assert says in str(err.value)


def test_the_cost_benchmark_prints_both_paths_and_their_ratio(capsys):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("augmentation_cost", REPO / "benchmarks" / "augmentation_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--batches", "2", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "per image (v2)" in out and "batch affine" in out and "ratio per image / batch affine:" in out

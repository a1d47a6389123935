"""Data attacks: label flips, label noise, backdoor trigger, corruptions (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest

import hospitrust.attacks as A
from hospitrust.attacks.math import data as D


def _images(n=20, h=28, w=28, c=1, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # smooth-ish structured images in the mid range (so noise/blur/contrast all change them)
    yy, xx = np.mgrid[0:h, 0:w]
    base = 128 + 60 * np.sin(xx / 3.0) * np.cos(yy / 4.0)
    imgs = base[None, :, :, None] + rng.normal(0, 20, size=(n, h, w, c))
    return np.clip(imgs, 0, 255).astype(np.uint8)


# ====================================================================== label flips
def test_label_flips_hand_cases():
    labels = np.array([0, 1, 2, 1, 0], dtype=np.int64)
    keep = labels.copy()
    assert np.array_equal(D.flip_all_to_one(labels, 2), [2, 2, 2, 2, 2])
    assert np.array_equal(D.flip_source_to_target(labels, 1, 2), [0, 2, 2, 2, 0])
    assert np.array_equal(labels, keep)  # inputs untouched
    assert D.flip_all_to_one(labels, 2).dtype == np.int64
    with pytest.raises(ValueError, match="differ"):
        D.flip_source_to_target(labels, 1, 1)
    # MedMNIST-style (N, 1) labels keep their shape
    assert D.flip_source_to_target(labels[:, None], 0, 1).shape == (5, 1)


def test_flip_permutation_is_a_derangement():
    labels = np.repeat(np.arange(7), 3)
    for seed in range(20):
        out = D.flip_permutation(labels, 7, np.random.default_rng(seed))
        assert not np.any(out == labels)
        # a permutation: each class maps to one class, all classes used
        mapping = {int(a): int(b) for a, b in zip(labels, out)}
        assert sorted(mapping.values()) == list(range(7))
    assert np.array_equal(D.flip_permutation(np.array([0, 1, 1]), 2, np.random.default_rng(0)), [1, 0, 0])
    with pytest.raises(ValueError, match="labels must lie"):
        D.flip_permutation(np.array([0, 3]), 3, np.random.default_rng(0))


def test_symmetric_label_noise_rate_and_never_same_class():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, size=50_000)
    out = D.symmetric_label_noise(labels, 7, 0.3, np.random.default_rng(1))
    changed = out != labels
    assert abs(changed.mean() - 0.3) < 0.01
    # replaced labels are uniform over the 6 other classes (never the same class)
    moved = (out[changed] - labels[changed]) % 7
    assert moved.min() >= 1
    counts = np.bincount(moved, minlength=7)[1:]
    assert np.all(np.abs(counts / counts.sum() - 1 / 6) < 0.02)
    assert np.array_equal(D.symmetric_label_noise(labels, 7, 0.0, rng), labels)
    assert np.all(D.symmetric_label_noise(labels[:100], 7, 1.0, rng) != labels[:100])
    with pytest.raises(ValueError, match="rate"):
        D.symmetric_label_noise(labels, 7, 1.5, rng)


# ========================================================================= backdoor
def test_backdoor_trigger_location_fraction_and_labels():
    images = _images(n=40)
    labels = np.arange(40) % 3
    images_before, labels_before = images.copy(), labels.copy()
    out_i, out_l, mask = D.backdoor(images, labels, 2, 0.25, np.random.default_rng(0), patch_size=3)
    assert mask.sum() == round(0.25 * 40) == 10
    # the trigger: bottom-right 3x3 square of 255 on exactly the poisoned images
    assert np.all(out_i[mask, -3:, -3:, :] == 255)
    assert np.array_equal(out_i[mask, :-3, :, :], images[mask, :-3, :, :])
    assert np.array_equal(out_i[mask, :, :-3, :], images[mask, :, :-3, :])
    assert np.array_equal(out_i[~mask], images[~mask])
    # poisoned samples relabelled to target, the others untouched
    assert np.all(out_l[mask] == 2) and np.array_equal(out_l[~mask], labels[~mask])
    assert np.array_equal(images, images_before) and np.array_equal(labels, labels_before)
    # same seed, same poisoned set; fraction rounding
    _, _, mask2 = D.backdoor(images, labels, 2, 0.25, np.random.default_rng(0))
    assert np.array_equal(mask, mask2)
    assert D.backdoor(images, labels, 2, 0.0, np.random.default_rng(0))[2].sum() == 0
    assert D.backdoor(images, labels, 2, 1.0, np.random.default_rng(0))[2].all()
    assert D.backdoor(images[:7], labels[:7], 0, 0.3, np.random.default_rng(0))[2].sum() == round(0.3 * 7)


def test_apply_trigger_positions_and_rgb():
    images = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    t = D.apply_trigger(images, patch_size=2, patch_value=200, position="top-left")
    assert np.all(t[:, :2, :2, :] == 200) and t.sum() == 2 * 4 * 3 * 200
    assert images.sum() == 0
    br = D.apply_trigger(images)
    assert np.all(br[:, 5:, 5:, :] == 255) and br[:, :5].sum() == 0
    assert np.all(D.apply_trigger(images, 2, position=(1, 3))[:, 1:3, 3:5] == 255)
    with pytest.raises(ValueError, match="does not fit"):
        D.apply_trigger(images, patch_size=9)
    with pytest.raises(ValueError, match="position"):
        D.apply_trigger(images, position="middle")
    bd = A.Backdoor(target=1, poison_fraction=0.5, patch_size=2)
    assert np.array_equal(bd.trigger(images), D.apply_trigger(images, 2))


# ======================================================================= corruption
@pytest.mark.parametrize("kind", D.CORRUPTIONS)
@pytest.mark.parametrize("channels", [1, 3])
def test_corruption_monotone_in_severity_and_uint8(kind, channels):
    images = _images(n=16, c=channels)
    before = images.copy()
    changes = []
    for severity in range(1, 6):
        out = D.corrupt(images, kind, severity, np.random.default_rng(0))
        assert out.dtype == np.uint8 and out.shape == images.shape
        changes.append(np.abs(out.astype(np.int64) - images.astype(np.int64)).mean())
    assert np.array_equal(images, before)
    assert changes[0] > 0
    assert all(a < b for a, b in zip(changes, changes[1:])), changes


def test_corruption_clips_and_validates():
    white = np.full((4, 28, 28, 1), 250, dtype=np.uint8)
    out = D.corrupt(white, "gaussian_noise", 5, np.random.default_rng(0))
    assert out.max() == 255 and out.dtype == np.uint8  # clipped, not wrapped around
    assert np.array_equal(D.corrupt(white, "gaussian-noise", 5, np.random.default_rng(0)), out)
    with pytest.raises(ValueError, match="severity"):
        D.corrupt(white, "blur", 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kind"):
        D.corrupt(white, "snow", 1, np.random.default_rng(0))
    with pytest.raises(TypeError, match="uint8"):
        D.corrupt(white.astype(np.float32), "blur", 1, np.random.default_rng(0))


# ====================================================================== data classes
def test_data_attack_classes():
    images = _images(n=10)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    rng = np.random.default_rng(0)
    i, lab = A.LabelFlip("source-to-target", source=1, target=2).poison(images, labels, rng=rng, num_classes=3)
    assert np.array_equal(lab, np.where(labels == 1, 2, labels)) and np.array_equal(i, images)
    with pytest.raises(ValueError, match="target"):
        A.LabelFlip("all-to-one", target=5).poison(images, labels, rng=rng, num_classes=3)
    i, lab = A.Backdoor(target=0, poison_fraction=0.5).poison(images, labels, rng=rng, num_classes=3)
    assert (np.all(i[:, -3:, -3:] == 255, axis=(1, 2, 3))).sum() >= 5
    i, lab = A.Corruption("contrast", 3).poison(images, labels, rng=rng, num_classes=3)
    assert np.array_equal(lab, labels) and not np.array_equal(i, images)
    _, lab = A.LabelNoise(1.0).poison(images, labels, rng=rng, num_classes=3)
    assert np.all(lab != labels)


def test_endoscopic_corruptions_by_hand():
    # motion blur along a row: a vertical line spreads over `length` columns in a horizontal pass, or stays
    # a line (and keeps its mean) whatever the direction
    img = np.zeros((1, 28, 28, 1), dtype=np.uint8)
    img[0, :, 14, 0] = 210
    out = D.corrupt(img, "motion_blur", 1, np.random.default_rng(0))  # 3 pixels
    assert abs(out.astype(float).mean() - img.astype(float).mean()) < 1.0
    assert out.max() < 210 or np.array_equal(out, img)  # spread (0, 45, 135 degrees) or along itself (90)
    # specular highlights: saturated spots on a dark image, more of them at higher severity
    dark = np.full((8, 28, 28, 3), 40, dtype=np.uint8)
    bright = [int((D.corrupt(dark, "specular", s, np.random.default_rng(1)) >= 250).sum()) for s in (1, 5)]
    assert bright[0] > 0 and bright[1] > bright[0]
    # illumination: pixels only lose light, up to 80 % at the far side at severity 5
    grey = np.full((4, 28, 28, 1), 200, dtype=np.uint8)
    lit = D.corrupt(grey, "illumination", 5, np.random.default_rng(2)).astype(int)
    assert lit.max() == 200 and abs(lit.min() - 40) <= 1  # 200 * (1 - 0.8)
    assert D.corrupt(grey, "illumination", 5, np.random.default_rng(2)).tolist() == lit.tolist()  # seeded

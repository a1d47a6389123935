"""Guarantees of the simulated-hospital partitioners."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hospitrust.datasets.partitioners import (
    PARTITIONERS,
    class_counts,
    dirichlet,
    iid,
    label_distribution_divergence,
    parse_specialist_classes,
    partition,
    pathological,
    quantity_skew,
    reference_cohort,
    specialist,
    split_train_val,
)

NUM_CLASSES = 5
# Imbalanced, as medical data usually is (class 4 is the "rare disease").
LABELS = np.random.default_rng(123).choice(NUM_CLASSES, size=2000, p=[0.4, 0.25, 0.15, 0.12, 0.08])

# (registry name, its options) for every partitioner; hospitals counts below must suit all of them.
CASES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3}),
    ("quantity-skew", {"alpha": 0.5}),
    ("pathological", {"classes_per_hospital": 3}),
    ("specialist", {"classes": "4:0;3:0,1", "alpha": 0.5}),
]
CASE_IDS = [name for name, _ in CASES]


def _split(name, params, labels, num_hospitals, **kw):
    """The registered partitioner with these options (its run-config section), applied."""
    cls = PARTITIONERS[name]
    return cls(cls.Options(**params)).split(labels, num_hospitals, **kw)


def _assert_exact_cover(parts, n, num_hospitals, min_size=1):
    assert len(parts) == num_hospitals
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique"
        assert p.size >= min_size
    allidx = np.concatenate(parts)
    assert allidx.size == n, "a sample was dropped or duplicated"
    assert np.array_equal(np.sort(allidx), np.arange(n))


def test_registry_keys():
    assert set(PARTITIONERS) == {"iid", "dirichlet", "quantity-skew", "pathological", "specialist"}


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("num_hospitals", [2, 5, 10])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_sample_exactly_once(name, params, num_hospitals, seed):
    parts = _split(name, params, LABELS, num_hospitals, seed=seed)
    _assert_exact_cover(parts, LABELS.size, num_hospitals)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_same_seed_same_partition_other_seed_differs(name, params):
    a = _split(name, params, LABELS, 5, seed=3)
    b = _split(name, params, LABELS, 5, seed=3)
    c = _split(name, params, LABELS, 5, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_min_size_respected(name, params):
    parts = _split(name, params, LABELS, 5, seed=0, min_size=40)
    _assert_exact_cover(parts, LABELS.size, 5, min_size=40)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_more_hospitals_than_samples(name, params):
    with pytest.raises(ValueError, match=r"5 hospitals.*only 3 samples"):
        _split(name, params, np.array([0, 1, 2]), 5, seed=0)


def test_one_sample_per_hospital_is_fine():
    parts = iid(np.array([0, 1, 0]), 3, seed=0)
    _assert_exact_cover(parts, 3, 3)


def test_labels_of_shape_n_by_1_accepted():
    parts = iid(LABELS[:, None], 4, seed=0)
    _assert_exact_cover(parts, LABELS.size, 4)


def test_partition_helper():
    a = partition("quantity_skew", LABELS, 4, seed=1, alpha=2.0)
    b = quantity_skew(LABELS, 4, seed=1, alpha=2.0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="unknown partitioner 'nope'"):
        partition("nope", LABELS, 4, seed=1)


# ---------------------------------------------------------------- iid
def test_iid_sizes_near_equal():
    sizes = [p.size for p in iid(LABELS, 7, seed=0)]
    assert max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------- dirichlet
TEN_CLASS = np.random.default_rng(123).integers(0, 10, size=10_000)


def _mean_divergence(alpha, seeds=range(5)):
    return float(
        np.mean(
            [label_distribution_divergence(TEN_CLASS, dirichlet(TEN_CLASS, 10, seed=s, alpha=alpha), 10) for s in seeds]
        )
    )


def test_dirichlet_small_alpha_skewed_large_alpha_near_iid():
    # Measured (10 classes, 10 000 samples, 10 hospitals, seeds 0-4, mean JSD in bits):
    #   alpha=0.1 -> 0.473, 0.5 -> 0.209, 1 -> 0.124, 10 -> 0.0153, 100 -> 0.00155
    #   iid -> 0.0015 (alpha=100 is as close to iid as sampling noise allows)
    small, mid, large = _mean_divergence(0.1), _mean_divergence(1.0), _mean_divergence(100.0)
    assert small > 0.35
    assert 0.05 < mid < 0.25
    assert large < 0.005
    assert small > 50 * large
    iid_div = label_distribution_divergence(TEN_CLASS, iid(TEN_CLASS, 10, seed=0), 10)
    assert iid_div < 0.005


def test_dirichlet_matches_flwr_datasets_class_counts():
    """Same algorithm and RNG stream as flwr-datasets' DirichletPartitioner: identical class counts."""
    pytest.importorskip("flwr_datasets")
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    for alpha in (0.1, 100.0):
        for seed in (0, 1):
            ref = DirichletPartitioner(
                num_partitions=10, partition_by="label", alpha=alpha, min_partition_size=1, seed=seed
            )
            ref.dataset = Dataset.from_dict({"label": TEN_CLASS, "idx": np.arange(TEN_CLASS.size)})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref_parts = [np.asarray(ref.load_partition(i)["idx"], dtype=np.int64) for i in range(10)]
            ours = dirichlet(TEN_CLASS, 10, seed=seed, alpha=alpha)
            assert np.array_equal(class_counts(TEN_CLASS, ours, 10), class_counts(TEN_CLASS, ref_parts, 10))


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), "x"])
def test_dirichlet_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        dirichlet(LABELS, 4, seed=0, alpha=alpha)


def test_dirichlet_impossible_min_size_gives_clear_error():
    # Two classes, tiny alpha: each class lands almost entirely at one hospital,
    # so 10 hospitals can never all reach 5 samples.
    labels = np.repeat([0, 1], 50)
    with pytest.raises(ValueError, match=r"alpha=0\.001.*10 hospitals.*min_size=5.*50 attempts"):
        dirichlet(labels, 10, seed=0, alpha=0.001, min_size=5, max_attempts=50)


def test_dirichlet_tiny_alpha_still_covers():
    parts = dirichlet(LABELS, 3, seed=0, alpha=1e-4)
    _assert_exact_cover(parts, LABELS.size, 3)


# ---------------------------------------------------------------- quantity skew
def test_quantity_skew_sizes_unequal_labels_iid():
    parts = quantity_skew(TEN_CLASS, 5, seed=0, alpha=0.5, min_size=500)
    sizes = np.array([p.size for p in parts])
    assert sizes.min() >= 500
    assert sizes.max() > 2 * sizes.min()
    # label mix stays close to the global one (hospitals are >= 500 samples)
    assert label_distribution_divergence(TEN_CLASS, parts, 10) < 0.01
    with pytest.raises(ValueError, match="alpha"):
        quantity_skew(TEN_CLASS, 5, seed=0, alpha=0.0)


# ---------------------------------------------------------------- pathological
@pytest.mark.parametrize(("num_hospitals", "k"), [(5, 1), (3, 2), (4, 3), (10, 2), (2, 3)])
def test_pathological_exactly_k_classes_and_coverage(num_hospitals, k):
    parts = pathological(LABELS, num_hospitals, seed=2, classes_per_hospital=k)
    _assert_exact_cover(parts, LABELS.size, num_hospitals)
    counts = class_counts(LABELS, parts, NUM_CLASSES)
    assert np.all((counts > 0).sum(axis=1) == k)
    assert np.all(counts.sum(axis=0) == np.bincount(LABELS, minlength=NUM_CLASSES))
    # a class is split evenly among its holders
    for c in range(NUM_CLASSES):
        held = counts[:, c][counts[:, c] > 0]
        assert held.max() - held.min() <= 1


def test_pathological_k_at_least_num_classes_gives_all():
    counts = class_counts(LABELS, pathological(LABELS, 4, seed=0, classes_per_hospital=9), NUM_CLASSES)
    assert np.all(counts > 0)


def test_pathological_errors():
    with pytest.raises(ValueError, match=r"2 hospitals x 2 classes each = 4 slots cannot cover all 5 classes"):
        pathological(LABELS, 2, seed=0, classes_per_hospital=2)
    with pytest.raises(ValueError, match=r"class 1 has only 1 samples but 2 hospitals"):
        pathological(np.array([0, 0, 0, 0, 1]), 2, seed=0, classes_per_hospital=5)
    with pytest.raises(ValueError, match="classes_per_hospital"):
        pathological(LABELS, 2, seed=0, classes_per_hospital=0)


# ---------------------------------------------------------------- specialist
def test_specialist_class_only_at_holders():
    spec = {4: [0], 3: [1, 2]}
    parts = specialist(LABELS, 6, seed=5, specialist_classes=spec, alpha=0.5)
    _assert_exact_cover(parts, LABELS.size, 6)
    counts = class_counts(LABELS, parts, NUM_CLASSES)
    assert counts[0, 4] == np.sum(LABELS == 4)
    assert np.all(counts[1:, 4] == 0)
    assert np.all(counts[[0, 3, 4, 5], 3] == 0)
    assert abs(counts[1, 3] - counts[2, 3]) <= 1
    # holders also take part in the Dirichlet split of the other classes
    assert counts[[0, 1, 2]][:, :3].sum() > 0


def test_specialist_without_specialists_equals_dirichlet():
    a = specialist(LABELS, 4, seed=9, specialist_classes={}, alpha=0.7)
    b = dirichlet(LABELS, 4, seed=9, alpha=0.7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_specialist_all_classes_named():
    spec = {c: [c % 3] for c in range(NUM_CLASSES)}
    parts = specialist(LABELS, 3, seed=0, specialist_classes=spec)
    _assert_exact_cover(parts, LABELS.size, 3)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({7: [0]}, r"specialist class 7 does not occur in labels"),
        ({4: [5]}, r"hospital id\(s\) \[5\] out of range for num_hospitals=5"),
        ({4: [-1]}, r"hospital id for class 4 must be >= 0"),
        ({4: []}, r"no holder"),
        ({4: [1, 1]}, r"twice"),
        ("4:0", r"mapping"),
    ],
)
def test_specialist_validation(spec, match):
    with pytest.raises(ValueError, match=match):
        specialist(LABELS, 5, seed=0, specialist_classes=spec)


def test_specialist_unreachable_min_size():
    # everything is a specialist class held by hospital 0: hospital 1 gets nothing
    with pytest.raises(ValueError, match=r"hospital 1 got 0 samples, fewer than min_size=1"):
        specialist(np.array([0, 0, 1, 1]), 2, seed=0, specialist_classes={0: [0], 1: [0]})


# ---------------------------------------------------------------- parser
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4:0", {4: [0]}),
        ("4:0,1;3:2", {4: [0, 1], 3: [2]}),
        (" 4 : 0 , 1 ; 3:2 ", {4: [0, 1], 3: [2]}),
        ("", {}),
        ("   ", {}),
    ],
)
def test_parse_specialist_classes(text, expected):
    assert parse_specialist_classes(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("4", "malformed specialist entry '4'"),
        ("4:", "malformed specialist entry '4:'"),
        (":0", "malformed"),
        ("a:0", "malformed specialist entry 'a:0'"),
        ("4:0;;3:1", "malformed specialist entry ''"),
        ("4:0,", "malformed"),
        ("4:-1", "malformed"),
        ("4:0;", "malformed"),
        ("4:0:1", "malformed"),
        ("4:0;4:1", "class 4 is listed twice"),
        ("4:0,0", "lists a hospital twice"),
    ],
)
def test_parse_specialist_classes_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_specialist_classes(text)


def test_parse_then_partition_round_trip():
    parts = specialist(LABELS, 3, seed=0, specialist_classes=parse_specialist_classes("4:2"))
    counts = class_counts(LABELS, parts, NUM_CLASSES)
    assert counts[2, 4] == np.sum(LABELS == 4) and counts[:2, 4].sum() == 0


# ---------------------------------------------------------------- local split
@pytest.mark.parametrize("frac", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_split_train_val_disjoint_complete(frac):
    idx = np.arange(1000, 1237) * 3
    tr, va = split_train_val(idx, frac, seed=4)
    assert np.intersect1d(tr, va).size == 0
    assert np.array_equal(np.sort(np.concatenate([tr, va])), idx)
    assert va.size == round(frac * idx.size)  # 237 samples: no clamping needed
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(va) > 0)
    tr2, va2 = split_train_val(idx, frac, seed=4)
    assert np.array_equal(tr, tr2) and np.array_equal(va, va2)


def test_split_train_val_small_hospitals():
    tr, va = split_train_val(np.array([5, 6, 7]), 0.01, seed=0)  # tiny share: still 1 val
    assert (tr.size, va.size) == (2, 1)
    tr, va = split_train_val(np.array([5, 6]), 0.99, seed=0)  # huge share: still 1 train
    assert (tr.size, va.size) == (1, 1)
    tr, va = split_train_val(np.array([5]), 0.5, seed=0)  # lone sample trains
    assert tr.tolist() == [5] and va.size == 0


def test_split_train_val_errors():
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\)"):
        split_train_val(np.arange(10), 1.0, seed=0)
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(np.arange(10), -0.1, seed=0)


# ---------------------------------------------------------------- diagnostics
def test_class_counts():
    parts = [np.array([0, 2]), np.array([1, 3, 4])]
    labels = np.array([0, 1, 0, 2, 2])
    assert class_counts(labels, parts, 3).tolist() == [[2, 0, 0], [0, 1, 2]]
    with pytest.raises(ValueError, match="out of range"):
        class_counts(labels, parts, 2)


def test_divergence_hand_values():
    labels = np.array([0, 0, 1, 1])
    # identical class mix everywhere -> 0
    assert label_distribution_divergence(labels, [np.array([0, 2]), np.array([1, 3])], 2) == pytest.approx(0.0)
    # each hospital holds one class, global (1/2, 1/2):
    # JSD((1,0), (1/2,1/2)) with m = (3/4, 1/4):
    #   KL(p||m) = log2(4/3) = 0.415037; KL(q||m) = 1/2 log2(2/3) + 1/2 log2(2) = 0.207519
    #   JSD = (0.415037 + 0.207519) / 2 = 0.311278 (same for both hospitals)
    assert label_distribution_divergence(labels, [np.array([0, 1]), np.array([2, 3])], 2) == pytest.approx(
        0.311278, abs=1e-6
    )


def test_reference_cohort_balanced():
    idx = reference_cohort(LABELS, 50, seed=0)
    assert np.all(np.diff(idx) > 0)
    counts = np.bincount(LABELS[idx], minlength=NUM_CLASSES)
    assert counts.tolist() == [50] * NUM_CLASSES
    assert np.array_equal(idx, reference_cohort(LABELS, 50, seed=0))
    assert not np.array_equal(idx, reference_cohort(LABELS, 50, seed=1))
    # a class with fewer samples than per_class contributes all of them
    small = np.array([0, 0, 0, 0, 1, 2, 2])
    ref = reference_cohort(small, 3, seed=0)
    assert np.bincount(small[ref]).tolist() == [3, 1, 2]
    assert reference_cohort(small, 0, seed=0).size == 0  # no cohort (the cohort-size sweep's 0)
    with pytest.raises(ValueError, match="per_class"):
        reference_cohort(small, -1, seed=0)

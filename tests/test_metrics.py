"""Metrics checked against hand-computed values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from hospitrust import metrics

# A small 3-class example.
#   y_true = 0 0 0 0 1 1 1 2 2 2
#   y_pred = 0 0 1 2 1 1 0 2 2 1
# Confusion matrix (rows: true, cols: predicted)
#            pred0 pred1 pred2 | support
#   true0      2     1     1   |   4
#   true1      1     2     0   |   3
#   true2      0     1     2   |   3
#   col sum    3     4     3
# accuracy          = (2+2+2)/10                       = 0.6
# recall            = 2/4, 2/3, 2/3
# balanced accuracy = (1/2 + 2/3 + 2/3) / 3            = 11/18
# precision         = 2/3, 2/4, 2/3
# F1 class 0        = 2*(2/3*1/2)/(2/3+1/2)            = 4/7
# F1 class 1        = 2*(1/2*2/3)/(1/2+2/3)            = 4/7
# F1 class 2        = 2/3
# macro F1          = (4/7 + 4/7 + 2/3) / 3            = 38/63
Y_TRUE = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
Y_PRED = np.array([0, 0, 1, 2, 1, 1, 0, 2, 2, 1])


def test_accuracy_hand():
    assert metrics.accuracy(Y_TRUE, Y_PRED) == pytest.approx(0.6)


def test_balanced_accuracy_hand():
    assert metrics.balanced_accuracy(Y_TRUE, Y_PRED) == pytest.approx(11 / 18)
    assert metrics.balanced_accuracy(Y_TRUE, Y_PRED) == pytest.approx(balanced_accuracy_score(Y_TRUE, Y_PRED))


def test_macro_f1_hand():
    assert metrics.macro_f1(Y_TRUE, Y_PRED) == pytest.approx(38 / 63)
    assert metrics.macro_f1(Y_TRUE, Y_PRED) == pytest.approx(f1_score(Y_TRUE, Y_PRED, average="macro"))


def test_per_class_and_worst_recall_hand():
    assert metrics.per_class_recall(Y_TRUE, Y_PRED, 3) == pytest.approx([0.5, 2 / 3, 2 / 3])
    assert metrics.worst_class_recall(Y_TRUE, Y_PRED, 3) == pytest.approx(0.5)


def test_absent_class_recall_is_nan_and_excluded():
    # class 3 exists in the label space but not in y_true: recall undefined.
    rec = metrics.per_class_recall(Y_TRUE, Y_PRED, 4)
    assert rec[:3] == pytest.approx([0.5, 2 / 3, 2 / 3])
    assert math.isnan(rec[3])
    assert metrics.worst_class_recall(Y_TRUE, Y_PRED, 4) == pytest.approx(0.5)
    # a class predicted but never true: excluded from balanced accuracy (as sklearn)
    y_true, y_pred = [0, 0, 1, 1], [0, 2, 1, 1]
    assert metrics.balanced_accuracy(y_true, y_pred) == pytest.approx((0.5 + 1.0) / 2)


def test_binary_auc_hand():
    # positives score 0.35 and 0.8, negatives 0.1 and 0.4.
    # pairs (pos > neg): 0.35>0.1 yes, 0.35>0.4 no, 0.8>0.1 yes, 0.8>0.4 yes -> 3/4
    y = [0, 0, 1, 1]
    p1 = np.array([0.1, 0.4, 0.35, 0.8])
    probs = np.stack([1 - p1, p1], axis=1)
    assert metrics.auc(y, probs) == pytest.approx(0.75)


def test_multiclass_auc_matches_sklearn_ovr_macro():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=200)
    logits = rng.normal(size=(200, 4)) + 1.5 * np.eye(4)[y]
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = roc_auc_score(y, probs, multi_class="ovr", average="macro")
    assert metrics.auc(y, probs) == pytest.approx(expected)


def test_multiclass_auc_skips_absent_class():
    # 3 classes in the model, class 2 never true: mean of the OvR AUCs of classes 0 and 1.
    y = [0, 0, 1, 1]
    probs = np.array([[0.7, 0.2, 0.1], [0.3, 0.4, 0.3], [0.5, 0.4, 0.1], [0.1, 0.8, 0.1]])
    # class 0 vs rest on probs[:,0]: pos {0.7,0.3} neg {0.5,0.1}: pairs 0.7>0.5,0.7>0.1,0.3>0.1 -> 3/4
    # class 1 vs rest on probs[:,1]: pos {0.4,0.8} neg {0.2,0.4}: 0.4>0.2, 0.4=0.4 (1/2), 0.8>both -> 3.5/4
    assert metrics.auc(y, probs) == pytest.approx((0.75 + 0.875) / 2)


def test_auc_single_class_is_nan():
    probs = np.array([[0.9, 0.1], [0.6, 0.4]])
    assert math.isnan(metrics.auc([1, 1], probs))
    assert math.isnan(metrics.auc([0, 0], np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])))


def test_classification_report_keys_types_and_values():
    probs = np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7], [0.6, 0.4]], dtype=np.float32)
    y = np.array([0, 1, 0, 1])
    rep = metrics.classification_report(y, probs, 2)
    assert set(rep) == {
        "accuracy",
        "balanced_accuracy",
        "macro_f1",
        "auc",
        "worst_class_recall",
        "per_class_recall",
        "loss",
        "num_examples",
    }
    # predictions 0 1 1 0: accuracy 1/2, each class recall 1/2
    assert rep["accuracy"] == pytest.approx(0.5)
    assert rep["balanced_accuracy"] == pytest.approx(0.5)
    assert rep["per_class_recall"] == pytest.approx([0.5, 0.5])
    assert rep["worst_class_recall"] == pytest.approx(0.5)
    # AUC on p1: pos {0.6, 0.4}, neg {0.2, 0.7}: 0.6>0.2, 0.4>0.2 -> 2/4
    assert rep["auc"] == pytest.approx(0.5)
    # loss = -(ln .8 + ln .6 + ln .3 + ln .4) / 4
    assert rep["loss"] == pytest.approx(-(np.log(0.8) + np.log(0.6) + np.log(0.3) + np.log(0.4)) / 4, rel=1e-6)
    assert rep["num_examples"] == 4
    for key, value in rep.items():
        if key == "per_class_recall":
            assert type(value) is list and all(type(v) is float for v in value)
        elif key == "num_examples":
            assert type(value) is int
        else:
            assert type(value) is float, key
    json.dumps(rep)


def test_classification_report_loss_is_clipped():
    probs = np.array([[1.0, 0.0]])
    rep = metrics.classification_report([1], probs, 2)
    assert rep["loss"] == pytest.approx(-np.log(1e-12))
    assert math.isnan(rep["auc"])


def test_classification_report_empty():
    rep = metrics.classification_report(np.array([], dtype=int), np.zeros((0, 3)), 3)
    assert rep["num_examples"] == 0
    assert math.isnan(rep["accuracy"]) and math.isnan(rep["loss"])
    assert len(rep["per_class_recall"]) == 3


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: metrics.accuracy([0, 1], [0]), "lengths differ"),
        (lambda: metrics.accuracy([], []), "empty"),
        (lambda: metrics.accuracy([[0, 1]], [[0, 1]]), "1-D"),
        (lambda: metrics.accuracy([0.5, 1], [0, 1]), "integer"),
        (lambda: metrics.per_class_recall([0, 3], [0, 1], 3), "out of range"),
        (lambda: metrics.per_class_recall([0, -1], [0, 1], 3), "negative"),
        (lambda: metrics.auc([0, 1], np.array([0.2, 0.8])), "2-D"),
        (lambda: metrics.auc([0, 2], np.array([[0.2, 0.8], [0.5, 0.5]])), "out of range"),
        (lambda: metrics.auc([0, 1, 1], np.array([[0.2, 0.8], [0.5, 0.5]])), "rows"),
        (lambda: metrics.classification_report([0, 1], np.full((2, 2), 0.5), 3), "columns"),
        (lambda: metrics.classification_report([0, 1], np.full((2, 2), np.nan), 2), "NaN"),
    ],
)
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_fairness_numbers():
    f = metrics.fairness({"a": 0.8, "b": 0.6, "c": 0.7})
    assert f["min"] == pytest.approx(0.6)
    assert f["max"] == pytest.approx(0.8)
    assert f["mean"] == pytest.approx(0.7)
    # population std: sqrt((0.1^2 + 0.1^2 + 0) / 3)
    assert f["std"] == pytest.approx(math.sqrt(0.02 / 3))
    assert f["spread"] == pytest.approx(0.2)
    assert all(type(v) is float for v in f.values())
    assert set(f) == {"min", "max", "mean", "std", "spread"}


def test_fairness_single_and_nan():
    assert metrics.fairness({"only": np.float32(0.5)}) == pytest.approx(
        {"min": 0.5, "max": 0.5, "mean": 0.5, "std": 0.0, "spread": 0.0}
    )
    f = metrics.fairness({"a": 0.9, "b": float("nan"), "c": 0.5})
    assert f["spread"] == pytest.approx(0.4)


def test_fairness_errors():
    with pytest.raises(ValueError, match="empty"):
        metrics.fairness({})
    with pytest.raises(ValueError, match="only NaN"):
        metrics.fairness({"a": float("nan")})
    with pytest.raises(ValueError, match="'b'"):
        metrics.fairness({"a": 0.5, "b": "high"})


def test_rare_classes_by_share_of_the_mean_and_always_the_rarest():
    from hospitrust.metrics import rare_classes

    # mean 100: 40 and 55 are under 0.6 x mean; an absent class is never rare
    assert rare_classes([40, 55, 205, 100, 0]) == [0, 1]
    assert rare_classes([100, 100, 99]) == [2]  # the rarest, even when close to the mean
    assert rare_classes([0, 0]) == []


def test_rare_class_macro_f1_hand():
    from hospitrust.metrics import rare_class_macro_f1

    y_true = [0, 0, 1, 1, 2, 2]
    y_pred = [0, 1, 1, 1, 2, 0]
    # class 0: precision 1/2, recall 1/2 -> F1 0.5; class 2: precision 1, recall 1/2 -> F1 2/3
    assert abs(rare_class_macro_f1(y_true, y_pred, [0, 2]) - (0.5 + 2 / 3) / 2) < 1e-12
    assert rare_class_macro_f1(y_true, y_pred, [1]) == pytest.approx(0.8)  # P 2/3, R 1
    assert rare_class_macro_f1(y_true, [1] * 6, [0]) == 0.0  # never predicted


def test_local_metrics_equal_the_full_report():
    # the hospital's own numbers (benchmark error, federated evaluation) without scikit-learn
    rng = np.random.default_rng(3)
    for n, k in ((1, 2), (7, 2), (50, 5)):
        y = rng.integers(0, k, n)
        p = rng.dirichlet(np.ones(k), n)
        full, local = metrics.classification_report(y, p, k), metrics.local_metrics(y, p, k)
        for key in ("accuracy", "balanced_accuracy", "loss", "num_examples"):
            assert local[key] == full[key], key
    empty = metrics.local_metrics(np.zeros(0, int), np.zeros((0, 3)), 3)
    assert empty["num_examples"] == 0 and np.isnan(empty["loss"])

"""Clinical and fairness metrics for hospital-level evaluation.

All public functions return plain Python ``float`` / ``int`` / ``list`` values
(never numpy scalars) so their results can go straight into Flower metric
records, JSON result files or logs.

Conventions
-----------
* Labels are integer class ids in ``[0, num_classes)``.
* ``probs`` is an ``(n, C)`` array of per-class scores (normally softmax
  probabilities); column ``c`` scores class ``c``.
* A class that does not occur in ``y_true`` has an undefined recall. It is
  reported as ``float('nan')`` by :func:`per_class_recall` (so the list stays
  aligned with class ids) and is *excluded* from :func:`worst_class_recall` and
  :func:`balanced_accuracy`. ``NaN`` is used rather than ``None`` because Flower
  metric records only accept numbers.
* When ``y_true`` contains a single class, ROC AUC is undefined and
  :func:`auc` returns ``float('nan')`` instead of raising: a small hospital's
  validation split can legitimately be single-class and must not crash a
  federated round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "per_class_recall",
    "worst_class_recall",
    "auc",
    "classification_report",
    "fairness",
]

#: Probabilities are clipped to ``[LOSS_EPS, 1]`` before the log in the loss so
#: a confidently wrong prediction gives a large but finite loss.
LOSS_EPS = 1e-12


# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
def _as_labels(y: Any, name: str) -> np.ndarray:
    """Return ``y`` as a 1-D int64 array of non-negative class ids."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        # Accept float arrays holding whole numbers (e.g. labels loaded from
        # a float tensor), reject anything else.
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must contain integer class ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.min() < 0:
        raise ValueError(f"{name} contains negative class id {int(arr.min())}")
    return arr


def _check_range(y: np.ndarray, num_classes: int, name: str) -> None:
    if y.size and y.max() >= num_classes:
        raise ValueError(
            f"{name} contains class id {int(y.max())}, out of range for num_classes={num_classes}"
        )


def _check_num_classes(num_classes: Any) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return int(num_classes)


def _pair(y_true: Any, y_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (y_true, y_pred) pair: 1-D, same non-zero length."""
    t = _as_labels(y_true, "y_true")
    p = _as_labels(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred lengths differ: {t.shape[0]} vs {p.shape[0]}")
    if t.size == 0:
        raise ValueError("y_true and y_pred are empty; metrics are undefined")
    return t, p


def _probs(y_true: Any, probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate (y_true, probs): probs 2-D (n, C), labels in [0, C)."""
    t = _as_labels(y_true, "y_true")
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"probs must be 2-D (num_examples, num_classes), got shape {p.shape}")
    if p.shape[0] != t.shape[0]:
        raise ValueError(f"y_true has {t.shape[0]} examples but probs has {p.shape[0]} rows")
    if p.shape[1] < 1:
        raise ValueError("probs must have at least one column")
    if not np.all(np.isfinite(p)):
        raise ValueError("probs contains NaN or infinite values")
    _check_range(t, p.shape[1], "y_true")
    return t, p


# --------------------------------------------------------------------------- #
# point metrics
# --------------------------------------------------------------------------- #
def accuracy(y_true: Any, y_pred: Any) -> float:
    """Fraction of correct predictions.

    Parameters
    ----------
    y_true, y_pred : array-like of int, shape (n,)
        True and predicted class ids; ``n`` must be > 0.

    Returns
    -------
    float
    """
    t, p = _pair(y_true, y_pred)
    return float(np.mean(t == p))


def _recall_by_class(t: np.ndarray, p: np.ndarray, num_classes: int) -> np.ndarray:
    """Recall per class id; NaN where the class is absent from ``t``."""
    support = np.bincount(t, minlength=num_classes).astype(np.float64)
    hits = np.bincount(t[t == p], minlength=num_classes).astype(np.float64)
    out = np.full(num_classes, np.nan)
    present = support > 0
    out[present] = hits[present] / support[present]
    return out


def balanced_accuracy(y_true: Any, y_pred: Any) -> float:
    """Mean recall over the classes present in ``y_true``.

    Matches :func:`sklearn.metrics.balanced_accuracy_score` (without its
    warning when ``y_pred`` contains classes missing from ``y_true``).

    Parameters
    ----------
    y_true, y_pred : array-like of int, shape (n,)

    Returns
    -------
    float
    """
    t, p = _pair(y_true, y_pred)
    n_cls = int(max(t.max(), p.max())) + 1
    return float(np.nanmean(_recall_by_class(t, p, n_cls)))


def macro_f1(y_true: Any, y_pred: Any) -> float:
    """Unweighted mean F1 over the classes seen in ``y_true`` or ``y_pred``.

    Classes that appear in neither array are ignored (they would otherwise
    count as an F1 of 0). A class predicted but never true has F1 = 0, and a
    class that is true but never predicted has F1 = 0 (``zero_division=0``).

    Parameters
    ----------
    y_true, y_pred : array-like of int, shape (n,)

    Returns
    -------
    float
    """
    from sklearn.metrics import f1_score  # lazy: a SuperNode starts a fresh ClientApp process per message

    t, p = _pair(y_true, y_pred)
    return float(f1_score(t, p, average="macro", zero_division=0))


RARE_FRACTION = 0.6  # a class is rare when its share is under this fraction of the mean class


def rare_classes(class_totals: Any, fraction: float = RARE_FRACTION) -> list[int]:
    """The federation's rare classes from its per-class training totals: every present class
    with fewer than ``fraction`` x the mean count, and always the rarest one.
    """
    totals = np.asarray(class_totals, dtype=float).reshape(-1)
    present = np.flatnonzero(totals > 0)
    if present.size == 0:
        return []
    mean = totals[present].mean()  # over the classes present
    rare = {int(c) for c in present if totals[c] < fraction * mean}
    rare.add(int(present[np.argmin(totals[present])]))
    return sorted(rare)


def rare_class_macro_f1(y_true: Any, y_pred: Any, classes: Any) -> float:
    """Mean F1 over the given (rare) classes; each class's F1 is 0 when it is neither
    predicted correctly nor at all (``zero_division=0``). NaN when ``classes`` is empty.
    """
    from sklearn.metrics import f1_score

    labels = [int(c) for c in classes]
    if not labels:
        return float("nan")
    t, p = _pair(y_true, y_pred)
    return float(np.mean(f1_score(t, p, labels=labels, average=None, zero_division=0)))


def per_class_recall(y_true: Any, y_pred: Any, num_classes: int) -> list[float]:
    """Recall (sensitivity) of every class id ``0 .. num_classes-1``.

    Parameters
    ----------
    y_true, y_pred : array-like of int, shape (n,)
    num_classes : int
        Length of the returned list; labels must be below it.

    Returns
    -------
    list of float
        ``result[c]`` is the recall of class ``c``, or ``float('nan')`` when
        class ``c`` does not occur in ``y_true`` (recall undefined).
    """
    num_classes = _check_num_classes(num_classes)
    t, p = _pair(y_true, y_pred)
    _check_range(t, num_classes, "y_true")
    _check_range(p, num_classes, "y_pred")
    return [float(v) for v in _recall_by_class(t, p, num_classes)]


def worst_class_recall(y_true: Any, y_pred: Any, num_classes: int) -> float:
    """Minimum recall over the classes present in ``y_true``.

    The clinically relevant "which disease do we miss most" number; classes
    absent from ``y_true`` have no recall and are skipped.

    Parameters
    ----------
    y_true, y_pred : array-like of int, shape (n,)
    num_classes : int

    Returns
    -------
    float
    """
    rec = np.asarray(per_class_recall(y_true, y_pred, num_classes))
    return float(np.nanmin(rec))  # at least one class is present (n > 0)


def auc(y_true: Any, probs: Any) -> float:
    """ROC AUC from class scores.

    Parameters
    ----------
    y_true : array-like of int, shape (n,)
        Class ids in ``[0, C)``.
    probs : array-like of float, shape (n, C)
        Per-class scores.

    Returns
    -------
    float
        * ``C == 2``: the plain binary ROC AUC of ``probs[:, 1]`` for class 1.
        * ``C > 2``: macro one-vs-rest AUC, i.e. the unweighted mean over
          the classes present in ``y_true`` of the AUC of ``probs[:, c]`` for
          "class c vs the rest". When every class is present this equals
          ``roc_auc_score(y_true, probs, multi_class="ovr", average="macro")``;
          unlike sklearn it neither fails when some classes are absent nor
          requires rows to sum exactly to 1.
        * ``float('nan')`` when ``y_true`` holds fewer than two distinct
          classes (AUC is undefined), including empty input.
    """
    from sklearn.metrics import roc_auc_score  # lazy, as above

    t, p = _probs(y_true, probs)
    present = np.unique(t)
    if present.size < 2:
        return float("nan")
    if p.shape[1] == 2:
        return float(roc_auc_score(t, p[:, 1]))
    scores = [roc_auc_score(t == c, p[:, c]) for c in present]
    return float(np.mean(scores))


def local_metrics(y_true: Any, probs: Any, num_classes: int) -> dict[str, Any]:
    """The metrics a hospital reports about a model on its own split: ``accuracy``,
    ``balanced_accuracy``, ``loss`` and ``num_examples``, computed as in
    :func:`classification_report` (same values) without its F1 and AUC (scikit-learn: about
    5 ms a call, twice a round per hospital; a simulation with hundreds of small hospitals pays it
    hundreds of times).

    Parameters
    ----------
    y_true : array-like of int, shape (n,)
    probs : array-like of float, shape (n, num_classes)
    num_classes : int

    Returns
    -------
    dict
        Plain Python types; NaN metrics and ``num_examples`` 0 for an empty split.
    """
    num_classes = _check_num_classes(num_classes)
    t, p = _probs(y_true, probs)
    if p.shape[1] != num_classes:
        raise ValueError(f"probs has {p.shape[1]} columns but num_classes={num_classes}")
    n = int(t.shape[0])
    if n == 0:
        nan = float("nan")
        return {"accuracy": nan, "balanced_accuracy": nan, "loss": nan, "num_examples": 0}
    y_pred = np.argmax(p, axis=1)
    p_true = np.clip(p[np.arange(n), t], LOSS_EPS, 1.0)
    return {"accuracy": accuracy(t, y_pred), "balanced_accuracy": balanced_accuracy(t, y_pred),
            "loss": float(-np.mean(np.log(p_true))), "num_examples": n}


def classification_report(y_true: Any, probs: Any, num_classes: int) -> dict[str, Any]:
    """All evaluation metrics for one model on one data split.

    Predictions are ``argmax(probs, axis=1)``.

    Parameters
    ----------
    y_true : array-like of int, shape (n,)
    probs : array-like of float, shape (n, num_classes)
        Predicted class probabilities (softmax outputs).
    num_classes : int

    Returns
    -------
    dict
        Keys ``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``auc``,
        ``worst_class_recall`` (floats), ``per_class_recall`` (list of
        ``num_classes`` floats, NaN for classes absent from ``y_true``),
        ``loss`` (mean cross-entropy ``-log p[y]`` with ``p`` clipped to
        ``[1e-12, 1]``) and ``num_examples`` (int). Plain Python types only.
        For empty input (``n == 0``, e.g. a one-sample hospital's empty
        validation split) every float is NaN and ``num_examples`` is 0,
        rather than raising mid-round.
    """
    num_classes = _check_num_classes(num_classes)
    t, p = _probs(y_true, probs)
    if p.shape[1] != num_classes:
        raise ValueError(f"probs has {p.shape[1]} columns but num_classes={num_classes}")
    n = int(t.shape[0])
    if n == 0:
        nan = float("nan")
        return {
            "accuracy": nan,
            "balanced_accuracy": nan,
            "macro_f1": nan,
            "auc": nan,
            "worst_class_recall": nan,
            "per_class_recall": [nan] * num_classes,
            "loss": nan,
            "num_examples": 0,
        }
    y_pred = np.argmax(p, axis=1)
    p_true = np.clip(p[np.arange(n), t], LOSS_EPS, 1.0)
    return {
        "accuracy": accuracy(t, y_pred),
        "balanced_accuracy": balanced_accuracy(t, y_pred),
        "macro_f1": macro_f1(t, y_pred),
        "auc": auc(t, p),
        "worst_class_recall": worst_class_recall(t, y_pred, num_classes),
        "per_class_recall": per_class_recall(t, y_pred, num_classes),
        "loss": float(-np.mean(np.log(p_true))),
        "num_examples": n,
    }


# --------------------------------------------------------------------------- #
# fairness across hospitals
# --------------------------------------------------------------------------- #
def fairness(per_hospital_accuracy: Mapping[str, float]) -> dict[str, float]:
    """Summary of how evenly a model serves the hospitals.

    Parameters
    ----------
    per_hospital_accuracy : Mapping[str, float]
        Hospital id -> accuracy (or any other per-hospital score). ``NaN``
        entries (a hospital with nothing to evaluate) are skipped.

    Returns
    -------
    dict
        ``min``, ``max``, ``mean``, ``std`` (population standard deviation,
        ``ddof=0``: the hospitals are the whole population, not a sample)
        and ``spread`` (``max - min``), all plain floats.

    Raises
    ------
    ValueError
        If the mapping is empty, has no non-NaN value, or holds a
        non-numeric or infinite value.
    """
    if not isinstance(per_hospital_accuracy, Mapping):
        raise ValueError(
            f"per_hospital_accuracy must be a mapping hospital -> accuracy, got {type(per_hospital_accuracy).__name__}"
        )
    if len(per_hospital_accuracy) == 0:
        raise ValueError("fairness() needs at least one hospital accuracy, got an empty mapping")
    values = []
    for hospital, value in per_hospital_accuracy.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"accuracy of hospital {hospital!r} is not a number: {value!r}") from None
        if math.isnan(v):
            continue  # nothing was evaluated there; don't let it poison the summary
        if math.isinf(v):
            raise ValueError(f"accuracy of hospital {hospital!r} is infinite")
        values.append(v)
    if not values:
        raise ValueError("fairness() got only NaN accuracies; no hospital had anything to evaluate")
    arr = np.asarray(values, dtype=np.float64)
    return {
        "min": float(arr.min()),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "std": float(arr.std()),
        "spread": float(arr.max() - arr.min()),
    }


# --------------------------------------------------------------------------- #
# federated evaluation: counts a hospital sends, pooled by the server
# --------------------------------------------------------------------------- #
#: The evaluate config key by which the server asks hospitals for pooled-evaluation counts.
POOLED_KEY = "pooled-metrics"
#: Score histograms are uniform in logit(p) over [-LOGIT_RANGE, LOGIT_RANGE]: a confident model's
#: scores crowd near 0 and 1, where uniform bins in p would tie most pairs.
LOGIT_RANGE, SCORE_BINS = 12.0, 480


def _score_bins(scores: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(scores, dtype=np.float64), 1e-12, 1 - 1e-12)
    z = np.clip(np.log(p) - np.log1p(-p), -LOGIT_RANGE, LOGIT_RANGE)
    return np.minimum(((z + LOGIT_RANGE) / (2 * LOGIT_RANGE) * SCORE_BINS).astype(np.int64), SCORE_BINS - 1)


def evaluation_counts(y_true: Any, probs: Any, num_classes: int) -> dict[str, Any]:
    """What a hospital sends for federated evaluation: counts, never a score or a label per image.

    Parameters
    ----------
    y_true : array-like of int, shape (n,)
    probs : array-like of float, shape (n, num_classes)
    num_classes : int

    Returns
    -------
    dict
        ``confusion`` (num_classes x num_classes, row = true class, flattened), ``score-histogram``
        (per class, the histogram of its score over the images of that class and over the others:
        num_classes x 2 x SCORE_BINS, flattened) and ``loss-sum`` (summed cross-entropy).
    """
    num_classes = _check_num_classes(num_classes)
    t, p = _probs(y_true, probs)
    n = int(t.shape[0])
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    hist = np.zeros((num_classes, 2, SCORE_BINS), dtype=np.int64)
    loss = 0.0
    if n:
        pred = np.argmax(p, axis=1)
        np.add.at(confusion, (t, pred), 1)
        for c in range(num_classes):
            bins = _score_bins(p[:, c])
            np.add.at(hist[c, 0], bins[t == c], 1)
            np.add.at(hist[c, 1], bins[t != c], 1)
        loss = float(-np.log(np.clip(p[np.arange(n), t], LOSS_EPS, 1.0)).sum())
    return {"confusion": [int(v) for v in confusion.ravel()], "score-histogram": [int(v) for v in hist.ravel()],
            "loss-sum": loss}


def _binned_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties within a bin counted half."""
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    below = np.concatenate([[0], np.cumsum(neg)[:-1]])
    return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))


def pooled_report(counts: Sequence[Mapping[str, Any]], num_classes: int, rare: Any = ()) -> dict[str, Any]:
    """The classification report of the hospitals' held-out images pooled, from their counts.

    Accuracy, balanced accuracy, macro F1, per-class and worst-class recall and the loss are exact
    (what ``classification_report`` gives on the pooled images); the AUC is computed from the
    score histograms (ties within a bin of width 0.05 in logit count half).

    Parameters
    ----------
    counts : list of Mapping
        Each hospital's :func:`evaluation_counts`.
    num_classes : int
    rare : sequence of int
        Rare classes: adds ``rare_class_macro_f1`` when given.

    Returns
    -------
    dict
        The keys of :func:`classification_report`.
    """
    num_classes = _check_num_classes(num_classes)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    hist = np.zeros((num_classes, 2, SCORE_BINS), dtype=np.int64)
    loss = 0.0
    for c in counts:
        conf_c = np.asarray(c["confusion"], dtype=np.int64).reshape(num_classes, num_classes)
        hist_c = np.asarray(c["score-histogram"], dtype=np.int64).reshape(num_classes, 2, SCORE_BINS)
        loss_c = float(c["loss-sum"])
        if (conf_c < 0).any() or (hist_c < 0).any() or not (math.isfinite(loss_c) and loss_c >= 0):
            raise ValueError("evaluation counts must be non-negative and the loss sum finite")
        confusion, hist, loss = confusion + conf_c, hist + hist_c, loss + loss_c
    n = int(confusion.sum())
    if n == 0:
        return classification_report(np.zeros(0, dtype=np.int64), np.zeros((0, num_classes)), num_classes)
    support, predicted, hits = confusion.sum(axis=1), confusion.sum(axis=0), np.diag(confusion)
    present = support > 0
    recall = np.full(num_classes, np.nan)
    recall[present] = hits[present] / support[present]
    seen = present | (predicted > 0)  # sklearn's macro F1 over labels in y_true or y_pred
    f1 = np.where(support + predicted > 0, 2 * hits / np.maximum(support + predicted, 1), 0.0)
    if int(present.sum()) < 2:
        auc_value = float("nan")
    elif num_classes == 2:
        auc_value = _binned_auc(hist[1, 0], hist[1, 1])
    else:
        auc_value = float(np.mean([_binned_auc(hist[c, 0], hist[c, 1]) for c in np.flatnonzero(present)]))
    report = {
        "accuracy": float(hits.sum() / n),
        "balanced_accuracy": float(np.nanmean(recall)),
        "macro_f1": float(f1[seen].mean()),
        "auc": auc_value,
        "worst_class_recall": float(np.nanmin(recall)),
        "per_class_recall": [float(v) for v in recall],
        "loss": loss / n,
        "num_examples": n,
    }
    rare = [int(c) for c in rare]
    if rare:
        report["rare_class_macro_f1"] = float(np.mean(f1[rare]))
    return report

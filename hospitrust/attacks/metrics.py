"""Security metrics: attack success and detection quality (pure functions).

Rates are NaN when their denominator is empty (no eligible test images, no malicious
or no honest hospitals, nothing flagged), never a division error.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np

#: A hospital's key in the flag maps (a name, a node id): Mapping is invariant in its keys.
H = TypeVar("H", bound=Hashable)


def _flat_ints(x, name: str) -> np.ndarray:
    a = np.asarray(x).reshape(-1)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must hold integer class labels, got dtype {a.dtype}")
    return a


def _pair(pred, true_labels) -> tuple[np.ndarray, np.ndarray]:
    p = _flat_ints(pred, "predictions")
    t = _flat_ints(true_labels, "true_labels")
    if p.shape != t.shape:
        raise ValueError(f"{p.size} predictions but {t.size} true labels")
    return p, t


def backdoor_success_rate(pred_on_triggered, true_labels, target: int) -> float:
    """Attack success rate (ASR) of a backdoor: among test images whose true class is
    not ``target``, the share predicted as ``target`` once the trigger is stamped on
    them. NaN if every test image is of the target class.

    Parameters
    ----------
    pred_on_triggered : array-like of int
        The model's predicted classes on the triggered test images.
    true_labels : array-like of int
        The test images' true classes, same length.
    target : int
        The backdoor's target class.

    Returns
    -------
    float
        The attack success rate in [0, 1], or NaN.
    """
    p, t = _pair(pred_on_triggered, true_labels)
    eligible = t != int(target)
    if not eligible.any():
        return float("nan")
    return float(np.mean(p[eligible] == int(target)))


def targeted_flip_success(pred, true_labels, source: int, target: int) -> float:
    """Targeted label-flip success: the share of ``source``-class test images predicted
    as ``target``. NaN if there are no source-class images.

    Parameters
    ----------
    pred : array-like of int
        The model's predicted classes on the clean test images.
    true_labels : array-like of int
        The test images' true classes, same length.
    source : int
        The flipped class.
    target : int
        The class it was flipped to.

    Returns
    -------
    float
        The success rate in [0, 1], or NaN.
    """
    p, t = _pair(pred, true_labels)
    eligible = t == int(source)
    if not eligible.any():
        return float("nan")
    return float(np.mean(p[eligible] == int(target)))


def _ratio(num: int, den: int) -> float:
    return float(num) / den if den else float("nan")


def detection_rates(
    flagged: Mapping[H, bool], malicious: Mapping[H, bool]
) -> dict[str, float | int]:
    """Confusion counts and rates of a detector over hospitals.

    ``malicious`` defines the population (hospital -> is malicious); ``flagged`` says
    which hospitals the defence excluded / down-weighted (missing hospitals count as
    not flagged; a hospital absent from ``malicious`` is an error). Returns ``tp``,
    ``fp``, ``fn``, ``tn``, ``tpr`` (recall), ``fpr``, ``precision`` and ``f1``; a rate
    with an empty denominator is NaN.

    Parameters
    ----------
    flagged : Mapping[H, bool]
        Hospital -> whether the defence flagged it.
    malicious : Mapping[H, bool]
        Hospital -> whether it is malicious (the population).

    Returns
    -------
    dict[str, float or int]
        The counts and rates named above.
    """
    unknown = set(flagged) - set(malicious)
    if unknown:
        raise ValueError(f"flagged hospitals {sorted(map(str, unknown))} are not in the malicious map")
    tp = fp = fn = tn = 0
    for h, is_bad in malicious.items():
        f = bool(flagged.get(h, False))
        if is_bad:
            tp, fn = (tp + 1, fn) if f else (tp, fn + 1)
        else:
            fp, tn = (fp + 1, tn) if f else (fp, tn + 1)
    tpr = _ratio(tp, tp + fn)
    precision = _ratio(tp, tp + fp)
    f1 = _ratio(2 * tp, 2 * tp + fp + fn)
    return {
        "tpr": tpr,
        "fpr": _ratio(fp, fp + tn),
        "precision": precision,
        "f1": f1,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def rounds_to_detection(
    flags_per_round: Sequence[Mapping[H, bool]],
    malicious: Mapping[H, bool],
    *,
    first_round: int = 1,
) -> dict[H, int | None]:
    """For each malicious hospital, the first round in which it was flagged, or None if
    never. ``flags_per_round[i]`` holds the flags of round ``first_round + i`` (Flower
    rounds are 1-based); a hospital missing from a round's map was not flagged.

    Parameters
    ----------
    flags_per_round : Sequence[Mapping[H, bool]]
        Per round, hospital -> flagged.
    malicious : Mapping[H, bool]
        Hospital -> whether it is malicious.
    first_round : int
        The round number of ``flags_per_round[0]``.

    Returns
    -------
    dict[H, int or None]
        Malicious hospital -> its first flagged round, or None.
    """
    out: dict[H, int | None] = {}
    for h, is_bad in malicious.items():
        if not is_bad:
            continue
        out[h] = None
        for i, flags in enumerate(flags_per_round):
            if flags.get(h, False):
                out[h] = first_round + i
                break
    return out


__all__ = ["backdoor_success_rate", "detection_rates", "rounds_to_detection", "targeted_flip_success"]

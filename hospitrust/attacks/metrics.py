"""Security metrics: attack success and detection quality (pure functions).

Rates are NaN when their denominator is empty (no eligible test images, no malicious
or no honest hospitals, nothing flagged), never a division error.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np


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
    """
    p, t = _pair(pred_on_triggered, true_labels)
    eligible = t != int(target)
    if not eligible.any():
        return float("nan")
    return float(np.mean(p[eligible] == int(target)))


def targeted_flip_success(pred, true_labels, source: int, target: int) -> float:
    """Targeted label-flip success: the share of ``source``-class test images predicted
    as ``target``. NaN if there are no source-class images.
    """
    p, t = _pair(pred, true_labels)
    eligible = t == int(source)
    if not eligible.any():
        return float("nan")
    return float(np.mean(p[eligible] == int(target)))


def _ratio(num: int, den: int) -> float:
    return float(num) / den if den else float("nan")


def detection_rates(
    flagged: Mapping[Hashable, bool], malicious: Mapping[Hashable, bool]
) -> dict[str, float | int]:
    """Confusion counts and rates of a detector over hospitals.

    ``malicious`` defines the population (hospital -> is malicious); ``flagged`` says
    which hospitals the defence excluded / down-weighted (missing hospitals count as
    not flagged; a hospital absent from ``malicious`` is an error). Returns ``tp``,
    ``fp``, ``fn``, ``tn``, ``tpr`` (recall), ``fpr``, ``precision`` and ``f1``; a rate
    with an empty denominator is NaN.
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
    flags_per_round: Sequence[Mapping[Hashable, bool]],
    malicious: Mapping[Hashable, bool],
    *,
    first_round: int = 1,
) -> dict[Hashable, int | None]:
    """For each malicious hospital, the first round in which it was flagged, or None if
    never. ``flags_per_round[i]`` holds the flags of round ``first_round + i`` (Flower
    rounds are 1-based); a hospital missing from a round's map was not flagged.
    """
    out: dict[Hashable, int | None] = {}
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

"""Membership inference by thresholding (Yeom et al. 2018): can the model tell a hospital's
training images (members) from images it never saw (non-members)?

The attack score is the model's probability of the true class (equivalently minus the
loss: the same ranking); the report is the AUROC of members against non-members. 0.5 is
chance: the model gives away nothing about membership.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score


def true_class_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The model's probability of each image's true class (the attack score).

    Parameters
    ----------
    probs : numpy.ndarray
        ``(N, C)`` predicted class probabilities.
    labels : numpy.ndarray
        ``(N,)`` true classes.

    Returns
    -------
    numpy.ndarray
        ``(N,)`` probabilities of the true class.
    """
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    probs = np.asarray(probs)
    if probs.shape[0] != labels.size:
        raise ValueError(f"{probs.shape[0]} probability rows but {labels.size} labels")
    return probs[np.arange(labels.size), labels]


def mia_auroc(member_probs: np.ndarray, member_labels: np.ndarray, nonmember_probs: np.ndarray,
              nonmember_labels: np.ndarray) -> float:
    """AUROC of the confidence-threshold attack; members are the positives.

    Parameters
    ----------
    member_probs : numpy.ndarray
        ``(N, C)`` probabilities on the training images (members).
    member_labels : numpy.ndarray
        ``(N,)`` their classes.
    nonmember_probs : numpy.ndarray
        ``(M, C)`` probabilities on images the model never saw.
    nonmember_labels : numpy.ndarray
        ``(M,)`` their classes.

    Returns
    -------
    float
        The AUROC in [0, 1] (0.5: chance).
    """
    m = true_class_confidence(member_probs, member_labels)
    n = true_class_confidence(nonmember_probs, nonmember_labels)
    if m.size == 0 or n.size == 0:
        raise ValueError(f"need members and non-members, got {m.size} and {n.size}")
    y = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    return float(roc_auc_score(y, np.concatenate([m, n])))

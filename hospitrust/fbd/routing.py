"""Inference over the warehouse, and per-color detection on the reference cohort.

Routing turns the colors' class probabilities ``(colors, n, classes)`` into one
prediction per sample:

- ``max-confidence``: per sample, the color whose top class probability is highest;
- ``ensemble``: the average over colors;
- either one without named colors (``exclude``), e.g. the colors flagged by detection.

Detection: each color's cross-entropy on the server's reference cohort, as a z-score
against the other colors (population standard deviation); a color with z above the
threshold is flagged.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from hospitrust.models.training import predict_proba

ROUTING_MODES = ("max-confidence", "ensemble")


def color_probabilities(warehouse, images: np.ndarray, colors: Iterable[int] | None = None,
                        device: torch.device | None = None) -> np.ndarray:
    """(colors, n, classes) float64 probabilities of every color (or the listed ones).

    Parameters
    ----------
    warehouse : Warehouse
        The warehouse (its colors' models).
    images : numpy.ndarray
        uint8 ``(n, H, W, C)`` images.
    colors : Iterable[int] or None
        The colors to evaluate; None: all.
    device : torch.device or None
        Where the models run; None: ``predict_proba``'s default.

    Returns
    -------
    numpy.ndarray
        ``(colors, n, classes)`` float64.
    """
    colors = list(range(warehouse.num_colors)) if colors is None else list(colors)
    return np.stack([predict_proba(warehouse.model(m), images, device=device) for m in colors])


def route(probs: np.ndarray, mode: str = "ensemble", exclude: Iterable[int] = ()) -> np.ndarray:
    """(n, classes) probabilities from ``(colors, n, classes)``; ``exclude`` names colors to leave out.

    Parameters
    ----------
    probs : numpy.ndarray
        ``(colors, n, classes)`` probabilities (:func:`color_probabilities`).
    mode : {"ensemble", "max-confidence"}
        The routing mode.
    exclude : Iterable[int]
        Colors left out (at least one must remain).

    Returns
    -------
    numpy.ndarray
        ``(n, classes)`` float64 probabilities.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3:
        raise ValueError(f"expected (colors, n, classes) probabilities, got shape {probs.shape}")
    excluded = set(int(c) for c in exclude)
    bad = sorted(c for c in excluded if not 0 <= c < probs.shape[0])
    if bad:
        raise ValueError(f"excluded colors {bad} out of range 0..{probs.shape[0] - 1}")
    keep = [m for m in range(probs.shape[0]) if m not in excluded]
    if not keep:
        raise ValueError(f"every color ({probs.shape[0]}) is excluded from routing; nothing left to predict with")
    p = probs[keep]
    if mode == "ensemble":
        return p.mean(axis=0)
    if mode == "max-confidence":
        best = p.max(axis=2).argmax(axis=0)  # (n,) index into keep
        return p[best, np.arange(p.shape[1])]
    raise ValueError(f"unknown routing mode {mode!r}; allowed: {', '.join(ROUTING_MODES)}")


def color_losses(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(colors,) mean cross-entropy of each color.

    Parameters
    ----------
    probs : numpy.ndarray
        ``(colors, n, classes)`` probabilities on the reference cohort.
    labels : numpy.ndarray
        ``(n,)`` its labels.

    Returns
    -------
    numpy.ndarray
        ``(colors,)`` float64 losses.
    """
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    p_true = np.asarray(probs)[:, np.arange(labels.size), labels]
    return -np.log(np.clip(p_true, 1e-12, 1.0)).mean(axis=1)


def loss_zscores(losses: np.ndarray) -> np.ndarray:
    """(loss - mean) / std over colors; zeros when all colors have the same loss.

    Parameters
    ----------
    losses : numpy.ndarray
        ``(colors,)`` losses (:func:`color_losses`).

    Returns
    -------
    numpy.ndarray
        ``(colors,)`` float64 z-scores.
    """
    losses = np.asarray(losses, dtype=np.float64)
    std = losses.std()
    return np.zeros_like(losses) if std == 0 or not np.isfinite(std) else (losses - losses.mean()) / std


def flagged_colors(zscores: np.ndarray, threshold: float) -> list[int]:
    """The colors whose z-score exceeds ``threshold`` (``fbd.detect-z``).

    Parameters
    ----------
    zscores : numpy.ndarray
        ``(colors,)`` z-scores (:func:`loss_zscores`).
    threshold : float
        The z above which a color is flagged.

    Returns
    -------
    list[int]
        The flagged colors, ascending.
    """
    return [int(m) for m in np.flatnonzero(np.asarray(zscores) > threshold)]


def parse_color_list(text: str, num_colors: int | None = None) -> tuple[int, ...]:
    """``'1, 3'`` -> ``(1, 3)``; ValueError names a bad item.

    Parameters
    ----------
    text : str
        Comma-separated color indices (``fbd.exclude-colors``).
    num_colors : int or None
        The colors there are (every index must be below it); None: not checked.

    Returns
    -------
    tuple[int, ...]
        The colors in the given order (no repeats allowed).
    """
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"color {part!r} is not a non-negative integer (expected e.g. '1,3')")
        c = int(part)
        if num_colors is not None and c >= num_colors:
            raise ValueError(f"color {c} out of range; there are {num_colors} colors (0..{num_colors - 1})")
        if c in out:
            raise ValueError(f"color {c} is listed twice")
        out.append(c)
    return tuple(out)

"""Geometric median, RFA (Pillutla, Kakade & Harchaoui, IEEE TSP 2022), by smoothed Weiszfeld."""

from __future__ import annotations

import torch

from hospitrust.aggregation import geometric_median
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class GeometricMedian(HospitrustStrategy):
    """The point minimizing the example-weighted sum of distances to the updates.

    Each hospital's recorded weight is its Weiszfeld weight at the solution,
    alpha_i / max(eps, ||z - x_i||), normalized: far-off updates count little.

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name (from the query round).
    options : Options or Mapping, optional
        The rule's options (an instance of its ``Options``, or a mapping of field names); its
        defaults when None.
    train_config : Mapping, optional
        Values every hospital gets in its train ConfigRecord (local epochs, lr, ...).
    fraction_train : float
        Share of hospitals asked each round (at least ``min_hospitals``).
    min_hospitals : int
        Fewest valid replies to update the model; fewer keeps the previous one.
    limits : ReplyLimits, optional
        Bounds of the reply validation.
    seed : int
        Seeds hospital sampling.
    device : torch.device or str
        Where the aggregation math runs.
    """

    name = "geometric-median"
    eps = 1e-6

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        alpha = (example_weights / example_weights.sum()).to(updates.dtype)
        z = geometric_median(updates, eps=self.eps, iters=100, weights=alpha)
        beta = alpha.double() / torch.linalg.vector_norm(updates - z, dim=1).double().clamp_min(self.eps)
        n = updates.shape[0]
        return Aggregate(z, beta / beta.sum(), torch.ones(n, dtype=torch.bool))

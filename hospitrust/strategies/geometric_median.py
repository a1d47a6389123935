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
    hospitals, options, **kwargs
        As every rule takes them (:class:`~hospitrust.strategies.base.HospitrustStrategy`).
    """

    name = "geometric-median"
    eps = 1e-6

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        alpha = (example_weights / example_weights.sum()).to(updates.dtype)
        z = geometric_median(updates, eps=self.eps, iters=100, weights=alpha)
        beta = alpha.double() / torch.linalg.vector_norm(updates - z, dim=1).double().clamp_min(self.eps)
        n = updates.shape[0]
        return Aggregate(z, beta / beta.sum(), torch.ones(n, dtype=torch.bool))

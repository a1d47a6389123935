"""Centered clipping (Karimireddy, He & Jaggi, ICML 2021)."""

from __future__ import annotations

import torch

from pydantic import Field

from hospitrust.aggregation import centered_clipping
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class CenteredClippingOptions(Options):
    """Centered clipping's options: the radius and the iterations."""

    radius: float = Field(0.0, ge=0.0, description=(
        "Clipping radius tau around the previous aggregate (0: the median distance to the center, each "
        "round)."
    ))
    iterations: int = Field(1, ge=1, le=100, description="Clipping iterations per round.")


class CenteredClipping(HospitrustStrategy):
    """Updates are clipped to radius tau around the previous round's aggregate (zero at first),
    then averaged: v <- v + mean_i (x_i - v) min(1, tau / ||x_i - v||).

    ``tau`` <= 0 picks the radius each round as the median distance of the updates to the
    center, so half the hospitals are clipped whatever the model's scale.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "centered-clipping"
    Options = CenteredClippingOptions
    options: CenteredClippingOptions
    state_attrs = ("center",)

    def __init__(self, hospitals, options=None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.center: torch.Tensor | None = None  # state across rounds

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n, d = updates.shape
        if self.center is None or self.center.numel() != d:
            self.center = torch.zeros(d, dtype=updates.dtype, device=updates.device)
        self.center = self.center.to(device=updates.device, dtype=updates.dtype)  # a checkpoint loads on the CPU
        distances = torch.linalg.vector_norm(updates - self.center, dim=1)
        radius = self.options.radius
        tau = radius if radius > 0 else float(distances.median().clamp_min(1e-12))
        update = centered_clipping(updates, self.center, tau, self.options.iterations)
        self.center = update.detach().clone()
        clip = torch.clamp(tau / distances.double().clamp_min(1e-12), max=1.0)
        return Aggregate(update, clip / clip.sum(), torch.ones(n, dtype=torch.bool),
                         extra={"clip_factor": [float(c) for c in clip]})

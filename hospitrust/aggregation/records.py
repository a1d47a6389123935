"""The per-hospital record the field's rules return beside their aggregate."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["RuleRecord"]


@dataclass(frozen=True)
class RuleRecord:
    """What a rule decided about every row of the stack it aggregated.

    Parameters
    ----------
    selected : torch.Tensor
        ``(n,)`` bool: the rows that count in the aggregate.
    weights : torch.Tensor
        ``(n,)`` float64 CPU: the coefficient of every row in the aggregate (before any noise),
        ``aggregate = weights @ x`` (+ noise for FLAME).
    detail : dict
        Rule-specific values (cluster labels, scores, clip factors, the chosen subset ...).
    """

    selected: torch.Tensor
    weights: torch.Tensor
    detail: dict = field(default_factory=dict)

    @property
    def excluded(self) -> list[int]:
        """The rows left out."""
        return [int(i) for i in torch.nonzero(~self.selected).flatten().tolist()]

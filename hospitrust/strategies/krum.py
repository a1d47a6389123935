"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017)."""

from __future__ import annotations

from typing import ClassVar

import torch

from pydantic import Field

from hospitrust.aggregation import krum_scores, multi_krum_select, pairwise_sq_distances
from hospitrust.options import NoOptions
from hospitrust.options import Options as OptionsModel
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sized import SizedRule


class MultiKrumOptions(OptionsModel):
    """Multi-Krum's options: how many updates are averaged."""

    num_selected: int = Field(0, ge=0, description=(
        "m, the updates with the lowest Krum scores that are averaged (0: n - f)."
    ))


class MultiKrum(SizedRule):
    """The mean of the m updates with the smallest Krum scores (sum of squared distances to
    their n-f-2 nearest neighbours); m = n - f by default. Needs n >= 2f + 3.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "multi-krum"
    Options: ClassVar[type[OptionsModel]] = MultiKrumOptions  # Krum below: NoOptions
    options: OptionsModel  # MultiKrumOptions here, NoOptions in Krum: hence getattr below
    agr_tailored = "selection"

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1, **kwargs) -> None:
        super().__init__(hospitals, options, assumed_malicious=assumed_malicious, **kwargs)
        self.m = getattr(self.options, "num_selected", 0)  # 0: n - f

    def required_replies(self) -> int:
        return 2 * self.f + 3

    def _m(self, n: int) -> int:
        return min(self.m, n) if self.m > 0 else n - self.f

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n = updates.shape[0]
        distances = pairwise_sq_distances(updates)  # computed once, used for scores and selection
        chosen = multi_krum_select(updates, self.f, self._m(n), distances=distances)
        selected = torch.zeros(n, dtype=torch.bool)
        selected[chosen.cpu()] = True
        weights = selected.double() / selected.sum()
        update = weights.to(updates.dtype).to(updates.device) @ updates
        scores = krum_scores(updates, self.f, distances=distances)
        return Aggregate(update, weights, selected, extra={"krum_score": [float(s) for s in scores]})


class Krum(MultiKrum):
    """The single update with the smallest Krum score.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "krum"
    Options = NoOptions
    options: NoOptions

    def _m(self, n: int) -> int:
        return 1

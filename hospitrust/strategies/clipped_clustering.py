"""Clipped clustering (Li, Ngai & Voigt, IEEE Transactions on Big Data 2023; Blades' ``Clippedclustering``)."""

from __future__ import annotations

from logging import INFO
from typing import Literal

import torch
from flwr.common import log
from pydantic import Field

from hospitrust.aggregation import clipped_clustering
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class ClippedClusteringOptions(Options):
    """Clipped clustering's options: the clip's ceiling and the linkage."""

    max_tau: float = Field(1e5, gt=0.0, description=(
        "tau_max: the clip bound is the median of every update norm so far, at most this (Blades' 1e5)."
    ))
    linkage: Literal["average", "complete", "single"] = Field("average", description=(
        "The linkage of the agglomerative clustering on cosine distance (Blades' average)."
    ))


class ClippedClustering(HospitrustStrategy):
    """Every update is clipped to the median of all update norms seen so far (this round's and every
    earlier round's), the updates are split in two by agglomerative clustering on cosine distance,
    and the larger group's clipped updates are averaged (Li, Ngai & Voigt, "An Experimental Study of
    Byzantine-Robust Aggregation Schemes in Federated Learning", 2023; Blades' definition).

    State across rounds: ``norm_history``, the norms of every update aggregated so far (float64, saved
    in the checkpoint).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "clipped-clustering"
    Options = ClippedClusteringOptions
    options: ClippedClusteringOptions
    state_attrs = ("norm_history",)

    def __init__(self, hospitals, options=None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.norm_history = torch.zeros(0, dtype=torch.float64)

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        o = self.options
        update, self.norm_history, rec = clipped_clustering(updates, self.norm_history, max_tau=o.max_tau,
                                                            linkage=o.linkage)
        d = rec.detail
        log(INFO, "clipped-clustering round %d: %d of %d in the larger cluster, clip bound %.4g (median of %d norms)",
            context.server_round, int(rec.selected.sum()), len(rec.selected), d["clip_bound"], self.norm_history.numel())
        return Aggregate(update, rec.weights, rec.selected, extra={
            "cluster_label": [int(v) for v in d["labels"]],
            "clip_factor": [float(v) for v in d["clip_factors"]],
        })

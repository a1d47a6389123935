"""FLAME (Nguyen et al., USENIX Security 2022): cosine HDBSCAN, median-norm clipping, adaptive noise."""

from __future__ import annotations

from logging import INFO
from typing import Literal

from flwr.common import log
from pydantic import Field

from hospitrust.aggregation import flame
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FLAMEOptions(Options):
    """FLAME's options: what is clustered and the noise level."""

    noise_lambda: float = Field(0.001, ge=0.0, description=(
        "lambda: the Gaussian noise added to the aggregate has standard deviation lambda x the median update norm "
        "(the paper's 0.001 for image classification); 0 adds none."
    ))
    cluster: Literal["models", "updates"] = Field("models", description=(
        "What HDBSCAN clusters by cosine distance: the local models global + u_i (as published) or the updates u_i."
    ))


class FLAME(HospitrustStrategy):
    """The majority cluster of a cosine-distance HDBSCAN is admitted; every admitted update is clipped
    to the median update norm S and they are averaged; Gaussian noise of standard deviation
    ``noise-lambda`` x S is added (Nguyen et al., "FLAME: Taming Backdoors in Federated Learning",
    USENIX Security 2022).

    The noise is drawn from a generator seeded by the run seed and the round, so a run (and a resumed
    run) is reproducible. With ``flame.cluster = "models"`` (the default, as published) the cosines are
    those of the local models global + u_i, formed from the updates' Gram matrix and their dot
    products with the global model.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "flame"
    Options = FLAMEOptions
    options: FLAMEOptions

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        o = self.options
        global_model = self.global_vector().to(updates.device, updates.dtype) if o.cluster == "models" else None
        update, rec = flame(updates, global_model=global_model, noise_lambda=o.noise_lambda,
                            generator=self.round_generator(context.server_round))
        d = rec.detail
        log(INFO, "flame round %d: %d of %d admitted, clip bound %.4g, noise std %.3g", context.server_round,
            int(rec.selected.sum()), len(rec.selected), d["clip_bound"], d["noise_std"])
        return Aggregate(update, rec.weights, rec.selected, extra={
            "cluster_label": [int(v) for v in d["labels"]],
            "admitted": [bool(v) for v in rec.selected],
            "clip_factor": [float(v) for v in d["clip_factors"]],
        })

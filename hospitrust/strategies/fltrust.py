"""FLTrust (Cao, Fang, Liu & Gong, NDSS 2021), with the reference cohort as root dataset."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hospitrust.aggregation import fltrust, fltrust_trust
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FLTrust(HospitrustStrategy):
    """Each round the server trains the current global model for one local epoch on its
    reference cohort; that root update g anchors trust: TS_i = ReLU(cos(u_i, g)); every
    update is rescaled to ||g|| and the trust-weighted mean is the aggregate.

    ``server_update`` is a callable global state -> (d,) root update (built by the
    ServerApp, which holds the model and the reference cohort).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    server_update : Callable[[dict, int], torch.Tensor]
        (global state, server round) -> the ``(d,)`` root update (required).
    **kwargs
        The base's other keyword arguments.
    """

    name = "fltrust"
    trust_signal = "trust"

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        return frozenset({"server_update"})

    def __init__(self, hospitals, options=None, *, server_update: Callable[[dict, int], torch.Tensor] | None = None,
                 **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        if server_update is None:
            raise ValueError("fltrust needs a server_update callable (the root update from the reference cohort)")
        self.server_update = server_update

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        g = self.server_update(self.global_state, context.server_round).to(updates.device, updates.dtype)
        trust = fltrust_trust(updates, g).double()
        update = fltrust(updates, g)
        weights = trust / trust.sum() if float(trust.sum()) > 0 else torch.zeros_like(trust)
        return Aggregate(update, weights, trust > 0, extra={"trust": [float(t) for t in trust]})

"""FedProx (Li et al. 2020): FedAvg on the server, a proximal term on the hospitals.

The server side is FedAvg's weighted mean; what differs is that every train message
carries ``proximal-mu`` and the ClientApp adds ``(mu/2)||w - w_global||^2`` to its loss.
"""

from __future__ import annotations

from pydantic import Field

from hospitrust.options import Options
from hospitrust.strategies.fedavg import FedAvg


class FedProxOptions(Options):
    """FedProx's options: the weight of the proximal term."""

    proximal_mu: float = Field(0.01, gt=0.0, description=(
        "Weight mu of the proximal term (mu/2)||w - w_global||^2 in each hospital's loss."
    ))


class FedProx(FedAvg):
    """FedAvg's aggregate; each hospital trains with FedProx's proximal term (weight ``fedprox.proximal-mu``).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "fedprox"
    Options = FedProxOptions
    options: FedProxOptions
    central_dp_compatible = False  # central DP was measured and documented with FedAvg only
    local_dp_compatible = False
    secagg_compatible = False
    capability_notes = {"local_dp_compatible": "Opacus replaces each gradient with the clipped, noised sum of "
                        "per-sample gradients, so FedProx's proximal term would be dropped silently; use fedavg"}

    def __init__(self, hospitals, options=None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.train_config["proximal-mu"] = float(self.options.proximal_mu)

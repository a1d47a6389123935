"""FedProx (Li et al. 2020): FedAvg on the server, a proximal term on the hospitals.

The server side is FedAvg's weighted mean; what differs is that every train message
carries ``proximal-mu`` and the ClientApp adds ``(mu/2)||w - w_global||^2`` to its loss.
"""

from __future__ import annotations

from hospitrust.strategies.fedavg import FedAvg


class FedProx(FedAvg):
    name = "fedprox"

    def __init__(self, hospitals, *, proximal_mu: float = 0.01, **kwargs) -> None:
        if proximal_mu <= 0:
            raise ValueError(f"fedprox needs proximal-mu > 0, got {proximal_mu}")
        super().__init__(hospitals, **kwargs)
        self.proximal_mu = proximal_mu
        self.train_config["proximal-mu"] = float(proximal_mu)

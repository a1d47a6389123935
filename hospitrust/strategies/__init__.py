"""Strategy registry: a run config name -> a Flower strategy class.

Every class takes ``(hospitals, **common)`` where ``common`` is built by
``strategy_kwargs`` from the run config.
"""

from __future__ import annotations

from typing import Any

from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.fedavg import FedAvg
from hospitrust.strategies.fedprox import FedProx

STRATEGIES: dict[str, type[HospitrustStrategy]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
}


def build_strategy(name: str, hospitals, **kwargs: Any) -> HospitrustStrategy:
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(sorted(STRATEGIES))}") from None
    return cls(hospitals, **kwargs)


__all__ = ["Aggregate", "HospitrustStrategy", "STRATEGIES", "build_strategy", "FedAvg", "FedProx"]

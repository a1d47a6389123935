"""Strategy registry: a run config name -> a Flower strategy class.

Every class takes ``(hospitals, **common)`` where ``common`` is built by
``strategy_kwargs`` from the run config.
"""

from __future__ import annotations

from typing import Any

from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.fedavg import FedAvg
from hospitrust.strategies.bulyan import Bulyan
from hospitrust.strategies.centered_clipping import CenteredClipping
from hospitrust.strategies.fedprox import FedProx
from hospitrust.strategies.fltrust import FLTrust
from hospitrust.strategies.geometric_median import GeometricMedian
from hospitrust.strategies.krum import Krum, MultiKrum
from hospitrust.strategies.median import Median
from hospitrust.strategies.trimmed_mean import TrimmedMean
from hospitrust.strategies.fedagain import FedAgain
from hospitrust.strategies.hta import HTA
from hospitrust.strategies.earn import EARN
from hospitrust.strategies.fbd import FBD
from hospitrust.strategies.contribution import ContributionWeighted

STRATEGIES: dict[str, type[HospitrustStrategy]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, Median, TrimmedMean, Krum, MultiKrum, Bulyan, GeometricMedian, CenteredClipping, FLTrust,
                FedAgain, HTA, EARN, ContributionWeighted, FBD)
}


def build_strategy(name: str, hospitals, **kwargs: Any) -> HospitrustStrategy:
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(sorted(STRATEGIES))}") from None
    return cls(hospitals, **kwargs)


__all__ = [
    "Aggregate", "HospitrustStrategy", "STRATEGIES", "build_strategy", "FedAvg", "FedProx", "Median", "TrimmedMean",
    "Krum", "MultiKrum", "Bulyan", "GeometricMedian", "CenteredClipping", "FLTrust",
    "FedAgain", "HTA", "EARN", "ContributionWeighted", "FBD",
]

"""Round features: what a run does besides the rule (privacy, contribution scoring, SecAgg+,
overlapping rounds, the simulated adversary, pre-aggregation, the ground truth's detection record), each an object
with hooks at named points of the round (``hospitrust.features.base``), found by the registry.

The names below load on first use, so that an option module (``secagg_options``) is imported
without the round machinery (torch, Flower).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["AheadSender", "Features", "Round", "RoundFeature", "RunFacts", "Trainer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("hospitrust.features.base"), name)
    raise AttributeError(f"module 'hospitrust.features' has no attribute {name!r}")

"""Flower strategies, one per file, each with its Options; ``registry`` finds them by name.

Every class takes ``(hospitals, options, **common)``; ``build_strategy`` builds one from the run
config's section and what the rule ``needs`` of the server.
"""

from __future__ import annotations

from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.registry import STRATEGIES, build_strategy, strategy_class

__all__ = ["Aggregate", "HospitrustStrategy", "STRATEGIES", "build_strategy", "strategy_class"]

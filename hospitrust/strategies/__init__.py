"""Flower strategies, one per file, each with its Options; ``registry`` finds them by name, and
the presets (published forms and ablations: named option values over one rule) beside them.

Every class takes ``(hospitals, options, **common)``; ``build_strategy`` builds one from the run
config's section and what the rule ``needs`` of the server.
"""

from __future__ import annotations

from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.preset import Preset
from hospitrust.strategies.registry import PRESETS, STRATEGIES, build_strategy, strategy_class, strategy_names

__all__ = ["Aggregate", "HospitrustStrategy", "PRESETS", "Preset", "STRATEGIES", "build_strategy", "strategy_class",
           "strategy_names"]

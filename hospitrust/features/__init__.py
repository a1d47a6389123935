"""Round features: what a run does besides the rule (privacy, contribution scoring, SecAgg+,
overlapping rounds, the simulated adversary, the ground truth's detection record), each an object
with hooks at named points of the round (``hospitrust.features.base``), found by the registry.
"""

from hospitrust.features.base import AheadSender, Features, Round, RoundFeature, RunFacts, Trainer

__all__ = ["AheadSender", "Features", "Round", "RoundFeature", "RunFacts", "Trainer"]

"""The base of the rules sized for f attackers (Krum, Multi-Krum, Bulyan, trimmed mean, DnC, the
ByzFL subset rules): run config ``assumed-malicious`` is their f.
"""

from __future__ import annotations

from hospitrust.strategies.base import HospitrustStrategy


class SizedRule(HospitrustStrategy):
    """A rule sized for f attackers.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    assumed_malicious : int
        f, the attackers the rule is sized for (run config ``assumed-malicious``).
    **kwargs
        The base's other keyword arguments.
    """

    sized_for_attackers = True

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.f = assumed_malicious

"""The ByzFL family of subset rules: MDA, SMEA, CAF (sized for f attackers) and MoNNA (around the
server's own update).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from logging import INFO

import torch
from flwr.common import log

from hospitrust.aggregation import caf, mda, monna_around, smea
from hospitrust.aggregation.subset_rules import MAX_SUBSETS
from hospitrust.strategies.base import Aggregate
from hospitrust.strategies.sized import SizedRule


class _SizedForF(SizedRule):
    """A rule over n - f (or n - 2f) of the updates: needs n >= 2f + 1 valid replies."""

    def required_replies(self) -> int:
        return 2 * self.f + 1


class _Enumerating(_SizedForF):
    """A rule that enumerates every subset of n - f updates: refused at start when C(n, f) for the
    federation's n is over ``MAX_SUBSETS`` (a round with fewer replies has fewer subsets).
    """

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1, **kwargs) -> None:
        super().__init__(hospitals, options, assumed_malicious=assumed_malicious, **kwargs)
        n, f = len(self.hospitals), self.f
        if 2 * f < n and math.comb(n, f) > MAX_SUBSETS:
            raise ValueError(f"strategy {self.name} enumerates every subset of n - f updates: with {n} hospitals and "
                             f"assumed-malicious = {f} that is C({n}, {f}) = {math.comb(n, f)} subsets, more than "
                             f"{MAX_SUBSETS}; set a smaller assumed-malicious or choose another rule (caf, dnc)")


class MDA(_Enumerating):
    """Minimum-diameter averaging: the mean of the n - f updates whose largest pairwise distance is
    the smallest (El Mhamdi, Guerraoui & Rouault, ICML 2018; ByzFL ``MDA``). f is
    ``assumed-malicious``; it needs n >= 2f + 1 valid replies, and C(n, f) at most 200000 subsets.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "mda"

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        update, rec = mda(updates, self.f)
        log(INFO, "mda round %d: subset diameter %.4g", context.server_round, rec.detail["diameter"])
        return Aggregate(update, rec.weights, rec.selected)


class SMEA(_Enumerating):
    """Smallest maximum eigenvalue averaging: the mean of the n - f updates whose empirical covariance
    has the smallest largest eigenvalue (Allouah et al., ICML 2023; ByzFL ``SMEA``, with the exact
    eigenvalue). f is ``assumed-malicious``; it needs n >= 2f + 1 valid replies, and C(n, f) at most
    200000 subsets.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "smea"

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        update, rec = smea(updates, self.f)
        log(INFO, "smea round %d: the subset's largest covariance eigenvalue %.4g", context.server_round,
            rec.detail["max_eigenvalue"])
        return Aggregate(update, rec.weights, rec.selected)


class CAF(_SizedForF):
    """Covariance-bound agnostic filter: down-weight the updates along the covariance's top
    eigenvector until the weights sum to n - 2f; the weighted mean whose covariance had the
    smallest top eigenvalue (Allouah, Guerraoui & Stephan, ICML 2025; ByzFL ``CAF``, with the exact
    eigenpair). f is ``assumed-malicious``; it needs n >= 2f + 1 valid replies.

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    """

    name = "caf"

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        update, rec = caf(updates, self.f)
        log(INFO, "caf round %d: top covariance eigenvalue %.4g after %d iterations", context.server_round,
            rec.detail["max_eigenvalue"], rec.detail["iterations"])
        # a weight of 0 is a hospital filtered out: CAF's per-hospital record is its weight
        return Aggregate(update, rec.weights, rec.selected)


class MoNNA(_SizedForF):
    """The mean of the n + 1 - f updates nearest to the server's own update, itself included: the
    server's root update (one local epoch of the global model on the reference cohort, as FLTrust's)
    is MoNNA's trusted vector, stacked with the n hospitals' (Farhadkhani et al., ICML 2023; ByzFL
    ``MoNNA``). f is ``assumed-malicious``; it needs n >= 2f valid replies (2f < n + 1).

    Parameters
    ----------
    hospitals, options, assumed_malicious, **kwargs
        As every rule sized for f attackers takes them (:class:`~hospitrust.strategies.sized.SizedRule`).
    server_update : Callable[[dict, int], torch.Tensor]
        (global state, server round) -> the ``(d,)`` root update (required; the ServerApp builds it from the
        reference cohort).
    """

    name = "monna"

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        return frozenset({"server_update"})

    def __init__(self, hospitals, options=None, *, assumed_malicious: int = 1,
                 server_update: Callable[[dict, int], torch.Tensor] | None = None, **kwargs) -> None:
        super().__init__(hospitals, options, assumed_malicious=assumed_malicious, **kwargs)
        if server_update is None:
            raise ValueError("monna needs a server_update callable (its trusted update, from the reference cohort)")
        self.server_update = server_update

    def required_replies(self) -> int:
        return max(1, 2 * self.f)

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        trusted = self.server_update(self.global_state, context.server_round).to(updates.device, updates.dtype)
        update, rec = monna_around(updates, trusted, self.f)
        log(INFO, "monna round %d: the server's update and the %d hospitals nearest to it averaged", context.server_round,
            int(rec.selected.sum()))
        return Aggregate(update, rec.weights, rec.selected,
                         extra={"distance_to_server_update": [float(v) for v in rec.detail["distances"]]})

"""Central differential privacy: Flower 1.42's server-side fixed-clipping wrapper around FedAvg.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` clips each hospital's update (returned
model - global model) to ``central-clipping-norm`` and adds Gaussian noise of std ``z x C / n``
to the aggregate. That std is right for the *equal-weight* mean of exactly ``n`` clipped
updates, so here FedAvg weighs hospitals equally, ``n`` is the number asked this round, and a
round with fewer valid updates than asked (an error, a rejected or budget-spent hospital)
releases nothing (the previous model is kept). Flower's own accounted mode only accepts Flower's
``FedAvg``, so the wrapper runs without its ``accountant`` argument and this class composes the
same event, ``GaussianPrivacyEvent(z, n, hospitals)``, into Flower's ``RdpAccountant`` with
``SamplingMethod.NO_AMPLIFICATION`` after every release: (epsilon, delta) at the hospital level
(one hospital's whole update added or removed).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy

from hospitrust.privacy.options import PrivacyOptions
from hospitrust.records import RoundRecord
from hospitrust.strategies import intake
from hospitrust.strategies.base import RoundResult, UpdateStep

ACCOUNTANT_DESCRIPTION = ("flwr RdpAccountant (dp-accounting RDP), GaussianPrivacyEvent per release, "
                          "SamplingMethod.NO_AMPLIFICATION, neighbours: one hospital's update added or removed")


def _accountant(delta: float, hospitals: int):
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    return RdpAccountant(PrivacyConfig(target_delta=delta, population_size=hospitals,
                                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       sampling_method=SamplingMethod.NO_AMPLIFICATION))


class _RuleRound(Strategy):
    """Flower's wrapper's strategy: the inner rule, whose ``aggregate_train`` is its typed round with this round's
    update steps and equal weights (the std z C / n holds for the equal-weight mean of n clipped updates); each
    result is kept for the wrapper's caller. The rule itself is never swapped or changed: only its inputs are.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.update_steps: Sequence[UpdateStep] = ()  # the round's, set by CentralPrivacy.aggregate_round
        self.results: list[RoundResult] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        # equal weights: the noise z C / n is for the equal-weight mean; no round-relative bound: which replies
        # enter must not depend on the other hospitals' norms (a release decision the accountant does not count)
        result = self.inner.aggregate_round(server_round, replies, self.update_steps, equal_weights=True,
                                            round_bound=False)
        self.results.append(result)
        return result.arrays, result.metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()


class CentralPrivacy(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed clipping around hospitrust's FedAvg, accounted per release.

    Parameters
    ----------
    strategy : HospitrustStrategy
        The rule it wraps, a ``central_dp_compatible`` one (each round asks it for the equal-weight mean).
    options : PrivacyOptions
        The ``privacy`` section (central noise multiplier, clipping norm, delta).
    num_hospitals : int
        The population the accountant counts (every hospital of the run).
    feature : str
        The round feature it belongs to: a round that releases nothing leaves every hospital out
        under this name.
    """

    def __init__(self, strategy: Any, options: PrivacyOptions, num_hospitals: int, feature: str = "privacy") -> None:
        self.round = _RuleRound(strategy)
        super().__init__(self.round, options.central_noise_multiplier, options.central_clipping_norm,
                         num_sampled_clients=max(num_hospitals, 1))
        if not strategy.central_dp_compatible:
            raise ValueError(f"central DP wraps a rule that can take the equal-weight mean of the clipped updates; "
                             f"{strategy.name} cannot ({strategy.why_not('central_dp_compatible', 'central_dp_compatible is False')})")
        self.inner = strategy
        self.options = options
        self.num_hospitals = num_hospitals
        self.feature = feature
        self.accountant_rdp = _accountant(options.delta, max(num_hospitals, 1))
        self.released: dict[int, int] = {}  # round -> n of its release

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.configure_round(server_round, arrays, config, grid)

    def configure_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        excluded: Collection[str] = ()) -> list[Message]:
        """Flower's ``configure_train`` with the inner rule's exclusions; the noise is for the n asked."""
        self.current_arrays = arrays  # what Flower's wrapper clips the replies against
        messages = list(self._prepare_accounting(server_round, self.inner.configure_round(
            server_round, arrays, config, grid, excluded)))
        self.num_sampled_clients = max(len(messages), 1)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        result = self.aggregate_round(server_round, replies)
        return result.arrays, result.metrics

    def aggregate_round(self, server_round: int, replies: Iterable[Message],
                        update_steps: Sequence[UpdateStep] = ()) -> RoundResult:
        """Flower's clipping and noise around the inner rule's ``aggregate_round``; a round with fewer
        valid updates than asked releases nothing.
        """
        replies = list(replies)
        # Flower's wrapper clips the replies, calls its strategy's aggregate_train (the rule's typed round, with
        # this round's update steps) and noises the result
        self.round.update_steps, self.round.results = update_steps, []
        arrays, metrics = super().aggregate_train(server_round, replies)
        inner_results = self.round.results
        if inner_results:
            result = inner_results[0]
        else:  # Flower's wrapper aggregates nothing when any reply is an error
            result = RoundResult()
            for reply in replies:
                node_id = int(reply.metadata.src_node_id)
                reason = (f"error reply: {(reply.error.reason or '').strip()[:300]}" if reply.has_error()
                          else "not aggregated: another hospital's reply was an error")
                result.clients.append(intake.hospital_record(self.inner, node_id, rejected=reply.has_error(), reason=reason))
        result.arrays, result.metrics = arrays, metrics
        valid = sum(1 for c in result.clients if c.selected)
        if arrays is None or valid != self.num_sampled_clients:
            why = (f"central DP: {valid} valid updates of the {self.num_sampled_clients} asked; the noise (z C / n) is "
                   "calibrated for all n, so nothing is released this round: kept the previous model")
            result.keep_previous(why)
            for c in result.clients:
                if c.selected:
                    c.exclude(f"central DP: nothing released ({valid} valid updates of the {self.num_sampled_clients} asked)",
                              by=self.feature)
            log(WARNING, "Round %d: %s", server_round, why)
            return result
        self._compose(server_round, self.num_sampled_clients)
        if self.inner.global_state is not None:  # the step as released: Flower's wrapper noised it after the rule
            from hospitrust.aggregation.vectorize import flatten_state

            before, _ = flatten_state(self.inner.global_state)
            after, _ = flatten_state(arrays.to_torch_state_dict())
            result.update_norm = float(torch.linalg.vector_norm(after.double() - before.double()))
        return result

    def _compose(self, server_round: int, n: int) -> None:
        from flwr.serverapp import GaussianPrivacyEvent

        self.accountant_rdp.compose(GaussianPrivacyEvent(noise_multiplier=self.noise_multiplier, sample_size=n,
                                                         population_size=self.accountant_rdp.config.population_size))
        self.released[server_round] = n
        spent = self.spent()
        log(INFO, "hospitrust: central DP round %d: epsilon %.4f at delta %g after %d releases", server_round,
            spent["epsilon"], spent["delta"], spent["releases"])

    def spent(self) -> dict[str, Any]:
        """Central (epsilon, delta) so far, with its releases."""
        releases = self.accountant_rdp.num_releases
        eps = self.accountant_rdp.get_privacy_spent().epsilon if releases else 0.0
        return {"epsilon": float(eps), "delta": float(self.options.delta), "releases": int(releases),
                "noise_multiplier": float(self.noise_multiplier), "clipping_norm": float(self.clipping_norm)}

    def restore(self, history: Sequence[RoundRecord]) -> None:
        """A resumed run's accountant: every earlier round's release, from its record."""
        for rec in history:
            central = (rec.entries.get("privacy") or {}).get("central") or {}
            if central.get("released"):
                self._compose(rec.number, int(central["sample_size"]))

    def round_record(self, server_round: int) -> dict[str, Any]:
        return {**self.spent(), "released": server_round in self.released,
                "sample_size": int(self.released.get(server_round, 0))}

    def settings(self) -> dict[str, Any]:
        return {"wrapper": type(self).__mro__[1].__name__, "accountant": ACCOUNTANT_DESCRIPTION,
                "noise_multiplier": float(self.noise_multiplier), "clipping_norm": float(self.clipping_norm),
                "delta": float(self.options.delta), "population": self.num_hospitals, "weights": "equal"}


__all__ = ["ACCOUNTANT_DESCRIPTION", "CentralPrivacy"]

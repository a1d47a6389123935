"""The simulated adversary as round features (simulation only), steps on the stacked updates before
the rule:

* :class:`SimulatedAdversary`: a colluding attack; the malicious hospitals' rows are replaced by what
  it crafts from the honest rows;
* :class:`RoundAwareAdversary`: an attack that needs more of the round (:class:`~hospitrust.attacks.
  interfaces.RoundView`): the run's rule in the loop (rule-tailored attacks), its state
  (defence-aware attacks) or the previous global update (Neurotoxin's mask).

The rule in the loop is the run's strategy, behind the run's pre-aggregation chain when one is
configured, evaluated on a **deep copy** made for every evaluation: the services it calls (the
reference-cohort judge, FLTrust's root trainer) and the round's global model are shared read-only,
everything else (HTA's reputations, EARN's trust, FoolsGold's history, the sampling RNG) is copied,
so the search never changes the rule the run aggregates with.
"""

from __future__ import annotations

import copy
import math
import types
from collections.abc import Sequence
from typing import Any

import torch
from flwr.app import Message

from hospitrust.attacks.interfaces import ColludingAttack, RoundAware, RoundView
from hospitrust.attacks.threat_model import ColludingAdversary, unwrapped
from hospitrust.features.base import Round, RoundFeature, RunFacts
from hospitrust.features.pre_aggregators import pre_aggregation_chain
from hospitrust.features.secagg_options import SecAggOptions
from hospitrust.strategies import intake
from hospitrust.strategies.base import Aggregate, AttackerRows, HospitrustStrategy, RoundResult, UpdateStep
from hospitrust.strategies.validation import CheckedReply, round_median_norm


class SimulatedAdversary(RoundFeature):
    """A colluding attack's server-side step, applied to the update stack of every round.

    Parameters
    ----------
    adversary : ColludingAdversary
        The attack with the malicious hospitals and the seed.
    """

    name = "simulated-adversary"
    order = 20

    @classmethod
    def for_run(cls, run: RunFacts) -> SimulatedAdversary | None:
        if not isinstance(run.attack, ColludingAttack) or isinstance(unwrapped(run.attack), RoundAware):
            return None
        return cls(ColludingAdversary(run.attack, {h for h, bad in run.truth.items() if bad}, run.cfg.seed))

    def __init__(self, adversary: ColludingAdversary) -> None:
        self.adversary = adversary

    def update_steps(self, rnd: Round) -> Sequence[UpdateStep]:
        return (AttackerRows(self.adversary),)  # its rows are held to the reply checks


def pre_aggregation_of(cfg: Any) -> Any:
    """The run's pre-aggregation chain (``.steps``, ``.apply(round, updates).rows``), or None without one.

    Built by the pre-aggregation feature's own function, so the loop applies exactly the chain the run does.

    Parameters
    ----------
    cfg : RunConfig
        The run config (its ``pre-aggregation`` key).

    Returns
    -------
    object or None
        The chain, or None when the run has none.
    """
    if not str(getattr(cfg, "pre_aggregation", "") or "").strip():
        return None
    return pre_aggregation_chain(cfg)


def private_copy(strategy: Any) -> Any:
    """A deep copy of ``strategy`` whose services (bound methods' owners: the reference-cohort judge, the
    root trainer) and round's global model are shared, not copied: they are only read.

    Parameters
    ----------
    strategy : HospitrustStrategy
        The run's rule.

    Returns
    -------
    HospitrustStrategy
        A copy whose aggregation changes nothing of ``strategy``.
    """
    memo: dict[int, Any] = {}

    def share(obj: Any, depth: int = 0) -> None:
        for value in vars(obj).values():
            if isinstance(value, types.MethodType):
                memo[id(value.__self__)] = value.__self__
            elif getattr(value, "shared_between_copies", False):  # a cache of what the server computes per round
                memo[id(value)] = value
            elif depth < 2 and isinstance(value, HospitrustStrategy):
                share(value, depth + 1)  # a composed rule (EARN's HTA base)
        if isinstance(getattr(obj, "global_state", None), dict):
            memo[id(obj.global_state)] = obj.global_state

    share(strategy)
    return copy.deepcopy(strategy, memo)


class RoundAwareAdversary(RoundFeature):
    """A round-aware attack's server-side step: the malicious rows replaced by what it crafts from the
    round (:class:`RoundView`), with the run's rule in the loop; its choices go on the round's record
    (``adversary`` in rounds.jsonl).

    Parameters
    ----------
    attack : Attack
        The attack (possibly in a schedule) whose innermost attack is :class:`RoundAware`.
    malicious_hospitals : set[str]
        The malicious hospitals' names.
    seed : int
        Seeds each round's generator (with the round number).
    pre_aggregation : object or None
        The run's pre-aggregation chain (:func:`pre_aggregation_of`).
    max_norm : float or None
        The server's bound on an update's norm (``max-update-norm``) the attack is told
        (``RoundView.max_norm``); None: the rule's own ``limits``. With the rule's ``round-norm-bound.over-median``
        the attack is told the smaller of it and that multiple of the honest rows' median norm.
    """

    name = "round-aware-adversary"
    order = 20

    @classmethod
    def for_run(cls, run: RunFacts) -> RoundAwareAdversary | None:
        if run.attack is None or not isinstance(unwrapped(run.attack), RoundAware):
            return None
        from hospitrust.strategies.registry import rule_name, rules_with, strategy_class

        inner = unwrapped(run.attack)
        if run.cfg.section(SecAggOptions).enabled:
            raise ValueError(f"attack {inner.name!r} rewrites the malicious hospitals' rows of the update stack on the "
                             "server, which secure aggregation never holds: disable secagg or choose another attack")
        check = getattr(inner, "check_rule", None)
        chain = pre_aggregation_of(run.cfg)
        if check is not None:  # refused before the first round (agr-tailored's rules)
            check(strategy_class(run.cfg.strategy), tuple(chain.steps) if chain is not None else (),
                  defined=rules_with("agr_tailored"))
        wanted = getattr(inner, "rules", None)
        if wanted and rule_name(run.cfg.strategy) not in wanted:
            raise ValueError(f"attack {inner.name!r} is written against the rule {' or '.join(wanted)}, and the run's "
                             f"strategy is {run.cfg.strategy!r}")
        return cls(run.attack, {h for h, bad in run.truth.items() if bad}, run.cfg.seed, chain,
                   max_norm=float(run.cfg.max_update_norm))

    def __init__(self, attack: Any, malicious_hospitals: set[str], seed: int, pre_aggregation: Any = None,
                 max_norm: float | None = None) -> None:
        inner = unwrapped(attack)
        if not isinstance(inner, RoundAware):
            raise TypeError(f"{attack!r} is not a round-aware attack (hospitrust.attacks.interfaces.RoundAware)")
        self.attack, self.inner = attack, inner
        self.malicious_hospitals, self.seed, self.chain = set(malicious_hospitals), seed, pre_aggregation
        self.max_norm = max_norm
        self.strategy: Any = None
        self.replies: dict[int, Message] = {}
        self.previous_global_update: torch.Tensor | None = None
        self.done: dict[int, dict[str, Any]] = {}

    def wrap_strategy(self, strategy: Any) -> Any:
        self.strategy = strategy  # the rule in the loop (the features before this one wrap nothing)
        return strategy

    def on_replies(self, rnd: Round, replies: list[Message]) -> list[Message]:
        self.replies = {int(r.metadata.src_node_id): r for r in replies}
        return replies

    def update_steps(self, rnd: Round) -> Sequence[UpdateStep]:
        return (AttackerRows(self.step),)  # its rows are held to the reply checks

    def _checked(self, hospitals: list[str]) -> list[CheckedReply]:
        """What the rule reads of each row's reply (node id, example count, metrics), in row order."""
        node_of = {name: nid for nid, name in self.strategy.hospitals.items()}
        out = []
        for name in hospitals:
            nid = node_of[name]
            metrics = dict(self.replies[nid].content.metric_records["metrics"])
            out.append(CheckedReply(nid, {}, None, int(metrics["num-examples"]), metrics))  # type: ignore[arg-type]
        return out

    def evaluator(self, server_round: int, hospitals: list[str]):
        """``(n, d)`` stack -> the rule's :class:`Aggregate` (behind the chain), on a private copy."""
        replies = self._checked(hospitals)
        num_examples = torch.tensor([r.num_examples for r in replies], dtype=torch.float64, device=self.strategy.device)
        context = intake.round_context(self.strategy, server_round, replies)
        chain = self.chain

        def aggregate(stack: torch.Tensor) -> Aggregate:
            if chain is None:
                return private_copy(self.strategy).aggregate(stack, num_examples, context)
            done = chain.apply(server_round, stack)
            groups = getattr(done, "groups", None)  # a chain is duck-typed: .apply(round, updates).rows at least
            if groups is not None:  # the rule gets the bucket means (bucketing.rule-input = "bucket-means")
                return intake.aggregate_grouped(private_copy(self.strategy), server_round, done.rows, groups, num_examples,
                                                                     replies)
            return private_copy(self.strategy).aggregate(done.rows, num_examples, context)

        return aggregate

    def step(self, server_round: int, updates: torch.Tensor, hospitals: list[str]) -> torch.Tensor:
        """The step on the stack (an ``UpdateStep``): the malicious rows replaced by what the attack crafts."""
        rows = [i for i, h in enumerate(hospitals) if h in self.malicious_hospitals]
        if not rows or len(rows) == len(hospitals):
            return updates
        if not self.attack.active(server_round):
            self.done[server_round] = {"attack": self.attack.name, "active": False}
            return updates
        aggregate = self.evaluator(server_round, hospitals)
        limits = getattr(self.strategy, "limits", None)
        max_norm = self.max_norm if self.max_norm is not None else getattr(limits, "max_update_norm", None)
        ratio = float(getattr(limits, "max_norm_over_median", 0.0) or 0.0)
        if ratio > 0.0:
            # the server's round-relative bound when the crafted rows sit at it: the median of the honest norms and
            # the crafted rows as the largest values (the attacker knows the honest rows)
            honest = [i for i in range(len(hospitals)) if i not in rows]
            norms = torch.linalg.vector_norm(updates[honest], dim=1, dtype=torch.float64).tolist()
            median = round_median_norm(norms + [math.inf] * len(rows))
            if median is not None:
                max_norm = ratio * median if max_norm is None else min(max_norm, ratio * median)
        view = RoundView(
            server_round, updates, list(hospitals), rows,
            rule=lambda stack: aggregate(stack).update, aggregate=aggregate,
            pre_aggregation=tuple(self.chain.steps) if self.chain is not None else (),
            strategy=lambda: private_copy(self.strategy),
            previous_global_update=self.previous_global_update,
            generator=torch.Generator().manual_seed(self.seed * 7919 + server_round),
            max_norm=max_norm,
            num_examples=torch.tensor([r.num_examples for r in self._checked(hospitals)], dtype=torch.float64))
        crafted, info = self.inner.craft_round(view)
        if tuple(crafted.shape) != (len(rows), updates.shape[1]):
            raise ValueError(f"{self.inner!r} crafted shape {tuple(crafted.shape)}, expected {(len(rows), updates.shape[1])}")
        self.done[server_round] = {"attack": self.attack.name, "active": True, **info}
        return view.with_rows(crafted)

    def on_aggregate(self, rnd: Round, result: RoundResult) -> RoundResult:
        if self.inner.needs_previous_global_update() and result.arrays is not None:
            from hospitrust.aggregation.vectorize import flatten_state

            after = flatten_state(result.arrays.to_torch_state_dict())[0]
            before = flatten_state(rnd.arrays.to_torch_state_dict())[0]
            self.previous_global_update = after - before  # what every hospital sees between two global models
        return result

    def record(self, rnd: Round) -> dict[str, Any]:
        done = self.done.pop(rnd.number, None)
        return {"adversary": done} if done is not None else {}


__all__ = ["RoundAwareAdversary", "SimulatedAdversary", "pre_aggregation_of", "private_copy"]

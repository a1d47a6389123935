"""Pre-aggregation as a round feature: the run's chain (``pre-aggregation = "arc,nnm"``) applied to
the validated stack of updates before the rule, every round, after the simulated adversary.

By default the rule keeps one row per hospital: with bucketing, each member of a bucket hands the
rule its bucket's row (:class:`~hospitrust.aggregation.pre_aggregation.PreAggregated`); with
``bucketing.rule-input = "bucket-means"`` the rule gets the bucket means themselves (ByzFL's
bucketing, a :class:`~hospitrust.strategies.base.GroupedRows` step) and each member's record its
bucket's weight split among the members. What the chain did is
on the record, by hospital name: each client entry's ``pre_aggregation`` (the hospitals whose
updates make up the row the rule saw for it, and per step its clip factor, its NNM neighbours or
its bucket), and the round's ``pre_aggregation`` (the chain, each step's threshold, clipped
hospitals and buckets). docs/rules/pre-aggregation.md describes both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.common import log

from hospitrust.aggregation.pre_aggregation import PreAggregated, PreAggregationChain, StepRecord, carried_rows, origin
from hospitrust.features.base import Round, RoundFeature, RunFacts
from hospitrust.features.pre_aggregators import PRE_AGGREGATORS, pre_aggregation_chain
from hospitrust.strategies.base import GroupedRows, RoundResult, UpdateStep

#: what joins the hospitals of a row that holds several (a bucket) in the records
ROW_JOIN = " + "


@dataclass(frozen=True)
class ChainRecords:
    """One round's application of the chain, by hospital name.

    Parameters
    ----------
    per_hospital : dict[str, dict[str, Any]]
        Hospital name -> its client entry's ``pre_aggregation``.
    round_entry : dict[str, Any]
        The round's ``pre_aggregation``.
    """

    per_hospital: dict[str, dict[str, Any]]
    round_entry: dict[str, Any]


def _clip_step(rec: StepRecord, labels: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"step": rec.step, "threshold": rec.threshold, "clipped": [labels[i] for i in rec.clipped]}
    if "num_clipped" in rec.detail:  # ARC: how many rows its rule clips (those already short enough keep factor 1)
        entry["num_clipped"] = int(rec.detail["num_clipped"])
    return entry


def chain_records(chain: PreAggregationChain, names: Sequence[str], done: PreAggregated) -> ChainRecords:
    """The records of one application of ``chain`` to the rows of hospitals ``names`` (in row order).

    A row the chain made of several hospitals (a bucket) is named by its hospitals joined with
    ``" + "``; a step after bucketing names such rows.

    Parameters
    ----------
    chain : PreAggregationChain
        The chain that ran.
    names : sequence of str
        The hospitals of the input rows.
    done : PreAggregated
        What it returned.

    Returns
    -------
    ChainRecords
        Per hospital and for the round.
    """
    names = list(names)
    weights = origin(done.records)  # (out_rows, n): each hospital's share of every output row
    per_hospital: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        row = weights[done.row_of[i]]
        per_hospital[name] = {
            "mixed_from": {names[j]: float(row[j]) for j in range(len(names)) if float(row[j]) != 0.0},
            "steps": [],
        }
    labels = list(names)  # the name of every row entering the step
    at = list(range(len(names)))  # every hospital's row entering the step
    steps: list[dict[str, Any]] = []
    for rec in done.records:
        if rec.step in ("arc", "clipping"):
            steps.append(_clip_step(rec, labels))
            for i, name in enumerate(names):
                factor = float(rec.factors[at[i]])
                per_hospital[name]["steps"].append({"step": rec.step, "factor": factor, "clipped": factor < 1.0})
        elif rec.step == "nnm":
            steps.append({"step": "nnm", "f": chain.f, "neighbourhood_size": len(rec.members[0]) if rec.members else 0})
            for i, name in enumerate(names):
                neighbours = [labels[j] for j in rec.members[at[i]]]
                per_hospital[name]["steps"].append({"step": "nnm", "neighbours": neighbours})
        else:  # bucketing
            buckets = [[labels[j] for j in members] for members in rec.members]
            steps.append({"step": "bucketing", "bucket_size": chain.bucket_size, "buckets": buckets})
            carried = carried_rows(rec)
            for i, name in enumerate(names):
                per_hospital[name]["steps"].append({"step": "bucketing", "bucket": buckets[carried[at[i]]]})
        carried = carried_rows(rec)
        at = [carried[r] for r in at]
        labels = [ROW_JOIN.join(labels[j] for j in members) for members in rec.members] if rec.step == "bucketing" \
            else labels
    round_entry = {"chain": list(chain.steps), "applied": True, "rows_in": len(names), "rows_out": done.out_rows,
                   "steps": steps}
    return ChainRecords(per_hospital, round_entry)


class PreAggregation(RoundFeature):
    """The run's pre-aggregation chain, applied to every round's validated update stack before the rule.

    Parameters
    ----------
    chain : PreAggregationChain
        The steps with their options bound (f = assumed-malicious, the seed).
    """

    name = "pre-aggregation"
    order = 25  # after the simulated adversary (20): the chain sees the attackers' rows as the rule would

    @classmethod
    def for_run(cls, run: RunFacts) -> PreAggregation | None:
        chain = pre_aggregation_chain(run.cfg)
        return None if chain is None else cls(chain)

    def __init__(self, chain: PreAggregationChain) -> None:
        self.chain = chain
        # round -> what the chain did (a round's records are written after its aggregation)
        self.done: dict[int, ChainRecords] = {}
        log(INFO, "hospitrust: pre-aggregation %s before the rule (f = %d%s)", " -> ".join(chain.steps), chain.f,
            (f", buckets of {chain.bucket_size}: the rule gets the bucket means" if chain.bucket_means else
             f", buckets of {chain.bucket_size}: each member hands the rule its bucket's mean")
            if "bucketing" in chain.steps else "")
        # the bucket means themselves are not handed out per member: no identical rows from bucketing then
        mixing = [s for s in chain.steps if PRE_AGGREGATORS[s].mixes and not (s == "bucketing" and chain.bucket_means)]
        if mixing:
            log(WARNING, "hospitrust: %s hand the rule mixtures of updates: hospitals with the same neighbourhood or "
                "bucket reach it as identical rows, and a rule's per-hospital record is about that mixture (a "
                "near-duplicate check, such as HTA's, counts them as one voice and flags them); see "
                "docs/rules/pre-aggregation.md", " and ".join(dict.fromkeys(mixing)))

    def settings(self) -> dict[str, Any]:
        return {"pre_aggregation": {"chain": list(self.chain.steps), "f": self.chain.f,
                                    **({"bucket_size": self.chain.bucket_size,
                                        "rule_input": "bucket-means" if self.chain.bucket_means else "member-rows"}
                                       if "bucketing" in self.chain.steps else {}),
                                    **({"max_norm": self.chain.max_norm} if "clipping" in self.chain.steps else {})}}

    def step(self, server_round: int, updates: torch.Tensor, hospitals: list[str]) -> torch.Tensor:
        """The chain on the round's stack (an ``UpdateStep``); its records kept for the round's line."""
        done = self.chain.apply(server_round, updates)
        self.done[server_round] = chain_records(self.chain, hospitals, done)
        return done.rows

    def grouped_step(self, server_round: int, updates: torch.Tensor, hospitals: list[str]
                     ) -> tuple[torch.Tensor, list[list[int]]]:
        """The chain on the round's stack when the rule gets the bucket means (``bucketing.rule-input =
        "bucket-means"``): the chain's own rows and whom each carries (a ``GroupedRows`` step).
        """
        done = self.chain.apply(server_round, updates)
        self.done[server_round] = chain_records(self.chain, hospitals, done)
        groups = done.groups if done.groups is not None else [[i] for i in range(done.rows.shape[0])]
        return done.rows, groups

    def update_steps(self, rnd: Round) -> Sequence[UpdateStep]:
        if self.chain.bucket_means:
            return (GroupedRows(self.grouped_step),)  # the rule gets the bucket means
        return (self.step,)

    def on_aggregate(self, rnd: Round, result: RoundResult) -> RoundResult:
        done = self.done.get(rnd.number)
        if done is not None:
            for client in result.clients:
                entry = done.per_hospital.get(client.hospital)
                if entry is not None and not client.rejected:
                    client.add_signals(self.name, entry)
        return result

    def record(self, rnd: Round) -> dict[str, Any]:
        done = self.done.pop(rnd.number, None)
        if done is None:  # too few valid replies: the rule did not run, nor did the chain
            return {"pre_aggregation": {"chain": list(self.chain.steps), "applied": False}}
        return {"pre_aggregation": done.round_entry}


__all__ = ["ChainRecords", "PreAggregation", "chain_records"]

"""The pre-aggregators a run can chain before its rule (``pre-aggregation = "arc,nnm"``), each a
component with its Options (its run-config section: ``bucketing.bucket-size``,
``clipping.max-norm``; NNM and ARC take the run's ``assumed-malicious`` and have none), and the
checks that tie the chain to the rest of the run config.

The math is :mod:`hospitrust.aggregation.pre_aggregation`; the round feature that applies the
chain is :mod:`hospitrust.features.pre_aggregation`. :func:`pre_aggregation_chain` builds a run's
chain from its config (what an attack that puts the chain in its loop calls).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from hospitrust.aggregation.pre_aggregation import STEPS, PreAggregationChain, parse_chain, rows_before_each_step
from hospitrust.features.secagg_options import SecAggOptions
from hospitrust.options import NoOptions, Options
from hospitrust.privacy.options import PrivacyOptions


class BucketingOptions(Options):
    """Bucketing's options (the ``bucketing`` section)."""

    bucket_size: int = Field(2, ge=1, le=1_000_000, description=(
        "s: hospitals per bucket (the last bucket is smaller when s does not divide the round's valid replies); "
        "each bucket's mean replaces its members' updates. 2: the smallest bucket that mixes (ByzFL's default 1 "
        "changes nothing)."
    ))
    rule_input: Literal["member-rows", "bucket-means"] = Field("member-rows", description=(
        "What the rule gets: member-rows, one row per hospital (every member of a bucket hands the rule its "
        "bucket's mean); bucket-means, the ceil(n / s) bucket means themselves, as ByzFL and the paper define "
        "bucketing (each member's record names its bucket; refused for rules that read who sent a row: hta, earn, "
        "foolsgold, contribution, fedagain)."
    ))


class StaticClippingOptions(Options):
    """Static clipping's options (the ``clipping`` section)."""

    max_norm: float = Field(2.0, gt=0.0, description=(
        "C: every update longer than C (L2 norm of returned - global model) is scaled to norm C. 2.0 is ByzFL's "
        "default; choose it from the updates' norms of an unattacked run (rounds.jsonl, clients' update_norm)."
    ))


class PreAggregator:
    """Base of a pre-aggregation step's component: its name in a chain and its Options."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = NoOptions
    #: whether the step mixes hospitals' updates (the rule then sees mixtures, not one hospital's update)
    mixes: ClassVar[bool] = False


class NearestNeighbourMixing(PreAggregator):
    """NNM: every update replaced by the mean of its n - f nearest updates (itself included; f =
    assumed-malicious). Allouah et al., "Fixing by Mixing", AISTATS 2023.
    """

    name = "nnm"
    mixes = True


class AdaptiveRobustClipping(PreAggregator):
    """ARC: the floor(2 f (n - f) / n) longest updates clipped to the norm of the longest one left
    (f = assumed-malicious). Allouah et al., "The Vital Role of Gradient Clipping", 2024.
    """

    name = "arc"


class Bucketing(PreAggregator):
    """Bucketing: the updates in a seeded random order, averaged in buckets of bucket-size; every member of a
    bucket hands the rule the bucket's mean. Karimireddy, He, Jaggi, ICLR 2022.
    """

    name = "bucketing"
    Options = BucketingOptions
    mixes = True


class StaticClipping(PreAggregator):
    """Static clipping: every update longer than max-norm scaled to norm max-norm (ByzFL's Clipping)."""

    name = "clipping"
    Options = StaticClippingOptions


#: Every pre-aggregation step by its name in a chain.
PRE_AGGREGATORS: dict[str, type[PreAggregator]] = {
    cls.name: cls for cls in (NearestNeighbourMixing, AdaptiveRobustClipping, Bucketing, StaticClipping)}
assert tuple(PRE_AGGREGATORS) == STEPS, "the components and the math name the same steps"

def check_pre_aggregation(cfg: Any) -> list[str]:
    """What keeps this run config's pre-aggregation from applying; one message per problem.

    Parameters
    ----------
    cfg : RunConfig
        The parsed run config (duck-typed: ``pre_aggregation``, ``strategy``, ``rule`` (its class), ``options(section)``,
        ``min_hospitals``, ``assumed_malicious``).

    Returns
    -------
    list[str]
        Messages naming the keys (empty when the chain applies).
    """
    steps = parse_chain(cfg.pre_aggregation)
    if not steps:
        return []
    chain = f"pre-aggregation = {cfg.pre_aggregation!r}"
    out: list[str] = []
    rule = cfg.rule
    if not rule.stacks_updates:
        why = rule.why_not("stacks_updates", "its replies are no stack of whole-model updates to mix or clip")
        out.append(f"{chain} with strategy {cfg.strategy!r}: {why}; use another rule or pre-aggregation = 'none'")
    if cfg.section(SecAggOptions).enabled:
        out.append(f"{chain} with secagg.enabled: SecAgg+ hands the server only the sum of the updates, and every "
                   "pre-aggregation step needs each hospital's update; disable one of them")
    privacy = cfg.section(PrivacyOptions)
    if privacy.central:
        out.append(f"{chain} with privacy.mode = {privacy.mode!r}: central DP's noise is calibrated for the mean of the "
                   "hospitals' own clipped updates, which a step that mixes or rescales them changes; use privacy.mode "
                   "'local' or 'off', or pre-aggregation = 'none'")
    bucket_size = cfg.options("bucketing").bucket_size
    if "bucketing" in steps and cfg.options("bucketing").rule_input == "bucket-means":
        if rule.reads_who_sent:
            out.append(f"{chain} with bucketing.rule-input = 'bucket-means' and strategy {cfg.strategy!r}: the rule reads "
                       "who sent each row (state kept per hospital, or a reply's metrics), and a bucket mean stands for "
                       "several hospitals; use bucketing.rule-input = 'member-rows' or another rule")
    rows = rows_before_each_step(steps, cfg.min_hospitals, bucket_size)
    f = cfg.assumed_malicious
    for i, step in enumerate(steps):
        if (step == "nnm" and rows[i] <= f) or (step == "arc" and rows[i] < f):
            need = "more rows than" if step == "nnm" else "at least as many rows as"
            where = f"after {', '.join(steps[:i])}" if i else "at the head of the chain"
            out.append(f"{chain}: {step} needs {need} assumed-malicious = {f}, and {where} a round with min-hospitals = "
                       f"{cfg.min_hospitals} valid replies gives it {rows[i]}: raise min-hospitals, lower "
                       "assumed-malicious" + (" or bucketing.bucket-size" if "bucketing" in steps[:i] else ""))
            break
    return out


def pre_aggregation_chain(cfg: Any) -> PreAggregationChain | None:
    """A run's chain with its options bound (f = assumed-malicious, the seed), or None without one.

    Parameters
    ----------
    cfg : RunConfig
        The parsed run config.

    Returns
    -------
    PreAggregationChain or None
        ``.apply(server_round, updates).rows`` is what the rule sees.
    """
    steps = parse_chain(cfg.pre_aggregation)
    if not steps:
        return None
    return PreAggregationChain(steps, f=cfg.assumed_malicious, bucket_size=cfg.options("bucketing").bucket_size,
                               max_norm=cfg.options("clipping").max_norm, seed=cfg.seed,
                               bucket_means=cfg.options("bucketing").rule_input == "bucket-means")


__all__ = ["AdaptiveRobustClipping", "Bucketing", "BucketingOptions", "NearestNeighbourMixing", "PRE_AGGREGATORS",
           "PreAggregator", "StaticClipping", "StaticClippingOptions", "check_pre_aggregation", "pre_aggregation_chain"]

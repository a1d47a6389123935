"""HTA, Hospital Trust Aggregation: direction, magnitude and reference-cohort validation, a reputation over rounds."""

from __future__ import annotations

import math
from collections.abc import Callable
from logging import INFO, WARNING

import torch
from flwr.common import log
from pydantic import Field

from hospitrust.aggregation.duplicates import duplicate_groups
from hospitrust.aggregation import excused_direction, hta_fusion, hta_signals, hta_weights, mad_exclusion, reputation_update
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.preset import Preset


class HTAAblation(Options):
    """Toggles that bring back an earlier, worse-measured HTA (never the default; docs/rules/hta.md)."""

    subsection = True
    trim_norms: bool = Field(True, description=(
        "The median norm behind m and the clip is taken over the norms at most hta.magnitude-tolerance x the "
        "plain median (one trimming step, the top only), so scaled updates do not raise the threshold every "
        "honest update is clipped to. false: the plain median (the rule before; measured in "
        "docs/experiments/2026-11-30-hta-trim-norms.md)."
    ))
    merge_duplicates: bool = Field(True, description=(
        "Updates whose pairwise cosine reaches hta.duplicate-cosine count as one voice (the medians of s, m "
        "and v see their mean once; the group shares one hospital's weight) and are flagged. false: not "
        "merged (the rule before; measured in docs/experiments/2026-11-30-hta-duplicates.md)."
    ))


class HTAOptions(Options):
    """HTA's options: the signals' exponents, the reputation, the exclusion, the clip."""

    direction_exponent: float = Field(0.5, ge=0.0, le=10.0, description=(
        "a, the exponent of s (direction agreement with the coordinate median); 0 drops the signal."
    ))
    magnitude_exponent: float = Field(1.0, ge=0.0, le=10.0, description=(
        "b, the exponent of m (magnitude plausibility); 0 drops the signal."
    ))
    validation_exponent: float = Field(1.0, ge=0.0, le=10.0, description=(
        "c, the exponent of v (reference-cohort validation); 0 drops the signal and HTA needs no reference "
        "cohort."
    ))
    ema_rate: float = Field(0.3, gt=0.0, le=1.0, description="Reputation EMA rate (weight of the new round).")
    variance_penalty: float = Field(1.0, ge=0.0, description=(
        "Reputation = EMA - this x the exponentially weighted standard deviation of tau."
    ))
    exclusion_mads: float = Field(2.0, ge=0.0, description=(
        "lambda: excluded when reputation < median - lambda x MAD (and below exclusion-fraction x median)."
    ))
    exclusion_fraction: float = Field(0.5, ge=0.0, le=1.0, description=(
        "kappa: excluded when reputation < kappa x median (and below median - exclusion-mads x MAD)."
    ))
    clip_to_median_norm: bool = Field(True, description="Clip each kept update to the kept updates' median norm.")
    magnitude_tolerance: float = Field(2.0, ge=1.0, description=(
        "m: norms within this factor of the median norm are not penalized."
    ))
    duplicate_cosine: float = Field(0.999, gt=0.0, le=1.0, description=(
        "The pairwise cosine at or above which two hospitals' updates are near-duplicates (counted as one "
        "voice)."
    ))
    ablation: HTAAblation = Field(default_factory=HTAAblation, description="Ablations of HTA.")


class HTA(HospitrustStrategy):
    """Per round, signals s (direction vs the coordinate median), m (norm vs the median
    norm), v (reference-cohort balanced accuracy of global + u_h, over the round's median),
    with near-duplicate updates (pairwise cosine >= ``hta.duplicate-cosine``) counted as one
    voice in those medians and sharing one hospital's weight;
    ``tau = s^a m^b v^c``; reputation = EMA of tau minus ``variance_penalty`` x its EW std;
    exclusion when reputation < mu - lambda MAD and < kappa mu; weights reputation x
    num-examples over the kept, each update optionally clipped to the kept median norm.

    State across rounds (per hospital name, plain dicts for checkpointing): ``ema``,
    ``var``, ``reputation``. ``candidate_scores``: callable (global state, (n, d) updates)
    -> (n,) balanced accuracies on the reference cohort; needed unless ``c == 0``.

    Choices beyond the method as first described (not yet measured on real runs):
    ``a`` = 0.5 by default (the square root softens the direction signal, on which an
    honest specialist is genuinely lower), a dead zone in the magnitude penalty (norms
    within ``magnitude_tolerance`` x the median are not penalized: hospital sizes differ),
    and clipping to the kept median norm on by default (caps what a scaler that slips
    through can do). That median norm, and m's, leaves out the norms above the tolerance
    x the plain median first (default on; ``hta.ablation.trim-norms``), so scalers cannot raise the
    threshold every honest update is clipped to. The method as first described and its three
    ablations are presets of this rule (``PRESETS`` below: ``hta-published``, ``-no-m``,
    ``-no-memory``, ``-no-direction``).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    candidate_scores : Callable[[dict, torch.Tensor], torch.Tensor] or None
        (global state, (n, d) updates) -> (n,) reference-cohort balanced accuracies; None: v = 1.
    **kwargs
        The base's other keyword arguments.
    """

    name = "hta"
    trust_signal = "reputation"
    reads_who_sent = True  # reputation per hospital
    Options = HTAOptions
    options: HTAOptions
    state_attrs = ("ema", "var", "reputation")

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        return frozenset({"candidate_scores"}) if options.validation_exponent > 0 else frozenset()

    @classmethod
    def cohort_free_setting(cls, options, composed) -> str | None:
        return "hta.validation-exponent = 0 (trust from direction and magnitude only)"

    def __init__(self, hospitals, options=None, *,
                 candidate_scores: Callable[[dict, torch.Tensor], torch.Tensor] | None = None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        o = self.options
        if o.validation_exponent > 0 and candidate_scores is None:  # the ServerApp always gives one; bare use (tests) runs without v
            log(WARNING, "hta: no candidate_scores callable (reference cohort): v = 1, as with hta.validation-exponent = 0")
        self.candidate_scores = candidate_scores
        self.ema: dict[str, float] = {}
        self.var: dict[str, float] = {}
        self.reputation: dict[str, float] = {}

    @property
    def norm_trim_tolerance(self) -> float | None:
        """The factor the median norm is trimmed at (m and the clip), None for the plain median."""
        return self.options.magnitude_tolerance if self.options.ablation.trim_norms else None

    def summary(self) -> None:
        super().summary()
        o = self.options
        log(INFO, "\t└── HTA: a %g b %g c %g, EMA rate %g, variance penalty %g, lambda %g, kappa %g, clip %s, %s, %s",
            o.direction_exponent, o.magnitude_exponent, o.validation_exponent, o.ema_rate, o.variance_penalty,
            o.exclusion_mads, o.exclusion_fraction, o.clip_to_median_norm,
            f"median norm of those at most {o.magnitude_tolerance:g}x the median" if o.ablation.trim_norms
            else "plain median norm",
            f"updates with cosine >= {o.duplicate_cosine:g} count as one voice" if o.ablation.merge_duplicates
            else "near-duplicate updates not merged")

    def aggregate(self, updates, example_weights, context, *,
                          direction_excuse: torch.Tensor | None = None) -> Aggregate:
        """``direction_excuse`` (n,) in [0, 1], optional: a floor under s, for hospitals whose
        different direction is explained elsewhere (EARN passes the rare-class trust a
        hospital has earned on the reference cohort); m and v still apply.
        """
        assert self.global_state is not None
        o = self.options
        merge = o.ablation.merge_duplicates
        names = list(context.hospitals)
        bacc = None
        if o.validation_exponent > 0 and self.candidate_scores is not None:
            bacc = torch.as_tensor(self.candidate_scores(self.global_state, updates), dtype=torch.float64).cpu()
        dup = duplicate_groups(updates, o.duplicate_cosine)
        group = dup["group"] if merge else None
        group_size = dup["size"] if merge else torch.ones_like(dup["size"])
        sig = hta_signals(updates, bacc, magnitude_tolerance=o.magnitude_tolerance, group=group,
                          trim_norms=o.ablation.trim_norms)
        s_raw = sig["s"]
        if direction_excuse is not None:
            sig["s"] = excused_direction(s_raw, direction_excuse)
        tau = hta_fusion(sig["s"], sig["m"], sig["v"], o.direction_exponent, o.magnitude_exponent, o.validation_exponent)
        reps = []
        for name, t in zip(names, tau.tolist()):
            ema, var, rep_i = reputation_update(t, self.ema.get(name), self.var.get(name, 0.0), rate=o.ema_rate,
                                                variance_penalty=o.variance_penalty)
            self.ema[name], self.var[name], self.reputation[name] = ema, var, rep_i
            reps.append(rep_i)
        rep = torch.tensor(reps, dtype=torch.float64)
        lam, kappa = o.exclusion_mads, o.exclusion_fraction
        ex = mad_exclusion(rep, lam=lam, kappa=kappa)
        excluded = ex["excluded"]
        update, weights = hta_weights(updates, rep, example_weights, ~excluded, clip_to_median_norm=o.clip_to_median_norm,
                                      group_size=group_size, trim_tolerance=self.norm_trim_tolerance)
        mu, mad = float(ex["mu"]), float(ex["mad"])
        reasons = [
            (f"reputation {r:.3f} < mu - lambda MAD = {mu - lam * mad:.3f} and < kappa mu = {kappa * mu:.3f}"
             if e else "") for r, e in zip(reps, excluded.tolist())
        ]
        together = [[names[j] for j in range(len(names)) if int(dup["group"][j]) == int(g) and j != i]
                    for i, g in enumerate(dup["group"].tolist())]
        if merge and int(group_size.max()) > 1:
            log(WARNING, "hta round %d: near-duplicate updates (cosine >= %g) counted as one voice: %s", context.server_round,
                o.duplicate_cosine, "; ".join(sorted({", ".join(sorted([n, *t])) for n, t in zip(names, together) if t})))
        return Aggregate(update, weights, ~excluded, extra={
            "s": [float(x) for x in sig["s"]],
            **({} if direction_excuse is None else {"s_raw": [float(x) for x in s_raw]}),
            "m": [float(x) for x in sig["m"]],
            "v": [float(x) for x in sig["v"]],
            "reference_balanced_accuracy": [float(x) for x in bacc] if bacc is not None else [math.nan] * len(reps),
            "tau": [float(x) for x in tau],
            "reputation": reps,
            "reputation_ema": [self.ema[n] for n in names],
            "reputation_std": [math.sqrt(self.var[n]) for n in names],
            "excluded": [bool(e) for e in excluded],
            "exclusion_reason": reasons,
            "max_peer_cosine": [float(c) for c in dup["max_cosine"]],
            "duplicate_group_size": [int(k) for k in group_size],
            "duplicates_of": together if merge else [[] for _ in names],
            # flagged: excluded, or sending what another hospital sent (no two hospitals' data train the same update)
            "flagged": [bool(e) or int(k) > 1 for e, k in zip(excluded.tolist(), group_size.tolist())],
        })


#: HTA as first described (the project's seed text; no HTA paper or code was found in public)
HTA_PUBLISHED = Preset(
    "hta-published", HTA,
    "HTA as first described: tau = s m v (unit exponents), m = exp(-|ln(||u|| / median norm)|) with no dead zone, "
    "the reputation (EMA minus the variance penalty) and the dual MAD exclusion, weights reputation x examples over "
    "the kept updates, unclipped; no norm trimming and no near-duplicate merging. The description does not fix the "
    "EMA rate, the variance penalty or the exclusion constants: they are hta's (0.3, 1, lambda 2, kappa 0.5).",
    {
        "direction-exponent": (1.0, "a = 1: tau = s m v, as described (hta's square root softens the direction signal)."),
        "magnitude-tolerance": (1.0, "No dead zone: every norm away from the median norm lowers m."),
        "clip-to-median-norm": (False, "The kept updates are not clipped to their median norm."),
        "ablation.trim-norms": (False, "The median norm behind m is the plain median (scaled norms not trimmed out)."),
        "ablation.merge-duplicates": (False, "Every update is its own voice (near-duplicates not merged)."),
    },
)

#: the published HTA and its three ablations (benchmarks/hta-ablation.toml)
PRESETS = (
    HTA_PUBLISHED,
    HTA_PUBLISHED.derive(
        "hta-published-no-m",
        "The ablation of HTA's magnitude signal: hta-published with b = 0 (tau = s v).",
        {"magnitude-exponent": (0.0, "b = 0: the magnitude signal dropped (the ablation).")},
    ),
    HTA_PUBLISHED.derive(
        "hta-published-no-memory",
        "The ablation of HTA's reputation memory: hta-published with EMA rate 1 and no variance penalty, so each "
        "round's reputation is that round's tau.",
        {"ema-rate": (1.0, "EMA rate 1: the reputation is this round's tau (the ablation)."),
         "variance-penalty": (0.0, "No penalty on tau's spread (with rate 1 there is none).")},
    ),
    HTA_PUBLISHED.derive(
        "hta-published-no-direction",
        "The ablation of HTA's direction signal: hta-published with a = 0 (tau = m v).",
        {"direction-exponent": (0.0, "a = 0: the direction signal dropped (the ablation).")},
    ),
)

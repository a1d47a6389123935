"""EARN: Earned, Audited, Rare-class-aware aggregation (per-class-row trust)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any, Literal

import torch
from flwr.common import log
from pydantic import Field, field_validator, model_validator

from hospitrust.aggregation import coordinate_median, flatten_state, median_norm_clip
from hospitrust.aggregation.earn import (
    RareRowStep,
    class_rows,
    extend_history,
    history_means,
    holder_mask,
    lost_trust_flags,
    mean_class_spearman,
    model_audit,
    rare_row_step,
    row_audit,
    update_count_evidence,
    update_evidence,
)
from hospitrust.metrics import rare_classes
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.hta import HTA, HTAOptions
from hospitrust.strategies.preset import Preset

FLAG_TRUST = 0.1  # a holder of a rare class whose trust on that row is below this, once its history is locked


def classifier_head(global_state: dict[str, torch.Tensor]) -> tuple[int, int, int, int]:
    """Where the last layer sits in the flat vector: ``(weight offset, C, H, bias offset)``.

    The last float 1-D tensor (bias, shape (C,)) right after a float 2-D tensor of shape (C, H).

    Parameters
    ----------
    global_state : dict[str, torch.Tensor]
        The global model's state dict.

    Returns
    -------
    tuple[int, int, int, int]
        ``(weight offset, C, H, bias offset)`` (ValueError when the model has no such layer).
    """
    spec = flatten_state(global_state)[1]
    for i in range(len(spec.keys) - 1, 0, -1):
        bias, weight = spec.shapes[i], spec.shapes[i - 1]
        if len(bias) == 1 and len(weight) == 2 and weight[0] == bias[0]:
            return spec.offsets[i - 1], int(weight[0]), int(weight[1]), spec.offsets[i]
    raise ValueError("earn needs a model whose last layer is a linear layer with a bias (weight (C, H), bias (C,))")


def reported_counts(metrics, num_classes: int) -> torch.Tensor | None:
    """``class-counts`` of every reply as (n, C) float64, or None if any reply lacks a valid one.

    Parameters
    ----------
    metrics : Sequence[Mapping]
        The round's replies' metrics, in row order (``RoundContext.metrics``).
    num_classes : int
        C, the number of classes.

    Returns
    -------
    torch.Tensor or None
        ``(n, C)`` float64 counts, or None.
    """
    rows = []
    for m in metrics:
        raw = m.get("class-counts")
        if not isinstance(raw, (list, tuple)) or len(raw) != num_classes:
            return None
        try:
            vals = [float(v) for v in raw]
        except (TypeError, ValueError):
            return None
        if any(not math.isfinite(v) or v < 0 for v in vals):
            return None
        rows.append(vals)
    return torch.tensor(rows, dtype=torch.float64)


def parse_class_list(text: str) -> tuple[int, ...]:
    """'3,4' -> (3, 4); '' -> () (automatic).

    Parameters
    ----------
    text : str
        ``earn.rare-classes``: comma-separated class indices (>= 0).

    Returns
    -------
    tuple[int, ...]
        The classes, sorted, without repeats.
    """
    text = str(text).strip()
    if not text:
        return ()
    try:
        out = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise ValueError(f"earn.rare-classes must be comma-separated class indices, e.g. '4' or '1,4'; got {text!r}") from None
    if any(c < 0 for c in out):
        raise ValueError(f"earn.rare-classes must be non-negative, got {text!r}")
    return out


class EARNAblation(Options):
    """Toggles that bring back an earlier, worse-measured EARN (never the default; docs/rules/earn.md)."""

    subsection = True
    nonholder_by_peers: bool = Field(True, description=(
        "Multiply earn.nonholder-weight in a rare row by 1 - p(c), p(c) = clip((n(c) - 1) / 4, 0, 1) from the"
        " class's holders: a row with one holder is as specified (its non-holders dilute a faker), a row with"
        " five or more holders is learned from them alone. false: the fixed factor (the rule before; "
        "docs/experiments/2026-12-01-earn-nonholder-by-peers.md)."
    ))
    excuse_direction: bool = Field(True, description=(
        "On the HTA base, the rare-class trust a hospital has earned (audited on the reference cohort) floors"
        " HTA's direction signal s for it at trust x the round's median s; m and v still apply. In effect "
        "only with earn.audit and hta.validation-exponent > 0. false: no excuse (the rule before; "
        "docs/experiments/2026-11-30-earn-direction-excuse.md)."
    ))


class EARNOptions(Options):
    """EARN's options: the evidence, agreement, audit, trust and row weights."""

    evidence: Literal["update", "update-count", "reported"] = Field("update", description=(
        "Evidence of who holds a class: update = the positive part of the class row's bias update; "
        "update-count = class counts estimated from the bias update per local step and num-examples; reported"
        " = the hospitals' class counts (fakeable)."
    ))
    agreement: Literal["blend", "peer", "history"] = Field("blend", description=(
        "Row agreement: blend = p(c) x peer + (1 - p(c)) x own history; peer = peers only; history = own "
        "history only."
    ))
    nonholder_weight: float = Field(1.0, ge=0.0, le=1.0, description=(
        "Factor on the base weight of a hospital that does not hold a rare class (by the evidence) in that "
        "class's row; 1 is the rule as specified, 0 learns the row from its holders only."
    ))
    row_cap: float = Field(0.5, gt=0.0, le=1.0, description=(
        "The largest share one hospital may hold of a rare-class row (1: no cap)."
    ))
    clip_rows: Literal["off", "update", "holders"] = Field("update", description=(
        "Rare rows: update = each hospital's row update scaled by the factor that clips its whole update to "
        "the round's median norm (the HTA base's kept updates); holders = the larger of that factor and the "
        "one that clips the row to the median row norm of the class's holders; off = unclipped rows (the rule"
        " before)."
    ))
    history_rounds: int = Field(3, ge=1, le=1000, description=(
        "A hospital's first rounds averaged into its locked history row."
    ))
    agree_threshold: float = Field(0.1, ge=0.0, le=1.0, description=(
        "A row agrees when its (blended) agreement is at least this."
    ))
    audit: bool = Field(True, description=(
        "A row must also raise its class's logit on the reference cohort's images of that class (needs the "
        "reference cohort)."
    ))
    audit_by: Literal["row", "row-shift-free", "model"] = Field("row-shift-free", description=(
        "Audit: row (the class row update against the global model's features), row-shift-free (the same with"
        " the row's component along the mean feature removed, so raising the class everywhere earns nothing) "
        "or model (the hospital's whole candidate model must separate the class better on the cohort than the"
        " global model)."
    ))
    rare_classes: str = Field("", description=(
        "The rare classes, e.g. '4' or '1,4'; empty: automatic (earn.rare-fraction)."
    ))
    rare_fraction: float = Field(0.6, gt=0.0, le=1.0, description=(
        "Automatic rare classes: reported federation total below this x the mean class total (and always the "
        "rarest)."
    ))
    rare_by: Literal["count", "holders"] = Field("count", description=(
        "Automatic rare classes by: count = the reported federation total of the class's images (without "
        "reported counts, the fewest holders); holders = the number of hospitals holding it, below "
        "earn.rare-fraction x the mean over the classes held (and always the least held; the published rule)."
    ))
    holder_min_count: int = Field(0, ge=0, le=1_000_000, description=(
        "A hospital holds a class when its evidence for it is at least this many images (20: the published "
        "rule; needs earn.evidence reported or update-count); 0: when its evidence is positive."
    ))
    base: Literal["fedavg", "median", "hta"] = Field("hta", description=(
        "The rule for the body and the other rows: fedavg, median, or hta (HTA with its hta.* options; its "
        "weights also replace FedAvg's in the rare rows)."
    ))
    ablation: EARNAblation = Field(default_factory=EARNAblation, description="Ablations of EARN.")

    @field_validator("rare_classes")
    @classmethod
    def _rare_classes(cls, v: str) -> str:
        parse_class_list(v)  # raises ValueError with the reason
        return v

    @model_validator(mode="after")
    def _holder_units(self) -> "EARNOptions":
        if self.holder_min_count > 0 and self.evidence == "update":
            raise ValueError("earn.holder-min-count counts images: it needs earn.evidence = 'reported' or 'update-count' "
                             "(earn.evidence = 'update' is a bias update, not a count)")
        return self

    def check_dependencies(self, set_keys: set[str]) -> None:
        # the excuse floors s by audited trust: unaudited, a consistent faker earns trust from its own history.
        # Left at its default it is in effect where the audit runs on the HTA base (the run summary says so).
        if "ablation.excuse-direction" in set_keys and self.ablation.excuse_direction:
            if not self.audit:
                raise ValueError("earn.ablation.excuse-direction = true needs earn.audit = true (only audited trust excuses "
                                 "a direction); set one of them differently")
            if self.base != "hta":
                raise ValueError(f"earn.ablation.excuse-direction = true needs earn.base = 'hta' (it floors HTA's direction "
                                 f"signal), got {self.base!r}")


class EARN(HospitrustStrategy):
    """Per rare class c: evidence of who holds c (``reported`` class counts, or ``update``:
    the positive part of each hospital's bias update of row c), n(c) holders,
    p(c) = clip((n(c) - 1) / 4, 0, 1); agreement of the row update (weights and bias)
    a = p peer + (1 - p) history (``earn.agreement`` peer: p = 1; history: p = 0), the history
    being the mean of the hospital's own rows over its first ``earn.history-rounds`` rounds,
    then locked. Audited (``earn.audit``): the row must also raise class c's logit more on
    the server's class-c reference images than on the others (``earn.audit-by``
    row-shift-free, the default: :func:`row_audit` of the row without its component along
    the mean feature, so raising class c on every image earns nothing; row: the plain row
    against the global model's features; model: :func:`model_audit`, the hospital's whole
    candidate model); a consistent faker agrees
    with its own history but fails the audit. Trust per (k, c):
    +gain on agreement, x decay otherwise (only for holders). Row c is averaged with
    FedAvg weight + trust x evidence share, no hospital above ``earn.row-cap`` (1: no cap),
    each row update first scaled (``earn.clip-rows`` update) by the factor that clips the
    hospital's whole update to the median norm (with the HTA base, the median of HTA's kept
    updates), or (holders) by the larger of that factor and the one that clips the row to
    the median row norm of the class's holders (:func:`rare_row_clip`); with all trust at 0
    this is FedAvg with the cap, on clipped rows (the non-holders scaled as below). Other
    rows and the body: FedAvg, the
    coordinate median or HTA (``earn.base``). With HTA, HTA's weights replace FedAvg's in
    the rare rows too (an update HTA excludes starts there from 0 and counts only through
    the trust it earned on that row).
    A non-holder's base weight in a rare row is multiplied by ``earn.nonholder-weight``, and
    with ``earn.ablation.nonholder-by-peers`` also by 1 - p(c) (:func:`nonholder_factor`): a row with
    one holder keeps its non-holders (they dilute a faker), a row with five or more holders is
    learned from them alone.
    ``earn.ablation.excuse-direction`` (HTA base): the rare-class trust a hospital earned up to the
    last round floors HTA's direction signal s for it (at trust x the round's median s),
    so HTA does not weigh an audited specialist down for the direction its rare data gives
    its update (m and v still apply; only with the audit on and HTA's v in use, which
    checks the whole update).

    EARN with the holder and rare-class definitions of its description is the preset
    ``earn-published`` (``PRESETS`` below).

    Rare classes: ``earn.rare-classes`` (e.g. '4'), or automatically those whose reported
    federation total is below ``earn.rare-fraction`` x the mean class total, plus the
    rarest; without reported counts, the classes with the fewest holders by evidence.
    The update-derived evidence is compared with the reported counts every round
    (mean over classes of the Spearman across hospitals), recorded as ``evidence_spearman``.

    State (plain dicts by hospital name): ``trust`` {name: {class: T}}, ``history_sum``
    {name: (C, H + 1) tensor}, ``history_rounds`` {name: int}.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    hta_options : HTAOptions or dict or None
        The ``hta`` section's options for the HTA base (``earn.base = "hta"``); its defaults when None.
    head_features : Callable[[dict], tuple[torch.Tensor, torch.Tensor]] or None
        Global state -> (``(m, H)`` last-layer inputs, ``(m,)`` labels) on the reference cohort; the
        audit (``earn.audit-by`` row, row-shift-free) is off without it.
    candidate_logits : Callable[[dict, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] or None
        (global state, (n, d) updates) -> (``(m, C)`` global logits, ``(n, m, C)`` candidate logits,
        ``(m,)`` labels) on the reference cohort; the audit (``earn.audit-by`` model) is off without it.
    candidate_scores : Callable[[dict, torch.Tensor], torch.Tensor] or None
        Passed to the HTA base (its v signal).
    **kwargs
        The base's other keyword arguments.
    """

    name = "earn"
    trust_signal = "earn_trust"  # its own: the rare rows' trust (mean over them); its HTA base's reputation beside
    reads_who_sent = True  # trust per hospital, each reply's class-counts
    Options = EARNOptions
    options: EARNOptions
    state_attrs = ("trust", "history_sum", "history_rounds", "evidence_spearman", "base_state")
    gain, decay = 0.1, 0.5  # trust on agreement: + gain; otherwise x decay

    @classmethod
    def composes(cls, options) -> tuple[str, ...]:
        return ("hta",) if options.base == "hta" else ()

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        out: set[str] = set()
        if options.audit:
            out.add("candidate_logits" if options.audit_by == "model" else "head_features")
        if options.base == "hta":
            out |= HTA.needs(composed.get("hta", HTAOptions()), composed)
        return frozenset(out)

    @classmethod
    def cohort_free_setting(cls, options, composed) -> str | None:
        settings = []
        if options.audit:
            settings.append("earn.audit = false")
        if options.base == "hta" and HTA.needs(composed.get("hta", HTAOptions()), composed):
            settings.append("hta.validation-exponent = 0")
        return " and ".join(settings) or None

    def __init__(
        self,
        hospitals,
        options=None,
        *,
        hta_options: HTAOptions | dict[str, Any] | None = None,
        head_features: Callable[[dict], tuple[torch.Tensor, torch.Tensor]] | None = None,
        candidate_logits: Callable[[dict, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
        candidate_scores: Callable[[dict, torch.Tensor], torch.Tensor] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(hospitals, options, **kwargs)
        o = self.options
        audit = o.audit
        judge = candidate_logits if o.audit_by == "model" else head_features
        if audit and judge is None:  # the ServerApp always gives both; bare use (tests) runs unaudited
            log(WARNING, "earn: no %s callable (reference cohort): rows are not audited",
                "candidate_logits" if o.audit_by == "model" else "head_features")
            audit = False
        self.audit_in_effect = audit  # earn.audit, off without the callable that judges a row
        self.given_rare_classes = parse_class_list(o.rare_classes)
        self.head_features, self.candidate_logits = head_features, candidate_logits
        # earn.base hta: HTA (its hta.* options, reputation kept across rounds) weighs the body and
        # the other rows, and its weights replace FedAvg's in the rare rows
        self.base_rule = (HTA(hospitals, hta_options, candidate_scores=candidate_scores, **kwargs)
                          if o.base == "hta" else None)
        # only audited trust excuses (unaudited, a consistent faker earns trust from its own history),
        # and only where HTA's v checks the whole update on the reference cohort (the audit checks one row)
        self.excuse_in_effect = (o.ablation.excuse_direction and self.audit_in_effect and self.base_rule is not None
                                 and self.base_rule.options.validation_exponent > 0
                                 and self.base_rule.candidate_scores is not None)
        self.trust: dict[str, dict[int, float]] = {}
        self.history_sum: dict[str, torch.Tensor] = {}
        self.history_rounds: dict[str, int] = {}
        self.evidence_spearman: dict[int, float] = {}

    def summary(self) -> None:
        super().summary()
        o = self.options
        log(INFO, "\t└── EARN: evidence %s, mode %s, cap %g, rows clipped: %s, history %d rounds, audit %s, "
            "rare %s, non-holders in a rare row x %g%s, base %s%s", o.evidence, o.agreement, o.row_cap,
            o.clip_rows, o.history_rounds, self.audit_in_effect and o.audit_by,
            list(self.given_rare_classes) or f"auto (< {o.rare_fraction} x mean)", o.nonholder_weight,
            " x (1 - p(c))" if o.ablation.nonholder_by_peers else "", o.base,
            " (audited rare-class trust excuses HTA's direction signal)" if self.excuse_in_effect else "")

    @property
    def base_state(self) -> dict[str, Any]:
        """The base rule's state across rounds (HTA's reputations), saved in the checkpoint."""
        return {} if self.base_rule is None else {a: getattr(self.base_rule, a) for a in self.base_rule.state_attrs}

    @base_state.setter
    def base_state(self, state: dict[str, Any]) -> None:
        if self.base_rule is not None:
            for a in self.base_rule.state_attrs:
                setattr(self.base_rule, a, state.get(a, {}))

    def _direction_excuse(self, names: list[str], rare: list[int]) -> torch.Tensor:
        """Per hospital, the most rare-class trust it has earned before this round (0 if none):
        the excuse HTA floors its direction signal with (trust x the round's median s), so an
        audited specialist is not marked down for pointing where only its rare data points
        (``earn.ablation.excuse-direction``).
        """
        return torch.tensor([max([self.trust.get(nm, {}).get(c, 0.0) for c in rare], default=0.0) for nm in names],
                            dtype=torch.float64)

    def _base(self, updates, example_weights, context,
              excuse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, Aggregate | None]:
        """The base rule's update and its per-hospital weights (what the rare rows start from)."""
        fedavg = (example_weights / example_weights.sum()).double().cpu()
        if self.options.base == "fedavg":
            return fedavg.to(updates.dtype).to(updates.device) @ updates, fedavg, None
        if self.options.base == "median":
            return coordinate_median(updates), fedavg, None
        assert self.base_rule is not None  # earn.base hta
        self.base_rule.global_state = self.global_state
        agg = self.base_rule.aggregate(updates, example_weights, context, direction_excuse=excuse)
        return agg.update.clone(), agg.weights.double().cpu(), agg

    def _rare_classes(self, counts: torch.Tensor | None, holders: torch.Tensor, num_classes: int) -> list[int]:
        o = self.options
        if self.given_rare_classes:
            return [c for c in self.given_rare_classes if c < num_classes]
        if o.rare_by == "holders":
            return rare_classes(holders.sum(dim=0).double().numpy(), o.rare_fraction)
        if counts is not None and float(counts.sum()) > 0:
            return rare_classes(counts.sum(dim=0).numpy(), o.rare_fraction)
        n_holders = holders.sum(dim=0)
        return sorted(torch.nonzero(n_holders == n_holders.min()).flatten().tolist())

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        o = self.options
        n = updates.shape[0]
        names = list(context.hospitals)
        try:
            w_off, C, H, b_off = classifier_head(self.global_state)
        except ValueError as err:  # no linear head: no class rows to judge, the base rule alone
            log(WARNING, "Round %d: %s; aggregated with earn.base %s only", context.server_round, err, o.base)
            update, base_w, base_agg = self._base(updates, example_weights, context)
            if base_agg is not None:
                return base_agg
            return Aggregate(update, base_w, torch.ones(n, dtype=torch.bool), extra={"flagged": [False] * n})
        W = updates[:, w_off : w_off + C * H].reshape(n, C, H).double().cpu()
        B = updates[:, b_off : b_off + C].double().cpu()
        rows = class_rows(W, B)
        counts = reported_counts(context.metrics, C)
        evidence, spear = self._evidence(context.server_round, B, example_weights, counts, b_off)
        holders = holder_mask(evidence, o.holder_min_count)
        rare = self._rare_classes(counts, holders, C)
        excuse = self._direction_excuse(names, rare) if self.excuse_in_effect else None
        update, base_w, base_agg = self._base(updates, example_weights, context, excuse)
        steps = self._rare_rows(names, rare, rows, holders, evidence, updates, base_w, base_agg)
        for c, step in steps.items():  # each rare row: its weights times its clip, over the hospitals' rows
            wt = (step.weight * step.clip).to(updates.dtype).to(updates.device)
            update[w_off + c * H : w_off + (c + 1) * H] = wt @ updates[:, w_off + c * H : w_off + (c + 1) * H]
            update[b_off + c] = wt @ updates[:, b_off + c]
        # the history: the mean of a hospital's rows over its first rounds, then locked
        self.history_sum, self.history_rounds = extend_history(self.history_sum, self.history_rounds, names, rows,
                                                               o.history_rounds)
        locked = [self.history_rounds.get(nm, 0) >= o.history_rounds for nm in names]
        flagged = lost_trust_flags(locked, holders, {c: step.trust for c, step in steps.items()}, FLAG_TRUST)
        return self._aggregate(update, base_w, base_agg, flagged, evidence, holders, rare, steps, spear)

    def _evidence(self, server_round: int, B: torch.Tensor, num_examples: torch.Tensor, counts: torch.Tensor | None,
                  b_off: int) -> tuple[torch.Tensor, float]:
        """``(n, C)`` who holds what (``earn.evidence``) and the round's Spearman of the update-derived
        evidence against the reported counts (NaN without them), kept in ``evidence_spearman``.
        """
        o = self.options
        if o.evidence == "update-count":
            assert self.global_state is not None
            global_bias = flatten_state(self.global_state)[0][b_off : b_off + B.shape[1]]
            derived = update_count_evidence(
                B, num_examples.double().cpu(), global_bias,
                learning_rate=float(self.train_config.get("learning-rate", 0.01)),
                batch_size=int(self.train_config.get("batch-size", 32)),
                local_epochs=int(self.train_config.get("local-epochs", 1)))
        else:
            derived = update_evidence(B)
        spear = mean_class_spearman(derived, counts) if counts is not None else math.nan
        self.evidence_spearman[server_round] = spear
        if o.evidence != "reported":
            return derived, spear
        return (counts if counts is not None else torch.zeros(B.shape, dtype=torch.float64)), spear

    def _auditor(self, rare: list[int], updates: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor] | None:
        """Class rows -> audit scores for class c on the reference cohort; None when unaudited."""
        if not (self.audit_in_effect and rare):  # audit_in_effect is on only with the judging callable (__init__)
            return None
        assert self.global_state is not None
        if self.options.audit_by != "model":
            assert self.head_features is not None
            feats, labels = self.head_features(self.global_state)
            shift_free = self.options.audit_by == "row-shift-free"
            return lambda rows, c: row_audit(rows[:, :-1], feats, labels, c, shift_free=shift_free)
        assert self.candidate_logits is not None
        logits = self.candidate_logits(self.global_state, updates)
        return lambda rows, c: model_audit(logits[1], logits[0], logits[2], c)

    def _rare_rows(self, names: list[str], rare: list[int], rows: torch.Tensor, holders: torch.Tensor,
                   evidence: torch.Tensor, updates: torch.Tensor, base_w: torch.Tensor,
                   base_agg: Aggregate | None) -> dict[int, RareRowStep]:
        """Each rare class's round (:func:`~hospitrust.aggregation.earn.rare_row_step`); the trust is kept."""
        o = self.options
        n = rows.shape[0]
        known, history = history_means(self.history_sum, self.history_rounds, names, tuple(rows.shape[1:]))
        # each hospital's rare rows scaled as its whole update is clipped to the median norm (the base's kept ones)
        update_clip = (median_norm_clip(updates, None if base_agg is None else base_agg.selected,
                                        None if base_agg is None or self.base_rule is None
                                        else self.base_rule.norm_trim_tolerance)
                       if o.clip_rows != "off" else torch.ones(n, dtype=torch.float64))
        # near-duplicate updates (HTA's groups) share one hospital's trust term, as they share its base weight
        group_size = (torch.ones(n, dtype=torch.float64) if base_agg is None
                      else torch.tensor(base_agg.extra["duplicate_group_size"], dtype=torch.float64))
        audit = self._auditor(rare, updates)
        steps = {}
        for c in rare:
            old = torch.tensor([self.trust.get(nm, {}).get(c, 0.0) for nm in names], dtype=torch.float64)
            steps[c] = rare_row_step(
                rows[:, c], holders[:, c], history[:, c], known, old, base_w, evidence[:, c], update_clip,
                group_size=group_size, audit=None if audit is None else audit(rows[:, c], c), mode=o.agreement,
                agree_threshold=o.agree_threshold, gain=self.gain, decay=self.decay,
                nonholder_weight=o.nonholder_weight, nonholder_by_peers=o.ablation.nonholder_by_peers, cap=o.row_cap,
                clip_holders=o.clip_rows == "holders")
            for nm, t in zip(names, steps[c].trust.tolist()):
                self.trust.setdefault(nm, {})[c] = t
        return steps

    @staticmethod
    def _aggregate(update: torch.Tensor, base_w: torch.Tensor, base_agg: Aggregate | None, flagged: list[bool],
                   evidence: torch.Tensor, holders: torch.Tensor, rare: list[int], steps: Mapping[int, RareRowStep],
                   spear: float) -> Aggregate:
        """The round's aggregate with every hospital's EARN signals (and the HTA base's, where it ran)."""
        n, C = evidence.shape

        def per(field: str, i: int) -> dict[str, float]:
            return {str(c): float(v[i]) for c, s in steps.items() if (v := getattr(s, field)) is not None}

        extra_base = {} if base_agg is None else dict(base_agg.extra)
        if base_agg is not None:  # flagged by either: HTA's exclusion or a lost rare-row trust
            flagged = [bool(a or b) for a, b in zip(flagged, extra_base.pop("flagged"))]
        selected = torch.ones(n, dtype=torch.bool) if base_agg is None else base_agg.selected
        return Aggregate(update, base_w, selected, extra={
            **extra_base,
            "evidence": [[float(x) for x in evidence[i]] for i in range(n)],
            "holds": [[int(c) for c in range(C) if bool(holders[i, c])] for i in range(n)],
            "rare_classes": [list(rare)] * n,
            "earn_trust": [per("trust", i) for i in range(n)],
            "row_agreement": [per("agreement", i) for i in range(n)],
            "row_audit": [per("audit", i) for i in range(n)],
            "rare_row_weight": [per("weight", i) for i in range(n)],
            "rare_row_clip": [per("clip", i) for i in range(n)],
            "evidence_spearman": [spear] * n,
            "flagged": flagged,
        })


#: EARN with the holder and rare-class definitions of its description (no EARN paper or code was found in public)
PRESETS = (
    Preset(
        "earn-published", EARN,
        "EARN as described: a hospital holds class c when it has at least 20 training images of c (its reported class "
        "counts), a rare class is one few hospitals hold (fewer than earn.rare-fraction x the mean number of holders, "
        "and always the least held), and peer reliability is p(c) = clip((n(c) - 1) / 4, 0, 1) from the number of "
        "holders n(c). Everything the description leaves open is earn's (docs/rules/earn.md lists each difference).",
        {
            "evidence": ("reported", "Who holds a class: the hospitals' reported training-image counts per class "
                                     "(fakeable; earn's evidence is the bias update)."),
            "rare-by": ("holders", "A class is rare when few hospitals hold it (earn: when its reported image total is "
                                   "small)."),
            "holder-min-count": (20, "A hospital holds a class when it has at least 20 training images of it."),
        },
    ),
)

"""Defence-aware colluding attacks on hospitrust's own rules, written as an attacker who has read the
rule page (the math: :mod:`hospitrust.attacks.math.defence_aware`).

They are omniscient simulation steps (the simulated adversary, on the server, before the rule): each
sees the round's honest updates and its own, and a private copy of the run's rule with the state the
round found it in (what an attacker who has read the page could forecast by simulating the rule; a
real one would estimate it). What each one reads is listed in its docstring and in docs/attacks.md.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from hospitrust.aggregation import coordinate_median
from hospitrust.aggregation.anchored_trust import reference_histories
from hospitrust.aggregation.vectorize import flatten_state
from hospitrust.attacks.interfaces import RoundAwareColludingAttack, RoundView
from hospitrust.attacks.math import defence_aware as DA
from hospitrust.attacks.math import update as U
from hospitrust.options import Options


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be finite, got {v}")
    return v


def _direction_away(honest: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Where the attackers pull: against the honest mean; its -std perturbation when that is parallel
    to ``reference`` (nothing to turn towards).
    """
    away = -honest.double().mean(0)
    ref = reference.double()
    cos = float(away @ ref) / max(float(torch.linalg.vector_norm(away) * torch.linalg.vector_norm(ref)), 1e-300)
    if abs(cos) > 1 - 1e-9:
        away = U.perturbation_vector(honest, "std").double()
    return away.to(honest.dtype)


def _spread(target: torch.Tensor, relative: float, generator: torch.Generator | None) -> torch.Tensor:
    """``target`` plus random noise of ``relative`` x its norm: each attacker turns a different way."""
    if relative <= 0:
        return target
    noise = torch.randn(target.shape, generator=generator, dtype=torch.float64, device="cpu").to(target.device)
    noise = noise / torch.linalg.vector_norm(noise) * relative * torch.linalg.vector_norm(target.double())
    return (target.double() + noise).to(target.dtype)


def _rule_copy(view: RoundView, wanted: tuple[str, ...], attack: str) -> Any:
    if view.strategy is None:
        raise ValueError(f"attack {attack!r} needs the run's rule (RoundView.strategy): it runs in a run")
    rule = view.strategy()
    if type(rule).name not in wanted:
        raise ValueError(f"attack {attack!r} is written against the rule {' or '.join(wanted)} (it reads its page and "
                         f"state), not strategy {type(rule).name!r}")
    return rule


def _classifier_head(global_state: dict[str, torch.Tensor]) -> tuple[int, int, int, int]:
    """Where the model's last linear layer sits in the flat update: ``(weight offset, C, H, bias
    offset)``, as EARN reads it (the last 1-D float tensor right after a ``(C, H)`` one): the attacker
    knows the architecture it trains.
    """
    spec = flatten_state(global_state)[1]
    for i in range(len(spec.keys) - 1, 0, -1):
        bias, weight = spec.shapes[i], spec.shapes[i - 1]
        if len(bias) == 1 and len(weight) == 2 and weight[0] == bias[0]:
            return spec.offsets[i - 1], int(weight[0]), int(weight[1]), spec.offsets[i]
    raise ValueError("earn-aware needs a model whose last layer is a linear layer with a bias (weight (C, H), bias (C,))")


class HTAAwareOptions(Options):
    """The HTA-aware attack's options."""

    margin: float = Field(0.02, ge=0.0, le=1.0, description=(
        "Added to the least trust that keeps the attacker out of HTA's dual MAD exclusion (for the median its "
        "own row moves)."
    ))
    expected_validation: float = Field(1.0, gt=0.0, le=1.0, description=(
        "The validation signal v the attacker expects for its update (HTA's v: reference-cohort balanced "
        "accuracy over the round's median)."
    ))
    spread: float = Field(0.5, ge=0.0, description=(
        "Each attacker turns towards its target plus its own random noise of this relative norm, so the copies "
        "differ (HTA merges near-duplicates) at the same cosine to the median."
    ))
    _finite = field_validator("margin", "expected_validation", "spread")(_finite)


class HTAAware(RoundAwareColludingAttack):
    """Against HTA: after building reputation honestly (``attack-schedule.start-round``), every round
    the least trust that keeps each attacker's reputation out of HTA's dual MAD exclusion
    (:func:`~hospitrust.attacks.math.defence_aware.hta_band_attack`), spent on an update of the
    median norm turned from the round's median update towards minus the honest mean.

    Reads: the honest updates (their coordinate median and median norm), HTA's options, and from a
    private copy of the rule its running reputations (each attacker's EMA and variance) and the
    others' reputations after this round (the copy evaluated on the round with the attackers' own
    updates in their rows).

    Parameters
    ----------
    margin : float
        Added to the trust needed.
    expected_validation : float
        The v it expects, in (0, 1].
    spread : float
        Relative noise on each attacker's target (>= 0).
    """

    name = "hta-aware"
    Options = HTAAwareOptions
    rules = ("hta",)

    def __init__(self, margin: float = 0.02, expected_validation: float = 1.0, spread: float = 0.5) -> None:
        self.margin = U.check_finite_number(margin, "margin", nonneg=True)
        self.expected_validation = U.check_finite_number(expected_validation, "expected_validation", positive=True)
        self.spread = U.check_finite_number(spread, "spread", nonneg=True)

    def craft_round(self, view: RoundView):
        hta = _rule_copy(view, self.rules, self.name)
        o = hta.options
        honest = view.honest
        reference = coordinate_median(honest)
        median_norm = float(torch.linalg.vector_norm(honest.double(), dim=1).median())
        target = _direction_away(honest, reference)
        if view.aggregate is None:
            raise ValueError("attack 'hta-aware' needs RoundView.aggregate (the rule's reputations this round)")
        forecast = view.aggregate(view.updates).extra["reputation"]
        others = torch.tensor([forecast[i] for i in view.honest_rows], dtype=torch.float64)
        m = len(view.malicious_rows)
        rows, taus, cosines, feasible = [], [], [], []
        for r in view.malicious_rows:
            name = view.hospitals[r]
            row, found = DA.hta_band_attack(
                reference, _spread(target, self.spread, view.generator), median_norm=median_norm,
                ema=hta.ema.get(name), var=hta.var.get(name, 0.0), others=others, num_malicious=m,
                expected_validation=self.expected_validation, a=o.direction_exponent, b=o.magnitude_exponent,
                c=o.validation_exponent, rate=o.ema_rate, variance_penalty=o.variance_penalty, lam=o.exclusion_mads,
                kappa=o.exclusion_fraction, margin=self.margin)
            rows.append(row)
            taus.append(found["tau"])
            cosines.append(found["cosine"])
            feasible.append(bool(found["feasible"]))
        return torch.stack(rows), {"tau": taus, "cosine": cosines, "feasible": feasible}


class FLTrustAwareOptions(Options):
    """The FLTrust-aware attack's options."""

    cosine: float = Field(0.1, gt=0.0, le=1.0, description=(
        "The cosine kept to the server's root update (estimated by the attacker's own honest update): FLTrust "
        "keeps weight ReLU(cosine)."
    ))
    _finite = field_validator("cosine")(_finite)


class FLTrustAware(RoundAwareColludingAttack):
    """Against FLTrust: each attacker sends an update at a small positive cosine to its estimate of
    the server's root update (its own honest update: the root cohort is drawn from the same kind of
    data), the rest along minus the honest mean
    (:func:`~hospitrust.attacks.math.defence_aware.fltrust_small_cosine`). FLTrust keeps weight c for
    it and rescales it to the root norm.

    Reads: its own update and the honest updates' mean; not the rule's state, nor the real root
    update.

    Parameters
    ----------
    cosine : float
        c in (0, 1].
    """

    name = "fltrust-aware"
    Options = FLTrustAwareOptions

    def __init__(self, cosine: float = 0.1) -> None:
        self.cosine = U.check_finite_number(cosine, "cosine", positive=True)

    def craft_round(self, view: RoundView):
        honest = view.honest
        rows = []
        for r in view.malicious_rows:
            # the root estimate: its own update; where that is zero (a hospital whose round moved nothing, seen at
            # Dirichlet 0.1) the honest mean it reads; where both are zero it has nothing to turn, and sends zero
            own = view.updates[r]
            if not float(torch.linalg.vector_norm(own.double())) > 0:
                own = honest.mean(0)
            if not float(torch.linalg.vector_norm(own.double())) > 0:
                rows.append(torch.zeros_like(view.updates[r]))
                continue
            row, _ = DA.fltrust_small_cosine(own, _direction_away(honest, own), self.cosine)
            rows.append(row)
        return torch.stack(rows), {"cosine": self.cosine}


class EARNAwareOptions(Options):
    """The EARN-aware attack's options."""

    target_class: int = Field(-1, ge=-1, description=(
        "The rare class whose row is pushed (-1: the class the fewest honest hospitals hold this round, by a "
        "positive bias update)."
    ))
    margin: float = Field(1e-3, ge=0.0, lt=1.0, description=(
        "Added to earn.agree-threshold, and the share of the last feasible angle kept back."
    ))
    _finite = field_validator("margin")(_finite)


class EARNAware(RoundAwareColludingAttack):
    """Against EARN: each attacker claims the rare class c (its bias update for c positive: a holder)
    and rotates its row of c, norm kept, from the other holders' median row towards minus the global
    model's row of c (lowering c's logit), by the largest angle that keeps EARN's agreement
    (``earn.agree-threshold``), the positive bias and the row audit
    (:func:`~hospitrust.attacks.math.defence_aware.earn_row_push`); the rest of its update is its own.

    Reads: the honest updates' class-c rows and bias updates, EARN's options, the global model's head,
    and the audit direction (mean head feature of class c minus the rest) from the rule's own
    reference-cohort features when the rule audits rows (the best estimate an attacker could make from
    a few real images of c). An attacker whose own bias update for c is not positive claims the class
    with the other holders' median row (as a holder with a few real images of c would send).

    Parameters
    ----------
    target_class : int
        The class pushed (-1: the one fewest honest hospitals hold).
    margin : float
        Kept back from the constraints.
    """

    name = "earn-aware"
    Options = EARNAwareOptions
    rules = ("earn",)

    def __init__(self, target_class: int = -1, margin: float = 1e-3) -> None:
        if int(target_class) != target_class or int(target_class) < -1:
            raise ValueError(f"target_class must be an integer >= -1, got {target_class!r}")
        self.target_class = int(target_class)
        self.margin = U.check_finite_number(margin, "margin", nonneg=True)

    def craft_round(self, view: RoundView):
        earn = _rule_copy(view, self.rules, self.name)
        global_state = earn.global_state
        w_off, C, H, b_off = _classifier_head(global_state)
        honest = view.honest.double()
        bias = honest[:, b_off:b_off + C]
        c = self.target_class
        if c >= C:
            raise ValueError(f"earn-aware.target-class = {c}: the model has {C} classes (0..{C - 1})")
        if c < 0:
            c = int(torch.argmin((bias > 0).sum(0)))  # fewest holders, lowest index on ties

        def row_of(u: torch.Tensor) -> torch.Tensor:
            u = u.double()
            return torch.cat([u[w_off + c * H: w_off + (c + 1) * H], u[b_off + c: b_off + c + 1]])

        holders = bias[:, c] > 0
        peers = honest[holders] if bool(holders.any()) else honest
        peer_rows = torch.stack([row_of(u) for u in peers])
        reference = peer_rows.median(dim=0).values
        if float(reference[-1]) <= 0:  # the median row is no holder's: lift its bias just above zero
            reference[-1] = 1e-6 * float(torch.linalg.vector_norm(reference)) or 1e-12
        global_vec = flatten_state(global_state)[0].double()
        push = -row_of(global_vec)
        push[-1] = 0.0
        audit = None
        if getattr(earn, "head_features", None) is not None and earn.options.audit_by != "model":
            feats, labels = earn.head_features(global_state)
            feats, labels = torch.as_tensor(feats).double().cpu(), torch.as_tensor(labels).cpu()
            if bool((labels == c).any()) and bool((labels != c).any()):
                diff = feats[labels == c].mean(0) - feats[labels != c].mean(0)
                audit = torch.cat([diff, torch.zeros(1, dtype=torch.float64)])
        rows, cosines, feasible = [], [], []
        for r in view.malicious_rows:
            own = view.updates[r]
            own_row = row_of(own)
            if float(own_row[-1]) <= 0:  # claims the class: sends what a holder of a few images of c would
                own_row = reference * (float(torch.linalg.vector_norm(own_row)) / float(torch.linalg.vector_norm(reference)))
            pushed, found = DA.earn_row_push(own_row, reference, push, agree_threshold=float(earn.options.agree_threshold),
                                             audit_direction=audit, margin=self.margin)
            out = own.clone()
            out[w_off + c * H: w_off + (c + 1) * H] = pushed[:H].to(out.dtype)
            out[b_off + c] = pushed[H].to(out.dtype)
            rows.append(out)
            cosines.append(found["cosine"])
            feasible.append(bool(found["feasible"]))
        return torch.stack(rows), {"class": c, "cosine": cosines, "feasible": feasible,
                                   "audit_estimated": audit is not None}


class AnchoredTrustAwareOptions(Options):
    """The anchored-trust-aware attack's options."""

    spread: float = Field(0.5, ge=0.0, description=(
        "Each attacker pulls along its own copy of the direction plus random noise of this relative norm, so the "
        "copies differ (anchored trust merges near-duplicates)."
    ))
    angles: int = Field(91, ge=2, le=10_000, description="The grid of angles searched between the anchor and the push.")
    _finite = field_validator("spread")(_finite)


class AnchoredTrustAware(RoundAwareColludingAttack):
    """Against anchored trust: each attacker sends, at the largest norm the rule and the server let
    through (its row's bound this round, within ``max-update-norm``), the update in the plane of this
    round's anchor and minus the honest mean that pushes furthest orthogonally to the anchor, times
    the trust its history keeps at this round's cosine of full trust
    (:func:`~hospitrust.attacks.math.defence_aware.anchored_trust_push`). After building history
    honestly (``attack-schedule.start-round``) it spends it.

    Reads: the honest updates and their examples, the rule's options, from a private copy of the
    rule each attacker's histories and the rule's previous aggregate, the round's exact anchor (the
    copy's reference-cohort trainer: an omniscient attacker who knows the operator's cohort), and the
    copy evaluated on the round with the attackers' own updates in their rows (the cosine of full
    trust and each row's bound).

    Parameters
    ----------
    spread : float
        Relative noise on each attacker's direction (>= 0).
    angles : int
        Angles searched (>= 2).
    """

    name = "anchored-trust-aware"
    Options = AnchoredTrustAwareOptions
    rules = ("anchored-trust",)

    def __init__(self, spread: float = 0.5, angles: int = 91) -> None:
        self.spread = U.check_finite_number(spread, "spread", nonneg=True)
        if int(angles) != angles or int(angles) < 2:
            raise ValueError(f"angles must be an integer >= 2, got {angles!r}")
        self.angles = int(angles)

    def craft_round(self, view: RoundView):
        rule = _rule_copy(view, self.rules, self.name)
        o = rule.options
        if rule.global_state is None or view.aggregate is None:
            raise ValueError("attack 'anchored-trust-aware' needs the rule's global model and RoundView.aggregate "
                             "(it runs in a run)")
        # the rule on this round as it stands (the attackers' own updates in their rows): the cosine of full trust
        # and each row's bound, which the crafted rows then meet
        forecast = view.aggregate(view.updates).extra
        anchor = rule.server_update(rule.global_state, view.server_round).double().cpu()
        gnorm = float(torch.linalg.vector_norm(anchor))
        honest = view.honest.double()
        counts = (view.num_examples.double().cpu() if view.num_examples is not None
                  else torch.ones(view.updates.shape[0], dtype=torch.float64))
        honest_counts = counts[view.honest_rows]
        away = -(honest_counts.unsqueeze(1) * honest).sum(0) / honest_counts.sum().clamp_min(1e-300)
        d = honest.shape[1]
        last = None if rule.last_step is None else rule.last_step.double().cpu()
        rows, angles, trusts = [], [], []
        for r in view.malicious_rows:
            name = view.hospitals[r]
            zero = torch.zeros(d, dtype=torch.float64)
            history = rule.history.get(name, zero).double().cpu()
            # the rule's own reference after this round (A_i + P_i), computed by the rule's function
            anchor_side, path_side = reference_histories(rule.anchor_history.get(name, zero).double().cpu(),
                                                         rule.path_history.get(name, zero).double().cpu(),
                                                         anchor, last, o.history_decay)
            reference = anchor_side + path_side
            norm = float(forecast["bound"][r]) * (1 - 1e-6)
            if view.max_norm is not None:
                norm = min(norm, float(view.max_norm) * (1 - 1e-6))
            if gnorm == 0 or norm <= 0:  # nothing to hide behind: the rule takes no step this round
                rows.append(view.updates[r].double())
                angles.append(float("nan"))
                trusts.append(float("nan"))
                continue
            row, found = DA.anchored_trust_push(anchor, _spread(away, self.spread, view.generator), history, reference,
                                                decay=o.history_decay,
                                                full_trust_cosine=float(forecast["full_trust_cosine"][r]),
                                                trust_width=o.trust_width, norm=norm, angles=self.angles)
            rows.append(row)
            angles.append(found["angle"])
            trusts.append(found["trust"])
        return torch.stack(rows).to(view.updates.dtype), {"angle": angles, "trust": trusts}


class SentinelAwareOptions(Options):
    """The sentinel-aware attack's options."""

    push: Literal["against-mean", "class-bias"] = Field("against-mean", description=(
        "Where the attackers pull: against-mean (minus the honest updates' mean, a fresh direction each round), or "
        "class-bias (the classifier's bias towards the class the honest hospitals hold most, the same direction "
        "every round: a slow drift that each round's check must catch)."
    ))
    spread: float = Field(0.5, ge=0.0, description=(
        "Each attacker pulls along its own copy of the direction plus random noise of this relative norm (decorrelated "
        "copies)."
    ))
    steps: int = Field(8, ge=1, le=60, description="Bisection steps of the search for the largest push the rule keeps.")
    _finite = field_validator("spread")(_finite)


class SentinelAware(RoundAwareColludingAttack):
    """Against sentinel: each attacker sends the honest updates' examples-weighted mean (the update
    the rule ranks best) plus the largest push the rule still keeps, found by bisection with the
    rule itself in the loop: the private copy of the rule, with its exact server update and the exact
    loss on the server's reference cohort, evaluated on the round with the crafted rows in place
    (stronger than an attacker who knows the rule and its thresholds but not the server's images).
    With ``push = "against-mean"`` two pushes are searched, minus the honest mean and its part
    orthogonal to the server's update (where the check's loss changes least, to first order), and the
    one that moves the round's step furthest from the honest mean is sent; with ``"class-bias"`` the
    classifier's bias towards the majority class, the same every round (a slow drift). Every row stays
    within the rule's bound (kappa x the server update's norm) and ``max-update-norm``; the pushes are
    decorrelated per attacker by ``spread``.

    Reads: the honest updates and their examples, the rule's bound and its exact server update, the
    rule's decision on candidate rows (its copy).

    Parameters
    ----------
    push : str
        ``"against-mean"`` (two pushes searched) or ``"class-bias"`` (a fixed drift).
    spread : float
        Relative noise on each attacker's push (>= 0).
    steps : int
        Bisection steps (>= 1).
    """

    name = "sentinel-aware"
    Options = SentinelAwareOptions
    rules = ("sentinel",)

    def __init__(self, push: str = "against-mean", spread: float = 0.5, steps: int = 8) -> None:
        if push not in ("against-mean", "class-bias"):
            raise ValueError(f"push must be 'against-mean' or 'class-bias', got {push!r}")
        self.push = push
        self.spread = U.check_finite_number(spread, "spread", nonneg=True)
        if int(steps) != steps or int(steps) < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        self.steps = int(steps)
        self._bias: dict[str, torch.Tensor] = {}  # class-bias: each attacker's fixed direction (a slow drift)

    def _bias_direction(self, view: RoundView, rule: Any, name: str, mean: torch.Tensor) -> torch.Tensor:
        if name not in self._bias:
            _, C, _, b_off = _classifier_head(rule.global_state)
            # the class whose bias the honest mean raises most: the majority class, pushed further
            c = int(torch.argmax(mean[b_off:b_off + C]))
            d = torch.zeros_like(mean)
            d[b_off + c] = 1.0
            d[b_off:b_off + C] -= 1.0 / C  # a pure shift of one logit against the others
            self._bias[name] = _spread(d, self.spread, view.generator)
        return self._bias[name].to(mean.device, mean.dtype)

    def craft_round(self, view: RoundView):
        rule = _rule_copy(view, self.rules, self.name)
        if rule.global_state is None or view.aggregate is None:
            raise ValueError("attack 'sentinel-aware' needs the rule's global model and RoundView.aggregate (it runs "
                             "in a run)")
        honest = view.honest.double().cpu()
        counts = (view.num_examples.double().cpu() if view.num_examples is not None
                  else torch.ones(view.updates.shape[0], dtype=torch.float64))
        hc = counts[view.honest_rows]
        mean = (hc.unsqueeze(1) * honest).sum(0) / hc.sum().clamp_min(1e-300)
        bound = float(view.aggregate(view.updates).extra["bound"][0])
        if view.max_norm is not None:
            bound = min(bound, float(view.max_norm))
        bound *= 1 - 1e-6

        def unit(v: torch.Tensor) -> torch.Tensor:
            return v / torch.linalg.vector_norm(v).clamp_min(1e-300)

        if self.push == "class-bias":
            families = {"class-bias": [unit(self._bias_direction(view, rule, view.hospitals[r], mean))
                                       for r in view.malicious_rows]}
        else:
            g = unit(rule._anchor.get(rule.server_update, rule.global_state, view.server_round).double().cpu())
            blind = -mean + float(mean @ g) * g  # minus the mean, without its part along the server's update
            families = {"against-mean": [unit(_spread(-mean, self.spread, view.generator))
                                         for _ in view.malicious_rows],
                        "orthogonal-to-server": [unit(_spread(blind, self.spread, view.generator))
                                                 for _ in view.malicious_rows]}

        def rows_at(dirs: list[torch.Tensor], lam: float) -> torch.Tensor:
            out = []
            for d in dirs:
                row = mean + lam * bound * d
                norm = float(torch.linalg.vector_norm(row))
                out.append(row * min(1.0, bound / norm) if norm > 0 else row)
            return torch.stack(out)

        aggregate = view.aggregate

        def decide(rows: torch.Tensor) -> tuple[bool, float]:
            agg = aggregate(view.with_rows(rows.to(view.updates.dtype)))
            kept = all(bool(agg.selected[r]) for r in view.malicious_rows)
            return kept, float(torch.linalg.vector_norm(agg.update.double().cpu() - mean))

        best: tuple[float, str, float, torch.Tensor, bool] | None = None
        for family, dirs in families.items():
            lo, hi = 0.0, 4.0  # lam = 4: the push four times the bound, the row all but the push itself
            if decide(rows_at(dirs, hi))[0]:
                lo = hi
            else:
                for _ in range(self.steps):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if decide(rows_at(dirs, mid))[0] else (lo, mid)
            rows = rows_at(dirs, lo)
            kept, distance = decide(rows)
            if best is None or (kept, distance) > (best[4], best[0]):
                best = (distance, family, lo, rows, kept)
        assert best is not None
        distance, family, lam, rows, kept = best
        return rows.to(view.updates.dtype), {"push": lam, "direction": family, "distance": distance, "kept": kept}


__all__ = ["AnchoredTrustAware", "EARNAware", "FLTrustAware", "HTAAware", "SentinelAware"]

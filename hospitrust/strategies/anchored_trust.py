"""Anchored trust: hospitrust's trust rule built from HTA's and EARN's measured failures (docs/rules/anchored-trust.md)."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO, WARNING

import torch
from flwr.common import log
from typing import Literal

from pydantic import Field

from hospitrust.aggregation.anchored_trust import anchored_trust, local_steps
from hospitrust.aggregation.duplicates import duplicate_groups
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class AnchoredTrustOptions(Options):
    """Anchored trust's options: the history's memory, the cosine of full trust, the step bound."""

    history_decay: float = Field(0.9, ge=0.0, lt=1.0, description=(
        "rho: each round a hospital's history of directions (and of the anchor's) is multiplied by this before "
        "the round's unit update is added; 0 judges each round alone, 0.9 remembers about ten rounds."
    ))
    full_trust_cosine: float = Field(0.5, gt=0.0, le=1.0, description=(
        "tau: a hospital whose history points at least this close to the reference (cosine) counts as one full "
        "voice. Lowered to the round's (n - f)-th largest history cosine when that is smaller (f = "
        "assumed-malicious), so the honest majority keeps full trust."
    ))
    trust_width: float = Field(0.5, gt=0.0, le=2.0, description=(
        "w: below the cosine of full trust, trust falls linearly to 0 at w under it."
    ))
    full_trust_rank: Literal["n-minus-f", "median"] = Field("n-minus-f", description=(
        "Which of the round's history cosines caps the cosine of full trust: the (n - f)-th largest (the honest "
        "majority keeps full trust), or the median (half the hospitals do; hospitals far below it lose trust even "
        "where one honest hospital is as low as the colluders)."
    ))
    bound_per_step: bool = Field(False, description=(
        "false: an update is clipped to kappa x the trusted updates' median norm, the same bound for every hospital; "
        "true: per local step (kappa x the hospital's steps x the trusted median norm per step), which let colluders "
        "holding the largest partitions move several times further (measured: docs/experiments/"
        "2026-12-04-anchored-trust-design.md)."
    ))
    step_bound: float = Field(2.0, gt=0.0, description=(
        "kappa: an update is clipped to kappa x the trusted updates' median norm (rows given no weight do not set "
        "it; per local step with bound-per-step)."
    ))
    duplicate_cosine: float = Field(0.999, gt=0.0, le=1.0, description=(
        "Updates whose pairwise cosine reaches this count as one voice (they share one hospital's weight)."
    ))


class AnchoredTrust(HospitrustStrategy):
    """Each round the server trains the global model on its reference cohort (the anchor, as
    FLTrust's root update). Every hospital keeps a decayed history of its update directions, and of
    the anchor's over the rounds it took part in; its trust is the history cosine over
    ``full-trust-cosine``, capped at 1. Each update loses its part against the round's anchor, is
    clipped to ``step-bound`` x the anchor's norm per local step x its own steps, and the aggregate
    is the trust x examples weighted mean (near-duplicates share one voice). Math:
    :func:`hospitrust.aggregation.anchored_trust.anchored_trust`.

    State across rounds (per hospital name, checkpointed): ``history`` and ``anchor_history``.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    server_update : Callable[[dict, int], torch.Tensor]
        (global state, server round) -> the ``(d,)`` anchor; it must have a ``local_steps``
        attribute (the anchor's optimizer steps), as the ServerApp's reference-cohort trainer has.
    **kwargs
        The base's other keyword arguments.
    """

    name = "anchored-trust"
    trust_signal = "trust"
    reads_who_sent = True  # history per hospital
    sized_for_attackers = True  # full trust at the (n - f)-th largest history cosine
    Options = AnchoredTrustOptions
    options: AnchoredTrustOptions
    state_attrs = ("history", "anchor_history", "path_history", "last_step")

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        return frozenset({"server_update"})

    def __init__(self, hospitals, options=None, *, server_update: Callable[[dict, int], torch.Tensor] | None = None,
                 assumed_malicious: int = 0, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        if assumed_malicious < 0:
            raise ValueError(f"anchored-trust: assumed_malicious must be >= 0, got {assumed_malicious}")
        self.f = assumed_malicious
        if server_update is None:
            raise ValueError("anchored-trust needs a server_update callable (the anchor, from the reference cohort)")
        steps = getattr(server_update, "local_steps", None)
        if not isinstance(steps, int | float) or steps <= 0:
            raise ValueError("anchored-trust needs the anchor's local steps: server_update must have a positive "
                             f"local_steps attribute, got {steps!r}")
        self.server_update = server_update
        self.history: dict[str, torch.Tensor] = {}
        self.anchor_history: dict[str, torch.Tensor] = {}
        self.path_history: dict[str, torch.Tensor] = {}
        self.last_step: torch.Tensor | None = None  # the rule's previous aggregate

    def summary(self) -> None:
        super().summary()
        o = self.options
        log(INFO, "\t└── anchored trust: history decay %g, full trust at cosine min(%g, the (n - %d)-th largest), "
            "0 at %g below, step bound %g x the trusted median norm per step, duplicates at cosine %g",
            o.history_decay, o.full_trust_cosine, self.f, o.trust_width, o.step_bound, o.duplicate_cosine)

    def _past(self, store: dict[str, torch.Tensor], names: list[str], like: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(like)
        for i, name in enumerate(names):
            past = store.get(name)
            if past is None:
                continue
            if past.numel() != like.shape[1]:
                raise ValueError(f"anchored-trust: {name}'s history has {past.numel()} numbers, the updates "
                                 f"{like.shape[1]} (a checkpoint of another model?)")
            out[i] = past.to(like.device, like.dtype)
        return out

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        o = self.options
        names = list(context.hospitals)
        anchor = self.server_update(self.global_state, context.server_round).to(updates.device, updates.dtype)
        n = updates.shape[0]
        steps = (local_steps(example_weights, int(self.train_config.get("batch-size", 32)),
                             int(self.train_config.get("local-epochs", 1)))
                 if o.bound_per_step else torch.ones(n, dtype=torch.float64))
        # the rank of the cosine of full trust, as the f of full_trust_at: the (n - f)-th largest, or the median
        rank_f = min(self.f, max(n - 1, 0)) if o.full_trust_rank == "n-minus-f" else n // 2
        dup = duplicate_groups(updates, o.duplicate_cosine)
        out = anchored_trust(
            updates, anchor, example_weights, steps,
            float(self.server_update.local_steps) if o.bound_per_step else 1.0,  # type: ignore[attr-defined]
            self._past(self.history, names, updates), self._past(self.anchor_history, names, updates),
            self._past(self.path_history, names, updates),
            None if self.last_step is None else self.last_step.to(updates.device, updates.dtype),
            decay=o.history_decay, full_trust_cosine=o.full_trust_cosine, trust_width=o.trust_width,
            assumed_malicious=rank_f, step_bound=o.step_bound, group_size=dup["size"])
        for i, name in enumerate(names):
            self.history[name] = out["history"][i].detach().cpu().clone()
            self.anchor_history[name] = out["anchor_history"][i].detach().cpu().clone()
            self.path_history[name] = out["path_history"][i].detach().cpu().clone()
        self.last_step = out["update"].detach().cpu().clone()
        if float(torch.linalg.vector_norm(anchor.double())) == 0:
            log(WARNING, "anchored-trust round %d: the anchor is zero (nothing learnt on the reference cohort): "
                "the model is kept", context.server_round)
        if int(dup["size"].max()) > 1:
            log(WARNING, "anchored-trust round %d: near-duplicate updates (cosine >= %g) share one voice",
                context.server_round, o.duplicate_cosine)
        weights = out["weights"]
        return Aggregate(out["update"], weights, weights > 0, extra={
            "trust": [float(t) for t in out["trust"]],
            "history_cosine": [float(v) for v in out["history_cosine"]],
            "round_cosine": [float(v) for v in out["round_cosine"]],
            "against_anchor": [float(v) for v in out["against_anchor"]],
            "bound": [float(v) for v in out["bound"]],
            "full_trust_cosine": [float(v) for v in out["full_trust_cosine"]],
            "clip_factor": [float(v) for v in out["clip_factor"]],
            "duplicate_group_size": [int(k) for k in dup["size"]],
            "flagged": [bool(t <= 0) or int(k) > 1 for t, k in zip(out["trust"].tolist(), dup["size"].tolist())],
        })

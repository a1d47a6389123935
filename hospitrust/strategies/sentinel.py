"""Sentinel: a step is kept only where it does at least as well on the server's own images as the
server's own update (docs/rules/sentinel.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal
from logging import INFO

import torch
from flwr.app import ArrayRecord
from flwr.common import log
from pydantic import Field

from hospitrust.aggregation.sentinel import sentinel
from hospitrust.aggregation.vectorize import flatten_state
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class SentinelOptions(Options):
    """Sentinel's options: the cohort's held-out part, the step bound."""

    check_fraction: float = Field(0.5, ge=0.0, lt=1.0, description=(
        "The share of the reference cohort (per class) held out to check steps on: the server trains its own "
        "update on the rest and never on these images, so the check measures what a step does on images nobody "
        "trained on. 0: train and check on the whole cohort (the check then favours the server's own update, "
        "which has fitted those images: measured worse, docs/experiments/2026-12-06-sentinel-design.md)."
    ))

    server_epochs: int = Field(4, ge=1, le=100, description=(
        "Epochs the server trains its own update for on its part of the cohort each round (the fall-back step, "
        "and with step-bound the bound on every hospital's update); 1 is FLTrust's root update, 4 did best on the "
        "tuning seeds (docs/experiments/2026-12-06-sentinel-design.md)."
    ))
    candidates: Literal["prefixes", "trimmed-mean", "trimmed-and-mean"] = Field("prefixes", description=(
        "The hospitals' candidate steps checked against the server's own update: prefixes (the examples-weighted "
        "means of the k updates that do best alone, k = 1..n), trimmed-mean (the coordinate-wise mean without the "
        "assumed-malicious largest and smallest values), or trimmed-and-mean (that and the mean of every update)."
    ))
    fall_back: Literal["server", "server-or-keep"] = Field("server", description=(
        "Where no hospitals' candidate does as well on the held-out images: the server's own update, or the better "
        "of it and keeping the model (the server's step, trained from the current model on a few images, can itself "
        "make the held-out loss worse)."
    ))
    floor: Literal["none", "cohort-model"] = Field("none", description=(
        "A floor under the released model: none, or cohort-model: the server also trains its own model to "
        "convergence on the cohort's training part (floor-epochs at floor-learning-rate, the cohort-only-converged "
        "control's recipe) and, each round, releases the federated model only where its loss on the held-out part "
        "is at most that model's; otherwise it releases the same recipe trained on the whole cohort (the control's "
        "model). The released model is the one evaluated and saved; the hospitals train on from the federated one."
    ))
    start: Literal["global", "cohort-model"] = Field("global", description=(
        "The model the first round starts from: global (the run's initial model, as every rule), or cohort-model: "
        "the server's own model trained on the cohort's training part (floor-epochs at floor-learning-rate, the "
        "cohort-only-converged control's recipe), never on the held-out part, so every step from it is still "
        "checked on images nobody trained on. With fall-back = server-or-keep the held-out loss never rises above "
        "that model's: the federation can only improve on what the server has alone."
    ))
    floor_check: Literal["loss", "balanced-accuracy"] = Field("loss", description=(
        "What the floor's release compares on the held-out part: the class-balanced loss, or the balanced accuracy "
        "(a model trained to convergence on a few images is overconfident, so its held-out loss can lose to a model "
        "it beats in accuracy: design probe 6). Ties release the federated model."
    ))
    floor_epochs: int = Field(240, ge=1, le=5000, description=(
        "Epochs of the server's own model's training, for floor and start (the PneumoniaMNIST main condition's "
        "cohort-only-converged control, chosen on the tuning seeds: docs/leaderboard.md, v3)."
    ))
    floor_learning_rate: float = Field(0.01, gt=0.0, le=10.0, description=(
        "The learning rate of the server's own model, for floor and start (that control's)."))
    step_bound: float = Field(4.0, gt=0.0, description=(
        "kappa: every hospital's update is clipped to kappa x the norm of the server's own update this round "
        "(the global model trained on the reference cohort), a bound no hospital can move. 0 < kappa; inf: none "
        "beyond max-update-norm."
    ))


class _RoundAnchor:
    """The server's own update of the round, computed once and shared with the rule's private copies
    (an aware attacker evaluates the rule many times a round; the update depends only on the round's
    global model and the round).
    """

    shared_between_copies = True

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.global_vector: torch.Tensor | None = None
        self.update: torch.Tensor | None = None

    def get(self, server_update: Callable[[dict, int], torch.Tensor], state: dict, server_round: int) -> torch.Tensor:
        vector = flatten_state(state, torch.float64)[0]
        if (self.key != (server_round, id(state)) or self.global_vector is None or self.update is None
                or not torch.equal(self.global_vector, vector)):
            self.update = server_update(state, server_round).detach().clone()
            self.key, self.global_vector = (server_round, id(state)), vector
        return self.update.clone()


class Sentinel(HospitrustStrategy):
    """The server's reference cohort is split per class into a part it trains on and a part it only
    checks on (``check-fraction``). Each round the server trains the global model on the first (its
    own update g, FLTrust's root update). Every update is clipped to ``step-bound`` x ||g|| and
    ranked by the class-balanced loss on the check part of the model it alone gives; the candidates
    are the examples-weighted means of the k best, and the round's step is the one with the lowest
    check loss, unless g does better: then g. Math: :func:`hospitrust.aggregation.sentinel.sentinel`.
    With ``floor``, the model released each round (evaluated and saved) is the global model where its check
    loss is at most that of the server's own model trained to convergence on the training part, otherwise
    that recipe trained on the whole cohort (the ``cohort-only-converged`` control's model). With ``start``,
    the first round starts from that model trained on the training part.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    server_update : Callable[[dict, int], torch.Tensor]
        (global state, server round) -> the ``(d,)`` server update.
    candidate_losses : Callable[[dict, torch.Tensor], torch.Tensor]
        (global state, ``(k, d)`` steps) -> ``(k,)`` the check part's loss of global + each step.
    cohort_split : Callable[[float, int], tuple]
        The server's service: (check fraction, server epochs) -> (server_update, candidate_losses) on the cohort's two
        parts (what a run passes; the two callables directly are for tests).
    cohort_floor : Callable[[float, int, float], Any], optional
        With ``floor`` or ``start``: (check fraction, epochs, learning rate) -> the server's own model (``whole``,
        ``part`` and ``check_loss``; :class:`hospitrust.server_app.services.CohortFloor`).
    **kwargs
        The base's other keyword arguments.
    """

    name = "sentinel"
    sized_for_attackers = True  # the trimmed mean drops assumed-malicious values at each end
    Options = SentinelOptions
    options: SentinelOptions

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        own_model = options.floor != "none" or options.start != "global"
        return frozenset({"cohort_split", "cohort_floor"} if own_model else {"cohort_split"})

    def __init__(self, hospitals, options=None, *, cohort_split: Callable[[float, int], tuple[Any, Any]] | None = None,
                 server_update: Callable[[dict, int], torch.Tensor] | None = None,
                 candidate_losses: Callable[[dict, torch.Tensor], torch.Tensor] | None = None,
                 cohort_floor: Callable[[float, int, float], Any] | None = None,
                 assumed_malicious: int = 0, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        o = self.options
        # the server's own model (CohortFloor-like: whole, part, check_loss), where floor or start asks for it
        self.own_model = None
        if o.floor != "none" or o.start != "global":
            if cohort_floor is None:
                which = "floor" if o.floor != "none" else "start"
                raise ValueError(f"sentinel.{which} = 'cohort-model' needs the server's own model (cohort_floor): it "
                                 "comes from the reference cohort")
            self.own_model = cohort_floor(o.check_fraction, o.floor_epochs, o.floor_learning_rate)
        self.floor = self.own_model if o.floor != "none" else None
        self._released: ArrayRecord | None = None
        # the server's own model is trained once: its check value and its record are the run's
        self._floor_value: float | None = None
        self._floor_arrays: ArrayRecord | None = None
        if assumed_malicious < 0:
            raise ValueError(f"sentinel: assumed_malicious must be >= 0, got {assumed_malicious}")
        self.f = assumed_malicious
        if cohort_split is not None:  # the server's cohort: trained on one part, checked on the other
            server_update, candidate_losses = cohort_split(self.options.check_fraction, self.options.server_epochs)
        if server_update is None or candidate_losses is None:
            raise ValueError("sentinel needs the server's own update (server_update) and the cohort's loss of a "
                             "candidate model (candidate_losses): both come from the reference cohort")
        self.server_update = server_update
        self.candidate_losses = candidate_losses
        self._anchor = _RoundAnchor()

    def summary(self) -> None:
        super().summary()
        kappa = self.options.step_bound
        log(INFO, "\t└── sentinel: updates clipped to %s x the server's own update norm; a step is kept only where "
            "its loss on the cohort's held-out part (%g of it) is at most the server's own update's",
            "no bound" if math.isinf(kappa) else f"{kappa:g}", self.options.check_fraction)

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        state = self.global_state
        anchor = self._anchor.get(self.server_update, state, context.server_round).to(updates.device, updates.dtype)
        out = sentinel(updates, anchor, example_weights, lambda steps: self.candidate_losses(state, steps),
                       step_bound=self.options.step_bound, candidates=self.options.candidates, trim=self.f,
                       may_keep=self.options.fall_back == "server-or-keep")
        n = updates.shape[0]
        if out["fell_back"]:
            log(INFO, "sentinel round %d: no hospitals' step did as well on the reference cohort as the server's own "
                "update (loss %.4f against %.4f): the server's update is the step", context.server_round,
                out["anchor_loss"], float(out["prefix_loss"].min()))  # type: ignore[union-attr]
        weights = out["weights"]
        assert isinstance(weights, torch.Tensor)
        return Aggregate(out["update"], weights, weights > 0, extra={  # type: ignore[arg-type]
            "clipped_loss": [float(v) for v in out["clipped_loss"]],  # type: ignore[union-attr]
            "rank": [int(v) for v in out["rank"]],  # type: ignore[union-attr]
            "clip_factor": [float(v) for v in out["clip_factor"]],  # type: ignore[union-attr]
            "bound": [float(out["bound"])] * n,  # type: ignore[arg-type]
            "anchor_loss": [float(out["anchor_loss"])] * n,  # type: ignore[arg-type]
            "step_loss": [float(out["anchor_loss"]) if out["fell_back"]
                          else float(out["prefix_loss"][int(out["chosen"]) - 1])] * n,  # type: ignore[index, arg-type]
            "fell_back": [bool(out["fell_back"])] * n,
            "candidate": [str(out["candidate"])] * n,
            "flagged": [not bool(w > 0) for w in weights],
        })

    def initial_model(self, arrays: ArrayRecord) -> ArrayRecord:
        if self.options.start == "global":
            return arrays
        assert self.own_model is not None
        part = self.own_model.part  # trained on the training part only: the held-out part still judges every step
        missing = sorted(set(arrays.keys()) ^ set(part))
        if missing:
            raise ValueError(f"sentinel.start = 'cohort-model': the server's own model and the run's differ in {missing}")
        log(INFO, "sentinel: the first round starts from the server's own model (trained on the cohort's training "
            "part), not the run's initial one")
        return ArrayRecord({k: v.detach().cpu().clone() for k, v in part.items()})

    def released(self, server_round: int, arrays: ArrayRecord) -> tuple[ArrayRecord, dict[str, Any]]:
        if self.floor is None:
            return arrays, {}
        by_accuracy = self.options.floor_check == "balanced-accuracy"
        check = self.floor.check_balanced_accuracy if by_accuracy else self.floor.check_loss
        if self._floor_value is None:
            self._floor_value = check(self.floor.part)
        federated, floor = check(arrays.to_torch_state_dict()), self._floor_value
        # ties to the federation: the hospitals' model where it does as well (lower loss, or higher accuracy)
        keep = federated >= floor if by_accuracy else federated <= floor
        if not keep and self._floor_arrays is None:
            self._floor_arrays = ArrayRecord(self.floor.whole)
        released = arrays if keep else self._floor_arrays
        assert released is not None
        self._released = released
        if not keep:
            log(INFO, "sentinel round %d: the federated model's held-out %s %.4f is worse than the server's own "
                "model's %.4f: the server's own model is released", server_round, self.options.floor_check, federated,
                floor)
        what = "balanced_accuracy" if by_accuracy else "loss"
        return released, {"sentinel_floor": {"released": "federated" if keep else "floor",
                                                   f"federated_{what}": federated, f"floor_{what}": floor}}

    def final_model(self, arrays: ArrayRecord) -> dict[str, torch.Tensor] | None:
        if self.floor is not None and self._released is not None:
            return self._released.to_torch_state_dict()
        return arrays.to_torch_state_dict()

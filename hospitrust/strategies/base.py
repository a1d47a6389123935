"""The base every hospitrust strategy stands on.

It is a Flower Message-API ``Strategy`` (:mod:`hospitrust.strategies.messages`) holding a rule's options,
capabilities and state. What a round does with the replies (the checks, the stack, the update steps, the
records) is :mod:`hospitrust.strategies.intake`'s; the types a round passes are in
:mod:`hospitrust.strategies.rounds`; the run's hooks a rule may override are :mod:`hospitrust.strategies.hooks`'.
A rule subclasses it and implements ``aggregate`` only.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import ValidationError

from hospitrust.aggregation.vectorize import flatten_state
from hospitrust.options import NoOptions, kebab
from hospitrust.options import Options as OptionsModel
from hospitrust.strategies.hooks import RunHooks
from hospitrust.strategies.messages import RoundMessages
from hospitrust.strategies.rounds import Aggregate, AttackerRows, GroupedRows, RoundContext, RoundResult, RowStep, UpdateStep
from hospitrust.strategies.validation import ReplyLimits

__all__ = ["SERVICES", "Aggregate", "AttackerRows", "GroupedRows", "HospitrustStrategy", "RoundContext", "RoundResult",
           "RowStep", "UpdateStep"]

#: What a rule can ask the server for (``HospitrustStrategy.needs``): the keyword argument the
#: registry passes, and what the server builds it from. All of them need the reference cohort.
SERVICES = {
    "candidate_scores": "the reference cohort's balanced accuracy of each candidate model global + u_h",
    "head_features": "the global model's inputs to its last linear layer on the reference cohort",
    "candidate_logits": "the logits of the global model and of each candidate model on the reference cohort",
    "server_update": "the global model trained one local epoch on the reference cohort (a root update)",
    "candidate_losses": "the reference cohort's class-balanced cross-entropy of each candidate model global + step",
    "cohort_split": ("the reference cohort split per class into a part the server trains on and a part it only checks "
                     "on: (check fraction) -> (the root update on the first, the candidate losses on the second)"),
    "cohort_floor": ("the server's own model trained to convergence on the reference cohort and on its training part, "
                     "with the check part's loss: (check fraction, epochs, learning rate) -> the floor"),
}


class HospitrustStrategy(RoundMessages, RunHooks):
    """What every rule is: a registry name, its options, its capabilities and trust signal (class attributes), its
    state, and its math (``aggregate``); the round's messages are :class:`RoundMessages`', its intake
    :mod:`hospitrust.strategies.intake`'s, the run's hooks :class:`RunHooks`'.

    A rule subclasses it with a registry ``name``, its ``Options`` (its run-config section) and
    ``aggregate``; ``needs`` says which server services it wants (``SERVICES``), and
    the registry builds it with exactly those.

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name (from the query round).
    options : Options or Mapping, optional
        The rule's options (an instance of its ``Options``, or a mapping of field names); its
        defaults when None.
    train_config : Mapping, optional
        Values every hospital gets in its train ConfigRecord (local epochs, lr, ...).
    fraction_train : float
        Share of hospitals asked each round (at least ``min_hospitals``).
    min_hospitals : int
        Fewest valid replies to update the model; fewer keeps the previous one.
    limits : ReplyLimits, optional
        Bounds of the reply validation.
    seed : int
        Seeds hospital sampling.
    device : torch.device or str
        Where the aggregation math runs.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[OptionsModel]] = NoOptions
    #: True for the rules sized for f attackers: they get run config ``assumed-malicious``
    sized_for_attackers: ClassVar[bool] = False
    #: True for the rules that read who sent each row (state kept per hospital, a reply's metrics): they
    #: cannot take rows that stand for several hospitals (:class:`GroupedRows`, ByzFL's bucket means)
    reads_who_sent: ClassVar[bool] = False
    # What the rule can do, asked by the loop, the features and the run-config checks (never its name).
    #: False for a rule whose replies are no stack of whole-model updates (FED-FBD's blocks): nothing for
    #: pre-aggregation to mix or clip
    stacks_updates: ClassVar[bool] = True
    #: True for a rule whose aggregate is a weighted mean ``M = M0 + sum_i w_i U_i``: contribution scoring's
    #: counterfactual models (``M - U_i``, ``M0 + U_i``, Shapley's coalitions) are defined for it
    weighted_mean: ClassVar[bool] = False
    #: True for a rule that computes the equal-weight mean of the clipped updates once asked to
    #: (``aggregate_round(..., equal_weights=True)``): central DP's noise ``z C / n`` is calibrated for exactly that
    central_dp_compatible: ClassVar[bool] = False
    #: True for a rule whose hospitals train as Opacus's DP-SGD accounts for (local DP)
    local_dp_compatible: ClassVar[bool] = True
    #: True for a rule that decides how much each hospital counts (trust, selection, scores): the run's trust
    #: plot draws it; False for the example-weighted means (FedAvg, FedProx)
    weighs_hospitals: ClassVar[bool] = True
    #: True for a rule whose state is no single global model (FED-FBD's colors): the loop asks its
    #: :meth:`own_evaluation` instead of evaluating the global model, and saves :meth:`final_model`
    runs_own_evaluation: ClassVar[bool] = False
    #: True for a rule that is the plain example-weighted mean of the updates, all the server needs being their
    #: sum (secure aggregation: the server never sees one update)
    secagg_compatible: ClassVar[bool] = False
    #: Why the rule lacks a capability, by the capability's name: the run-config checks quote it
    capability_notes: ClassVar[Mapping[str, str]] = {}
    #: How Shejwalkar and Houmansadr's AGR-tailored attack (NDSS 2021) is defined against the rule: "selection"
    #: (a rule that selects rows: the largest gamma it still selects), "distance" (a rule of coordinate-wise order
    #: statistics: gamma moved while its output moves further); None: not defined (their AGR-agnostic attacks are)
    agr_tailored: ClassVar[Literal["selection", "distance"] | None] = None
    #: The name of the rule's own per-hospital trust among the signals its aggregate records (``trust``,
    #: ``reputation``, ...): each hospital record's ``trust`` holds its value (a per-class mapping: the mean) and
    #: the round record names it, so readers (the trust plot, the console) never guess; None: the rule gives
    #: none, the aggregation weight stands for it
    trust_signal: ClassVar[str | None] = None

    @classmethod
    def why_not(cls, capability: str, default: str) -> str:
        """Why this rule lacks ``capability`` (its ``capability_notes`` entry), else ``default``.

        Parameters
        ----------
        capability : str
            A capability's class-attribute name (``local_dp_compatible``).
        default : str
            The reason given when the rule names none.

        Returns
        -------
        str
            The reason.
        """
        return cls.capability_notes.get(capability, default)

    @classmethod
    def composes(cls, options: OptionsModel) -> tuple[str, ...]:
        """Other rules whose options (run-config sections) this rule uses with ``options``."""
        return ()

    @classmethod
    def needs(cls, options: OptionsModel, composed: Mapping[str, OptionsModel]) -> frozenset[str]:
        """The server services (keys of ``SERVICES``) this rule needs with these options."""
        return frozenset()

    @classmethod
    def cohort_free_setting(cls, options: OptionsModel, composed: Mapping[str, OptionsModel]) -> str | None:
        """The setting under which this rule needs no reference cohort (named in the error a run
        without one gets), e.g. ``hta.validation-exponent = 0``; None when it has none.
        """
        return None

    @classmethod
    def check_run_config(cls, cfg: Any) -> None:
        """Checks of this rule against the rest of the run config when it is selected (a duck-typed
        ``hospitrust.config.RunConfig``); ValueError naming the keys.
        """

    @classmethod
    def parse_options(cls, options: OptionsModel | Mapping[str, Any] | None) -> OptionsModel:
        if options is None:
            return cls.Options()
        if isinstance(options, cls.Options):
            return options
        if isinstance(options, OptionsModel):
            raise TypeError(f"{cls.name}: options must be {cls.Options.__name__}, got {type(options).__name__}")
        try:
            parsed = cls.Options.model_validate(dict(options))
        except ValidationError as err:  # the run-config names: earn.nonholder-weight = 1.5: ...
            lines = [f"{cls.name}.{'.'.join(kebab(str(p)) for p in e['loc'])} = {e.get('input')!r}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in err.errors()]
            raise ValueError("; ".join(lines)) from None
        parsed.check_dependencies(parsed.set_keys())
        return parsed

    def __init__(
        self,
        hospitals: Mapping[int, str],
        options: OptionsModel | Mapping[str, Any] | None = None,
        *,
        train_config: Mapping[str, Any] | None = None,
        fraction_train: float = 1.0,
        min_hospitals: int = 2,
        limits: ReplyLimits | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if not hospitals:
            raise ValueError("a strategy needs at least one hospital")
        self.options = self.parse_options(options)
        self.hospitals = dict(hospitals)
        self.train_config = dict(train_config or {})
        self.fraction_train = fraction_train
        self.min_hospitals = min_hospitals
        self.limits = limits or ReplyLimits()
        self.seed = seed
        self.rng = random.Random(seed)
        self.device = torch.device(device)
        self.global_state: dict[str, torch.Tensor] | None = None
        # global_state flattened (aggregate_round's), with the state it was flattened from
        self._global_vector: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None

    # attributes that carry over from round to round (trust, reputation, history): saved in
    # the server checkpoint with the sampling RNG; subclasses list theirs, keyed by hospital name
    state_attrs: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), **{a: copy.deepcopy(getattr(self, a)) for a in self.state_attrs}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [a for a in ("rng", *self.state_attrs) if a not in state]
        if missing:
            raise ValueError(f"{self.name}: checkpoint state lacks {missing} (saved by another strategy?)")
        self.rng.setstate(state["rng"])
        for a in self.state_attrs:
            setattr(self, a, copy.deepcopy(state[a]))

    def round_generator(self, server_round: int) -> torch.Generator:
        """A CPU generator for the rule's random draws in ``server_round`` (DnC's and SignGuard's
        coordinates, FLAME's noise): seeded from the run seed and the round alone, so a run is
        reproducible and a resumed run draws what the unbroken one drew, with nothing to checkpoint.

        Parameters
        ----------
        server_round : int
            The round the draws are for.

        Returns
        -------
        torch.Generator
            A fresh generator.
        """
        entropy = np.random.SeedSequence([int(self.seed) % (1 << 64), int(server_round)]).generate_state(2, np.uint64)
        return torch.Generator().manual_seed(int(entropy[0]) & 0x7FFFFFFFFFFFFFFF)

    def global_vector(self) -> torch.Tensor:
        """The round's global model flattened as the updates are (the ``(d,)`` vector they are relative
        to), on the rule's device: what FLAME needs to cluster the local models.
        """
        if self.global_state is None:
            raise RuntimeError(f"{self.name}: no global model yet (configure_train sends it first)")
        if self._global_vector is None or self._global_vector[0] is not self.global_state:
            self._global_vector = (self.global_state, flatten_state(self.global_state)[0].to(self.device))
        return self._global_vector[1]

    # ---- what a rule implements ----------------------------------------------------------
    def required_replies(self) -> int:
        """Fewest valid replies the rule is defined for (e.g. Krum: 2f + 3)."""
        return 1

    def aggregate(self, updates: torch.Tensor, example_weights: torch.Tensor, context: RoundContext) -> Aggregate:
        """Combine the round's ``(n, d)`` updates into one ``(d,)`` update: the rule's math, the one method a rule
        must implement.

        Parameters
        ----------
        updates : torch.Tensor
            ``(n, d)`` the accepted updates (after the round's update steps), one row per reply, in hospital order.
        example_weights : torch.Tensor
            ``(n,)`` float64 each row's weight: its example count, or 1 each where the round asks for the
            equal-weight mean (central DP).
        context : RoundContext
            The round, who sent each row and its reply's metrics.

        Returns
        -------
        Aggregate
            The update, and per row its weight, selection and the rule's signals.
        """
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "aggregate_updates" in cls.__dict__:  # a rule written for the interface before issue 64
            raise TypeError(
                f"{cls.__module__}.{cls.__name__} implements aggregate_updates(server_round, updates, num_examples, "
                "replies): a rule now implements aggregate(updates, example_weights, context), where "
                "context.server_round is the round, context.hospitals who sent each row and context.metrics each "
                "reply's metrics (docs/extending.md)")

    # ---- helpers ---------------------------------------------------------------------------
    def hospital_name(self, node_id: int) -> str:
        """The name of the hospital behind ``node_id`` (``unknown-node-ID`` for a node the run never queried)."""
        return self.hospitals.get(node_id, f"unknown-node-{node_id}")

    @property
    def signal_source(self) -> str:
        """The name the rule's signals are recorded under in each :class:`HospitalRecord`."""
        return self.name or type(self).__name__


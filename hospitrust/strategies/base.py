"""The base every hospitrust strategy stands on.

It is a Flower Message-API ``Strategy``. Its job is the plumbing that every rule shares:
choose hospitals, send them the model, check every reply (a bad reply is rejected with a
reason, never an exception), stack the accepted updates into an ``(n, d)`` tensor, hand
that to the rule's math, and record per hospital what happened. A rule subclasses it and
implements ``aggregate_updates`` only.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import ValidationError
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from hospitrust.aggregation.vectorize import FlatSpec, flatten_state, unflatten_state
from hospitrust.options import NoOptions, kebab
from hospitrust.options import Options as OptionsModel
from hospitrust.records import HospitalRecord, RoundRecord, mean_of_signal
from hospitrust.strategies.validation import CheckedReply, RejectedReply, ReplyLimits, check_train_reply, check_update_row

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


@dataclass
class Aggregate:
    """What a rule returns: the aggregated update and, per accepted reply, its weight and selection.

    Parameters
    ----------
    update : torch.Tensor
        ``(d,)`` the aggregated update.
    weights : torch.Tensor
        ``(n,)`` each accepted reply's share in the aggregate (sums to 1 for averaging rules).
    selected : torch.Tensor
        ``(n,)`` bool: whether the reply took part.
    extra : dict[str, list[Any]]
        Per-client signals by name (one value per reply), recorded in its :class:`HospitalRecord`
        under the rule's name (``trust`` and ``flagged`` as the record's own fields).
    """

    update: torch.Tensor  # (d,)
    weights: torch.Tensor  # (n,) share of each accepted reply in the aggregate (sums to 1 for averaging rules)
    selected: torch.Tensor  # (n,) bool: did the reply take part
    extra: dict[str, list[Any]] = field(default_factory=dict)  # per-client signals, recorded in the hospital records


@dataclass
class RoundResult:
    """What a round's aggregation decided, returned by ``HospitrustStrategy.aggregate_round``.

    Parameters
    ----------
    arrays : ArrayRecord or None
        The new global model; None keeps the previous one.
    clients : list[HospitalRecord]
        One record per reply (accepted or rejected): hospital, weight, selected, reason, the
        rule's per-hospital signals.
    metrics : MetricRecord or None
        Flower's aggregate metrics (valid replies, train loss).
    aggregation_seconds : float
        Time spent aggregating.
    kept_previous_model : bool
        Whether the previous model was kept (too few valid replies, nothing released).
    note : str
        Why the previous model was kept ('' otherwise).
    update_norm : float or None
        L2 norm of the round's aggregated update (how far the global model moved); None when
        the previous model was kept.
    """

    arrays: ArrayRecord | None = None
    clients: list[HospitalRecord] = field(default_factory=list)
    metrics: MetricRecord | None = None
    aggregation_seconds: float = 0.0
    kept_previous_model: bool = False
    note: str = ""
    update_norm: float | None = None

    def keep_previous(self, why: str) -> None:
        """No new model this round, and why (appended to an earlier note)."""
        self.arrays, self.update_norm, self.kept_previous_model = None, None, True
        self.note = (self.note + "; " if self.note else "") + why


#: A step on the stacked updates before the rule sees them: (round, (n, d) updates, hospital
#: names in row order) -> updates. Round features supply them (the simulated colluding adversary;
#: pre-aggregation); ``aggregate_round`` applies them in order.
RowStep = Callable[[int, torch.Tensor, list[str]], torch.Tensor]


@dataclass(frozen=True)
class AttackerRows:
    """An update step that puts rows of its own in hospitals' places (the simulated colluding adversary).

    The server never decoded those rows from a reply, so ``aggregate_round`` holds every row the step
    returns to the reply checks (:func:`~hospitrust.strategies.validation.check_update_row`): a row
    that fails is rejected and recorded as a rejected reply is, its hospital leaves the round, and
    min-hospitals is checked again. A deployed server would have rejected such a reply; a simulated
    attacker gets no more than a real one.

    Parameters
    ----------
    step : RowStep
        The step itself (it keeps the number and order of the rows).
    """

    step: RowStep

    def __call__(self, server_round: int, updates: torch.Tensor, hospitals: list[str]) -> torch.Tensor:
        return self.step(server_round, updates, hospitals)


@dataclass(frozen=True)
class GroupedRows:
    """An update step that hands the rule fewer rows than replies, each row standing for a group of them
    (ByzFL's bucketing: the rule gets the bucket means, ``bucketing.rule-input = "bucket-means"``).

    ``step(round, updates, hospitals)`` returns the ``(k, d)`` rows and, per row, the indices of the
    replies it carries (every reply in exactly one group). It must be the last update step. The rule
    aggregates the rows (:meth:`HospitrustStrategy.aggregate_grouped`), and each member's record gets
    its group's weight split equally among the members, its group's selection and signals.

    Parameters
    ----------
    step : callable
        ``(round, (n, d) updates, names) -> ((k, d) rows, k groups of reply indices)``.
    """

    step: Callable[[int, torch.Tensor, list[str]], tuple[torch.Tensor, list[list[int]]]]


#: What ``aggregate_round`` takes: steps that keep one row per reply (:data:`RowStep`, an
#: :class:`AttackerRows` among them), the last one possibly a :class:`GroupedRows`.
UpdateStep = RowStep | GroupedRows


class HospitrustStrategy(Strategy):
    """Plumbing for all rules: sampling, reply validation, stacking, records.

    A rule subclasses it with a registry ``name``, its ``Options`` (its run-config section) and
    ``aggregate_updates``; ``needs`` says which server services it wants (``SERVICES``), and
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
    #: (:meth:`use_equal_weights`): central DP's noise ``z C / n`` is calibrated for exactly that
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

    @classmethod
    def server_parts(cls, options: OptionsModel, *, task: Any, sets: Any, device: torch.device,
                     hospitals: Sequence[str], seed: int, run_dir: Any, resuming: bool) -> dict[str, Any]:
        """Further keyword arguments of the constructor that the server builds for this rule at the
        start of a run (FED-FBD's plan and warehouse); none by default.

        Parameters
        ----------
        options : Options
            The rule's resolved options.
        task : Task
            The run's task (its model, channels, classes, image size).
        sets : ServerSets
            The server's test set and reference cohort.
        device : torch.device
            Where the server's math runs.
        hospitals : Sequence[str]
            The hospitals' names in the query rows' order (partition, then name).
        seed : int
            The run's seed.
        run_dir : pathlib.Path
            The run directory (files the rule keeps beside the loop's).
        resuming : bool
            True when the run resumes from a checkpoint (what the first round wrote is there already).

        Returns
        -------
        dict
            Keyword arguments for the constructor.
        """
        return {}

    def own_evaluation(self, server_round: int, result: RoundResult) -> tuple[dict[str, Any], dict[str, Any]]:
        """The round's central report and the rule's own entries in its rounds.jsonl line, for a rule
        whose state is no single global model (``runs_own_evaluation``); the loop asks no other rule.

        Parameters
        ----------
        server_round : int
            The round just aggregated.
        result : RoundResult
            What :meth:`aggregate_round` returned for it.

        Returns
        -------
        tuple[dict, dict]
            (the central classification report, extra entries of the round's record).
        """
        raise NotImplementedError(f"{self.name} evaluates the global model centrally (runs_own_evaluation is False)")

    def initial_model(self, arrays: ArrayRecord) -> ArrayRecord:
        """The global model the first round starts from, given the run's initial one (a fresh run's, never a
        resumed run's): that model itself for every rule but one that starts from the server's own model
        (sentinel's ``start``).

        Parameters
        ----------
        arrays : ArrayRecord
            The run's initial model (the task's, from the run's seed).

        Returns
        -------
        ArrayRecord
        """
        return arrays

    def released(self, server_round: int, arrays: ArrayRecord) -> tuple[ArrayRecord, dict[str, Any]]:
        """The model the consortium gets after ``server_round`` (evaluated centrally; the last round's is saved as
        the run's model) and the rule's entries about it in the round's line: the global model itself and none for
        every rule but one that keeps a floor (sentinel's ``floor``). The hospitals train on from the global model.

        Parameters
        ----------
        server_round : int
            The round just aggregated.
        arrays : ArrayRecord
            The loop's global model after it.

        Returns
        -------
        tuple[ArrayRecord, dict[str, Any]]
            The released model and the rule's entries.
        """
        return arrays, {}

    def final_model(self, arrays: ArrayRecord) -> dict[str, torch.Tensor] | None:
        """The state dict saved as the run's model.pt; None for a rule that keeps its final state in
        its own file (FED-FBD's warehouse.pt).

        Parameters
        ----------
        arrays : ArrayRecord
            The loop's global model after the last round.

        Returns
        -------
        dict or None
            The state dict to save, or None.
        """
        return arrays.to_torch_state_dict()

    def run_summary(self, history: Sequence[RoundRecord], truth: Mapping[str, bool]) -> dict[str, Any]:
        """The rule's own entries in summary.json; none by default.

        Parameters
        ----------
        history : Sequence[RoundRecord]
            The run's round records.
        truth : Mapping[str, bool]
            The simulation's ground truth: which hospitals attack.

        Returns
        -------
        dict
            Entries merged into the summary.
        """
        return {}

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

    # ---- Flower Strategy interface ------------------------------------------------------
    def summary(self) -> None:
        log(INFO, "\t├── Strategy: %s (%s)", self.name, type(self).__name__)
        log(INFO, "\t├── Hospitals: %d, fraction-train %.2f, min-hospitals %d", len(self.hospitals),
            self.fraction_train, self.min_hospitals)
        log(INFO, "\t└── Reply bounds: update norm <= %g, num-examples <= %d", self.limits.max_update_norm,
            self.limits.max_num_examples)

    def sample_hospitals(self, grid: Grid, excluded: Collection[str] = ()) -> list[int]:
        """Node ids to ask this round, chosen by hospital name with the seeded rng (node ids are random),
        among the online hospitals not ``excluded`` (names a round feature keeps out, e.g. a spent budget).
        """
        online = set(grid.get_node_ids())
        candidates = sorted((name, nid) for nid, name in self.hospitals.items() if nid in online and name not in excluded)
        k = min(len(candidates), max(math.ceil(self.fraction_train * len(candidates)), self.min_hospitals))
        chosen = self.rng.sample(candidates, k) if k < len(candidates) else candidates
        return [nid for _, nid in sorted(chosen)]

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

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.configure_round(server_round, arrays, config, grid)

    def configure_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        excluded: Collection[str] = ()) -> list[Message]:
        """The round's train messages, to the sampled hospitals not ``excluded`` (hospital names)."""
        self.global_state = arrays.to_torch_state_dict()
        cfg = ConfigRecord({**self.train_config, **dict(config), "server-round": server_round})
        content = RecordDict({"arrays": arrays, "config": cfg})
        return [
            Message(content, dst_node_id=nid, message_type=MessageType.TRAIN)
            for nid in self.sample_hospitals(grid, excluded)
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's form of :meth:`aggregate_round`: (new model or None, metrics)."""
        result = self.aggregate_round(server_round, replies)
        return result.arrays, result.metrics

    def aggregate_round(self, server_round: int, replies: Iterable[Message],
                        update_steps: Sequence[UpdateStep] = ()) -> RoundResult:
        """Check every reply, stack the accepted updates, apply ``update_steps`` to the stack, run the
        rule; the result says what the round decided, per hospital and as a whole.
        """
        started = time.perf_counter()
        record = RoundResult()
        accepted: list[CheckedReply] = []
        if self.global_state is not None:
            global_vec, spec = flatten_state(self.global_state)
            global_vec = global_vec.to(self.device)
            self._global_vector = (self.global_state, global_vec)
        # replies arrive in whatever order the hospitals finish; floating-point sums depend on
        # the order of their terms, so the same seed gives the same model only in a fixed order
        for reply in self._in_hospital_order(replies):
            node_id = int(reply.metadata.src_node_id)
            if node_id not in self.hospitals and reply.has_error():
                # the SuperLink answers for a node that is gone ("node unavailable"): that
                # hospital is missing this round, not a hospital that sent something bad
                log(WARNING, "Round %d: no reply from a hospital: %s", server_round, (reply.error.reason or "").strip()[:200])
                continue
            try:
                if self.global_state is None:
                    raise RejectedReply("no global model was sent this round")
                accepted.append(check_train_reply(reply, self.global_state, global_vec, self.limits))
            except RejectedReply as rej:
                record.clients.append(self.hospital_record(node_id, rejected=True, reason=rej.reason))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self._name_of(node_id), rej.reason)
            except Exception as exc:  # a check itself failed on odd input: still the hospital's fault
                reason = f"unreadable reply: {type(exc).__name__}: {exc}"
                record.clients.append(self.hospital_record(node_id, rejected=True, reason=reason))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self._name_of(node_id), reason)

        if self._too_few(server_round, record, accepted, started):
            return record

        updates = torch.stack([cast(torch.Tensor, r.update) for r in accepted])  # set by check_train_reply
        for r in accepted:
            r.update = None  # the stacked copy is the only one kept
        groups: list[list[int]] | None = None
        for step in update_steps:
            if groups is not None:
                raise ValueError("an update step that groups rows (GroupedRows) must be the last update step")
            names = [self._name_of(r.node_id) for r in accepted]
            if isinstance(step, GroupedRows):
                updates, groups = step.step(server_round, updates, names)
                continue
            updates = step(server_round, updates, names)
            if isinstance(step, AttackerRows):  # rows no reply check has seen: held to the same checks
                updates, accepted = self._checked_rows(server_round, record, updates, accepted, global_vec, spec)
                if self._too_few(server_round, record, accepted, started):
                    return record
        num_examples = torch.tensor([r.num_examples for r in accepted], dtype=torch.float64, device=self.device)
        # what each hospital's update (as the rule saw it) and the aggregate weigh: step lengths for the record
        row_norms = torch.linalg.vector_norm(updates, dim=1).tolist()
        if groups is None:
            norms = row_norms
            result = self.aggregate_updates(server_round, updates, num_examples, accepted)
        else:
            if len(groups) < self.required_replies():
                self._kept(server_round, record, accepted, started, f"{len(groups)} rows after the pre-aggregation < the "
                           f"{self.name} rule's minimum of {self.required_replies()} (assumed malicious f)")
                return record
            norms = [0.0] * len(accepted)
            for row, members in enumerate(groups):
                for i in members:
                    norms[i] = row_norms[row]
            result = self.aggregate_grouped(server_round, updates, groups, num_examples, accepted)
        record.update_norm = float(torch.linalg.vector_norm(result.update))

        new_vec = global_vec + result.update.to(global_vec.dtype)
        template = self._integer_buffers(accepted, result.selected)
        new_state = unflatten_state(new_vec.cpu(), spec, template)
        record.aggregation_seconds = time.perf_counter() - started
        for i, r in enumerate(accepted):
            record.clients.append(self.hospital_record(
                r.node_id, reply=r, weight=float(result.weights[i]), selected=bool(result.selected[i]),
                update_norm=norms[i], signals={k: v[i] for k, v in result.extra.items()}))
        losses = [float(r.metrics.get("train-loss", float("nan"))) for r in accepted]
        total = float(num_examples.sum())
        train_loss = float(sum(loss * n for loss, n in zip(losses, num_examples.tolist())) / total) if total else math.nan
        record.arrays = ArrayRecord(new_state)
        record.metrics = MetricRecord({"valid-replies": len(accepted), "train-loss": train_loss})
        return record

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        cfg = ConfigRecord({**dict(config), "server-round": server_round})
        content = RecordDict({"arrays": arrays, "config": cfg})
        online = set(grid.get_node_ids())
        return [
            Message(content, dst_node_id=nid, message_type=MessageType.EVALUATE)
            for nid in sorted(self.hospitals)
            if nid in online
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's form of :meth:`hospital_evaluation`: the mean and spread of the hospitals' accuracy."""
        per_hospital = self.hospital_evaluation(server_round, replies)
        if not per_hospital:
            return None
        accs = np.array([v["accuracy"] for v in per_hospital.values()])
        return MetricRecord({"mean-accuracy": float(accs.mean()), "accuracy-spread": float(accs.max() - accs.min())})

    def hospital_evaluation(self, server_round: int, replies: Iterable[Message]) -> dict[str, dict[str, float]]:
        """Hospital name -> its accuracy, example count and balanced accuracy of the global model on
        its local validation set (fairness); malformed replies are left out.
        """
        per_hospital: dict[str, dict[str, float]] = {}
        for reply in self._in_hospital_order(replies):
            if reply.has_error() or not reply.has_content() or "metrics" not in reply.content.metric_records:
                continue
            m = reply.content.metric_records["metrics"]
            try:
                # a list value raises TypeError: left out below
                acc = float(cast(float, m["accuracy"]))
                n = int(cast(int, m["num-examples"]))
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(acc) and 0.0 <= acc <= 1.0 and n > 0:
                per_hospital[self._name_of(int(reply.metadata.src_node_id))] = {
                    "accuracy": acc,
                    "num_examples": n,
                    "balanced_accuracy": float(cast(float, m.get("balanced-accuracy", float("nan")))),
                }
        return per_hospital

    def _too_few(self, server_round: int, record: RoundResult, accepted: list[CheckedReply], started: float) -> bool:
        """Whether ``accepted`` is below min-hospitals (or the rule's minimum); if so ``record`` says the
        previous model is kept and lists the valid replies with weight 0.
        """
        needed = max(self.min_hospitals, self.required_replies())
        if len(accepted) >= needed:
            return False
        why = (f"min-hospitals {self.min_hospitals}" if needed == self.min_hospitals
               else f"the {self.name} rule's minimum of {needed} (assumed malicious f)")
        self._kept(server_round, record, accepted, started, f"{len(accepted)} valid replies < {why}")
        return True

    def _kept(self, server_round: int, record: RoundResult, accepted: list[CheckedReply], started: float,
              why: str) -> None:
        """``record``: the previous model kept because ``why``; the valid replies listed with weight 0."""
        record.kept_previous_model = True
        record.note = f"{why}: kept the previous model"
        log(WARNING, "Round %d: %s", server_round, record.note)
        for r in accepted:
            record.clients.append(self.hospital_record(r.node_id, reply=r, weight=0.0, selected=False))
        record.aggregation_seconds = time.perf_counter() - started
        record.metrics = MetricRecord({"valid-replies": len(accepted)})

    def _checked_rows(self, server_round: int, record: RoundResult, updates: torch.Tensor,
                      accepted: list[CheckedReply], global_vec: torch.Tensor, spec: FlatSpec
                      ) -> tuple[torch.Tensor, list[CheckedReply]]:
        """Every row of ``updates`` held to the reply checks (``check_update_row``); the rows that fail are
        rejected, recorded as a rejected reply is, and dropped with their replies.
        """
        if updates.shape[0] != len(accepted):
            raise ValueError(f"an attacker's update step returned {updates.shape[0]} rows for {len(accepted)} replies")
        keep: list[int] = []
        for i, r in enumerate(accepted):
            try:
                check_update_row(updates[i], global_vec, spec, self.limits)
                keep.append(i)
            except RejectedReply as rej:
                record.clients.append(self.hospital_record(r.node_id, rejected=True, reason=rej.reason))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self._name_of(r.node_id), rej.reason)
        if len(keep) == len(accepted):
            return updates, accepted
        return updates[keep], [accepted[i] for i in keep]

    def aggregate_grouped(self, server_round: int, rows: torch.Tensor, groups: Sequence[Sequence[int]],
                          num_examples: torch.Tensor, replies: list[CheckedReply]) -> Aggregate:
        """The rule on ``(k, d)`` rows that each stand for a group of replies (ByzFL's bucket means), its
        result given per reply.

        The rule sees k rows; a row's example count is the sum of its members', and the reply it is
        handed carries that count and its first member's node id (nothing else: a rule that reads who
        sent a row, ``reads_who_sent``, is refused). Each member gets its group's weight divided by the
        group's size (a bucket is its members' plain mean, so that is each member's share in the
        aggregate), its group's selection and its group's per-row signals.

        Parameters
        ----------
        server_round : int
            The round.
        rows : torch.Tensor
            ``(k, d)`` the rows the rule aggregates.
        groups : sequence of sequences of int
            For every row, the indices (into ``replies``) of the replies it stands for.
        num_examples : torch.Tensor
            ``(n,)`` the replies' example counts.
        replies : list of CheckedReply
            The n accepted replies.

        Returns
        -------
        Aggregate
            The rule's update, with weights, selection and signals per reply (``(n,)``).
        """
        if self.reads_who_sent:
            raise ValueError(f"the {self.name} rule reads who sent each row (state kept per hospital, or a reply's "
                             "metrics): it cannot take rows that stand for several hospitals (bucketing.rule-input = "
                             "'bucket-means'); use bucketing.rule-input = 'member-rows'")
        n = len(replies)
        if rows.shape[0] != len(groups) or sorted(i for g in groups for i in g) != list(range(n)):
            raise ValueError(f"{len(groups)} groups for {rows.shape[0]} rows must hold every one of the {n} replies once")
        counts = torch.stack([num_examples[list(g)].sum() for g in groups])
        handed = [CheckedReply(replies[g[0]].node_id, {}, None, int(c), {"num-examples": int(c)})
                  for g, c in zip(groups, counts.tolist())]
        agg = self.aggregate_updates(server_round, rows, counts, handed)
        row_weights, row_selected = agg.weights.detach().cpu().double(), agg.selected.detach().cpu()
        weights = torch.zeros(n, dtype=torch.float64)
        selected = torch.zeros(n, dtype=torch.bool)
        extra: dict[str, list[Any]] = {k: [None] * n for k in agg.extra}
        for row, members in enumerate(groups):
            for i in members:
                weights[i] = row_weights[row] / len(members)
                selected[i] = bool(row_selected[row])
                for k, v in agg.extra.items():
                    extra[k][i] = v[row]
        return Aggregate(agg.update, weights, selected, extra)

    # ---- what the loop and the features ask of a rule -----------------------------------------
    def use_equal_weights(self) -> None:
        """Weigh every accepted reply equally from now on: central DP's noise is calibrated for the
        equal-weight mean of the clipped updates. Only a ``central_dp_compatible`` rule can.
        """
        raise NotImplementedError(f"the {self.name} rule cannot weigh every reply equally (central_dp_compatible is "
                                  "False)")

    def receive_scores(self, totals: Mapping[str, Mapping[str, float]]) -> None:
        """The contribution ledger's accumulated scores after a scored round; a rule that weighs
        hospitals by them keeps them (``contribution``), the others ignore them.

        Parameters
        ----------
        totals : Mapping[str, Mapping[str, float]]
            Hospital name -> score name (``fp``, ``ee``, ...) -> its total over the rounds scored so far.
        """

    # ---- what a rule implements ----------------------------------------------------------
    def required_replies(self) -> int:
        """Fewest valid replies the rule is defined for (e.g. Krum: 2f + 3)."""
        return 1

    def aggregate_updates(
        self,
        server_round: int,
        updates: torch.Tensor,
        num_examples: torch.Tensor,
        replies: list[CheckedReply],
    ) -> Aggregate:
        """Combine the accepted ``(n, d)`` updates into one ``(d,)`` update."""
        raise NotImplementedError

    # ---- helpers ---------------------------------------------------------------------------
    def _in_hospital_order(self, replies: Iterable[Message]) -> list[Message]:
        """Replies sorted by hospital name (then node id): arrival order must not change a result."""
        def key(reply: Message) -> tuple[str, int]:
            node_id = int(reply.metadata.src_node_id)
            return self._name_of(node_id), node_id

        return sorted(replies, key=key)

    def _name_of(self, node_id: int) -> str:
        return self.hospitals.get(node_id, f"unknown-node-{node_id}")

    def hospital_record(
        self,
        node_id: int,
        *,
        reply: CheckedReply | None = None,
        weight: float = 0.0,
        selected: bool = False,
        rejected: bool = False,
        reason: str = "",
        update_norm: float | None = None,
        signals: Mapping[str, Any] | None = None,
    ) -> HospitalRecord:
        """The record of one hospital's reply this round: the one place a strategy builds it.

        Parameters
        ----------
        node_id : int
            The node that replied.
        reply : CheckedReply, optional
            The reply, where it passed the checks (its example count and metrics are recorded).
        weight : float
            Its share in the aggregate.
        selected : bool
            Whether its update took part.
        rejected : bool
            Whether the reply was rejected (``reason`` says why).
        reason : str
            Why it was rejected.
        update_norm : float, optional
            L2 norm of its update as the rule saw it.
        signals : Mapping, optional
            The rule's per-hospital signals (an :class:`Aggregate`'s ``extra`` for this reply): ``trust``
            and ``flagged`` go to the record's own fields, the rest under the rule's name; the value of the
            rule's :attr:`trust_signal` is also the record's ``trust``.

        Returns
        -------
        HospitalRecord
            The record.
        """
        record = HospitalRecord.from_reply(
            self._name_of(node_id), node_id, reply.num_examples if reply is not None else 0,
            reply.metrics if reply is not None else None, weight=weight, selected=selected, rejected=rejected,
            reason=reason, update_norm=update_norm)
        values = dict(signals or {})
        trust, flagged = values.pop("trust", None), values.pop("flagged", None)
        if self.trust_signal is not None and self.trust_signal != "trust":  # it stays among the signals too
            trust = mean_of_signal(values.get(self.trust_signal))
        if trust is not None:
            record.trust = float(trust)
        if flagged is not None:
            record.flagged = bool(flagged)
        if values:
            record.add_signals(self.signal_source, values)
        return record

    @property
    def signal_source(self) -> str:
        """The name the rule's signals are recorded under in each :class:`HospitalRecord`."""
        return self.name or type(self).__name__

    def _integer_buffers(self, accepted: list[CheckedReply], selected: torch.Tensor) -> dict[str, torch.Tensor]:
        """Non-float tensors (BatchNorm counters) are copied, never averaged: the largest among
        the selected replies, so a counter only moves forward.
        """
        assert self.global_state is not None
        template = dict(self.global_state)
        chosen = [r for r, s in zip(accepted, selected.tolist()) if s] or accepted
        for name, ref in self.global_state.items():
            if not ref.is_floating_point():
                template[name] = torch.stack([r.state[name] for r in chosen]).amax(dim=0)
        return template

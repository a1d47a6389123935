"""FED-FBD (Chen & McMillan 2026): block ownership with direct replacement.

The strategy's state is the warehouse (``hospitrust.fbd.warehouse``), not one global
model. Each round, every hospital the schedule names gets only its colors' blocks (the
color it writes and a sibling color to distill from) in a ``train.fbd`` message; its reply
replaces those blocks outright, block by block, where the shipping plan lets that hospital
write them. Every other write (a color it does not own, a color it was not scheduled to
write this round, an incomplete block, a bad tensor) is rejected and recorded, in
``rounds.jsonl`` and in the stamp log. Nothing is averaged.

``aggregate_round`` returns a result without arrays: the new state is ``self.warehouse``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from pydantic import Field, model_validator

from hospitrust import metrics
from hospitrust.datasets.server import ServerSets
from hospitrust.contribution.options import ContributionScoringOptions
from hospitrust.fbd.blocks import blocks_for
from hospitrust.fbd.plan import ShippingPlan, make_plan, parse_plan
from hospitrust.fbd.routing import (
    ROUTING_MODES, color_losses, color_probabilities, flagged_colors, loss_zscores, parse_color_list, route,
)
from hospitrust.options import Options
from hospitrust.options import Options as OptionsModel
from hospitrust.fbd.stamps import STAMP_LOG, StampLog
from hospitrust.fbd.warehouse import Warehouse, parse_color_key
from hospitrust.records import RoundRecord
from hospitrust.strategies import intake
from hospitrust.strategies.base import HospitrustStrategy, RoundResult, UpdateStep
from hospitrust.strategies.validation import CheckedReply, RejectedReply, shorten, negative_running_var


class FBDOptions(Options):
    """FED-FBD's options: the warehouse, the plan, distillation, routing and detection."""

    colors: int = Field(6, ge=1, le=64, description=(
        "Colors in the warehouse (complete models, each from one version of every block)."
    ))
    redundancy: int = Field(3, ge=1, description=(
        "Writers per color; a generated plan needs colors x redundancy to be a multiple of the hospitals."
    ))
    plan: str = Field("", description=(
        "The shipping plan: '' generates one (seeded); 'hospital-0:0,1,2; hospital-1:3,4,5' (a bare index i "
        "means hospital-i) or a plan .json path."
    ))
    distill_weight: float = Field(0.1, ge=0.0, le=100.0, description=(
        "lambda, the weight of the KL term to the sibling color's predictions in local training (0: plain "
        "cross-entropy)."
    ))
    routing: Literal["ensemble", "max-confidence"] = Field("ensemble", description=(
        "Inference routing: ensemble (the mean of the colors' predictions) or max-confidence (per sample, the"
        " most confident color)."
    ))
    exclude_colors: str = Field("", description="Colors left out of routing, e.g. '1,4'.")
    detect_z: float = Field(1.5, gt=0.0, description=(
        "Detection: a color whose reference-cohort loss z-score exceeds this is flagged."
    ))
    exclude_flagged: bool = Field(False, description="Leave flagged colors out of routing.")

    @model_validator(mode="after")
    def _colors(self) -> "FBDOptions":
        excluded = parse_color_list(self.exclude_colors, self.colors)  # raises ValueError naming the bad color
        if len(excluded) >= self.colors:
            raise ValueError(f"fbd.exclude-colors leaves none of the {self.colors} colors for routing")
        return self


PLAN_FILE = "fbd_plan.json"
WAREHOUSE_FILE = "warehouse.pt"


def plan_from_options(options: FBDOptions, hospitals: Sequence[str], seed: int) -> ShippingPlan:
    """The run's shipping plan: ``fbd.plan`` when given, else a generated one (:func:`make_plan`).

    Parameters
    ----------
    options : FBDOptions
        The run's ``fbd`` section.
    hospitals : Sequence[str]
        The hospitals that answered the query round, in schedule order.
    seed : int
        The run's seed.

    Returns
    -------
    ShippingPlan
        The validated plan.
    """
    if options.plan.strip():
        return parse_plan(options.plan, list(hospitals), options.colors, options.redundancy, seed)
    return make_plan(list(hospitals), options.colors, options.redundancy, seed)


class WarehouseEvaluator:
    """Every color on the test split and the reference cohort; routing; detection.

    Parameters
    ----------
    options : FBDOptions
        The run's ``fbd`` section (routing and detection).
    num_classes : int
        The task's classes.
    device : torch.device
        Where the colors' models run.
    sets : ServerSets
        The server's test set and reference cohort (both required).
    """

    def __init__(self, options: FBDOptions, num_classes: int, device: Any, sets: ServerSets) -> None:
        self.options, self.num_classes, self.device = options, num_classes, device
        assert sets.test is not None and sets.cohort is not None  # FBD.check_run_config requires both
        self.test, self.cohort = sets.test, sets.cohort
        self.named_exclusions = parse_color_list(options.exclude_colors, options.colors)

    def __call__(self, warehouse: Warehouse) -> tuple[dict[str, Any], dict[str, Any]]:
        k, opts = self.num_classes, self.options
        probs = color_probabilities(warehouse, self.test.images, device=self.device)
        ref_probs = color_probabilities(warehouse, self.cohort.images, device=self.device)
        # a color that predicts NaN / Inf (a state no check caught) is broken: uniform
        # predictions for its own metrics, infinite reference loss, always left out of routing
        broken = [m for m in range(warehouse.num_colors)
                  if not (np.isfinite(probs[m]).all() and np.isfinite(ref_probs[m]).all())]
        for m in broken:
            probs[m], ref_probs[m] = 1.0 / k, 1.0 / k
        losses = color_losses(ref_probs, self.cohort.labels)
        losses[broken] = np.inf
        finite = np.isfinite(losses)
        z = np.full_like(losses, np.inf)
        z[finite] = loss_zscores(losses[finite])
        finite_idx = np.flatnonzero(finite)
        flagged = sorted({int(finite_idx[i]) for i in flagged_colors(z[finite], opts.detect_z)} | set(broken))
        exclude = sorted(set(self.named_exclusions) | (set(flagged) if opts.exclude_flagged else set()))
        if len(exclude) >= warehouse.num_colors:
            exclude = sorted(self.named_exclusions)  # never exclude everything: fall back to the named ones
        exclude = sorted(set(exclude) | set(broken)) if len(broken) < warehouse.num_colors else exclude
        colors = {}
        for m in range(warehouse.num_colors):
            rep = metrics.classification_report(self.test.labels, probs[m], k)
            colors[str(m)] = {"accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"],
                              "reference_loss": float(losses[m]) if finite[m] else None,
                              "z": float(z[m]) if finite[m] else None, "flagged": m in flagged, "broken": m in broken}
        routing = {}
        for mode in ROUTING_MODES:
            for label, ex in ((mode, ()), (f"{mode}-without-excluded", exclude)):
                if label.endswith("excluded") and not ex:
                    continue
                rep = metrics.classification_report(self.test.labels, route(probs, mode, ex), k)
                routing[label] = {"accuracy": rep["accuracy"], "balanced_accuracy": rep["balanced_accuracy"], "auc": rep["auc"]}
        central = metrics.classification_report(self.test.labels, route(probs, opts.routing, exclude), k)
        return central, {"colors": colors, "flagged_colors": flagged, "excluded_colors": exclude, "broken_colors": broken,
                         "routing_mode": opts.routing, "routing": routing}


class FBD(HospitrustStrategy):
    """Block ownership: per-hospital shipping, permission-checked direct replacement.

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    plan : ShippingPlan
        Which hospital may write which colors (required; its colors match the warehouse's).
    warehouse : Warehouse
        The colors' current blocks (required).
    stamp_log : StampLog or None
        Where every write and rejected write is logged; None: not logged.
    evaluator : WarehouseEvaluator or None
        The colors' central evaluation (:meth:`own_evaluation`); None: the rule cannot evaluate.
    warehouse_path : Path or None
        Where :meth:`own_evaluation` saves the warehouse each round; None: not saved.
    **common
        The base's other keyword arguments; ``seed`` also seeds the sibling draw.
    """

    name = "fbd"
    Options = FBDOptions
    options: FBDOptions
    #: the hospitals' writes replace blocks: no stack of whole-model updates (no pre-aggregation)
    stacks_updates: ClassVar[bool] = False
    #: the hospitals train block pairs with their own loss: no local DP-SGD
    local_dp_compatible: ClassVar[bool] = False
    #: the state is a warehouse of colors, evaluated through routing (:meth:`own_evaluation`)
    runs_own_evaluation: ClassVar[bool] = True
    capability_notes: ClassVar[Mapping[str, str]] = {
        **dict.fromkeys(("local_dp_compatible", "central_dp_compatible"), (
            "FED-FBD trains and sends blocks of a warehouse of models, which neither Opacus's accountant nor Flower's "
            "DP wrappers account for; use another rule or privacy.mode 'off'")),
        "stacks_updates": "FED-FBD's replies write blocks of a warehouse of models; there is no stack of whole-model "
                          "updates to mix or clip",
    }

    @classmethod
    def server_parts(cls, options: OptionsModel, *, task: Any, sets: Any, device: torch.device,
                     hospitals: Sequence[str], seed: int, run_dir: Any, resuming: bool) -> dict[str, Any]:
        """The plan (saved as ``fbd_plan.json``), the initial warehouse, the stamp log and the evaluator.

        Parameters
        ----------
        options : Options
            The run's ``fbd`` section.
        task : Task
            The run's task (its model, channels, classes, image size).
        sets : ServerSets
            The server's test set and reference cohort.
        device : torch.device
            Where the colors are evaluated.
        hospitals : Sequence[str]
            The hospitals' names in the query rows' order (partition, then name): the schedule's order.
        seed : int
            The run's seed (the plan, the colors' initialization, the sibling draw).
        run_dir : pathlib.Path
            The run directory.
        resuming : bool
            True on a resumed run: the stamp log has its init stamps already.

        Returns
        -------
        dict
            ``plan``, ``warehouse``, ``stamp_log``, ``evaluator`` and ``warehouse_path``.
        """
        assert isinstance(options, FBDOptions)
        run_dir = Path(run_dir)
        plan = plan_from_options(options, hospitals, seed)
        plan.save(run_dir / PLAN_FILE)
        warehouse = Warehouse.create(task.model, task.channels, task.num_classes, task.image_size, options.colors, seed)
        stamps = StampLog(run_dir / STAMP_LOG)
        if not resuming:
            stamps.extend({"event": "init", **s} for s in warehouse.init_stamps())
        return {"plan": plan, "warehouse": warehouse, "stamp_log": stamps,
                "evaluator": WarehouseEvaluator(options, task.num_classes, device, sets),
                "warehouse_path": run_dir / WAREHOUSE_FILE}

    @classmethod
    def check_run_config(cls, cfg: Any) -> None:
        blocks_for(cfg.model)  # ValueError naming the models that have a block cut
        lacking = [key for key, ok in (("server-data.test-path", cfg.server_data.has_test_set(cfg.task.custom)),
                                       ("server-data.cohort-path", cfg.server_data.has_cohort(cfg.task.custom, cfg.reference_cohort_per_class)))
                   if not ok]
        if lacking or cfg.server_data.evaluation == "federated":
            raise ValueError(f"strategy fbd evaluates, routes and screens its colors on the server's test set and "
                             f"reference cohort: set {' and '.join(lacking) or 'server-data.evaluation = auto'} (it has "
                             "no cohort-free or federated-evaluation setting)")
        if cfg.task.mean.strip() or cfg.task.std.strip() or cfg.task.augmentation.strip():
            raise ValueError("strategy fbd trains with the default normalization and no augmentation: leave task.mean, "
                             "task.std and task.augmentation empty")
        on = [key for key, value in (("secagg.enabled", cfg.options("secagg").enabled),
                                     ("contribution-scoring.enabled", cfg.section(ContributionScoringOptions).enabled)) if value]
        if on:
            raise ValueError(f"strategy fbd does not support {', '.join(on)} (its state is a warehouse of colors, "
                             "written by direct replacement); turn them off")
        if cfg.train.fedrs_alpha < 1.0:
            raise ValueError(f"train.fedrs-alpha {cfg.train.fedrs_alpha} is not used by strategy fbd (its hospitals "
                             "train block pairs with their own loss); leave it at 1.0")

    def __init__(self, hospitals: Mapping[int, str], options=None, *, plan: ShippingPlan | None = None,
                 warehouse: Warehouse | None = None, stamp_log: StampLog | None = None,
                 evaluator: WarehouseEvaluator | None = None, warehouse_path: Path | None = None,
                 **common: Any) -> None:
        super().__init__(hospitals, options, **common)
        if plan is None or warehouse is None:
            raise ValueError("strategy fbd needs a shipping plan and a warehouse (FBD.server_parts builds them)")
        if plan.num_colors != warehouse.num_colors:
            raise ValueError(f"plan has {plan.num_colors} colors, warehouse {warehouse.num_colors}")
        self.plan, self.warehouse, self.stamp_log = plan.validate(), warehouse, stamp_log
        self.seed = int(common.get("seed", 0))
        self._shipped: dict[int, dict[str, Any]] = {}
        self.evaluator, self.warehouse_path = evaluator, warehouse_path

    def state_dict(self) -> dict[str, Any]:
        """The base's state and the warehouse (every color's blocks and their stamps)."""
        return {**super().state_dict(), "warehouse": copy.deepcopy(self.warehouse.to_dict())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "warehouse" not in state:
            raise ValueError("fbd: checkpoint state lacks the warehouse (saved by another strategy?)")
        super().load_state_dict(state)
        warehouse = Warehouse.from_dict(copy.deepcopy(dict(state["warehouse"])))
        if warehouse.num_colors != self.plan.num_colors:
            raise ValueError(f"fbd: checkpoint warehouse has {warehouse.num_colors} colors, the plan {self.plan.num_colors}")
        self.warehouse = warehouse

    def summary(self) -> None:
        log(INFO, "\t├── Strategy: fbd (block ownership, direct replacement)")
        log(INFO, "\t├── Colors: %d, redundancy %d, lambda %.3g, blocks %s", self.plan.num_colors, self.plan.redundancy,
            self.options.distill_weight, ", ".join(self.warehouse.block_names))
        for h in self.plan.hospitals:
            log(INFO, "\t│   %s writes colors %s", h, list(self.plan.colors_of[h]))
        log(INFO, "\t└── Reply bounds: update norm <= %g, num-examples <= %d", self.limits.max_update_norm,
            self.limits.max_num_examples)

    # ---- train --------------------------------------------------------------------------------------
    def _sibling(self, hospital: str, color: int, server_round: int) -> int:
        """A sibling with parameters different from ``color`` (identical ones teach nothing)."""
        mine = [self.warehouse.meta[(color, b)].hash for b in self.warehouse.block_names]
        others = [m for m in self.plan.colors_of.get(hospital, ()) if m != color
                  and [self.warehouse.meta[(m, b)].hash for b in self.warehouse.block_names] != mine]
        if not others:
            return -1
        pick = self.plan.sibling(hospital, color, server_round, self.seed)
        return pick if pick in others else others[0]

    def configure_train(self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.configure_round(server_round, arrays, config, grid)

    def configure_round(self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord, grid: Grid,
                        excluded: Collection[str] = ()) -> list[Message]:
        """Each scheduled, connected hospital not ``excluded`` gets its color and a sibling (``train.fbd``);
        ``arrays`` (the loop's model) is not sent: the blocks come from the warehouse.
        """
        online = set(grid.get_node_ids())
        node_of = {name: nid for nid, name in self.hospitals.items()}
        self._shipped = {}
        messages = []
        for hospital, color in self.plan.schedule(server_round).items():
            nid = node_of.get(hospital)
            if hospital in excluded:
                log(WARNING, "Round %d: %s is scheduled to write color %d but is kept out this round", server_round,
                    hospital, color)
                continue
            if nid is None or nid not in online:
                log(WARNING, "Round %d: %s is scheduled to write color %d but is not connected", server_round, hospital, color)
                continue
            sibling = self._sibling(hospital, color, server_round)
            colors = [color] + ([sibling] if sibling >= 0 else [])
            teacher = self.warehouse.color_influences(sibling) if sibling >= 0 else set()
            self._shipped[nid] = {"hospital": hospital, "color": color, "sibling": sibling, "teacher_influences": teacher}
            cfg = ConfigRecord({**self.train_config, **dict(config), "server-round": server_round, "fbd-color": color,
                                "fbd-sibling": sibling, "fbd-lambda": float(self.options.distill_weight)})
            content = RecordDict({"arrays": self.warehouse.to_arrays(colors), "config": cfg})
            messages.append(Message(content, dst_node_id=nid, message_type=f"{MessageType.TRAIN}.fbd"))
        return messages

    def _check(self, reply: Message, shipped: dict[str, Any]) -> tuple[dict, list[tuple[str, dict]], list[dict], int]:
        """(metrics, accepted (block, tensors) writes, rejected writes, num-examples) of one reply;
        RejectedReply when the reply as a whole is unusable.
        """
        hospital, color = shipped["hospital"], shipped["color"]
        if reply.has_error():
            raise RejectedReply(f"error reply: {shorten(reply.error.reason)}")
        if not reply.has_content():
            raise RejectedReply("empty reply")
        content = reply.content
        if "arrays" not in content.array_records or len(content.array_records) != 1:
            raise RejectedReply(f"expected exactly one ArrayRecord named 'arrays', got {sorted(content.array_records)}")
        if "metrics" not in content.metric_records:
            raise RejectedReply("no MetricRecord named 'metrics'")
        metrics = dict(content.metric_records["metrics"])
        n = metrics.get("num-examples")
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(float(n)) or n != int(n) or n <= 0:
            raise RejectedReply(f"'num-examples' must be a positive integer, got {n!r}")
        if n > self.limits.max_num_examples:
            raise RejectedReply(f"'num-examples' {n} exceeds the bound {self.limits.max_num_examples}")
        record = content.array_records["arrays"]
        rejected: list[dict] = []
        by_color: dict[int, dict[str, Any]] = {}
        for name in record.keys():
            parsed = parse_color_key(name)
            if parsed is None or parsed[1] not in self.warehouse.states[0] or parsed[0] >= self.warehouse.num_colors:
                rejected.append({"key": name, "reason": "not a tensor of any color of the warehouse"})
                continue
            by_color.setdefault(parsed[0], {})[parsed[1]] = name
        accepted: list[tuple[str, dict]] = []
        for m in sorted(by_color):
            names = by_color[m]
            for block in self.warehouse.block_names:
                present = [k for k in self.warehouse.block_keys[block] if k in names]
                if not present:
                    continue
                write = {"color": m, "block": block}
                if not self.plan.may_write(hospital, m):
                    rejected.append({**write, "reason": f"the plan does not let {hospital} write color {m} "
                                                        f"(its writers: {self.plan.writers(m)})"})
                    continue
                if m != color:
                    rejected.append({**write, "reason": f"{hospital} is scheduled to write color {color} this round, not {m}"})
                    continue
                missing = [k for k in self.warehouse.block_keys[block] if k not in names]
                if missing:
                    rejected.append({**write, "reason": f"incomplete block: missing {missing[:3]}"})
                    continue
                try:
                    tensors = {k: torch.from_numpy(record[names[k]].numpy().copy()) for k in present}
                except Exception as exc:  # undecodable bytes
                    rejected.append({**write, "reason": f"arrays cannot be decoded: {type(exc).__name__}"})
                    continue
                problem = self._tensor_problem(m, tensors)
                if problem:
                    rejected.append({**write, "reason": problem})
                    continue
                accepted.append((block, tensors))
        if accepted:
            current = self.warehouse.states[color]
            sq = sum(float(((t.double() - current[k].double()) ** 2).sum())
                     for _, ts in accepted for k, t in ts.items() if t.is_floating_point())
            norm = math.sqrt(sq)
            if norm > self.limits.max_update_norm:
                rejected.extend({"color": color, "block": b, "reason": f"update norm {norm:.4g} exceeds the bound "
                                 f"{self.limits.max_update_norm:g} (max-update-norm)"} for b, _ in accepted)
                accepted = []
        return metrics, accepted, rejected, int(n)

    def _tensor_problem(self, color: int, tensors: dict[str, torch.Tensor]) -> str:
        for k, t in tensors.items():
            ref = self.warehouse.states[color][k]
            if tuple(t.shape) != tuple(ref.shape):
                return f"array {k!r} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
            if t.dtype != ref.dtype:
                return f"array {k!r} has dtype {t.dtype}, expected {ref.dtype}"
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"array {k!r} contains NaN or Inf"
            if negative_running_var(k, t):
                return f"array {k!r} (a BatchNorm variance) has negative entries"
        return ""

    def aggregate_round(self, server_round: int, replies: Iterable[Message],
                        update_steps: Sequence[UpdateStep] = (), *, equal_weights: bool = False,
                        round_bound: bool = True) -> RoundResult:
        """Write the accepted blocks into the warehouse; the result's ``arrays`` is None (the new state
        is the warehouse). ``update_steps`` take a stack of whole-model updates, which FED-FBD has not.
        """
        if update_steps:
            raise ValueError("fbd: update steps (pre-aggregation, a colluding adversary) need whole-model updates")
        if equal_weights:
            raise ValueError("fbd: blocks have no weighted mean to make equal (central_dp_compatible is False)")
        started = time.perf_counter()
        record = RoundResult()
        stamps: list[dict] = []
        writes = 0
        for reply in intake.in_hospital_order(self, replies):  # stamps and writes in a fixed order
            nid = int(reply.metadata.src_node_id)
            if nid not in self.hospitals and reply.has_error():
                log(WARNING, "Round %d: no reply from a hospital: %s", server_round, (reply.error.reason or "").strip()[:200])
                continue
            shipped = self._shipped.get(nid)
            signals: dict[str, Any] = {"color": -1, "sibling": -1, "accepted_blocks": [], "rejected_writes": []}
            try:
                if shipped is None:
                    raise RejectedReply("this hospital was not asked to train this round")
                signals.update(color=shipped["color"], sibling=shipped["sibling"])
                metrics, accepted, rejected, n = self._check(reply, shipped)
            except RejectedReply as rej:
                record.clients.append(intake.hospital_record(self, nid, rejected=True, reason=rej.reason, signals=signals))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self.hospital_name(nid), rej.reason)
                continue
            except Exception as exc:  # a check failed on odd input: still the hospital's fault
                reason = f"unreadable reply: {type(exc).__name__}: {shorten(exc)}"
                record.clients.append(intake.hospital_record(self, nid, rejected=True, reason=reason, signals=signals))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self.hospital_name(nid), reason)
                continue
            hospital, color = shipped["hospital"], shipped["color"]
            # training couples the blocks of a color: each new version carries every block's history
            influences = self.warehouse.color_influences(color) | {hospital} | set(shipped["teacher_influences"])
            for block, tensors in accepted:
                old = self.warehouse.meta[(color, block)]
                stamp = self.warehouse.write_block(color, block, tensors, writer=hospital, server_round=server_round,
                                                   trail=old.trail + [hospital], influences=influences)
                stamps.append({"event": "write", **stamp})
                writes += 1
            for bad in rejected:
                stamps.append({"event": "rejected", "round": server_round, "writer": hospital, **bad})
                log(WARNING, "Round %d: rejected write by %s: %s", server_round, hospital, bad["reason"])
            # what the record keeps of a reply: its example count and metrics
            checked = CheckedReply(node_id=nid, state={}, update=None, num_examples=n, metrics=metrics)
            record.clients.append(intake.hospital_record(self,
                nid, reply=checked, weight=1.0 if accepted else 0.0, selected=bool(accepted),
                rejected=not accepted, reason="" if accepted else "no block write accepted (see rejected_writes)",
                signals={**signals, "accepted_blocks": [b for b, _ in accepted], "rejected_writes": rejected}))
        if self.stamp_log is not None:
            self.stamp_log.extend(stamps)
        record.aggregation_seconds = time.perf_counter() - started
        if not writes:
            record.kept_previous_model = True
            record.note = "no block was written this round"
        record.metrics = MetricRecord({"blocks-written": writes, "valid-replies": sum(1 for c in record.clients if c.selected)})
        return record

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: the warehouse is evaluated centrally (routing, per color)."""
        return []

    def own_evaluation(self, server_round: int, result: RoundResult) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every color and every routing mode on the test split, detection on the reference cohort; the
        warehouse saved first (``warehouse.pt``). The record's ``fbd`` entry: schedule, per-color metrics,
        z-scores, flagged colors, routing, rejected writes.

        Parameters
        ----------
        server_round : int
            The round just aggregated.
        result : RoundResult
            Its result (the hospitals' entries, with their rejected writes).

        Returns
        -------
        tuple[dict, dict]
            (the routed central report, ``{"fbd": ...}``).
        """
        if self.evaluator is None:
            raise RuntimeError("fbd: no evaluator (FBD.server_parts builds one)")
        if self.warehouse_path is not None:
            self.warehouse.save(self.warehouse_path)
        central, fbd = self.evaluator(self.warehouse)
        fbd["schedule"] = dict(self.plan.schedule(server_round).items())
        mine = [c.signals.get(self.name, {}) for c in result.clients]  # what FBD recorded per hospital, under its name
        fbd["rejected_writes"] = sum(len(s.get("rejected_writes", [])) for s in mine)
        log(INFO, "round %3d fbd: %s auc %.4f  writes %d  rejected writes %d  flagged colors %s", server_round,
            self.options.routing, central["auc"], sum(len(s.get("accepted_blocks", [])) for s in mine),
            fbd["rejected_writes"], fbd["flagged_colors"])
        return central, {"fbd": fbd}

    def final_model(self, arrays: ArrayRecord) -> dict[str, torch.Tensor] | None:
        """None: the final state is the warehouse (``warehouse.pt``), not one model."""
        return None

    def run_summary(self, history: Sequence[RoundRecord], truth: Mapping[str, bool]) -> dict[str, Any]:
        """The colors a malicious hospital reached, the clean ones, the final routing.

        Parameters
        ----------
        history : Sequence[RoundRecord]
            The run's round records (each with its ``fbd`` entry).
        truth : Mapping[str, bool]
            Which hospitals attack.

        Returns
        -------
        dict
            ``malicious_hospitals`` and the ``fbd`` section.
        """
        malicious = sorted(h for h, bad in truth.items() if bad)
        reached = {h: sorted({m for m, _ in self.warehouse.reached_by(h)}) for h in malicious}
        tainted = sorted(set().union(*reached.values())) if reached else []
        clean = [m for m in range(self.warehouse.num_colors) if m not in tainted]
        log(INFO, "hospitrust: fbd routed (%s); clean colors %s", self.options.routing, clean)
        return {
            "malicious_hospitals": malicious,
            "fbd": {
                "plan": self.plan.to_json(),
                "colors_reached_by_malicious": tainted,
                "clean_colors": clean,
                "final_colors": history[-1].entries["fbd"]["colors"],
                "final_routing": history[-1].entries["fbd"]["routing"],
                "block_hashes": self.warehouse.hashes(),
                "rejected_writes": sum(r.entries["fbd"]["rejected_writes"] for r in history),
            },
        }

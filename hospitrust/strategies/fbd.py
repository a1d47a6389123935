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

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any, Literal

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from pydantic import Field, model_validator

from hospitrust.fbd.blocks import blocks_for
from hospitrust.fbd.plan import ShippingPlan
from hospitrust.fbd.routing import parse_color_list
from hospitrust.options import Options
from hospitrust.fbd.stamps import StampLog
from hospitrust.fbd.warehouse import Warehouse, parse_color_key
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


class FBD(HospitrustStrategy):
    """Block ownership: per-hospital shipping, permission-checked direct replacement.

    Parameters
    ----------
    hospitals : Mapping[int, str]
        Node id -> hospital name (from the query round).
    options : Options or Mapping, optional
        The rule's options (an instance of its ``Options``, or a mapping of field names); its
        defaults when None.
    plan : ShippingPlan
        Which hospital may write which colors (required; its colors match the warehouse's).
    warehouse : Warehouse
        The colors' current blocks (required).
    stamp_log : StampLog or None
        Where every write and rejected write is logged; None: not logged.
    **common
        The base's keyword arguments (:class:`~hospitrust.strategies.base.HospitrustStrategy`:
        train_config, fraction_train, min_hospitals, limits, seed, device); ``seed`` also seeds
        the sibling draw.
    """

    name = "fbd"
    Options = FBDOptions
    options: FBDOptions

    @classmethod
    def check_run_config(cls, cfg: Any) -> None:
        blocks_for(cfg.model)  # ValueError naming the models that have a block cut
        lacking = [key for key, ok in (("server-data.test-path", cfg.server_data.has_test_set(cfg.task.custom)),
                                       ("server-data.cohort-path", cfg.server_data.has_cohort(cfg.task.custom)))
                   if not ok]
        if lacking or cfg.server_data.evaluation == "federated":
            raise ValueError(f"strategy fbd evaluates, routes and screens its colors on the server's test set and "
                             f"reference cohort: set {' and '.join(lacking) or 'server-data.evaluation = auto'} (it has "
                             "no cohort-free or federated-evaluation setting)")
        if cfg.task.mean.strip() or cfg.task.std.strip() or cfg.task.augmentation.strip():
            raise ValueError("strategy fbd trains with the default normalization and no augmentation: leave task.mean, "
                             "task.std and task.augmentation empty")
        on = [key for key, value in (("resume-from", bool(cfg.resume_from)), ("secagg.enabled", cfg.secagg.enabled),
                                     ("contribution-scoring.enabled", cfg.contribution_scoring.enabled)) if value]
        if on:
            raise ValueError(f"strategy fbd does not support {', '.join(on)} (its state is a warehouse of colors, "
                             "written by direct replacement); turn them off")
        if cfg.train.fedrs_alpha < 1.0:
            raise ValueError(f"train.fedrs-alpha {cfg.train.fedrs_alpha} is not used by strategy fbd (its hospitals "
                             "train block pairs with their own loss); leave it at 1.0")

    def __init__(self, hospitals: Mapping[int, str], options=None, *, plan: ShippingPlan | None = None,
                 warehouse: Warehouse | None = None, stamp_log: StampLog | None = None,
                 **common: Any) -> None:
        super().__init__(hospitals, options, **common)
        if plan is None or warehouse is None:
            raise ValueError("strategy fbd needs a shipping plan and a warehouse (run it through hospitrust.server_app.fbd)")
        if plan.num_colors != warehouse.num_colors:
            raise ValueError(f"plan has {plan.num_colors} colors, warehouse {warehouse.num_colors}")
        self.plan, self.warehouse, self.stamp_log = plan.validate(), warehouse, stamp_log
        self.seed = int(common.get("seed", 0))
        self._shipped: dict[int, dict[str, Any]] = {}

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
        online = set(grid.get_node_ids())
        node_of = {name: nid for nid, name in self.hospitals.items()}
        self._shipped = {}
        messages = []
        for hospital, color in self.plan.schedule(server_round).items():
            nid = node_of.get(hospital)
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
                        update_steps: Sequence[UpdateStep] = ()) -> RoundResult:
        """Write the accepted blocks into the warehouse; the result's ``arrays`` is None (the new state
        is the warehouse). ``update_steps`` take a stack of whole-model updates, which FED-FBD has not.
        """
        if update_steps:
            raise ValueError("fbd: update steps (pre-aggregation, a colluding adversary) need whole-model updates")
        started = time.perf_counter()
        record = RoundResult()
        stamps: list[dict] = []
        writes = 0
        for reply in self._in_hospital_order(replies):  # stamps and writes in a fixed order
            nid = int(reply.metadata.src_node_id)
            if nid not in self.hospitals and reply.has_error():
                log(WARNING, "Round %d: no reply from a hospital: %s", server_round, (reply.error.reason or "").strip()[:200])
                continue
            shipped = self._shipped.get(nid)
            entry_extra: dict[str, Any] = {"color": -1, "sibling": -1, "accepted_blocks": [], "rejected_writes": []}
            try:
                if shipped is None:
                    raise RejectedReply("this hospital was not asked to train this round")
                entry_extra.update(color=shipped["color"], sibling=shipped["sibling"])
                metrics, accepted, rejected, n = self._check(reply, shipped)
            except RejectedReply as rej:
                record.clients.append(self._client_entry(nid, rejected=True, reason=rej.reason, **entry_extra))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self._name_of(nid), rej.reason)
                continue
            except Exception as exc:  # a check failed on odd input: still the hospital's fault
                reason = f"unreadable reply: {type(exc).__name__}: {shorten(exc)}"
                record.clients.append(self._client_entry(nid, rejected=True, reason=reason, **entry_extra))
                log(WARNING, "Round %d: rejected %s: %s", server_round, self._name_of(nid), reason)
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
            # what the entry records of a reply: its example count and metrics
            checked = CheckedReply(node_id=nid, state={}, update=None, num_examples=n, metrics=metrics)
            record.clients.append(self._client_entry(
                nid, reply=checked, weight=1.0 if accepted else 0.0, selected=bool(accepted),
                rejected=not accepted, reason="" if accepted else "no block write accepted (see rejected_writes)",
                **{**entry_extra, "accepted_blocks": [b for b, _ in accepted], "rejected_writes": rejected}))
        if self.stamp_log is not None:
            self.stamp_log.extend(stamps)
        record.aggregation_seconds = time.perf_counter() - started
        if not writes:
            record.kept_previous_model = True
            record.note = "no block was written this round"
        record.metrics = MetricRecord({"blocks-written": writes, "valid-replies": sum(1 for c in record.clients if c["selected"])})
        return record

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: the warehouse is evaluated centrally (routing, per color)."""
        return []

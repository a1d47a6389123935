"""A hospital's setup for one message: the validated run and node config, the task, its data."""

from __future__ import annotations

import functools
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from hospitrust import metrics
from hospitrust.config import NodeConfig, RunConfig, memoised_node_config, memoised_run_config
from hospitrust.datasets.federation import HospitalData, LabelledImages, simulated_hospital
from hospitrust.datasets.local import HospitalDataError, RowView, data_card, load_local, split_local
from hospitrust.errors import HospitalError
from hospitrust.models.training import predict_proba
from hospitrust.privacy.ledger import content_hash
from hospitrust.tasks.model import task_model
from hospitrust.tasks.task import TASK_KEY, Task, resolve_task

#: Where a hospital keeps the task the server sent with the query round (``context.state``).
TASK_STATE = "hospitrust-task"
#: The node-config key where the hospital's gate (``hospitrust.ops.deploy.policy.GATE_KEY``) hands this ClientApp the
#: values it checked its site policy against; this bundle declares that it uses them ([tool.hospitrust] gate-values = 1).
GATE_KEY = "hospitrust-gate"
GATE_VALUES_VERSION = 1


class GateValuesError(HospitalError, ValueError):
    """The hospital's gate handed values this ClientApp cannot use, or its data no longer fits them."""


def gate_values(node_config: dict[str, Any]) -> dict[str, Any] | None:
    """The values the hospital's gate resolved for this message (None: no gate runs at this hospital)."""
    text = node_config.get(GATE_KEY)
    if text is None:
        return None
    try:
        values = json.loads(str(text))
    except ValueError:
        raise GateValuesError("the hospital's gate values are not valid JSON") from None
    if not isinstance(values, dict) or values.get("version") != GATE_VALUES_VERSION:
        raise GateValuesError(f"the hospital's gate values are not version {GATE_VALUES_VERSION}, the one this ClientApp uses")
    return values


@dataclass(frozen=True)
class HospitalContext:
    """What every handler needs: the run config, this node's config, the task, its data and data card."""

    cfg: RunConfig
    node: NodeConfig
    task: Task
    data: HospitalData
    card: dict[str, Any] = field(default_factory=dict, compare=False)
    #: what the hospital's gate checked its site policy against (:func:`gate_values`); None without a gate
    agreed: dict[str, Any] | None = field(default=None, compare=False)

    def _agreed_int(self, key: str) -> int:
        value = cast(dict, self.agreed).get(key)
        if not isinstance(value, int):
            raise GateValuesError(f"the hospital's gate resolved no {key.replace('_', '-')} for this message")
        return value

    def local_epochs(self, server_cfg: ConfigRecord) -> int:
        """The local epochs: the gate's, else the message's, else the run config's."""
        if self.agreed is not None:
            return self._agreed_int("local_epochs")
        return int(cast(int, server_cfg.get("local-epochs", self.cfg.local_epochs)))

    def batch_size(self, server_cfg: ConfigRecord) -> int:
        """The batch size: the gate's, else the message's, else the run config's."""
        if self.agreed is not None:
            return self._agreed_int("batch_size")
        return int(cast(int, server_cfg.get("batch-size", self.cfg.batch_size)))

    def check_train_images(self, count: int) -> None:
        """Refuse to train on more images per epoch than the gate counted (the data grew after its data check)."""
        limit = None if self.agreed is None else self.agreed.get("images_per_epoch")
        if isinstance(limit, int) and count > limit:
            raise GateValuesError(f"hospital '{self.node.hospital_name}' cannot train: {count} training images, more than "
                                  f"the {limit} its gate checked the site policy against (restart it with its data check)")

    @property
    def info(self) -> Task:
        """The task (classes, channels), under the name the handlers used for the dataset's description."""
        return self.task

    def model_from(self, msg: Message) -> torch.nn.Module:
        """The task's model, loaded with the message's arrays."""
        model = task_model(self.task)
        model.load_state_dict(cast(ArrayRecord, msg.content["arrays"]).to_torch_state_dict(), strict=True)
        return model

    def new_model(self) -> torch.nn.Module:
        return task_model(self.task)


@functools.lru_cache(maxsize=4)
def load_hospital(cfg: RunConfig, node: NodeConfig, task: Task) -> tuple[HospitalData, dict[str, Any]]:
    """The local data of this node, and its data card: its own images (``data-path``: decoded once
    into the cache) or its simulated share.
    """
    if node.data_path:
        try:
            data = load_local(node.data_path, node.data_format, task, node.cache_dir,
                              skip_unreadable=node.skip_unreadable)
            # the local split is seeded by the hospital's name, so it is stable across messages
            name_seed = zlib.crc32(node.hospital_name.encode())
            train_idx, val_idx = split_local(data, cfg.val_fraction, seed=cfg.seed * 1000 + name_seed)
        except HospitalDataError as exc:  # the server records the public reason; the round goes on without it
            cannot = f"hospital '{node.hospital_name}' cannot join: "
            raise HospitalDataError(cannot + exc.public, cannot + exc.detail) from None
        card = data_card(data, train_idx, val_idx, task.num_classes)
        # the key of its privacy ledger (on this machine only; the query round does not send it)
        card["content-hash"] = content_hash(data.images, data.labels, data.digests)
        hospital = HospitalData(
            node.hospital_name,
            LabelledImages(cast(np.ndarray, RowView(data.images, train_idx)), data.labels[train_idx]),
            LabelledImages(cast(np.ndarray, RowView(data.images, val_idx)), data.labels[val_idx]),
        )
        return hospital, card
    # no data-path: NodeConfig's validator requires partition-id and num-partitions
    if not task.dataset:
        raise HospitalDataError(f"hospital '{node.hospital_name}' cannot join: task {task.name} is the consortium's own "
                                "(no dataset to simulate hospitals from); set data-path in the node config")
    sim = simulated_hospital(cfg.federation, int(cast(int, node.partition_id)), int(cast(int, node.num_partitions)))
    if node.hospital:
        sim = HospitalData(node.hospital_name, sim.train, sim.val)
    card = {"images": len(sim.train) + len(sim.val), "format": "simulated"}
    return sim, card


def message_task(context: Context, msg: Message | None, cfg: RunConfig) -> Task:
    """The task the server sent (with the message, or earlier in this run), else resolved here from the run config."""
    text = None
    config = msg.content.config_records.get("config") if msg is not None and msg.has_content() else None
    if config is not None and TASK_KEY in config:
        text = str(config[TASK_KEY])
        context.state[TASK_STATE] = ConfigRecord({"json": text})
    elif TASK_STATE in context.state:
        text = str(cast(ConfigRecord, context.state[TASK_STATE])["json"])
    return Task.from_json(text) if text is not None else resolve_task(cfg)


def hospital_context(context: Context, msg: Message | None = None) -> HospitalContext:
    """Parse the configs (a bad value fails here, naming it) and load this hospital's data."""
    cfg = memoised_run_config(context.run_config)
    agreed = gate_values(context.node_config)
    node = memoised_node_config({k: v for k, v in context.node_config.items() if k != GATE_KEY})
    if agreed is None:
        task = message_task(context, msg, cfg)
    else:  # the task the gate checked (the message's, or the one it accepted earlier in this run), else the run config's
        task = Task.from_json(str(agreed["task"])) if agreed.get("task") else resolve_task(cfg)
    data, card = load_hospital(cfg, node, task)
    return HospitalContext(cfg, node, task, data, card, agreed)


def process_start_time() -> float:
    """When this process started (epoch seconds): a forked ClientApp's fork, a fresh one's exec."""
    import psutil

    return float(psutil.Process().create_time())


def local_report(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, num_classes: int,
                 device: torch.device) -> dict:
    """Accuracy, balanced accuracy and loss of ``model`` on a local split (NaN metrics for an empty one):
    :func:`hospitrust.metrics.local_metrics`, which needs no scikit-learn.
    """
    if labels.size == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "balanced_accuracy": float("nan")}
    probs = predict_proba(model, images, device=device)
    return metrics.local_metrics(labels, probs, num_classes)

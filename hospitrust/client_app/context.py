"""A hospital's setup for one message: the validated run and node config, the task, its data."""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message

from hospitrust import metrics
from hospitrust.config import NodeConfig, RunConfig, parse_node_config, parse_run_config
from hospitrust.datasets.base import DatasetInfo
from hospitrust.datasets.federation import HospitalData, LabelledImages, simulated_hospital
from hospitrust.datasets.image_folder import load_image_folder
from hospitrust.datasets.partitioners import split_train_val
from hospitrust.datasets.registry import dataset_info
from hospitrust.models import build_model
from hospitrust.models.training import predict_proba


@dataclass(frozen=True)
class HospitalContext:
    """What every handler needs: the run config, this node's config, the dataset's shape, its data."""

    cfg: RunConfig
    node: NodeConfig
    info: DatasetInfo
    data: HospitalData

    def model_from(self, msg: Message) -> torch.nn.Module:
        """The model architecture of the run, loaded with the message's arrays."""
        model = build_model(self.cfg.model, self.info.in_channels, self.info.num_classes, self.cfg.image_size)
        model.load_state_dict(cast(ArrayRecord, msg.content["arrays"]).to_torch_state_dict(), strict=True)
        return model

    def new_model(self) -> torch.nn.Module:
        return build_model(self.cfg.model, self.info.in_channels, self.info.num_classes, self.cfg.image_size)


@functools.lru_cache(maxsize=4)
def load_hospital(cfg: RunConfig, node: NodeConfig) -> HospitalData:
    """The local data of this node: its own image folders (``data-path``) or its simulated share."""
    if node.data_path:
        info = dataset_info(cfg.dataset)
        images, labels = load_image_folder(node.data_path, info, cfg.image_size)
        # the local split is seeded by the hospital's name, so it is stable across messages
        name_seed = zlib.crc32(node.hospital_name.encode())
        train_idx, val_idx = split_train_val(np.arange(labels.size), cfg.val_fraction, seed=cfg.seed * 1000 + name_seed)
        return HospitalData(
            node.hospital_name,
            LabelledImages(images[train_idx], labels[train_idx]),
            LabelledImages(images[val_idx], labels[val_idx]),
        )
    # no data-path: NodeConfig's validator requires partition-id and num-partitions
    data = simulated_hospital(cfg.federation, int(cast(int, node.partition_id)), int(cast(int, node.num_partitions)))
    if node.hospital:
        data = HospitalData(node.hospital_name, data.train, data.val)
    return data


def hospital_context(context: Context) -> HospitalContext:
    """Parse the configs (a bad value fails here, naming it) and load this hospital's data."""
    cfg = parse_run_config(context.run_config)
    node = parse_node_config(context.node_config)
    info = dataset_info(cfg.dataset)
    return HospitalContext(cfg, node, info, load_hospital(cfg, node))


def local_report(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, num_classes: int,
                 device: torch.device) -> dict:
    """The classification report of ``model`` on a local split (NaN metrics for an empty one)."""
    if labels.size == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "balanced_accuracy": float("nan")}
    probs = predict_proba(model, images, device=device)
    return metrics.classification_report(labels, probs, num_classes)

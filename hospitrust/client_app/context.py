"""A hospital's setup for one message: the validated run and node config, the task, its data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Context, Message

from hospitrust import metrics
from hospitrust.config import NodeConfig, RunConfig, parse_node_config, parse_run_config
from hospitrust.datasets import load_hospital
from hospitrust.datasets.base import DatasetInfo
from hospitrust.datasets.registry import dataset_info
from hospitrust.datasets.federation import HospitalData
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
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
        return model

    def new_model(self) -> torch.nn.Module:
        return build_model(self.cfg.model, self.info.in_channels, self.info.num_classes, self.cfg.image_size)


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

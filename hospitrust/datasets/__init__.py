"""Data sources (MedMNIST, a hospital's own image folders), partitioners and splits."""

from __future__ import annotations

import functools
import zlib

from hospitrust.config import NodeConfig, RunConfig
from hospitrust.datasets.federation import HospitalData, LabelledImages, simulated_hospital
from hospitrust.datasets.base import DataMissingError, DatasetInfo
from hospitrust.datasets.registry import dataset_info
from hospitrust.datasets.partitioners import split_train_val


@functools.lru_cache(maxsize=4)
def load_hospital(cfg: RunConfig, node: NodeConfig) -> HospitalData:
    """This node's local data: its own image folders (``data-path``) or its simulated share."""
    if node.data_path:
        import numpy as np

        from hospitrust.datasets.image_folder import load_image_folder

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
    data = simulated_hospital(cfg, int(node.partition_id), int(node.num_partitions))
    if node.hospital:
        data = HospitalData(node.hospital_name, data.train, data.val)
    return data


__all__ = ["DataMissingError", "DatasetInfo", "HospitalData", "LabelledImages", "load_hospital"]

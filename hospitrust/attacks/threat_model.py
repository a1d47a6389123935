"""Who attacks, and how the attack reaches the model (the wiring around hospitrust.attacks).

- Malicious hospitals are a fixed set for the whole run: drawn by seed from
  ``malicious-fraction`` or named by ``malicious-hospitals`` (partition ids in
  simulation). A real SuperNode run by a red team says so with node config
  ``malicious=true``.
- A data attack poisons the malicious hospital's own training data in its ClientApp; an
  update attack rewrites its own update after training; a colluding attack is an
  omniscient simulation step on the server, between reply collection and aggregation
  (it sees the honest updates, which no real attacker would).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hospitrust.attacks.apply import attack_update_stack
from hospitrust.attacks.interfaces import Attack, ColludingAttack, DataAttack, UpdateAttack
from hospitrust.attacks.registry import build_attack
from hospitrust.attacks.selection import malicious_set


def configured_attack(cfg: Any) -> Attack | None:
    """The run's attack with its schedule, or None (``cfg``: a ``hospitrust.config.RunConfig``).

    Parameters
    ----------
    cfg : RunConfig
        The validated run config.

    Returns
    -------
    Attack or None
        The attack (None when ``attack = "none"``).
    """
    return build_attack(cfg.attack, cfg.attack_sections()) if cfg.attack_enabled else None


def malicious_partitions(cfg: Any, num_partitions: int) -> frozenset[int]:
    """The malicious partition ids of a simulated run (empty when no attack is configured).

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (``malicious-fraction``, ``malicious-hospitals``, ``seed``).
    num_partitions : int
        The number of simulated hospitals.

    Returns
    -------
    frozenset[int]
        The malicious partition ids (:func:`~hospitrust.attacks.selection.malicious_set`).
    """
    if not cfg.attack_enabled:
        return frozenset()
    return malicious_set(num_partitions, malicious_fraction=cfg.malicious_fraction,
                         malicious_hospitals=cfg.malicious_hospitals, seed=cfg.seed)


def is_malicious(cfg: Any, node: Any) -> bool:
    """Whether this hospital attacks: node config ``malicious`` when set (and an attack is configured), else
    whether its partition id is in the run's malicious set.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config.
    node : NodeConfig
        This hospital's validated node config.

    Returns
    -------
    bool
        True for an attacker.
    """
    if node.malicious is not None:
        return bool(node.malicious) and cfg.attack_enabled
    if node.partition_id is None or node.num_partitions is None:
        return False
    return int(node.partition_id) in malicious_partitions(cfg, int(node.num_partitions))


def hospital_attack(cfg: Any, node: Any) -> Attack | None:
    """The attack this hospital's ClientApp carries out itself (data or update), or None.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config.
    node : NodeConfig
        This hospital's validated node config.

    Returns
    -------
    Attack or None
        The data or update attack (None for an honest hospital or a colluding attack).
    """
    if not is_malicious(cfg, node):
        return None
    attack = configured_attack(cfg)
    return attack if isinstance(attack, (DataAttack, UpdateAttack)) else None


def ground_truth(cfg: Any, partition_of: Mapping[str, int], num_partitions: int) -> dict[str, bool]:
    """Hospital name -> malicious, for the record (simulation: from partition ids).

    Parameters
    ----------
    cfg : RunConfig
        The validated run config.
    partition_of : Mapping[str, int]
        Hospital name -> its partition id.
    num_partitions : int
        The number of simulated hospitals.

    Returns
    -------
    dict[str, bool]
        Hospital name -> whether it is malicious.
    """
    bad = malicious_partitions(cfg, num_partitions)
    return {name: pid in bad for name, pid in partition_of.items()}


class ColludingAdversary:
    """The server-side simulation step: malicious rows of the update stack are replaced by
    what the colluding attack crafts from the honest rows.

    Parameters
    ----------
    attack : ColludingAttack
        The colluding attack (possibly in a schedule).
    malicious_hospitals : set[str]
        Names of the malicious hospitals.
    seed : int
        Seeds each round's generator (with the round number).
    """

    def __init__(self, attack: ColludingAttack, malicious_hospitals: set[str], seed: int) -> None:
        self.attack, self.malicious_hospitals, self.seed = attack, set(malicious_hospitals), seed

    def __call__(self, server_round: int, updates: torch.Tensor, hospitals: list[str]) -> torch.Tensor:
        rows = [i for i, h in enumerate(hospitals) if h in self.malicious_hospitals]
        if not rows or len(rows) == len(hospitals):
            return updates
        generator = torch.Generator(device=updates.device).manual_seed(self.seed * 7919 + server_round)
        return attack_update_stack(self.attack, updates, rows, server_round=server_round, generator=generator)


def data_rng(cfg: Any, node: Any) -> np.random.Generator:
    """Fixed per hospital (not per round): a hospital's poisoned data stays the same all run.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (its ``seed``).
    node : NodeConfig
        This hospital's validated node config (its partition id; 0 if none).

    Returns
    -------
    numpy.random.Generator
        The hospital's generator for data attacks.
    """
    return np.random.default_rng([cfg.seed, int(node.partition_id or 0), 0xDA7A])

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
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from hospitrust.attacks.apply import attack_update_stack
from hospitrust.attacks.interfaces import Attack, ColludingAttack, DataAttack, UpdateAttack
from hospitrust.attacks.registry import build_attack
from hospitrust.attacks.selection import malicious_set
from hospitrust.options import Options


@dataclass(frozen=True)
class ThreatModel:
    """What the functions below need of a run config (``RunConfig.threat_model``): the attack by
    name with its sections, and what draws the malicious set.

    Parameters
    ----------
    attack : str
        The attack's registry name; "none": no attack.
    sections : Mapping[str, Options]
        The attack's sections and the attack schedule, by section name.
    malicious_fraction : float
        Share of hospitals that attack (a fixed set drawn by ``seed``).
    malicious_hospitals : str
        Comma-separated partition ids, instead of the fraction.
    seed : int
        Draws the malicious set.
    """

    attack: str  # the attack's registry name; "none": no attack
    sections: Mapping[str, Options] = field(default_factory=dict)  # the attack sections and the schedule, by name
    malicious_fraction: float = 0.0
    malicious_hospitals: str = ""  # comma-separated partition ids (instead of the fraction)
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return self.attack != "none"


class Hospital(Protocol):
    """What the functions below read of a hospital's node config (``NodeConfig``)."""

    @property
    def malicious(self) -> bool | None: ...
    @property
    def partition_id(self) -> int | None: ...
    @property
    def num_partitions(self) -> int | None: ...


def configured_attack(threat: ThreatModel) -> Attack | None:
    """The run's attack with its schedule, or None.

    Parameters
    ----------
    threat : ThreatModel
        The run's threat model.

    Returns
    -------
    Attack or None
        The attack (None when ``attack = "none"``).
    """
    return build_attack(threat.attack, dict(threat.sections)) if threat.enabled else None


def malicious_partitions(threat: ThreatModel, num_partitions: int) -> frozenset[int]:
    """The malicious partition ids of a simulated run (empty when no attack is configured).

    Parameters
    ----------
    threat : ThreatModel
        The run's threat model (``malicious-fraction``, ``malicious-hospitals``, ``seed``).
    num_partitions : int
        The number of simulated hospitals.

    Returns
    -------
    frozenset[int]
        The malicious partition ids (:func:`~hospitrust.attacks.selection.malicious_set`).
    """
    if not threat.enabled:
        return frozenset()
    return malicious_set(num_partitions, malicious_fraction=threat.malicious_fraction,
                         malicious_hospitals=threat.malicious_hospitals, seed=threat.seed)


def is_malicious(threat: ThreatModel, node: Hospital) -> bool:
    """Whether this hospital attacks: node config ``malicious`` when set (and an attack is configured), else
    whether its partition id is in the run's malicious set.

    Parameters
    ----------
    threat : ThreatModel
        The run's threat model.
    node : NodeConfig
        This hospital's validated node config.

    Returns
    -------
    bool
        True for an attacker.
    """
    if node.malicious is not None:
        return bool(node.malicious) and threat.enabled
    if node.partition_id is None or node.num_partitions is None:
        return False
    return int(node.partition_id) in malicious_partitions(threat, int(node.num_partitions))


def hospital_attack(threat: ThreatModel, node: Hospital) -> Attack | None:
    """The attack this hospital's ClientApp carries out itself (data or update), or None.

    Parameters
    ----------
    threat : ThreatModel
        The run's threat model.
    node : NodeConfig
        This hospital's validated node config.

    Returns
    -------
    Attack or None
        The data or update attack (None for an honest hospital or a colluding attack).
    """
    if not is_malicious(threat, node):
        return None
    attack = configured_attack(threat)
    if not isinstance(attack, (DataAttack, UpdateAttack)):
        return None
    inner = unwrapped(attack)
    if hasattr(inner, "for_hospital"):  # DBA: which part of the trigger this hospital stamps
        bad = sorted(malicious_partitions(threat, int(node.num_partitions))) if node.num_partitions else []
        pid = node.partition_id
        inner.for_hospital(bad.index(int(pid)) if pid is not None and int(pid) in bad else 0, max(1, len(bad)))
    return attack


def unwrapped(attack: Attack) -> Attack:
    """The attack inside its schedules (a schedule keeps the attack it gates as ``attack``).

    Parameters
    ----------
    attack : Attack
        An attack, possibly in schedules.

    Returns
    -------
    Attack
        The innermost attack.
    """
    while isinstance(getattr(attack, "attack", None), Attack):
        attack = attack.attack  # type: ignore[attr-defined]
    return attack


def ground_truth(threat: ThreatModel, partition_of: Mapping[str, int], num_partitions: int) -> dict[str, bool]:
    """Hospital name -> malicious, for the record (simulation: from partition ids).

    Parameters
    ----------
    threat : ThreatModel
        The run's threat model.
    partition_of : Mapping[str, int]
        Hospital name -> its partition id.
    num_partitions : int
        The number of simulated hospitals.

    Returns
    -------
    dict[str, bool]
        Hospital name -> whether it is malicious.
    """
    bad = malicious_partitions(threat, num_partitions)
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


def data_rng(seed: int, node: Hospital) -> np.random.Generator:
    """Fixed per hospital (not per round): a hospital's poisoned data stays the same all run.

    Parameters
    ----------
    seed : int
        The run's seed.
    node : NodeConfig
        This hospital's validated node config (its partition id; 0 if none).

    Returns
    -------
    numpy.random.Generator
        The hospital's generator for data attacks.
    """
    return np.random.default_rng([seed, int(node.partition_id or 0), 0xDA7A])

"""Attacks on trust-aware federated learning across hospitals.

* :mod:`~hospitrust.attacks.update_math` - model-poisoning rules as pure torch functions.
* :mod:`~hospitrust.attacks.data` - data poisoning / faults as pure numpy functions.
* :mod:`~hospitrust.attacks.base` - the three interfaces (DataAttack, UpdateAttack,
  ColludingAttack), schedules (OnOff, DelayedStart), concrete attacks, wiring helpers.
* :mod:`~hospitrust.attacks.settings` - the run config keys (AttackSettings) and
  :func:`malicious_set`.
* :mod:`~hospitrust.attacks.metrics` - backdoor / targeted success and detection rates.

``ATTACKS`` maps kebab-case names to factories ``AttackSettings -> attack``;
:func:`build_attack` also loads ``"package.module:ClassName"`` plugins.
"""

from hospitrust.attacks.base import (
    ALIE,
    IPM,
    Attack,
    Backdoor,
    ColludingAttack,
    Corruption,
    DataAttack,
    DelayedStart,
    FangMedian,
    FangTrimmedMean,
    FreeRider,
    NonFinite,
    GaussianNoise,
    LabelFlip,
    LabelNoise,
    Mimic,
    MinMax,
    MinSum,
    OnOff,
    Scaling,
    Schedule,
    SignFlip,
    Sybil,
    UpdateAttack,
    attack_kind,
    attack_state_dict,
    attack_update_stack,
)
from hospitrust.attacks.registry import ATTACKS, KINDS, AttackError, build_attack, load_plugin, with_schedule
from hospitrust.attacks.settings import AttackSettings, malicious_set

__all__ = [
    "ALIE",
    "ATTACKS",
    "IPM",
    "KINDS",
    "Attack",
    "AttackError",
    "AttackSettings",
    "Backdoor",
    "ColludingAttack",
    "Corruption",
    "DataAttack",
    "DelayedStart",
    "FangMedian",
    "FangTrimmedMean",
    "FreeRider",
    "NonFinite",
    "GaussianNoise",
    "LabelFlip",
    "LabelNoise",
    "Mimic",
    "MinMax",
    "MinSum",
    "OnOff",
    "Scaling",
    "Schedule",
    "SignFlip",
    "Sybil",
    "UpdateAttack",
    "attack_kind",
    "attack_state_dict",
    "attack_update_stack",
    "build_attack",
    "load_plugin",
    "malicious_set",
    "with_schedule",
]

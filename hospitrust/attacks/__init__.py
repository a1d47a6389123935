"""Attacks on trust-aware federated learning across hospitals.

* :mod:`~hospitrust.attacks.interfaces` - the three interfaces (DataAttack, UpdateAttack,
  ColludingAttack): an attack class carries its ``name``, ``kind`` and ``Options``.
* :mod:`~hospitrust.attacks.data_attacks`, :mod:`~hospitrust.attacks.update_attacks`,
  :mod:`~hospitrust.attacks.colluding` - the concrete attacks and their options.
* :mod:`~hospitrust.attacks.rule_tailored`, :mod:`~hospitrust.attacks.defence_aware`,
  :mod:`~hospitrust.attacks.backdoors` - the field's attacks (issue 34): rule-tailored, defence-aware
  (round-aware: they see the round through :class:`~hospitrust.attacks.interfaces.RoundView`),
  Neurotoxin and DBA.
* :mod:`~hospitrust.attacks.schedule` - OnOff, DelayedStart and the ``attack-schedule`` section.
* :mod:`~hospitrust.attacks.math` - the math as pure functions (``update``: torch, ``data``: numpy).
* :mod:`~hospitrust.attacks.registry` - ATTACKS, derived from the classes; ``build_attack``, plugins.
* :mod:`~hospitrust.attacks.apply` - an attack applied to the server's stack or a hospital's state.
* :mod:`~hospitrust.attacks.selection` - the fixed malicious set of a run.
* :mod:`~hospitrust.attacks.threat_model` - the wiring: who attacks, where each kind runs.
* :mod:`~hospitrust.attacks.metrics` - backdoor / targeted success and detection rates.
"""

from hospitrust.attacks.apply import attack_state_dict, attack_update_stack
from hospitrust.attacks.colluding import ALIE, IPM, FangMedian, FangTrimmedMean, Mimic, MinMax, MinSum, SameForAll, Sybil
from hospitrust.attacks.data_attacks import LABEL_FLIP_MODES, Backdoor, Corruption, LabelFlip, LabelNoise
from hospitrust.attacks.interfaces import INTERFACES, Attack, ColludingAttack, DataAttack, UpdateAttack, attack_kind
from hospitrust.attacks.registry import ATTACKS, AttackError, attack_class, build_attack, load_plugin
from hospitrust.attacks.schedule import DelayedStart, OnOff, Schedule, ScheduleOptions, with_schedule
from hospitrust.attacks.selection import malicious_set, parse_int_list
from hospitrust.attacks.update_attacks import FreeRider, GaussianNoise, NonFinite, Scaling, SignFlip

__all__ = [
    "ALIE", "ATTACKS", "Attack", "AttackError", "Backdoor", "ColludingAttack", "Corruption", "DataAttack", "DelayedStart",
    "FangMedian", "FangTrimmedMean", "FreeRider", "GaussianNoise", "INTERFACES", "IPM", "LABEL_FLIP_MODES", "LabelFlip",
    "LabelNoise", "Mimic", "MinMax", "MinSum", "NonFinite", "OnOff", "SameForAll", "Scaling", "Schedule",
    "ScheduleOptions", "SignFlip", "Sybil", "UpdateAttack", "attack_class", "attack_kind", "attack_state_dict",
    "attack_update_stack", "build_attack", "load_plugin", "malicious_set", "parse_int_list", "with_schedule",
]

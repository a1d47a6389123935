"""Attack registry: kebab-case name -> factory(AttackSettings) -> attack, plus plugins."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from hospitrust.attacks import base as B
from hospitrust.attacks.settings import AttackSettings


class AttackError(ValueError):
    """An attack name, plugin path or plugin class is wrong; the message says why."""


Factory = Callable[[AttackSettings], B.Attack]


def _sybil(s: AttackSettings) -> B.Attack:
    if s.attack_sybil_base == "mean":
        return B.Sybil("mean")
    return B.Sybil(ATTACKS[s.attack_sybil_base](s))


ATTACKS: dict[str, Factory] = {
    # data attacks (ClientApp, before training)
    "label-flip": lambda s: B.LabelFlip(s.label_flip_mode, s.attack_source, s.attack_target),
    "backdoor": lambda s: B.Backdoor(s.attack_target, s.attack_poison_fraction, s.attack_patch_size),
    "corruption": lambda s: B.Corruption(s.attack_corruption, s.attack_severity),
    "label-noise": lambda s: B.LabelNoise(s.attack_noise_rate),
    # update attacks (ClientApp, after training, own update only)
    "sign-flip": lambda s: B.SignFlip(),
    "scaling": lambda s: B.Scaling(s.attack_gamma),
    "gaussian-noise": lambda s: B.GaussianNoise(s.attack_sigma),
    "free-rider": lambda s: B.FreeRider(s.attack_free_rider_noise),
    "nan-update": lambda s: B.NonFinite(),
    # colluding attacks (server-side simulation step, sees honest updates)
    "alie": lambda s: B.ALIE(s.attack_z).with_copy_noise(s.attack_copy_noise),
    "ipm": lambda s: B.IPM(s.attack_eps).with_copy_noise(s.attack_copy_noise),
    "min-max": lambda s: B.MinMax(s.attack_perturbation).with_copy_noise(s.attack_copy_noise),
    "min-sum": lambda s: B.MinSum(s.attack_perturbation).with_copy_noise(s.attack_copy_noise),
    "fang-trimmed-mean": lambda s: B.FangTrimmedMean(),
    "fang-median": lambda s: B.FangMedian(),
    "mimic": lambda s: B.Mimic(s.attack_mimic_index),
    "sybil": _sybil,
}

#: Registry name -> "data" | "update" | "colluding" (where the attack must be wired).
KINDS: dict[str, str] = {
    "label-flip": "data",
    "backdoor": "data",
    "corruption": "data",
    "label-noise": "data",
    "sign-flip": "update",
    "scaling": "update",
    "gaussian-noise": "update",
    "free-rider": "update",
    "nan-update": "update",
    "alie": "colluding",
    "ipm": "colluding",
    "min-max": "colluding",
    "min-sum": "colluding",
    "fang-trimmed-mean": "colluding",
    "fang-median": "colluding",
    "mimic": "colluding",
    "sybil": "colluding",
}


def load_plugin(path: str, settings: AttackSettings) -> B.Attack:
    """Instantiate ``"package.module:Name"``.

    ``Name`` is a class implementing :class:`~hospitrust.attacks.base.DataAttack`,
    :class:`~hospitrust.attacks.base.UpdateAttack` or
    :class:`~hospitrust.attacks.base.ColludingAttack`, built with
    ``Name.from_settings(settings)`` when it defines that classmethod, else ``Name()``;
    or a function ``Name(settings)`` returning such an attack.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise AttackError(f"plugin attack must look like 'package.module:ClassName', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or an error raised while importing it
        raise AttackError(f"cannot import module {module_name!r} for attack plugin {path!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise AttackError(
                f"module {module_name!r} has no attribute {attr!r} (attack plugin {path!r}); it defines: {', '.join(public)}"
            )
        obj = getattr(obj, part)
    ifaces = "DataAttack, UpdateAttack or ColludingAttack (hospitrust.attacks.base)"
    if inspect.isclass(obj):
        if not issubclass(obj, B.INTERFACES):
            raise AttackError(f"plugin {path!r} is a class that implements none of {ifaces}")
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise AttackError(f"plugin {path!r} is abstract: it does not implement {missing}")
        try:
            attack = obj.from_settings(settings) if hasattr(obj, "from_settings") else obj()
        except Exception as exc:
            raise AttackError(f"cannot instantiate attack plugin {path!r}: {exc}") from exc
    elif callable(obj):
        try:
            attack = obj(settings)
        except Exception as exc:
            raise AttackError(f"attack plugin factory {path!r} failed: {exc}") from exc
        if not isinstance(attack, B.INTERFACES):
            raise AttackError(f"attack plugin factory {path!r} returned {attack!r}, which implements none of {ifaces}")
    else:
        raise AttackError(f"plugin {path!r} is {type(obj).__name__}, not a class implementing {ifaces}")
    return attack


def with_schedule(attack: B.Attack, settings: AttackSettings) -> B.Attack:
    """Wrap ``attack`` in the schedule the settings ask for: OnOff (attack-on-rounds or
    attack-period / attack-on-for), then DelayedStart (attack-start-round > 0)."""
    if settings.on_rounds:
        attack = B.OnOff(attack, rounds=settings.on_rounds)
    elif settings.attack_period > 0:
        attack = B.OnOff(attack, period=settings.attack_period, on_for=settings.attack_on_for)
    if settings.attack_start_round > 0:
        attack = B.DelayedStart(attack, start_round=settings.attack_start_round)
    return attack


def build_attack(name: str, settings: AttackSettings | Mapping[str, Any] | None = None) -> B.Attack | None:
    """Build attack ``name`` (registry name or ``"package.module:Name"`` plugin) with the
    parameters and schedule in ``settings`` (an AttackSettings, a flat run config dict,
    or None for defaults). Returns None for ``"none"``."""
    if settings is None:
        settings = AttackSettings()
    elif not isinstance(settings, AttackSettings):
        settings = AttackSettings.from_run_config(settings)
    name = str(name).strip()
    if name == "none":
        return None
    if ":" in name:
        attack = load_plugin(name, settings)
    elif name in ATTACKS:
        attack = ATTACKS[name](settings)
    else:
        raise AttackError(
            f"unknown attack {name!r}; allowed: none, {', '.join(sorted(ATTACKS))}, or 'package.module:ClassName'"
        )
    return with_schedule(attack, settings)


__all__ = ["ATTACKS", "AttackError", "KINDS", "build_attack", "load_plugin", "with_schedule"]

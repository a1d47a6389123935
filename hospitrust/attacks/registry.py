"""The attack registry, derived from the classes: every concrete attack class carries its
``name``, ``kind`` and ``Options``, and is registered by name; no list to keep in step.

``build_attack`` makes the configured attack from the run config's sections (the attack's
own, and the ``attack-schedule`` section) and also loads a user's ``"package.module:Name"``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, cast

from hospitrust.attacks.interfaces import INTERFACES, Attack, RoundAware
from hospitrust.attacks.schedule import ScheduleOptions, with_schedule
from hospitrust.options import Options

SCHEDULE_SECTION = "attack-schedule"


class AttackError(ValueError):
    """An attack name, plugin path or plugin class is wrong; the message says why."""


NOT_ATTACKS = {"apply", "interfaces", "math", "metrics", "registry", "schedule", "selection", "threat_model"}


def attack_modules() -> list[ModuleType]:
    """The modules of the attacks package that hold attacks (a new attack is a new module here)."""
    package = importlib.import_module("hospitrust.attacks")
    return [importlib.import_module(f"hospitrust.attacks.{m.name}") for m in sorted(pkgutil.iter_modules(package.__path__),
                                                                                   key=lambda m: m.name)
            if m.name not in NOT_ATTACKS and not m.name.startswith("_")]


def _registered(modules) -> dict[str, type[Attack]]:
    found: dict[str, type[Attack]] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Attack) and cls.__module__ == module.__name__ and cls.name and not inspect.isabstract(cls):
                if cls.name in found and found[cls.name] is not cls:
                    raise AttackError(f"two attacks are named {cls.name!r}")
                found[cls.name] = cls
    return dict(sorted(found.items()))


#: Registry name -> attack class (its ``kind`` says where it is wired: data, update, colluding).
ATTACKS: dict[str, type[Attack]] = _registered(attack_modules())


def refresh() -> dict[str, type[Attack]]:
    """Search the package again (after a module was added to its path); returns the registry."""
    ATTACKS.clear()
    ATTACKS.update(_registered(attack_modules()))
    return ATTACKS


def load_plugin(path: str, options: Options | None = None) -> Attack:
    """Instantiate ``"package.module:Name"``.

    ``Name`` is a class implementing DataAttack, UpdateAttack or ColludingAttack
    (``hospitrust.attacks.interfaces``), built with ``Name.from_options(Name.Options(), ...)``
    (its options' defaults; a plugin has no run-config section), or a function ``Name()``
    returning such an attack.

    Parameters
    ----------
    path : str
        ``"package.module:Name"`` (a dotted ``Name`` reaches a nested attribute).
    options : Options or None
        Options to build a plugin class with; None: the class's ``Options()`` defaults.

    Returns
    -------
    Attack
        The plugin's attack (AttackError when it cannot be loaded or built).
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
    ifaces = "DataAttack, UpdateAttack or ColludingAttack (hospitrust.attacks.interfaces)"
    if inspect.isclass(obj):
        if not issubclass(obj, INTERFACES):
            raise AttackError(f"plugin {path!r} is a class that implements none of {ifaces}")
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise AttackError(f"plugin {path!r} is abstract: it does not implement {missing}")
        try:
            attack = obj.from_options(options or obj.Options(), lambda name: cast(Attack, build_attack(name)))
        except Exception as exc:
            raise AttackError(f"cannot instantiate attack plugin {path!r}: {exc}") from exc
    elif callable(obj):
        try:
            attack = obj()
        except Exception as exc:
            raise AttackError(f"attack plugin factory {path!r} failed: {exc}") from exc
        if not isinstance(attack, INTERFACES):
            raise AttackError(f"attack plugin factory {path!r} returned {attack!r}, which implements none of {ifaces}")
    else:
        raise AttackError(f"plugin {path!r} is {type(obj).__name__}, not a class implementing {ifaces}")
    return attack


def attack_class(name: str) -> type[Attack]:
    """The registered attack class named ``name``; AttackError listing the names when unknown.

    Parameters
    ----------
    name : str
        A registry name (``"label-flip"``).

    Returns
    -------
    type[Attack]
        Its class.
    """
    try:
        return ATTACKS[name]
    except KeyError:
        raise AttackError(
            f"unknown attack {name!r}; allowed: none, {', '.join(ATTACKS)}, or 'package.module:ClassName'"
        ) from None


def build_attack(name: str, sections: Mapping[str, Options] | None = None, *, schedule: bool = True) -> Attack | None:
    """Attack ``name`` (registry name or ``"package.module:Name"`` plugin) with its options
    (``sections[name]``, else its defaults), wrapped in the schedule of
    ``sections["attack-schedule"]`` (when ``schedule``). None for ``"none"``.

    Parameters
    ----------
    name : str
        Registry name, ``"package.module:Name"`` plugin, or ``"none"``.
    sections : Mapping[str, Options] or None
        Run-config section name -> its options (``RunConfig.attack_sections()``); a missing section
        gives the defaults.
    schedule : bool
        Wrap the attack in the ``attack-schedule`` section's schedule.

    Returns
    -------
    Attack or None
        The attack, or None for ``"none"``.
    """
    sections = dict(sections or {})
    name = str(name).strip()
    if name == "none":
        return None
    if ":" in name:
        attack = load_plugin(name)
    else:
        cls = attack_class(name)
        options = sections.get(name) or cls.Options()
        attack = cls.from_options(options, lambda other: _build_inner(other, sections))
    if not schedule:
        return attack
    plan = sections.get(SCHEDULE_SECTION) or ScheduleOptions()
    return with_schedule(attack, plan)  # type: ignore[arg-type]


def _build_inner(name: str, sections: Mapping[str, Options]) -> Attack:
    cls = attack_class(name)
    if cls.kind == "data" or name == "sybil" or issubclass(cls, RoundAware):
        allowed = sorted(n for n, c in ATTACKS.items() if c.kind != "data" and n != "sybil" and not issubclass(c, RoundAware))
        raise AttackError(f"sybil.base must be 'mean' or one of {', '.join(allowed)}, got {name!r}")
    return cls.from_options(sections.get(name) or cls.Options(), lambda other: _build_inner(other, sections))


Builder = Callable[[str], Attack]

__all__ = ["ATTACKS", "AttackError", "SCHEDULE_SECTION", "attack_class", "build_attack", "load_plugin", "refresh"]

"""The strategy registry, derived from the classes: every ``HospitrustStrategy`` subclass with a
``name`` in a module of this package (a new rule is a new file here; nothing else lists it), plus
a user's own class by ``"package.module:Name"``; and the presets (published forms, ablations:
named option values over one rule, ``hospitrust.strategies.preset``), from each module's
``PRESETS``.

``build_strategy`` makes one from its options and what it ``needs`` of the server; a preset's
name makes its rule with the preset's values.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from hospitrust.options import Options
from hospitrust.strategies.base import SERVICES, HospitrustStrategy
from hospitrust.strategies.preset import Preset, flat_options

NOT_RULES = ("base", "preset", "registry", "validation")  # modules of the package that hold no rule


class StrategyError(ValueError):
    """A strategy name, plugin path or service is wrong; the message says which and what is allowed."""


def discover(package: ModuleType) -> dict[str, type[HospitrustStrategy]]:
    """Every named HospitrustStrategy subclass defined in the modules of ``package`` (its
    ``__path__``, so a folder added to it is searched too), by name.

    Parameters
    ----------
    package : ModuleType
        A package of strategy modules (``hospitrust.strategies``).

    Returns
    -------
    dict[str, type[HospitrustStrategy]]
        Registry name -> class, sorted by name.
    """
    found: dict[str, type[HospitrustStrategy]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = _rule_module(package, info.name)
        if module is None:
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, HospitrustStrategy) and cls.__module__ == module.__name__ and cls.name:
                if cls.name in found and found[cls.name] is not cls:
                    raise StrategyError(f"two strategies are named {cls.name!r}: {found[cls.name].__module__} and "
                                        f"{cls.__module__}")
                found[cls.name] = cls
    return dict(sorted(found.items()))


def _rule_module(package: ModuleType, name: str) -> ModuleType | None:
    if name.startswith("_") or name in NOT_RULES:
        return None
    return importlib.import_module(f"{package.__name__}.{name}")


def discover_presets(package: ModuleType, rules: Mapping[str, type[HospitrustStrategy]]) -> dict[str, Preset]:
    """Every ``Preset`` in the ``PRESETS`` tuple of a module of ``package``, by name.

    Parameters
    ----------
    package : ModuleType
        A package of strategy modules (``hospitrust.strategies``).
    rules : Mapping[str, type[HospitrustStrategy]]
        The rules found there (``discover``): a preset may not take a rule's name.

    Returns
    -------
    dict[str, Preset]
        Preset name -> preset, sorted by name.
    """
    found: dict[str, Preset] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = _rule_module(package, info.name)
        for preset in getattr(module, "PRESETS", ()) if module is not None else ():
            if not isinstance(preset, Preset):
                raise StrategyError(f"{module.__name__}.PRESETS holds {preset!r}, not a Preset")  # type: ignore[union-attr]
            if preset.name in rules or (preset.name in found and found[preset.name] is not preset):
                raise StrategyError(f"two strategies or presets are named {preset.name!r} (one a preset of "
                                    f"{preset.rule.name})")
            found[preset.name] = preset
    return dict(sorted(found.items()))


def _package() -> ModuleType:
    return importlib.import_module("hospitrust.strategies")


#: rule name -> class (each is a run-config section)
STRATEGIES: dict[str, type[HospitrustStrategy]] = discover(_package())
#: preset name -> preset (values over a rule's section; no section of its own)
PRESETS: dict[str, Preset] = discover_presets(_package(), STRATEGIES)


def refresh() -> dict[str, type[HospitrustStrategy]]:
    """Search the package again (after a module was added to its path); returns the rules
    (``PRESETS`` is searched again too).
    """
    STRATEGIES.clear()
    STRATEGIES.update(discover(_package()))
    PRESETS.clear()
    PRESETS.update(discover_presets(_package(), STRATEGIES))
    return STRATEGIES


def strategy_names() -> list[str]:
    """Every name ``strategy`` takes from the registry: the rules and the presets, sorted."""
    return sorted([*STRATEGIES, *PRESETS])


#: What a rule can do: the capability class attributes of ``HospitrustStrategy`` (the loop, the features
#: and the run-config checks ask these, never a rule's name).
CAPABILITIES = ("stacks_updates", "weighted_mean", "central_dp_compatible", "local_dp_compatible", "weighs_hospitals",
                "runs_own_evaluation", "secagg_compatible")
#: What a rule is, as an attack or a reader asks it: tags with a value, None where the rule has none
#: (``agr_tailored``: how that attack is defined against it; ``trust_signal``: its own trust signal's name)
TAGS = ("agr_tailored", "trust_signal")


def rules_with(capability: str) -> list[str]:
    """The registered rules that have ``capability`` (a class attribute in ``CAPABILITIES``, or a tag of ``TAGS``
    that is set), sorted: what a run-config message offers instead of a rule that lacks it.

    Parameters
    ----------
    capability : str
        A name in ``CAPABILITIES`` or ``TAGS``.

    Returns
    -------
    list[str]
        Rule names.
    """
    if capability not in CAPABILITIES and capability not in TAGS:
        raise StrategyError(f"unknown capability {capability!r}; known: {', '.join((*CAPABILITIES, *TAGS))}")
    return sorted(name for name, cls in STRATEGIES.items() if getattr(cls, capability))


def preset_of(name: str) -> Preset | None:
    """The preset called ``name``, None when ``name`` is a rule, a plugin path or unknown.

    Parameters
    ----------
    name : str
        A strategy name.

    Returns
    -------
    Preset or None
        The preset.
    """
    return PRESETS.get(name)


def rule_name(name: str) -> str:
    """The rule a strategy name selects (its run-config section): the preset's rule for a preset,
    else ``name`` itself.

    Parameters
    ----------
    name : str
        A strategy name (a rule, a preset or a plugin path).

    Returns
    -------
    str
        The rule's registry name (``name`` when it is not a preset).
    """
    preset = PRESETS.get(name)
    return preset.rule.name if preset is not None else name


def load_plugin(path: str) -> type[HospitrustStrategy]:
    """``"package.module:Name"``: a user's HospitrustStrategy subclass.

    Parameters
    ----------
    path : str
        ``"package.module:Name"``.

    Returns
    -------
    type[HospitrustStrategy]
        The class (StrategyError when it cannot be imported or is not a strategy).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise StrategyError(f"a plugin strategy looks like 'package.module:ClassName', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise StrategyError(f"cannot import {module_name!r} for strategy {path!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (inspect.isclass(cls) and issubclass(cls, HospitrustStrategy)):
        raise StrategyError(f"{path!r} is not a HospitrustStrategy subclass")
    return cls


def strategy_class(name: str) -> type[HospitrustStrategy]:
    """The class registered as ``name`` (a preset's rule for a preset, or a plugin path);
    StrategyError with the allowed names.

    Parameters
    ----------
    name : str
        A registry name (a rule or a preset) or ``"package.module:Name"``.

    Returns
    -------
    type[HospitrustStrategy]
        Its class.
    """
    if ":" in name:
        return load_plugin(name)
    if name in PRESETS:
        return PRESETS[name].rule
    try:
        return STRATEGIES[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; allowed: {', '.join(strategy_names())}, "
                            "or 'package.module:ClassName'") from None


def build_strategy(name: str, hospitals: Mapping[int, str], *, options: Options | Mapping[str, Any] | None = None,
                   composed: Mapping[str, Options] | None = None,
                   services: Mapping[str, Callable[..., Any]] | None = None, **common: Any) -> HospitrustStrategy:
    """Strategy ``name`` with ``options`` (its Options, or a mapping of its field names).

    A preset's name: its rule with the preset's values, then those of ``options`` when it is a
    mapping (an Options instance is taken as already resolved, as the run config resolves it).

    ``composed``: the options of the rules it composes (EARN's HTA base), by section name.
    ``services``: what the server offers (keys of ``SERVICES``); the strategy gets exactly the
    ones it ``needs`` with these options, and a missing one is an error naming it.
    ``common``: the base's keyword arguments (train_config, fraction_train, ...), and
    ``assumed_malicious`` for the rules sized for attackers (ignored by the others).

    Parameters
    ----------
    name : str
        A registry name (a rule or a preset) or ``"package.module:Name"``.
    hospitals : Mapping[int, str]
        Node id -> hospital name.
    options : Options or Mapping or None
        The rule's options; its defaults when None.
    composed : Mapping[str, Options] or None
        Options of the composed rules, by section name.
    services : Mapping[str, Callable] or None
        The server's services by ``SERVICES`` key; None: none offered, and none checked.
    **common
        The base's keyword arguments and ``assumed_malicious``.

    Returns
    -------
    HospitrustStrategy
        The strategy.
    """
    cls = strategy_class(name)
    preset = PRESETS.get(name)
    if preset is not None and not isinstance(options, Options):
        options = _nested({**preset.values, **flat_options(options or {})})
    opts = cls.parse_options(options)
    composed = dict(composed or {})
    kwargs = dict(common)
    if not cls.sized_for_attackers:
        kwargs.pop("assumed_malicious", None)
    for section in cls.composes(opts):
        if section in composed:
            kwargs[f"{section}_options"] = composed[section]
    wanted = cls.needs(opts, composed)
    offered = dict(services or {})
    for need in sorted(wanted):
        if need not in SERVICES:
            raise StrategyError(f"strategy {name} needs an unknown service {need!r}; known: {', '.join(SERVICES)}")
        if need in offered:
            kwargs[need] = offered[need]
        elif services is not None:
            raise StrategyError(f"strategy {name} needs {SERVICES[need]} ({need}), which this server does not offer")
    return cls(hospitals, opts, **kwargs)


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flat keys relative to a section (``ablation.trim-norms``) as the nested mapping of field
    names that ``parse_options`` validates (its errors name the run-config keys).
    """
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.replace("-", "_").split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


__all__ = ["CAPABILITIES", "PRESETS", "Preset", "STRATEGIES", "StrategyError", "build_strategy", "discover", "discover_presets",
           "load_plugin", "preset_of", "refresh", "rule_name", "rules_with", "strategy_class", "strategy_names"]

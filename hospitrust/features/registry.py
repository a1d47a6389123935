"""The round-feature registry, derived from the classes: every ``RoundFeature`` subclass with a
``name`` in a module of this package (a new feature is a new file here; nothing else lists it).
``run_features`` asks each whether the run has it (``for_run``) and orders them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

from hospitrust.features.base import Features, RoundFeature, RunFacts


def discover(package: ModuleType) -> dict[str, type[RoundFeature]]:
    """Every named RoundFeature subclass defined in the modules of ``package`` (its ``__path__``,
    so a folder added to it is searched too), by name.
    """
    found: dict[str, type[RoundFeature]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, RoundFeature) and cls.__module__ == module.__name__ and cls.name:
                if cls.name in found and found[cls.name] is not cls:
                    raise ValueError(f"two round features are named {cls.name!r}: {found[cls.name].__module__} and "
                                     f"{cls.__module__}")
                found[cls.name] = cls
    return dict(sorted(found.items()))


def _package() -> ModuleType:
    return importlib.import_module("hospitrust.features")


FEATURES: dict[str, type[RoundFeature]] = {}


def refresh() -> dict[str, type[RoundFeature]]:
    """Search the package again (a module added to its path since); the registry in place."""
    FEATURES.clear()
    FEATURES.update(discover(_package()))
    return FEATURES


def feature_sections() -> dict[str, type[RoundFeature]]:
    """Every feature that declares a run-config section, by section name (sorted): the run config
    composes these sections (each feature's ``Options``) beside the components' own.

    Returns
    -------
    dict[str, type[RoundFeature]]
        Section name -> the feature class that owns it.
    """
    if not FEATURES:
        refresh()
    found: dict[str, type[RoundFeature]] = {}
    for cls in FEATURES.values():
        if not cls.section:
            continue
        if cls.Options is None:
            raise ValueError(f"round feature {cls.name!r} names section {cls.section!r} without its Options")
        if cls.section in found:
            raise ValueError(f"two round features own section {cls.section!r}: {found[cls.section].name} and {cls.name}")
        found[cls.section] = cls
    return dict(sorted(found.items()))


def run_features(run: RunFacts) -> Features:
    """The run's features, in hook order (``order``, then name)."""
    if not FEATURES:
        refresh()
    return Features(f for cls in FEATURES.values() if (f := cls.for_run(run)) is not None)


__all__ = ["FEATURES", "discover", "feature_sections", "refresh", "run_features"]

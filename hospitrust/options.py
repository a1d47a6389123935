"""The options a component declares beside its class: a pydantic model per strategy, attack,
partitioner, model and service.

A component owns its options and its run-config section, named after its registry name:
``[tool.flwr.app.config.hta]`` holds HTA's options, which Flower flattens to ``hta.ema-rate``.
Field names are snake_case, keys kebab-case; a nested ``Options`` field is a sub-section
(``hta.ablation.trim-norms``). Each field's ``description`` is its line in the generated
config reference; bounds and choices are checked where they are declared, and dependencies
between a component's own options in a ``model_validator`` beside them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


def memo_key(raw: Mapping[str, Any]) -> tuple | None:
    """A flat config's items as a hashable memo key (sorted by key), or None when a value is not hashable."""
    items = tuple(sorted((str(k), v) for k, v in raw.items()))
    try:
        hash(items)
    except TypeError:  # a list value
        return None
    return items


def kebab(name: str) -> str:
    """``ema_rate`` -> ``ema-rate``: the run config's spelling of a field."""
    return name.replace("_", "-")


class OptionsError(ValueError):
    """Options that do not validate; ``problems`` lists (flat key, value, message)."""

    def __init__(self, problems: list[tuple[str, Any, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{k} = {v!r}: {m}" if k else m for k, v, m in problems))


_FLAT_FIELDS: dict[tuple[type, str], dict[str, tuple[type, str]]] = {}  # Options.flat_fields, per (model, prefix)


class Options(BaseModel):
    """Base of every component's options: frozen, unknown keys refused, kebab-case keys.

    ``ablation``: where a component keeps the toggles that bring back an earlier, worse-measured
    form of its rule (never the default; its doc page gives the measurement).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=kebab, populate_by_name=True)

    #: True for a sub-section model (an ``ablation`` table): documented under its parent.
    subsection: ClassVar[bool] = False

    @classmethod
    def flat_fields(cls, prefix: str = "") -> dict[str, tuple[type[Options], str]]:
        """Flat key (relative to the section, ``ablation.trim-norms``) -> (model, field name)."""
        cached = _FLAT_FIELDS.get((cls, prefix))  # a model's fields never change: a grid asks thousands of times
        if cached is not None:
            return dict(cached)
        out: dict[str, tuple[type[Options], str]] = {}
        for name, info in cls.model_fields.items():
            key = f"{prefix}{kebab(name)}"
            sub = info.annotation
            if isinstance(sub, type) and issubclass(sub, Options):
                out.update(sub.flat_fields(prefix=f"{key}."))
            else:
                out[key] = (cls, name)
        _FLAT_FIELDS[(cls, prefix)] = out
        return dict(out)

    def to_flat(self, prefix: str = "") -> dict[str, Any]:
        """The options as flat run-config keys (``prefix`` + key)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            key = f"{prefix}{kebab(name)}"
            if isinstance(value, Options):
                out.update(value.to_flat(prefix=f"{key}."))
            else:
                out[key] = value
        return out

    @classmethod
    def defaults_flat(cls) -> dict[str, Any]:
        return cls().to_flat()

    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]) -> Options:
        """Options from flat keys relative to the section (``ema-rate``, ``ablation.trim-norms``).

        Raises OptionsError naming each bad key: unknown ones (with the known keys), and values
        that fail the field's type, bounds or a cross-check.
        """
        key = memo_key(flat)
        if key is not None:  # frozen models: a grid parses the same sections for thousands of cells
            # each value's type in the key too: 1, 1.0 and True are equal keys but not the same input
            return _memoised_from_flat(cls, tuple((k, type(v), v) for k, v in key))
        return cls._from_flat(flat)

    @classmethod
    def _from_flat(cls, flat: Mapping[str, Any]) -> Options:
        known = cls.flat_fields()
        unknown = [k for k in flat if k not in known]
        if unknown:
            raise OptionsError([(k, flat[k], "unknown key") for k in unknown])
        nested: dict[str, Any] = {}
        for key, value in flat.items():
            parts = key.split(".")
            node = nested
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        try:
            return cls.model_validate(nested)
        except ValidationError as err:
            problems = []
            for e in err.errors():
                loc = ".".join(kebab(str(p)) for p in e.get("loc", ()))
                problems.append((loc, e.get("input") if loc else None, e["msg"].removeprefix("Value error, ")))
            raise OptionsError(problems) from None

    def check_dependencies(self, set_keys: set[str]) -> None:
        """Dependencies between this component's options, checked for the keys a user set
        (``set_keys``, flat): Flower passes every default of pyproject, so a default value does
        not count as set. ValueError naming the keys; the default is no check.
        """

    def set_keys(self, prefix: str = "") -> set[str]:
        """The flat keys whose value was given explicitly (not left at its default)."""
        out: set[str] = set()
        for name in self.model_fields_set:
            value = getattr(self, name)
            key = f"{prefix}{kebab(name)}"
            if isinstance(value, Options):
                out |= value.set_keys(prefix=f"{key}.")
            else:
                out.add(key)
        return out


@functools.lru_cache(maxsize=4096)
def _memoised_from_flat(cls: type[Options], items: tuple) -> Options:
    return cls._from_flat({k: v for k, _, v in items})  # an OptionsError is raised each time (lru_cache keeps only results)


class NoOptions(Options):
    """A component without options of its own."""


__all__ = ["NoOptions", "Options", "OptionsError", "kebab"]

"""A preset: a named set of option values over one rule (a published form of it, or an ablation).

``strategy = "hta-published"`` means the rule ``hta`` with the preset's values; every other key
is the rule's own, from its run-config section (``[tool.flwr.app.config.hta]``). A preset has no
section and no class of its own. It lives beside its rule, in the rule's module, in a module-level
``PRESETS`` tuple, where the registry finds it (``hospitrust.strategies.registry.PRESETS``).

A value set in the rule's section overrides the preset's (recorded: a warning, a line in the run's
log, and the resolved values in its ``config.json``). Flower hands the ServerApp every key at
pyproject's default, so a value counts as set when it differs from the rule's default; one equal to
the rule's default cannot be told from unset and leaves the preset's value. Where the keys a user
set are known (``hospitrust simulate -c``, a bench grid's cells) such a value is refused: select
the rule itself with the preset's values instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hospitrust.options import Options, OptionsError, kebab

if TYPE_CHECKING:
    from hospitrust.strategies.base import HospitrustStrategy


def flat_options(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A mapping of option names (field or kebab names, a nested mapping for a sub-section) as
    flat run-config keys relative to the section: ``{"ablation": {"trim_norms": False}}`` ->
    ``{"ablation.trim-norms": False}``.

    Parameters
    ----------
    values : Mapping[str, Any]
        Option names -> values.
    prefix : str
        Put before every key (the sub-section's path, when recursing).

    Returns
    -------
    dict[str, Any]
        Flat kebab-case key -> value.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{kebab(str(key))}"
        if isinstance(value, Mapping):
            out.update(flat_options(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Preset:
    """A rule with set values, selectable by its own name.

    Parameters
    ----------
    name : str
        Its registry name (``strategy = name``), unique among rules and presets.
    rule : type[HospitrustStrategy]
        The rule it sets values of.
    summary : str
        What it is (the first sentence is its line in the config reference).
    settings : Mapping[str, tuple[Any, str]]
        Flat key relative to the rule's section (``ablation.trim-norms``) -> (value, why): the
        why is its line in the preset's table on its page.
    extends : str
        The preset it was derived from (``derive``), '' for none; its settings are included.
    own : frozenset[str]
        The keys this preset sets itself (the rest come from ``extends``); all of them when empty.
    """

    name: str
    rule: type[HospitrustStrategy]
    summary: str
    settings: Mapping[str, tuple[Any, str]]
    extends: str = ""
    own: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        known = self.rule.Options.flat_fields()
        unknown = sorted(set(self.settings) - set(known))
        if unknown:
            raise ValueError(f"preset {self.name}: {', '.join(unknown)} are not options of {self.rule.name} "
                             f"(its keys: {', '.join(known)})")
        try:
            self.rule.Options.from_flat(self.values)
        except OptionsError as err:
            raise ValueError(f"preset {self.name}: {err}") from None
        if not self.own:  # a preset of its own: every setting is its own
            object.__setattr__(self, "own", frozenset(self.settings))

    @property
    def values(self) -> dict[str, Any]:
        """Flat key -> value, as the rule's section spells it."""
        return {key: value for key, (value, _) in self.settings.items()}

    def derive(self, name: str, summary: str, settings: Mapping[str, tuple[Any, str]]) -> Preset:
        """A preset of the same rule with this one's settings and ``settings`` on top (an ablation of a published form)."""
        return Preset(name, self.rule, summary, {**self.settings, **settings}, extends=self.name,
                      own=frozenset(settings))

    def options(self, overrides: Mapping[str, Any] | None = None) -> Options:
        """The rule's options with this preset's values, then ``overrides`` (flat keys relative to the
        section, or a mapping of option names); OptionsError naming a bad key.
        """
        return self.rule.Options.from_flat({**self.values, **flat_options(overrides or {})})

    def overridden(self, overrides: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Flat key -> (the preset's value, the override) for each override of a value the preset sets."""
        flat = flat_options(overrides)
        return {key: (self.values[key], flat[key]) for key in sorted(flat)
                if key in self.settings and flat[key] != self.values[key]}


__all__ = ["Preset", "flat_options"]

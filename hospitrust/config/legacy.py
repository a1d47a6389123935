"""The flat run-config keys of hospitrust 0.1 (``hta-kappa``) and their sectioned names now
(``hta.exclusion-fraction``).

Wherever hospitrust reads a config (``hospitrust simulate -c``, grid files, ``cells.csv``,
``config.json``, checkpoints) an old key is translated, with one deprecation line naming its
new key. A few old keys were shared by several components (``attack-target`` by label-flip and
backdoor); they go to the section of the component the config selects. Plain ``flwr run
--run-config`` takes only the new names (Flower refuses keys pyproject does not declare).

The published forms and ablations had sections of their own (``hta-published.ema-rate``) until
they became presets, values over their rule's section (issue 31): such a key is translated to its
rule's section (``hta.ema-rate``) where the config selects that preset, and refused otherwise
(:func:`hospitrust.config.run.parse_run_config` names the preset and its rule).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: old flat key -> new key (one section), for the keys that moved
RENAMED: dict[str, str] = {
    # reply checks
    "max-norm-over-median": "round-norm-bound.over-median",
    # local training
    "optimizer": "train.optimizer",
    "momentum": "train.momentum",
    "weight-decay": "train.weight-decay",
    "class-weighted-loss": "train.class-weighted-loss",
    "class-weights-from": "train.class-weights-from",
    "fedrs-alpha": "train.fedrs-alpha",
    # rules
    "proximal-mu": "fedprox.proximal-mu",
    "multi-krum-m": "multi-krum.num-selected",
    "clipping-tau": "centered-clipping.radius",
    "clipping-iters": "centered-clipping.iterations",
    "fedagain-benchmark": "fedagain.benchmark",
    "fedagain-divergence": "fedagain.divergence",
    "fedagain-divergence-quantile": "fedagain.divergence-quantile",
    "fedagain-error-quantile": "fedagain.error-quantile",
    "fedagain-error-floor": "fedagain.error-floor",
    "hta-a": "hta.direction-exponent",
    "hta-b": "hta.magnitude-exponent",
    "hta-c": "hta.validation-exponent",
    "hta-ema-rate": "hta.ema-rate",
    "hta-variance-penalty": "hta.variance-penalty",
    "hta-lambda": "hta.exclusion-mads",
    "hta-kappa": "hta.exclusion-fraction",
    "hta-clip": "hta.clip-to-median-norm",
    "hta-magnitude-tolerance": "hta.magnitude-tolerance",
    "hta-duplicate-cosine": "hta.duplicate-cosine",
    "hta-merge-duplicates": "hta.ablation.merge-duplicates",
    "hta-trim-norms": "hta.ablation.trim-norms",
    "earn-evidence": "earn.evidence",
    "earn-mode": "earn.agreement",
    "earn-nonholder-weight": "earn.nonholder-weight",
    "earn-nonholder-by-peers": "earn.ablation.nonholder-by-peers",
    "earn-cap": "earn.row-cap",
    "earn-clip-rows": "earn.clip-rows",
    "earn-history-rounds": "earn.history-rounds",
    "earn-agree-threshold": "earn.agree-threshold",
    "earn-audit": "earn.audit",
    "earn-audit-by": "earn.audit-by",
    "earn-rare-classes": "earn.rare-classes",
    "earn-rare-fraction": "earn.rare-fraction",
    "earn-base": "earn.base",
    "earn-excuse-direction": "earn.ablation.excuse-direction",
    "contribution-score": "contribution.score",
    "fbd-colors": "fbd.colors",
    "fbd-redundancy": "fbd.redundancy",
    "fbd-plan": "fbd.plan",
    "fbd-lambda": "fbd.distill-weight",
    "fbd-routing": "fbd.routing",
    "fbd-exclude-colors": "fbd.exclude-colors",
    "fbd-detect-z": "fbd.detect-z",
    "fbd-exclude-flagged": "fbd.exclude-flagged",
    # services
    "contribution-scoring": "contribution-scoring.enabled",
    "contribution-utility": "contribution-scoring.utility",
    "contribution-selfish-hospitals": "contribution-scoring.selfish-hospitals",
    "contribution-selfish-inflation": "contribution-scoring.selfish-inflation",
    "secure-aggregation": "secagg.enabled",
    "secagg-clipping-range": "secagg.clipping-range",
    "secagg-quantization-range": "secagg.quantization-range",
    "secagg-max-weight": "secagg.max-weight",
    "secagg-reconstruction-threshold": "secagg.reconstruction-threshold",
    # partitioners
    "quantity-skew-alpha": "quantity-skew.alpha",
    "classes-per-hospital": "pathological.classes-per-hospital",
    "specialist-classes": "specialist.classes",
    # attacks
    "attack-source": "label-flip.source",
    "label-flip-mode": "label-flip.mode",
    "attack-gamma": "scaling.gamma",
    "attack-z": "alie.z",
    "attack-eps": "ipm.eps",
    "attack-sigma": "gaussian-noise.sigma",
    "attack-free-rider-noise": "free-rider.noise",
    "attack-severity": "corruption.severity",
    "attack-corruption": "corruption.kind",
    "attack-poison-fraction": "backdoor.poison-fraction",
    "attack-patch-size": "backdoor.patch-size",
    "attack-noise-rate": "label-noise.rate",
    "attack-mimic-index": "mimic.index",
    "attack-sybil-base": "sybil.base",
    "attack-start-round": "attack-schedule.start-round",
    "attack-period": "attack-schedule.period",
    "attack-on-for": "attack-schedule.on-for",
    "attack-on-rounds": "attack-schedule.on-rounds",
}

#: old flat key -> (the top-level key that selects the component, {component: new key});
#: an old key several components shared goes to the selected one (else the first)
SHARED: dict[str, tuple[str, dict[str, str]]] = {
    "dirichlet-alpha": ("partitioner", {"dirichlet": "dirichlet.alpha", "specialist": "specialist.alpha"}),
    "attack-target": ("attack", {"label-flip": "label-flip.target", "backdoor": "backdoor.target"}),
    "attack-perturbation": ("attack", {"min-max": "min-max.perturbation", "min-sum": "min-sum.perturbation"}),
    "attack-copy-noise": ("attack", {"alie": "alie.copy-noise", "ipm": "ipm.copy-noise", "min-max": "min-max.copy-noise",
                                     "min-sum": "min-sum.copy-noise"}),
}


#: a preset's former section -> its rule's section (the sections these presets had until issue 31)
PRESET_SECTIONS: dict[str, str] = {
    "hta-published": "hta",
    "hta-published-no-m": "hta",
    "hta-published-no-memory": "hta",
    "hta-published-no-direction": "hta",
    "earn-published": "earn",
    "fedagain-published": "fedagain",
    "fedagain-authors-code": "fedagain",
}


def _preset_key(key: str) -> tuple[str, str] | None:
    """``hta-published.ema-rate`` -> (``hta-published``, ``hta.ema-rate``); None for another key."""
    section, dot, sub = key.partition(".")
    if not dot or section not in PRESET_SECTIONS:
        return None
    return section, f"{PRESET_SECTIONS[section]}.{sub}"


def new_names(old: str) -> list[str]:
    """The new key(s) of an old flat key ([] if it is not an old key)."""
    if old in RENAMED:
        return [RENAMED[old]]
    if old in SHARED:
        return list(SHARED[old][1].values())
    preset_key = _preset_key(old)
    return [preset_key[1]] if preset_key is not None else []


def _selected(raw: Mapping[str, Any], selector: str) -> set[str]:
    """The components a config selects of one kind (an attack also through Sybil's base)."""
    chosen = {str(raw.get(selector, ""))}
    if selector == "attack":
        chosen.add(str(raw.get("sybil.base", raw.get("attack-sybil-base", ""))))
    return chosen


_OLD_FLAT_KEYS = frozenset(RENAMED) | frozenset(SHARED)
_PRESET_KEY = re.compile("^(?:" + "|".join(map(re.escape, PRESET_SECTIONS)) + r")\.", re.MULTILINE)


def _has_old_key(raw: Mapping[str, Any]) -> bool:
    """Whether any key of ``raw`` is an old one (set and regex operations: a grid asks for every cell, often)."""
    return not _OLD_FLAT_KEYS.isdisjoint(raw) or _PRESET_KEY.search("\n".join(map(str, raw))) is not None


def translate(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``raw`` with every old key under its new name, and one deprecation note per old key.

    An old key replaces its new key's value when both are there (a config built from
    pyproject's defaults plus old-style overrides). A key of a preset's former section is
    translated only where the config selects that preset (elsewhere it was inactive, and is left
    for the run config's parser to refuse by name).
    """
    if not _has_old_key(raw):
        return dict(raw), []  # nothing old (every current config): one pass instead of two
    out: dict[str, Any] = {}
    notes: list[str] = []
    strategy = str(raw.get("strategy", ""))
    for key, value in raw.items():
        preset_key = _preset_key(key)
        if key not in RENAMED and key not in SHARED and (preset_key is None or preset_key[0] != strategy):
            out.setdefault(key, value)
    for key, value in raw.items():
        preset_key = _preset_key(key)
        if preset_key is not None and preset_key[0] == strategy:
            out[preset_key[1]] = value
            notes.append(f"run config key {key!r} is deprecated: {strategy} is a preset of {PRESET_SECTIONS[strategy]} now, "
                         f"so it is {preset_key[1]!r} (a value other than {PRESET_SECTIONS[strategy]}'s default overrides "
                         f"the preset's; docs/rules/{strategy}.md)")
            continue
        if key in RENAMED:
            new = RENAMED[key]
        elif key in SHARED:
            selector, by_component = SHARED[key]
            chosen = [by_component[c] for c in by_component if c in _selected({**raw, **out}, selector)]
            new = chosen[0] if chosen else next(iter(by_component.values()))
        else:
            continue
        out[new] = value
        notes.append(f"run config key {key!r} is deprecated: it is now {new!r} (docs/config.md lists every old key)")
    return out, notes


def translate_keys(keys: Iterable[str], translated: Mapping[str, Any]) -> set[str]:
    """The new names of a set of keys (old ones translated as ``translate`` did for ``translated``)."""
    out = set()
    strategy = str(translated.get("strategy", ""))
    for key in keys:
        preset_key = _preset_key(key)
        if preset_key is not None and preset_key[0] == strategy:
            out.add(preset_key[1])
        elif key in RENAMED:
            out.add(RENAMED[key])
        elif key in SHARED:
            selector, by_component = SHARED[key]
            chosen = [by_component[c] for c in by_component if c in _selected(translated, selector)]
            out.add(chosen[0] if chosen else next(iter(by_component.values())))
        else:
            out.add(key)
    return out


def old_key_table() -> list[tuple[str, str]]:
    """(old key, new key or keys) for the config reference."""
    rows = [(old, new) for old, new in RENAMED.items()]
    rows += [(old, " / ".join(by.values()) + f" (by {selector})") for old, (selector, by) in SHARED.items()]
    rows += [(f"{preset}.*", f"{rule}.* (with strategy = \"{preset}\", a preset of {rule})")
             for preset, rule in PRESET_SECTIONS.items()]
    return sorted(rows)

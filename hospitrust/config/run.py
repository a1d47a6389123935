"""The run config: the top-level keys and one section per component, validated once.

Flower hands the app a flat dict: ``[tool.flwr.app.config]`` with ``--run-config`` overrides,
nested tables flattened to dotted keys (``hta.ema-rate``). ``parse_run_config`` turns it into a
``RunConfig`` before any data is loaded: an unknown key fails with a "did you mean", a bad value
names the key, the value and what is allowed, and a section's options are refused when its
component is not selected (``strategy = "krum"`` with ``hta.exclusion-fraction = 0.4``).
Old flat keys (``hta-kappa``) are translated with one deprecation line
(:mod:`hospitrust.config.legacy`). A preset (``strategy = "hta-published"``) is its rule's
section with the preset's values; a value set in that section overrides the preset's
(:func:`resolve_preset`).
"""

from __future__ import annotations

import functools

import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hospitrust.attacks.registry import ATTACKS, SCHEDULE_SECTION, AttackError, build_attack
from hospitrust.attacks.schedule import ScheduleOptions
from hospitrust.attacks.threat_model import ThreatModel
from hospitrust.attacks.selection import parse_int_list
from hospitrust.config import legacy
from hospitrust.errors import ConfigError, did_you_mean
from hospitrust.config.sections import Section, all_sections, section_of
from hospitrust.contribution.options import check_contribution_settings, ContributionScoringOptions
from hospitrust.datasets.base import DATA_DIR_ENV
from hospitrust.datasets.federation import SimulatedFederation
from hospitrust.datasets.partitioners import PARTITIONERS
from hospitrust.datasets.registry import source_of
from hospitrust.models import MODELS
from hospitrust.models.training import TrainOptions
from hospitrust.options import Options, OptionsError, memo_key
from hospitrust.privacy.options import check_privacy_settings
from hospitrust.features.pre_aggregators import check_pre_aggregation
from hospitrust.aggregation.options import AggregationOptions
from hospitrust.aggregation.pre_aggregation import parse_chain
from hospitrust.features.secagg_options import SecAggOptions
from hospitrust.datasets.server import ServerDataOptions
from hospitrust.tasks.task import TaskOptions
from hospitrust.strategies.base import HospitrustStrategy
from hospitrust.strategies.validation import RoundNormBoundOptions
from hospitrust.strategies.registry import STRATEGIES, StrategyError, preset_of, rule_name, rules_with, strategy_class

OptionsT = TypeVar("OptionsT", bound=Options)


class CoreOptions(Options):
    """The top-level keys of ``[tool.flwr.app.config]``: what every run has."""

    # federation
    num_server_rounds: int = Field(10, ge=1, le=100_000, description="Rounds of training.")
    strategy: str = Field("fedavg", description=(
        "The aggregation rule, by registry name (its options: the section of that name), or "
        "'package.module:Class'."
    ))
    fraction_train: float = Field(1.0, gt=0.0, le=1.0, description="Share of hospitals asked to train each round.")
    federated_evaluation_every: int = Field(1, ge=1, description=(
        "Rounds between the hospitals' own evaluations of the global model (per-hospital accuracy, fairness); "
        "the last round is always evaluated. Above 1 a deployed round saves one exchange with its SuperNodes' "
        "polling waits (docs/deployment.md); needs a server test set, and no contribution scoring."
    ))
    min_hospitals: int = Field(2, ge=1, description="Fewest valid replies a round needs to update the model.")
    reply_timeout: float = Field(600.0, gt=0.0, description=(
        "Seconds an exchange waits for hospitals' replies, from its push (deployed, a round's train messages go"
        " out with the previous round's evaluation, so that evaluation's time counts in it)."
    ))
    seed: int = Field(42, ge=0, description="Seeds partitions, model init, sampling and local training.")
    assumed_malicious: int = Field(1, ge=0, description=(
        "f, the attackers the robust rules are sized for (trimmed-mean, krum, multi-krum, bulyan)."
    ))
    pre_aggregation: str = Field("", description=(
        "Steps applied to the validated updates before the rule, left to right: nnm, arc, bucketing, clipping, or "
        "a chain such as 'arc,nnm'; '' or 'none': the rule sees the updates as sent (docs/rules/pre-aggregation.md)."
    ))
    max_update_norm: float = Field(1e4, gt=0.0, description=(
        "Replies whose update (returned - global) has a larger L2 norm are rejected, and so is a simulated colluding "
        "attacker's row (the adaptive attacks keep their strength inside it)."
    ))
    max_num_examples: int = Field(10_000_000, ge=1, description="Replies claiming more training examples are rejected.")
    # data
    dataset: str = Field("pneumoniamnist", description=(
        "The dataset: a MedMNIST 2D flag, or torchvision's mnist / cifar10."
    ))
    image_size: int = Field(28, description=(
        "Image size: 28, 64, 128 or 224 (the MedMNIST sizes); mnist and cifar10 are resampled to it, and also"
        " take 32."
    ))
    data_dir: str = Field("", description=(
        "Folder of the dataset files; empty: $HOSPITRUST_DATA_DIR, else medmnist's default (~/.medmnist)."
    ))
    partitioner: str = Field("dirichlet", description=(
        "How the training split is divided over simulated hospitals (its options: the section of that name)."
    ))
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "Share of each hospital's data kept for local validation."
    ))
    train_subsample: float = Field(1.0, gt=0.0, le=1.0, description=(
        "Share of the training split used (stratified; for quick runs)."
    ))
    reference_cohort_per_class: int = Field(20, ge=0, description=(
        "The server's reference cohort: images per class, from the val split. 0: no cohort (a rule that judges "
        "updates on data then refuses to start, naming its cohort-free setting)."
    ))
    # model and local training (the rest in the train section)
    model: str = Field("small-cnn", description="The model architecture, by registry name.")
    local_epochs: int = Field(2, ge=1, le=1000, description="Local epochs per round at each hospital.")
    batch_size: int = Field(32, ge=1, le=65536, description="Local minibatch size.")
    learning_rate: float = Field(0.01, gt=0.0, le=10.0, description="Local learning rate.")
    # attacks (simulation ground truth)
    attack: str = Field("none", description=(
        "The attack, by registry name (its options: the section of that name), 'package.module:Class', or "
        "'none'."
    ))
    malicious_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "Share of hospitals that are malicious (a fixed set drawn by seed; > 0 gives at least 1)."
    ))
    malicious_hospitals: str = Field("", description=(
        "Comma-separated malicious hospital indices (instead of malicious-fraction)."
    ))
    # results
    output_dir: str = Field("runs", description="Folder for run directories (made absolute).")
    run_name: str = Field("", description="Run directory name; empty: <time>-<dataset>-<strategy>.")
    checkpoint: bool = Field(True, description="Write checkpoint.pt (model, round, strategy state) after every round.")
    resume_from: str = Field("", description=(
        "A run directory or checkpoint.pt to continue from; the run goes on in that directory."
    ))
    # deployment
    app_signature: str = Field("", description=(
        "A consortium signature of this run's app bundle (hospitrust app sign): hospitals that trust its key run "
        "the bundle without approving it themselves. Never read by the server."
    ))

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        try:
            strategy_class(v)
        except StrategyError as err:
            raise ValueError(str(err)) from None
        return v

    @field_validator("pre_aggregation")
    @classmethod
    def _pre_aggregation(cls, v: str) -> str:
        parse_chain(v)  # ValueError naming the allowed steps
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        source_of(v)  # ValueError listing the datasets
        return v

    @field_validator("partitioner")
    @classmethod
    def _partitioner(cls, v: str) -> str:
        if v not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {v!r}; allowed: {', '.join(PARTITIONERS)}")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v not in MODELS:
            raise ValueError(f"unknown model {v!r}; allowed: {', '.join(sorted(MODELS))}")
        return v

    @field_validator("attack")
    @classmethod
    def _attack(cls, v: str) -> str:
        v = v.strip()
        if v == "none":
            return v
        if ":" in v:
            mod, _, attr = v.partition(":")
            if not mod or not attr:
                raise ValueError(f"a plugin attack looks like 'package.module:ClassName', got {v!r}")
            return v
        if v not in ATTACKS:
            raise ValueError(f"unknown attack {v!r}; allowed: none, {', '.join(ATTACKS)}, or 'package.module:ClassName'")
        return v

    @field_validator("malicious_hospitals")
    @classmethod
    def _hospitals(cls, v: str) -> str:
        parse_int_list(v, "malicious-hospitals", minimum=0)
        return v

    @model_validator(mode="after")
    def _checks(self) -> "CoreOptions":
        if not 8 <= self.image_size <= 1024:
            raise ValueError(f"image-size {self.image_size}: expected 8 to 1024 pixels")
        if self.malicious_fraction > 0 and parse_int_list(self.malicious_hospitals, "malicious-hospitals"):
            raise ValueError("set either malicious-fraction or malicious-hospitals, not both")
        return self


class RunConfig(CoreOptions):
    """The validated run config: the top-level keys as attributes, and one Options per section
    (``options(name)``; typed shortcuts for the run's parts: ``train``, ``task``, ``server_data``,
    ``attack_schedule``; any section by its options class, typed: ``section(PrivacyOptions)``). Frozen and
    hashable.
    """

    _sections: dict[str, Options] = PrivateAttr(default_factory=dict)
    _preset_overrides: dict[str, tuple[Any, Any]] = PrivateAttr(default_factory=dict)

    # ---- sections ----------------------------------------------------------------
    def options(self, section: str) -> Options:
        """The options of ``section`` (its defaults when the run config did not set it)."""
        if section in self._sections:
            return self._sections[section]
        known = all_sections()
        if section not in known:
            raise KeyError(f"no run config section {section!r}")
        return known[section].options()

    def section(self, options_class: type[OptionsT]) -> OptionsT:
        """The options of the one section whose options are ``options_class`` (typed, so a caller needs no cast)."""
        names = [name for name, sec in all_sections().items() if sec.options is options_class]
        if len(names) != 1:
            raise KeyError(f"{options_class.__name__} is the options of {len(names)} run config sections, not one: "
                           f"{names or 'none'}")
        return cast(OptionsT, self.options(names[0]))

    @property
    def strategy_options(self) -> Options:
        """The selected rule's options (a preset's: its rule's section with the preset's values)."""
        section = rule_name(self.strategy)
        return self.options(section) if section in all_sections() else strategy_class(self.strategy).Options()

    @property
    def rule(self) -> type[HospitrustStrategy]:
        """The selected rule's class (a preset's rule, a plugin's class): what it can do are its class
        attributes (``stacks_updates``, ``weighted_mean``, ``central_dp_compatible``, ...).
        """
        return strategy_class(self.strategy)

    @property
    def preset_overrides(self) -> dict[str, tuple[Any, Any]]:
        """With a preset selected: each key of its rule's section set to another value than the
        preset's, -> (the preset's value, the value used); empty otherwise.
        """
        return dict(self._preset_overrides)

    @property
    def train(self) -> TrainOptions:
        return cast(TrainOptions, self.options("train"))

    @property
    def task(self) -> TaskOptions:
        return cast(TaskOptions, self.options("task"))

    @property
    def aggregation(self) -> AggregationOptions:
        return cast(AggregationOptions, self.options("aggregation"))

    @property
    def server_data(self) -> ServerDataOptions:
        return cast(ServerDataOptions, self.options("server-data"))

    @property
    def round_norm_bound(self) -> RoundNormBoundOptions:
        return cast(RoundNormBoundOptions, self.options("round-norm-bound"))

    @property
    def attack_schedule(self) -> ScheduleOptions:
        return cast(ScheduleOptions, self.options(SCHEDULE_SECTION))

    @property
    def pre_aggregation_steps(self) -> tuple[str, ...]:
        """The pre-aggregation chain's steps in order (empty without one)."""
        return parse_chain(self.pre_aggregation)

    @property
    def attack_enabled(self) -> bool:
        return self.attack != "none"

    def active_sections(self) -> list[str]:
        """The sections this run uses: the services, and the selected strategy, partitioner and
        attack with the components they compose (EARN's HTA base, Sybil's base attack).
        """
        return active_sections(self, self._sections)

    def attack_sections(self) -> dict[str, Options]:
        """The options of the attack sections (and the schedule), by name, for ``build_attack``."""
        known = all_sections()
        return {name: self.options(name) for name in [*ATTACKS, SCHEDULE_SECTION] if name in known}

    @property
    def threat_model(self) -> ThreatModel:
        """Who attacks and how: what ``hospitrust.attacks.threat_model`` needs of this config."""
        return ThreatModel(self.attack, self.attack_sections(), self.malicious_fraction, self.malicious_hospitals,
                           self.seed)

    # ---- derived -------------------------------------------------------------------
    def resolved_data_dir(self) -> Path | None:
        """The dataset folder: run config, else $HOSPITRUST_DATA_DIR, else None (the source's default)."""
        raw = self.data_dir or os.environ.get(DATA_DIR_ENV, "")
        return Path(raw).expanduser().resolve() if raw else None

    @property
    def federation(self) -> SimulatedFederation:
        """What the data side of a simulated federation needs of this config."""
        partitioner = PARTITIONERS[self.partitioner](self.options(self.partitioner) if self.partitioner in self._sections
                                                     else None)
        return SimulatedFederation(self.dataset, self.image_size, self.resolved_data_dir(), partitioner,
                                   self.train_subsample, self.val_fraction, self.seed, self.reference_cohort_per_class)

    def to_flat(self, prefix: str = "") -> dict[str, Any]:
        """The run config as flat kebab-case keys: the top-level keys and every active section's
        options (what config.json and checkpoints record); ``prefix`` goes before every key, as in
        ``Options.to_flat`` (the run config is the top level: "" in practice).
        """
        flat = CoreOptions.to_flat(self, prefix=prefix)
        for name in self.active_sections():
            flat.update(self.options(name).to_flat(prefix=f"{prefix}{name}."))
        return flat

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_flat(), sort_keys=True, default=str))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_flat() == other.to_flat()


def active_sections(core: CoreOptions, sections: Mapping[str, Options]) -> list[str]:
    known = all_sections()
    preset = preset_of(core.strategy)

    def opts(name: str) -> Options:
        if name in sections:
            return sections[name]
        return preset.options() if preset is not None and name == preset.rule.name else known[name].options()

    active = [name for name in known if known[name].kind == "service"]
    todo = [rule_name(core.strategy), core.partitioner] + ([core.attack] if core.attack != "none" else [])
    todo += list(parse_chain(core.pre_aggregation))  # the chain's steps with options of their own
    while todo:
        name = todo.pop(0)
        if name not in known or name in active:
            continue
        active.append(name)
        section = known[name]
        if section.kind == "strategy":
            todo += list(STRATEGIES[name].composes(opts(name)))
        elif section.kind == "attack":
            todo += list(ATTACKS[name].composes(opts(name)))
    return active


# ---- parsing ---------------------------------------------------------------------------
def known_keys() -> list[str]:
    """Every run config key: the top-level ones and every section's (dotted)."""
    keys = list(CoreOptions.flat_fields())
    for name, section in all_sections().items():
        keys += [f"{name}.{k}" for k in section.options.flat_fields()]
    return keys


def _problem(key: str, value: Any, msg: str) -> str:
    return f"  - {key} = {value!r}: {msg}" if key else f"  - {msg}"


def parse_run_config(raw: Mapping[str, Any], *, explicit: Iterable[str] | None = None) -> RunConfig:
    """Validate Flower's flat run config; raises ConfigError naming each bad key and what is allowed.

    ``explicit``: the keys the user set (``hospitrust simulate -c``): a section's key there is
    refused when its component is not selected, even at its default value. Without it (the
    ServerApp, which sees pyproject's defaults for every section) a key of an unselected
    component is refused when its value is not the default.
    """
    bad = [k for k in raw if "_" in str(k) and not str(k).startswith("_")]
    if bad:
        raise ConfigError(f"invalid run config: keys are kebab-case, got {bad} (write e.g. 'num-server-rounds')")
    translated, notes = legacy.translate(raw)
    for note in notes:
        warnings.warn(note, FutureWarning, stacklevel=2)
    explicit_keys = legacy.translate_keys(explicit, translated) if explicit is not None else None
    known = all_sections()
    core_keys = set(CoreOptions.flat_fields())
    all_known = known_keys()
    problems: list[str] = []
    core_raw: dict[str, Any] = {}
    section_raw: dict[str, dict[str, Any]] = {}
    for key, value in translated.items():
        section = section_of(key)
        if section is None:
            if key in core_keys:
                core_raw[key] = value
            else:
                problems.append(f"  - unknown key {key!r}{did_you_mean(key, all_known)}")
        elif section in known:
            sub = key[len(section) + 1:]
            if sub in known[section].options.flat_fields():
                section_raw.setdefault(section, {})[sub] = value
            else:
                problems.append(f"  - unknown key {key!r}{did_you_mean(key, all_known)}")
        elif section in legacy.PRESET_SECTIONS:  # a preset's section before presets were values over their rule's
            rule, sub = legacy.PRESET_SECTIONS[section], key[len(section) + 1:]
            problems.append(f"  - {key} = {value!r}: {section} is a preset of {rule} now, with no section of its own, and "
                            f"the selected strategy is {translated.get('strategy', 'fedavg')!r}: with strategy = "
                            f"{section!r} write {rule}.{sub}, or remove the key")
        else:
            problems.append(f"  - unknown key {key!r} (no section {section!r}){did_you_mean(key, all_known)}")
    core: CoreOptions | None = None
    try:
        core = CoreOptions.from_flat(core_raw)  # type: ignore[assignment]
    except OptionsError as err:
        problems += [_problem(k, v, m) for k, v, m in err.problems]
    sections: dict[str, Options] = {}
    preset = preset_of(str(core_raw.get("strategy", "")))
    for name, values in section_raw.items():
        if preset is not None and name == preset.rule.name:
            continue  # parsed over the preset's values (resolve_preset), once the core is
        try:
            sections[name] = known[name].options.from_flat(values)
        except OptionsError as err:
            problems += [_problem(f"{name}.{k}" if k else "", v, m) for k, v, m in err.problems]
    if problems or core is None:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))
    if preset is not None:
        try:
            sections[preset.rule.name], overrides = resolve_preset(core.strategy, section_raw.get(preset.rule.name, {}),
                                                                   explicit_keys)
        except ValueError as err:
            raise ConfigError("invalid run config:\n" + str(err)) from None
    cfg = RunConfig.model_validate(core.model_dump())
    cfg._sections.update(sections)
    if preset is not None:
        cfg._preset_overrides = overrides
        for key, (was, now) in overrides.items():
            warnings.warn(f"strategy {core.strategy}: {preset.rule.name}.{key} = {now!r} overrides the preset's {was!r}",
                          UserWarning, stacklevel=2)
    active = set(cfg.active_sections())
    for name, values in section_raw.items():
        if name in active:
            continue
        defaults = known[name].options.defaults_flat()
        for sub, value in values.items():
            key = f"{name}.{sub}"
            if (explicit_keys is not None and key in explicit_keys) or (explicit_keys is None and value != defaults[sub]):
                problems.append(_problem(key, value, unselected_message(known[name], cfg)))
    for name, options in sections.items():
        defaults = known[name].options.defaults_flat()
        set_keys = ({k[len(name) + 1:] for k in explicit_keys if section_of(k) == name} if explicit_keys is not None
                    else {k for k, v in options.to_flat().items() if v != defaults[k]})
        if preset is not None and name == preset.rule.name:  # a preset's values count as set
            set_keys |= set(preset.settings)
        try:
            options.check_dependencies(set_keys)
        except ValueError as err:
            problems.append(f"  - {err}")
    problems += [f"  - {p}" for p in cross_checks(cfg)]
    if problems:
        raise ConfigError("invalid run config:\n" + "\n".join(problems))
    return cfg


def resolve_preset(strategy: str, values: Mapping[str, Any],
                   explicit_keys: set[str] | None = None) -> tuple[Options, dict[str, tuple[Any, Any]]]:
    """The options of preset ``strategy``: its rule's defaults, the preset's values, then the values
    set in the rule's section (``values``: its flat keys as the config gives them, ``ema-rate``).

    A value counts as set when it differs from the rule's default: Flower passes every key at
    pyproject's default, so a value equal to it cannot be told from unset and leaves the preset's.
    Where the keys the user set are known (``explicit_keys``: ``hospitrust simulate -c``, a grid's
    cells), such a value on a key the preset sets is refused (ValueError), not silently dropped.

    Parameters
    ----------
    strategy : str
        A preset's name.
    values : Mapping[str, Any]
        The rule's section as the config gives it (flat keys relative to the section).
    explicit_keys : set[str] or None
        The keys the user set (full run-config names), when known.

    Returns
    -------
    tuple[Options, dict[str, tuple[Any, Any]]]
        The options, and each key whose preset value was overridden -> (preset's value, value used).
    """
    preset = preset_of(strategy)
    if preset is None:
        raise KeyError(f"{strategy!r} is not a preset")
    rule = preset.rule.name
    defaults = preset.rule.Options.defaults_flat()
    overrides = {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}
    problems = []
    for key in sorted(explicit_keys or ()):
        sub = key[len(rule) + 1:]
        if section_of(key) == rule and sub in preset.settings and sub not in overrides and sub in values \
                and values[sub] != preset.values[sub]:
            problems.append(f"  - {key} = {values[sub]!r}: {rule}'s default, which the ServerApp cannot tell from unset, so "
                            f"it cannot override preset {strategy}'s {preset.values[sub]!r}; select strategy = {rule!r} "
                            f"with the preset's values instead (docs/rules/{strategy}.md lists them)")
    try:
        resolved = preset.options(overrides)
    except OptionsError as err:
        problems += [_problem(f"{rule}.{k}" if k else "", v, m) for k, v, m in err.problems]
    if problems:
        raise ValueError("\n".join(problems))
    return resolved, preset.overridden(overrides)


def preset_key_problems(flat: Mapping[str, Any], explicit_keys: Iterable[str]) -> list[str]:
    """For a translated flat config that selects a preset: the problems :func:`resolve_preset` finds
    with the keys a user set (``explicit_keys``, new names), one line each; [] otherwise. A bench
    grid checks its cells with it (it knows which keys a cell sets; the ServerApp does not).

    Parameters
    ----------
    flat : Mapping[str, Any]
        A flat run config in the current key names.
    explicit_keys : Iterable[str]
        The keys the user set, in the current names.

    Returns
    -------
    list[str]
        One line per problem (the key, its value and what to do instead).
    """
    strategy = str(flat.get("strategy", ""))
    preset = preset_of(strategy)
    if preset is None:
        return []
    rule = preset.rule.name
    try:
        resolve_preset(strategy, {k[len(rule) + 1:]: v for k, v in flat.items() if section_of(k) == rule}, set(explicit_keys))
    except ValueError as err:
        return [line.removeprefix("  - ") for line in str(err).splitlines()]
    return []


def unselected_message(section: Section, cfg: CoreOptions) -> str:
    if section.kind == "pre-aggregator":
        return (f"an option of pre-aggregation step {section.name}, but pre-aggregation is {cfg.pre_aggregation!r}, "
                f"without it (add {section.name!r} to the chain, e.g. pre-aggregation = {section.name!r}, or remove "
                "the key)")
    selected = {"strategy": cfg.strategy, "partitioner": cfg.partitioner, "attack": cfg.attack}[section.kind]
    return (f"an option of {section.kind} {section.name}, but the selected {section.kind} is {selected!r} "
            f"(set {section.kind} = {section.name!r} or remove the key)")


def check_server_data(cfg: RunConfig) -> list[str]:
    """What the run's rule and evaluation need of the server's data and do not get; messages name the keys."""
    out = []
    if cfg.server_data.evaluation == "central" and not cfg.server_data.has_test_set(cfg.task.custom):
        out.append("server-data.evaluation = 'central' needs a test set: set server-data.test-path (a task of the "
                   "consortium's own has no dataset file to fall back to), or use 'auto' / 'federated'")
    cls = strategy_class(cfg.strategy)
    options = cfg.strategy_options
    composed = {name: cfg.options(name) for name in cls.composes(options)}
    needs = cls.needs(options, composed)
    if needs and not cfg.server_data.has_cohort(cfg.task.custom, cfg.reference_cohort_per_class):
        free = cls.cohort_free_setting(options, composed)
        out.append(f"strategy {cfg.strategy} needs the server's reference cohort ({', '.join(sorted(needs))}), and this "
                   "run has none: set server-data.cohort-path (the operator's cohort on the SuperLink machine)"
                   + (" or reference-cohort-per-class >= 1" if not cfg.task.custom else "")
                   + (f", or {free} to run it without one" if free else f"; {cfg.strategy} has no cohort-free setting"))
    return out



def cross_checks(cfg: RunConfig) -> list[str]:
    """Checks across sections, declared by the components; messages name the keys."""
    out: list[str] = []
    sd = cfg.server_data
    if not cfg.task.custom and not (sd.test_path.strip() and sd.cohort_path.strip()):
        # the dataset file serves the server's sets (and simulated hospitals): only at the sizes it ships
        source = source_of(cfg.dataset)
        sizes = source.sizes(cfg.dataset)
        if cfg.image_size not in sizes:
            out.append(f"image-size {cfg.image_size}: {source.title} ships {', '.join(map(str, sizes))} only (a task "
                       "of your own, or server-data paths for both the test set and the cohort, take any size)")
    out += check_server_data(cfg)
    for check in (strategy_class(cfg.strategy).check_run_config, PARTITIONERS[cfg.partitioner].check_run_config):
        try:
            check(cfg)
        except ValueError as err:
            out.append(str(err))
    attack = None
    if cfg.attack_enabled:
        try:
            attack = build_attack(cfg.attack, cfg.attack_sections())
        except (AttackError, ValueError, TypeError) as err:
            out.append(str(err))
    kind = getattr(getattr(attack, "attack", attack), "kind", None)
    try:
        check_contribution_settings(cfg.rule, cfg.section(ContributionScoringOptions), cfg.section(SecAggOptions).enabled, cfg.fraction_train,
                                    kind, weighted_mean_rules=rules_with("weighted_mean"))
    except ValueError as err:
        out.append(str(err))
    out += check_privacy_settings(cfg)
    out += check_pre_aggregation(cfg)
    if cfg.federated_evaluation_every > 1:  # rounds without the hospitals' evaluation replies
        every = f"federated-evaluation-every = {cfg.federated_evaluation_every}"
        if cfg.server_data.evaluation_mode(cfg.task.custom) == "federated":
            out.append(f"{every}: this run has no server test set, so every round's metrics are the hospitals' "
                       "evaluations (federated evaluation): set it to 1, or give the server a test set")
        if cfg.section(ContributionScoringOptions).enabled:
            out.append(f"{every}: contribution-scoring.enabled scores every round from the hospitals' evaluations: "
                       "set it to 1")
        if cfg.rule.runs_own_evaluation:
            out.append(f"{every}: strategy {cfg.strategy!r} runs its own evaluation every round: set it to 1")
    return out


class _OnDemand(Mapping[str, Options]):
    """Sections parsed when first asked for: active_sections reads the few on the selected components' path, and a
    grid restricts thousands of cells. A section that does not parse is absent (its defaults stand in).
    """

    def __init__(self, parse: Callable[[str], Options], names: list[str]) -> None:
        self._parse, self._names = parse, names
        self._done: dict[str, Options | None] = {}

    def __getitem__(self, name: str) -> Options:
        if name not in self._done:
            try:
                self._done[name] = self._parse(name)
            except (OptionsError, ValueError):
                self._done[name] = None
        value = self._done[name]
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        try:
            self[cast(str, name)]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def restrict_to_active(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` without the keys of sections its components do not select: a benchmark grid's
    shared keys apply where they are relevant (``[base] earn.rare-classes`` with a strategy axis).
    Keys that do not parse are kept, so validation reports them.
    """
    known = all_sections()
    core_keys = set(CoreOptions.flat_fields())
    try:
        core = cast(CoreOptions, CoreOptions.from_flat({k: v for k, v in flat.items() if k in core_keys}))
    except OptionsError:
        return dict(flat)
    preset = preset_of(core.strategy)
    by_section: dict[str | None, dict[str, Any]] = {}  # grouped once: a grid restricts thousands of cells
    for k, v in flat.items():
        section = section_of(k)
        by_section.setdefault(section, {})[k if section is None else k[len(section) + 1:]] = v

    def parse(name: str) -> Options:
        values = by_section.get(name, {})
        if preset is not None and name == preset.rule.name:
            return resolve_preset(core.strategy, values)[0]
        return known[name].options.from_flat(values)

    active = set(active_sections(core, _OnDemand(parse, list(known))))
    preset_sections = {name for name in legacy.PRESET_SECTIONS if name != core.strategy}  # their keys were inactive here
    keep = {name for name in by_section if (name not in known and name not in preset_sections) or name in active}
    return {k: v for k, v in flat.items() if section_of(k) in keep}


def run_config_defaults() -> dict[str, Any]:
    """Every key at its default, flat (what pyproject declares)."""
    flat = CoreOptions().to_flat()
    for name, section in all_sections().items():
        flat.update(section.options().to_flat(prefix=f"{name}."))
    return flat


__all__ = ["CoreOptions", "DATA_DIR_ENV", "RunConfig", "active_sections", "cross_checks", "known_keys", "parse_run_config",
           "preset_key_problems", "resolve_preset", "restrict_to_active", "run_config_defaults"]


@functools.lru_cache(maxsize=16)
def _memoised_run_config(items: tuple) -> RunConfig:
    return parse_run_config(dict(items))


def memoised_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """:func:`parse_run_config` of a run's config, memoised on its values.

    A simulation actor serves hundreds of hospitals and messages of one run, and validating
    the 100-odd keys cost about 10-20 ms each time (a tenth of a small hospital's round).
    Errors are not memoised (lru_cache keeps only results): a bad value fails every message.
    """
    items = memo_key(raw)
    return parse_run_config(raw) if items is None else _memoised_run_config(items)

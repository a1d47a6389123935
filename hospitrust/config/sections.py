"""Every run-config section, from the components that own them.

A section is named after its component's registry name (``hta``, ``dirichlet``, ``label-flip``),
a round feature's declared section (``secagg``, ``contribution-scoring``, ``privacy``: the
feature registry's ``feature_sections``) or a part every run has (``task``, ``train``,
``attack-schedule``); its keys are that component's ``Options``. Adding a rule, an attack, a
partitioner or a feature with options adds its section.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from hospitrust.aggregation.options import AggregationOptions
from hospitrust.attacks.registry import ATTACKS, SCHEDULE_SECTION
from hospitrust.attacks.schedule import ScheduleOptions
from hospitrust.config.legacy import new_names
from hospitrust.datasets.partitioners import PARTITIONERS
from hospitrust.models.training import TrainOptions
from hospitrust.options import Options
from hospitrust.features.pre_aggregators import PRE_AGGREGATORS
from hospitrust.features.registry import FEATURES, feature_sections
from hospitrust.datasets.server import ServerDataOptions
from hospitrust.tasks.task import TaskOptions
from hospitrust.strategies.registry import STRATEGIES
from hospitrust.strategies.validation import RoundNormBoundOptions

KINDS = ("service", "strategy", "partitioner", "attack", "pre-aggregator")


@dataclass(frozen=True)
class Section:
    """One ``[tool.flwr.app.config.<name>]`` table: whose it is and its options."""

    name: str
    kind: str  # service (every run has it: a run part's or a round feature's) | strategy | partitioner | attack | pre-aggregator
    options: type[Options]
    summary: str  # one line, from the component's docstring
    doc: str  # its docs page, relative to docs/


def _summary(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


#: Sections every run has that no round feature owns (the features' own come from their registry), with their
#: docs pages.
RUN_SECTIONS: dict[str, tuple[type[Options], str]] = {
    "task": (TaskOptions, "tasks.md"),
    "server-data": (ServerDataOptions, "operators.md"),
    "train": (TrainOptions, "getting-started.md"),
    "aggregation": (AggregationOptions, "benchmark.md"),
    "round-norm-bound": (RoundNormBoundOptions, "attacks.md"),
    SCHEDULE_SECTION: (ScheduleOptions, "attacks.md"),
}


_SECTIONS_MEMO: dict[tuple, dict[str, Section]] = {}


def all_sections() -> dict[str, Section]:
    """Every section with at least one option, services first, then by kind and name.

    Memoised on the registries' contents (a component added at run time, as docs/extending.md's
    test does, makes a new entry): every message's config lookups call this, and building the
    summaries from the docstrings cost about 1 ms a call.
    """
    if not FEATURES:
        feature_sections()  # fills the feature registry
    key = tuple(tuple(registry.items()) for registry in (STRATEGIES, PARTITIONERS, ATTACKS, PRE_AGGREGATORS, FEATURES))
    memo = _SECTIONS_MEMO.get(key)
    if memo is None:
        memo = _SECTIONS_MEMO[key] = _build_sections()
    return dict(memo)


def _build_sections() -> dict[str, Section]:
    out: dict[str, Section] = {}
    for name, (options, doc) in RUN_SECTIONS.items():
        out[name] = Section(name, "service", options, _summary(options), doc)
    for name, feature in feature_sections().items():
        if name in out:
            raise RuntimeError(f"section name {name!r} is used by round feature {feature.name!r} and a run part")
        assert feature.Options is not None  # feature_sections checks it
        out[name] = Section(name, "service", feature.Options, _summary(feature.Options), feature.doc)
    for kind, registry, doc in (("strategy", STRATEGIES, "rules/{}.md"), ("partitioner", PARTITIONERS, "data.md"),
                                ("attack", ATTACKS, "attacks.md"),
                                ("pre-aggregator", PRE_AGGREGATORS, "rules/pre-aggregation.md")):
        for name, cls in registry.items():
            if not cls.Options.model_fields:
                continue
            if name in out:
                raise RuntimeError(f"section name {name!r} is used by two components ({out[name].kind} and {kind})")
            out[name] = Section(name, kind, cls.Options, _summary(cls), doc.format(name))
    return out


def section_of(key: str) -> str | None:
    """The section of a flat key (``hta.ema-rate`` -> ``hta``); None for a top-level key."""
    return key.split(".", 1)[0] if "." in key else None


def is_hyperparameter(key: str) -> bool:
    """Whether a run-config key (new or old name) is an option of an aggregation rule: the bench
    report compares a rule's settings as variants of it, not as scenarios.
    """
    names = new_names(key) or [key]  # old names too: 0.1 grids and cells.csv
    sections = all_sections()
    return any(sections.get(section_of(name) or "", None) is not None and sections[section_of(name) or ""].kind == "strategy"
               for name in names)

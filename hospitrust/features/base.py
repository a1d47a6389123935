"""Round features: what a run does besides the rule, as objects with hooks at named points of the round.

The round loop (``hospitrust.server_app.loop``) knows no feature by name. It calls every feature's
hooks in the run's feature order, at these points (``docs/architecture.md`` draws them):

setup, once
    ``wrap_strategy(strategy)``: the strategy the rounds use (itself, or a wrapper around it).
    ``wrap_trainer(trainer)``: the train exchange the rounds use (SecAgg+ replaces it).
    ``settings()``: entries for config.json.
    ``restore(checkpoint)``: a resumed run's state (the checkpoint's ``features`` entry, the history).
each round
    ``before_round(rnd)``: before any message (e.g. names in ``rnd.excluded`` are not asked).
    ``on_configure(rnd, messages)``: the train messages before they go out.
    ``on_replies(rnd, replies)``: the train replies before the rule sees them.
    ``update_steps(rnd)``: steps on the stacked updates before the rule (in the strategy's aggregation).
    ``on_aggregate(rnd, result)``: the strategy's :class:`RoundResult`, after the rule.
    ``on_evaluate(rnd, messages)``: the evaluate messages before they go out.
    ``while_evaluating(rnd, loop)``: the evaluate messages are out, their replies not yet in.
    ``record(rnd)``: entries for the round's line in rounds.jsonl.
    ``scores()``: per-hospital scores the rule takes after the round's record
    (``HospitrustStrategy.receive_scores``: contribution scoring's totals).
    ``state()``: the feature's state for the round's checkpoint.
at the end
    ``summary()``: entries for summary.json; ``finish(run_dir)``: files of its own.

A feature says with ``overlaps_rounds`` whether the next round's train messages may go out
during this round's evaluation (false when it needs the round's evaluation first, or runs its
own stages). A new capability is a new feature, not a new branch in the loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from flwr.app import ArrayRecord, Message

from hospitrust.options import Options as OptionsModel
from hospitrust.strategies.base import RoundResult, UpdateStep


@dataclass
class Round:
    """One round as the loop and the features see it, filled in as the round goes.

    Parameters
    ----------
    number : int
        The server round (1-based).
    arrays : ArrayRecord
        The global model the round starts from.
    started : float
        ``time.perf_counter()`` at its start.
    offline : list[str]
        Hospitals the SuperLink listed as offline at its start (not asked).
    excluded : set[str]
        Hospital names features keep out of the round's sample (``before_round``).
    asked : list[int]
        Node ids of the hospitals asked to train.
    answered : set[int]
        Node ids whose train reply a feature took (``on_replies``): asked, answered, not missing.
    unavailable : dict[int, str]
        Node ids asked to train that Flower's SuperLink answered for with "Node Unavailable" (their SuperNode
        stopped sending heartbeats), with its reason.
    result : RoundResult or None
        What the aggregation decided.
    hospitals_evaluate : bool
        Whether the hospitals evaluate the new model this round.
    evaluate_replies : list[Message]
        The hospitals' evaluate replies.
    timing : dict[str, Any]
        Wall-clock stamps and durations of its phases.
    """

    number: int
    arrays: ArrayRecord
    started: float
    offline: list[str] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    asked: list[int] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)
    unavailable: dict[int, str] = field(default_factory=dict)
    result: RoundResult | None = None
    hospitals_evaluate: bool = False
    evaluate_replies: list[Message] = field(default_factory=list)
    timing: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunFacts:
    """What a feature may build itself from (``RoundFeature.for_run``), known after the query round.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (a feature reads its own section).
    grid : Grid
        The ServerApp's grid.
    task : Task
        The run's task.
    hospitals : dict[int, str]
        Node id -> hospital name.
    rows : list[dict[str, Any]]
        The query round's per-hospital class counts (``train``, ``val``) and partition ids.
    truth : dict[str, bool]
        Hospital name -> malicious (the simulation's ground truth; all False without an attack).
    attack : Any
        The configured attack, or None.
    grid_takes_pushes : bool
        Whether the grid takes messages pushed ahead of their pull (``server_app.transport.pipelines``).
    """

    cfg: Any
    grid: Any
    task: Any
    hospitals: dict[int, str]
    rows: list[dict[str, Any]]
    truth: dict[str, bool]
    attack: Any
    grid_takes_pushes: bool = False


class Trainer(Protocol):
    """A round's train exchange: ``send`` configures and pushes, ``receive`` pulls and aggregates."""

    strategy: Any

    def send(self, rnd: Round) -> Any: ...

    def receive(self, rnd: Round, sent: Any) -> RoundResult: ...


class AheadSender(Protocol):
    """What ``while_evaluating`` may ask of the loop: start the next round's train exchange now."""

    def overlaps_rounds(self) -> bool: ...

    def send_ahead(self, number: int) -> None: ...


class RoundFeature:
    """A feature of the round: every hook is a no-op here; a feature overrides the ones it needs.

    The registry (``hospitrust.features.registry``) finds every subclass with a ``name`` in a module
    of ``hospitrust/features/``; ``for_run`` says whether the run has it. ``name`` keys its state in
    the checkpoint; ``order`` places its hooks among the others' (lower first). A feature with options
    declares its run-config section (``section``, ``Options``, ``doc``): the run config composes the
    sections from the registry (``feature_sections``), and every run has them.
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100
    #: the feature's run-config section (``[tool.flwr.app.config.<section>]``); "" when it has no options
    section: ClassVar[str] = ""
    #: the section's keys
    Options: ClassVar[type[OptionsModel] | None] = None
    #: the docs page that explains them, relative to docs/
    doc: ClassVar[str] = ""
    #: whether the next round's train messages may go out during this round's evaluation
    overlaps_rounds: bool = True

    @classmethod
    def for_run(cls, run: RunFacts) -> RoundFeature | None:
        """The feature for this run, or None when the run does not have it (its section is off)."""
        return None

    # ---- setup ------------------------------------------------------------------------
    def wrap_strategy(self, strategy: Any) -> Any:
        return strategy

    def wrap_trainer(self, trainer: Trainer) -> Trainer:
        return trainer

    def settings(self) -> dict[str, Any]:
        return {}

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        """A resumed run: ``checkpoint["features"][self.name]`` (when saved) and its ``history``."""

    # ---- each round -------------------------------------------------------------------
    def before_round(self, rnd: Round) -> None:
        pass

    def on_configure(self, rnd: Round, messages: list[Message]) -> list[Message]:
        return messages

    def on_replies(self, rnd: Round, replies: list[Message]) -> list[Message]:
        return replies

    def update_steps(self, rnd: Round) -> Sequence[UpdateStep]:
        return ()

    def on_aggregate(self, rnd: Round, result: RoundResult) -> RoundResult:
        return result

    def on_evaluate(self, rnd: Round, messages: list[Message]) -> list[Message]:
        return messages

    def while_evaluating(self, rnd: Round, loop: AheadSender) -> None:
        pass

    def record(self, rnd: Round) -> dict[str, Any]:
        return {}

    def scores(self) -> Mapping[str, Mapping[str, float]] | None:
        """Hospital name -> score name -> value, for the rule (``receive_scores``) after the round's
        record; None when the feature scores nothing.
        """
        return None

    def state(self) -> dict[str, Any]:
        return {}

    # ---- at the end -------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {}

    def finish(self, run_dir: Path) -> None:
        pass


class Features:
    """The run's features in order; each call runs one hook of every feature, in that order."""

    def __init__(self, features: Iterable[RoundFeature]) -> None:
        self.features = sorted(features, key=lambda f: f.order)  # stable: equal orders keep theirs
        names = [f.name for f in self.features]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"round features need distinct, non-empty names; got {names}")

    def __iter__(self):
        return iter(self.features)

    def wrap_strategy(self, strategy: Any) -> Any:
        for f in self.features:
            strategy = f.wrap_strategy(strategy)
        return strategy

    def wrap_trainer(self, trainer: Trainer) -> Trainer:
        for f in self.features:
            trainer = f.wrap_trainer(trainer)
        return trainer

    def settings(self) -> dict[str, Any]:
        return {k: v for f in self.features for k, v in f.settings().items()}

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        for f in self.features:
            f.restore(checkpoint)

    def before_round(self, rnd: Round) -> None:
        for f in self.features:
            f.before_round(rnd)

    def on_configure(self, rnd: Round, messages: list[Message]) -> list[Message]:
        for f in self.features:
            messages = f.on_configure(rnd, messages)
        return messages

    def on_replies(self, rnd: Round, replies: list[Message]) -> list[Message]:
        for f in self.features:
            replies = f.on_replies(rnd, replies)
        return replies

    def update_steps(self, rnd: Round) -> list[UpdateStep]:
        return [step for f in self.features for step in f.update_steps(rnd)]

    def on_aggregate(self, rnd: Round, result: RoundResult) -> RoundResult:
        for f in self.features:
            result = f.on_aggregate(rnd, result)
        return result

    def on_evaluate(self, rnd: Round, messages: list[Message]) -> list[Message]:
        for f in self.features:
            messages = f.on_evaluate(rnd, messages)
        return messages

    def while_evaluating(self, rnd: Round, loop: AheadSender) -> None:
        for f in self.features:
            f.while_evaluating(rnd, loop)

    def record(self, rnd: Round) -> dict[str, Any]:
        return {k: v for f in self.features for k, v in f.record(rnd).items()}

    def scores(self) -> dict[str, dict[str, float]] | None:
        """Every feature's per-hospital scores merged (hospital -> score name -> value); None when none scores."""
        found = [s for f in self.features if (s := f.scores()) is not None]
        if not found:
            return None
        out: dict[str, dict[str, float]] = {}
        for scores in found:
            for hospital, values in scores.items():
                out.setdefault(hospital, {}).update(values)
        return out

    def state(self) -> dict[str, dict[str, Any]]:
        return {f.name: state for f in self.features if (state := f.state())}

    def summary(self) -> dict[str, Any]:
        return {k: v for f in self.features for k, v in f.summary().items()}

    def finish(self, run_dir: Path) -> None:
        for f in self.features:
            f.finish(run_dir)

    def overlaps_rounds(self) -> bool:
        return all(f.overlaps_rounds for f in self.features)


__all__ = ["AheadSender", "Features", "Round", "RoundFeature", "RunFacts", "Trainer"]

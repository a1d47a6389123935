"""Schedules: an attack gated by round (on-off attackers, a delayed start), and the
``attack-schedule`` run-config section that wraps the configured attack in them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from hospitrust.attacks.interfaces import INTERFACES, Attack
from hospitrust.attacks.math import update as U
from hospitrust.attacks.selection import parse_int_list
from hospitrust.options import Options


def _kind_base(attack: Any) -> type[Attack]:
    for iface in INTERFACES:
        if isinstance(attack, iface):
            return iface
    raise TypeError(f"a schedule wraps a DataAttack, UpdateAttack or ColludingAttack, got {attack!r}")


class Schedule(Attack):
    """Wraps any attack and gates it by round. An instance is also an instance of the
    wrapped attack's interface (``OnOff(SignFlip())`` is an ``UpdateAttack``), so
    schedules nest: ``DelayedStart(OnOff(a, period=3), start_round=5)``.

    Parameters
    ----------
    attack : Attack
        The attack gated (a DataAttack, UpdateAttack or ColludingAttack, or another schedule).
    """

    _variants: ClassVar[dict[tuple[type, type], type]] = {}

    def __new__(cls, attack: Any = None, *args: Any, **kwargs: Any):
        if any(issubclass(cls, iface) for iface in INTERFACES):  # already specialised
            return super().__new__(cls)
        base = _kind_base(attack)
        key = (cls, base)
        sub = Schedule._variants.get(key)
        if sub is None:
            sub = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "_public": cls})
            sub.__qualname__ = cls.__qualname__
            Schedule._variants[key] = sub
        return super().__new__(sub)

    def __init__(self, attack: Attack) -> None:
        _kind_base(attack)
        self.attack = attack

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.attack.kind

    @property
    def name(self) -> str:  # type: ignore[override]
        return getattr(self.attack, "name", "")

    def _scheduled(self, server_round: int) -> bool:
        raise NotImplementedError

    def active(self, server_round: int) -> bool:
        return self._scheduled(int(server_round)) and self.attack.active(server_round)

    def _ctor_args(self) -> tuple:
        raise NotImplementedError

    def __reduce__(self):
        return (getattr(type(self), "_public", type(self)), self._ctor_args())

    # the three interfaces, delegated and gated ------------------------------------
    def poison(self, images, labels, *, rng, num_classes):
        return self.attack.poison(images, labels, rng=rng, num_classes=num_classes)

    def poison_for_round(self, images, labels, *, server_round, rng, num_classes):
        if not self.active(server_round):
            return images, labels
        return self.attack.poison(images, labels, rng=rng, num_classes=num_classes)

    def apply(self, update, *, server_round, generator=None):
        if not self.active(server_round):
            return update.clone()
        return self.attack.apply(update, server_round=server_round, generator=generator)

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        if not self.active(server_round):
            m = U.check_count(num_malicious, "num_malicious")
            return U.sybil(U.check_stack(honest).double().mean(dim=0).to(honest.dtype), m)
        return self.attack.craft(honest, num_malicious, server_round=server_round, generator=generator)

    def __repr__(self) -> str:
        cls = getattr(type(self), "_public", type(self))
        names = list(inspect.signature(cls.__init__).parameters)[2:]
        args = ", ".join(f"{k}={v!r}" for k, v in zip(names, self._ctor_args()[1:]))
        return f"{cls.__name__}({self.attack!r}, {args})"


class OnOff(Schedule):
    """On-off attacker: acts only in the given ``rounds`` (a set of 1-based rounds), or
    ``on_for`` rounds out of every ``period``: honest first, then attacking, i.e. active
    iff ``(server_round - 1) % period >= period - on_for`` (period=3, on_for=1: rounds
    3, 6, 9, ...). Give exactly one of ``rounds`` and ``period``. The threat to
    EMA/reputation trust: honest rounds rebuild trust spent in attack rounds.

    Parameters
    ----------
    attack : Attack
        The attack gated.
    rounds : Iterable[int] or None
        The 1-based rounds it acts in (non-empty); None: use ``period``.
    period : int or None
        The on-off period in rounds (>= 1); None: use ``rounds``.
    on_for : int
        Attacking rounds at the end of each period, in [1, period].
    """

    def __init__(
        self,
        attack: Attack,
        rounds: Iterable[int] | None = None,
        period: int | None = None,
        on_for: int = 1,
    ) -> None:
        super().__init__(attack)
        if (rounds is None) == (period is None):
            raise ValueError("OnOff needs exactly one of rounds (a set of rounds) and period")
        if rounds is not None:
            rs = frozenset(int(r) for r in rounds)
            if any(r < 1 for r in rs):
                raise ValueError(f"rounds are 1-based Flower server rounds, got {sorted(rs)}")
            if not rs:
                raise ValueError("rounds is empty: the attack would never act")
            self.rounds: frozenset[int] | None = rs
            self.period: int | None = None
        else:
            assert period is not None  # exactly one of rounds and period, checked above
            if int(period) != period or int(period) < 1:
                raise ValueError(f"period must be an integer >= 1, got {period!r}")
            self.rounds = None
            self.period = int(period)
        if int(on_for) != on_for or int(on_for) < 1 or (self.period is not None and int(on_for) > self.period):
            raise ValueError(f"on_for must be an integer in [1, period], got {on_for!r} (period={self.period})")
        self.on_for = int(on_for)

    def _scheduled(self, server_round: int) -> bool:
        if self.rounds is not None:
            return server_round in self.rounds
        assert self.period is not None  # set whenever rounds is None
        return (server_round - 1) % self.period >= self.period - self.on_for

    def _ctor_args(self) -> tuple:
        rounds = None if self.rounds is None else sorted(self.rounds)
        return (self.attack, rounds, self.period, self.on_for)


class DelayedStart(Schedule):
    """Builds trust, then attacks: honest for the first ``start_round`` rounds, active
    iff ``server_round > start_round`` (start_round=0: from round 1).

    Parameters
    ----------
    attack : Attack
        The attack gated.
    start_round : int
        Honest rounds first (>= 0).
    """

    def __init__(self, attack: Attack, start_round: int = 0) -> None:
        super().__init__(attack)
        if int(start_round) != start_round or int(start_round) < 0:
            raise ValueError(f"start_round must be an integer >= 0, got {start_round!r}")
        self.start_round = int(start_round)

    def _scheduled(self, server_round: int) -> bool:
        return server_round > self.start_round

    def _ctor_args(self) -> tuple:
        return (self.attack, self.start_round)


class ScheduleOptions(Options):
    """When the configured attack acts (the ``attack-schedule`` section; any attack)."""

    start_round: int = Field(0, ge=0, description="Honest for this many rounds first (0: attack from round 1).")
    period: int = Field(0, ge=0, description="On-off period in rounds (0: always on).")
    on_for: int = Field(1, ge=1, description="On-off: attacking rounds at the end of each period.")
    on_rounds: str = Field("", description="Comma-separated rounds to attack in ('': all).")

    @field_validator("on_rounds")
    @classmethod
    def _on_rounds(cls, v: str) -> str:
        parse_int_list(v, "attack-schedule.on-rounds", minimum=1)
        return v

    @model_validator(mode="after")
    def _one_schedule(self) -> "ScheduleOptions":
        if self.on_rounds.strip() and self.period > 0:
            raise ValueError("set either attack-schedule.on-rounds or attack-schedule.period (on-off), not both")
        if self.period > 0 and self.on_for > self.period:
            raise ValueError(f"attack-schedule.on-for ({self.on_for}) must be <= attack-schedule.period ({self.period})")
        return self

    @property
    def rounds(self) -> frozenset[int]:
        return frozenset(parse_int_list(self.on_rounds, "attack-schedule.on-rounds", minimum=1))


def with_schedule(attack: Attack, schedule: ScheduleOptions) -> Attack:
    """Wrap ``attack`` in the schedule asked for: OnOff (on-rounds or period / on-for), then
    DelayedStart (start-round > 0).

    Parameters
    ----------
    attack : Attack
        The configured attack.
    schedule : ScheduleOptions
        The ``attack-schedule`` section.

    Returns
    -------
    Attack
        ``attack`` itself when no schedule is asked for, else the wrapping schedule.
    """
    if schedule.rounds:
        attack = OnOff(attack, rounds=schedule.rounds)
    elif schedule.period > 0:
        attack = OnOff(attack, period=schedule.period, on_for=schedule.on_for)
    if schedule.start_round > 0:
        attack = DelayedStart(attack, start_round=schedule.start_round)
    return attack

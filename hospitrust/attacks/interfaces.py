"""The three attack interfaces, by where an attack runs.

* :class:`DataAttack` - a malicious hospital's ClientApp poisons its *own training data*
  before local training (label flips, backdoor, corruption, label noise).
* :class:`UpdateAttack` - a malicious hospital alone rewrites its *own* ``(d,)`` update
  (returned - global) after training; the ClientApp then returns
  ``global + attacked update`` (sign flip, scaling, Gaussian, free-riding).
* :class:`ColludingAttack` - an omniscient, colluding adversary that **sees the honest
  hospitals' updates** and crafts the malicious ones (ALIE, IPM, Min-Max, Min-Sum,
  Fang, Mimic, Sybil). This is a *simulation tool*: it runs on the server between reply
  collection and aggregation (see :func:`hospitrust.attacks.apply.attack_update_stack`);
  a real deployment has no such step.

Every attack has ``active(server_round) -> bool`` (always True unless wrapped in a
schedule, :class:`~hospitrust.attacks.schedule.OnOff` or
:class:`~hospitrust.attacks.schedule.DelayedStart`). When inactive:

* a data attack returns the data unchanged (use :meth:`DataAttack.poison_for_round`, or
  check ``active`` before calling ``poison``, which has no round argument);
* an update attack returns the honest update unchanged;
* a colluding attack returns ``num_malicious`` copies of the honest mean (its only
  honest information). The server helper ``attack_update_stack`` does better: when
  the attack is inactive it leaves the malicious hospitals' own honest updates alone.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from hospitrust.options import NoOptions
from hospitrust.options import Options as OptionsModel


class Attack(abc.ABC):
    """Root of all attacks. ``kind`` is "data", "update" or "colluding"; ``name`` the registry
    name (the class is registered by it: ``hospitrust.attacks.registry``); ``Options`` its
    run-config section (``[tool.flwr.app.config.<name>]``).
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Options: ClassVar[type[OptionsModel]] = NoOptions

    @classmethod
    def from_options(cls, options: OptionsModel, build: Callable[[str], "Attack"]) -> "Attack":
        """The attack with these options; ``build(name)`` makes another registered attack
        (with its own section's options), for attacks that wrap one (Sybil).
        """
        return cls(**options.model_dump())

    @classmethod
    def composes(cls, options: OptionsModel) -> tuple[str, ...]:
        """Other attacks whose options this one uses (Sybil's base)."""
        return ()

    def active(self, server_round: int) -> bool:  # noqa: ARG002 - schedules override
        """Whether the attack acts in ``server_round`` (1-based Flower rounds)."""
        return True

    def data_steps(self, *, server_round: int, rng: np.random.Generator, num_classes: int) -> list[Callable]:  # noqa: ARG002
        """The data steps this attack adds to the hospital's training loop (``hospitrust.models.loop``):
        none, but a data attack's poisoning.
        """
        return []

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class DataAttack(Attack):
    """Poisons a malicious hospital's own training data before local training."""

    kind: ClassVar[str] = "data"

    @abc.abstractmethod
    def poison(
        self, images: np.ndarray, labels: np.ndarray, *, rng: np.random.Generator, num_classes: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return poisoned ``(images, labels)`` (uint8 ``(N,H,W,C)``, int ``(N,)``); never
        modify the inputs (an array the attack does not change may be returned as is).
        """

    def poison_for_round(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        server_round: int,
        rng: np.random.Generator,
        num_classes: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``poison`` if ``active(server_round)``, else the inputs unchanged (same objects)."""
        if not self.active(server_round):
            return images, labels
        return self.poison(images, labels, rng=rng, num_classes=num_classes)

    def data_steps(self, *, server_round: int, rng: np.random.Generator, num_classes: int) -> list[Callable]:
        """Its poisoning of the round (``poison_for_round``), the training loop's data step."""
        return [lambda images, labels: self.poison_for_round(images, labels, server_round=server_round, rng=rng,
                                                             num_classes=num_classes)]


class UpdateAttack(Attack):
    """Rewrites a malicious hospital's own ``(d,)`` update after local training."""

    kind: ClassVar[str] = "update"

    @abc.abstractmethod
    def apply(
        self, update: torch.Tensor, *, server_round: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Return the attacked ``(d,)`` update (a new tensor)."""


class ColludingAttack(Attack):
    """Omniscient colluding adversary (simulation only): crafts the malicious updates
    from the honest ``(n, d)`` stack, between reply collection and aggregation.
    """

    kind: ClassVar[str] = "colluding"

    @abc.abstractmethod
    def craft(
        self,
        honest: torch.Tensor,
        num_malicious: int,
        *,
        server_round: int,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Return ``(num_malicious, d)`` malicious updates."""


INTERFACES: tuple[type[Attack], ...] = (DataAttack, UpdateAttack, ColludingAttack)


@dataclass
class RoundView:
    """What a round-aware attack sees of one round, on the server, before the rule (a simulation step).

    Parameters
    ----------
    server_round : int
        The 1-based round.
    updates : torch.Tensor
        ``(n, d)`` the round's accepted updates in row order; the malicious rows hold what the
        malicious hospitals sent (trained on their own, possibly poisoned, data).
    hospitals : list[str]
        The hospital of every row.
    malicious_rows : list[int]
        The rows of the malicious hospitals (sorted; at least one row is honest).
    rule : callable or None
        ``(n, d)`` stack in row order -> ``(d,)``: the run's rule (behind its pre-aggregation chain
        when one is configured) evaluated on a private copy of its state, so a call changes nothing
        of the run; None outside a run.
    aggregate : callable or None
        The same evaluation, its whole result (``hospitrust.strategies.base.Aggregate``: the weights
        and the rows selected) for the attacks on selection rules; None outside a run.
    pre_aggregation : tuple of str
        The run's pre-aggregation chain in front of the rule (its steps' names; empty: none).
    strategy : callable or None
        ``() ->`` a private copy of the run's rule (its state as this round found it), for the
        attacks that read that state (HTA's reputations, EARN's trust); None outside a run.
    previous_global_update : torch.Tensor or None
        ``(d,)`` the last round's global update (global model now - the one before), which every
        hospital can compute from the models it received; None in the first round.
    generator : torch.Generator or None
        The round's randomness.
    max_norm : float or None
        The server's bound on an update's norm (run config ``max-update-norm``, and with
        ``round-norm-bound.over-median`` the smaller of it and that multiple of the honest rows' median norm): the
        server checks every crafted row against it as it checks a reply and rejects a row above it, so an
        adaptive attack keeps its strength inside it; None outside a run (no bound).
    num_examples : torch.Tensor or None
        ``(n,)`` the examples each row's hospital reported (an attacker knows its own; the omniscient
        colluders the others'); None outside a run.
    """

    server_round: int
    updates: torch.Tensor
    hospitals: list[str]
    malicious_rows: list[int]
    rule: Callable[[torch.Tensor], torch.Tensor] | None = None
    aggregate: Callable[[torch.Tensor], Any] | None = None
    pre_aggregation: tuple[str, ...] = ()
    strategy: Callable[[], Any] | None = None
    previous_global_update: torch.Tensor | None = None
    generator: torch.Generator | None = None
    max_norm: float | None = None
    num_examples: torch.Tensor | None = None

    @property
    def honest_rows(self) -> list[int]:
        bad = set(self.malicious_rows)
        return [i for i in range(self.updates.shape[0]) if i not in bad]

    @property
    def honest(self) -> torch.Tensor:
        """``(h, d)`` the honest rows."""
        return self.updates[self.honest_rows]

    def with_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The stack with the malicious rows replaced by ``rows`` (``(m, d)``, or ``(d,)`` for all)."""
        out = self.updates.clone()
        out[self.malicious_rows] = rows.to(dtype=out.dtype, device=out.device)
        return out

    def rule_on_appended(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The rule for the attack math's convention (honest rows first, the m malicious rows
        appended): the appended rows are put back where the malicious hospitals' rows are.
        """
        rule = self.require_rule()
        h = len(self.honest_rows)
        return lambda stack: rule(self.with_rows(stack[h:]))

    def require_rule(self) -> Callable[[torch.Tensor], torch.Tensor]:
        if self.rule is None:
            raise ValueError("this attack needs the run's rule in the loop: it runs only in a run (the simulated "
                             "adversary gives it the rule), or with RoundView(rule=...)")
        return self.rule


class RoundAware(abc.ABC):
    """An attack that crafts the malicious rows with more of the round than the honest updates: the
    run's rule (rule-tailored attacks), its state (defence-aware attacks) or the previous global
    update (Neurotoxin). The simulated adversary (``hospitrust.features.adversary``) calls
    :meth:`craft_round` on the server, before the rule; a data attack that is also round-aware
    (Neurotoxin) poisons the hospital's data in its ClientApp as well.
    """

    @abc.abstractmethod
    def craft_round(self, view: RoundView) -> tuple[torch.Tensor, dict[str, Any]]:
        """The ``(m, d)`` malicious rows and a record of what was chosen (JSON-able numbers and strings)."""

    def needs_previous_global_update(self) -> bool:
        return False


class RoundAwareColludingAttack(ColludingAttack, RoundAware):
    """A colluding attack that needs the round (:class:`RoundView`): ``craft`` alone cannot run it."""

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        raise TypeError(f"attack {self.name!r} needs the run's rule or state (RoundView): it runs through the "
                        "simulated adversary in a run, or through craft_round(RoundView(...)); it cannot be a sybil base")


def attack_kind(attack: Any) -> str:
    """``"data"``, ``"update"`` or ``"colluding"``; TypeError for anything else.

    Parameters
    ----------
    attack : Any
        An attack (a schedule counts as the kind of the attack it wraps).

    Returns
    -------
    str
        The interface's ``kind``.
    """
    for iface in INTERFACES:
        if isinstance(attack, iface):
            return iface.kind
    raise TypeError(
        f"{attack!r} implements none of DataAttack, UpdateAttack, ColludingAttack (hospitrust.attacks.interfaces)"
    )

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

"""Attack interfaces, schedules, concrete attacks and wiring helpers.

Three interfaces, by where an attack runs:

* :class:`DataAttack` - a malicious hospital's ClientApp poisons its *own training data*
  before local training (label flips, backdoor, corruption, label noise).
* :class:`UpdateAttack` - a malicious hospital alone rewrites its *own* ``(d,)`` update
  (returned - global) after training; the ClientApp then returns
  ``global + attacked update`` (sign flip, scaling, Gaussian, free-riding).
* :class:`ColludingAttack` - an omniscient, colluding adversary that **sees the honest
  hospitals' updates** and crafts the malicious ones (ALIE, IPM, Min-Max, Min-Sum,
  Fang, Mimic, Sybil). This is a *simulation tool*: it runs on the server between reply
  collection and aggregation (see :func:`attack_update_stack`); a real deployment has no
  such step.

Every attack has ``active(server_round) -> bool`` (always True unless wrapped in a
schedule, :class:`OnOff` or :class:`DelayedStart`). When inactive:

* a data attack returns the data unchanged (use :meth:`DataAttack.poison_for_round`, or
  check ``active`` before calling ``poison``, which has no round argument);
* an update attack returns the honest update unchanged;
* a colluding attack returns ``num_malicious`` copies of the honest mean (its only
  honest information). The server helper :func:`attack_update_stack` does better: when
  the attack is inactive it leaves the malicious hospitals' own honest updates alone.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from hospitrust.attacks import data as D
from hospitrust.attacks import update_math as U


# ================================================================== interfaces
class Attack(abc.ABC):
    """Root of all attacks. ``kind`` is "data", "update" or "colluding"."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""

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
        modify the inputs (an array the attack does not change may be returned as is)."""

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
    from the honest ``(n, d)`` stack, between reply collection and aggregation."""

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
    """``"data"``, ``"update"`` or ``"colluding"``; TypeError for anything else."""
    for iface in INTERFACES:
        if isinstance(attack, iface):
            return iface.kind
    raise TypeError(
        f"{attack!r} implements none of DataAttack, UpdateAttack, ColludingAttack (hospitrust.attacks.base)"
    )


def _replicate(update: torch.Tensor, m: int) -> torch.Tensor:
    return U.sybil(update, m)


# =================================================================== schedules
def _kind_base(attack: Any) -> type[Attack]:
    for iface in INTERFACES:
        if isinstance(attack, iface):
            return iface
    raise TypeError(f"a schedule wraps a DataAttack, UpdateAttack or ColludingAttack, got {attack!r}")


class Schedule(Attack):
    """Wraps any attack and gates it by round. An instance is also an instance of the
    wrapped attack's interface (``OnOff(SignFlip())`` is an ``UpdateAttack``), so
    schedules nest: ``DelayedStart(OnOff(a, period=3), start_round=5)``."""

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
            m = U._check_count(num_malicious, "num_malicious")
            return _replicate(U._check_stack(honest).double().mean(dim=0).to(honest.dtype), m)
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
    EMA/reputation trust: honest rounds rebuild trust spent in attack rounds."""

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
        return (server_round - 1) % self.period >= self.period - self.on_for

    def _ctor_args(self) -> tuple:
        rounds = None if self.rounds is None else sorted(self.rounds)
        return (self.attack, rounds, self.period, self.on_for)


class DelayedStart(Schedule):
    """Builds trust, then attacks: honest for the first ``start_round`` rounds, active
    iff ``server_round > start_round`` (start_round=0: from round 1)."""

    def __init__(self, attack: Attack, start_round: int = 0) -> None:
        super().__init__(attack)
        if int(start_round) != start_round or int(start_round) < 0:
            raise ValueError(f"start_round must be an integer >= 0, got {start_round!r}")
        self.start_round = int(start_round)

    def _scheduled(self, server_round: int) -> bool:
        return server_round > self.start_round

    def _ctor_args(self) -> tuple:
        return (self.attack, self.start_round)


# ================================================================ data attacks
LABEL_FLIP_MODES = ("all-to-one", "source-to-target", "permutation")


class LabelFlip(DataAttack):
    """Label flipping: ``all-to-one`` (every label -> target), ``source-to-target``
    (source -> target) or ``permutation`` (a random derangement of the classes, drawn
    from ``rng`` at each call: pass the same seed for a consistent flip)."""

    name = "label-flip"

    def __init__(self, mode: str = "all-to-one", source: int = 1, target: int = 0) -> None:
        if mode not in LABEL_FLIP_MODES:
            raise ValueError(f"mode must be one of {', '.join(LABEL_FLIP_MODES)}, got {mode!r}")
        if mode == "source-to-target" and int(source) == int(target):
            raise ValueError(f"source and target must differ, both are {source}")
        self.mode, self.source, self.target = mode, int(source), int(target)

    def poison(self, images, labels, *, rng, num_classes):
        labels = np.asarray(labels)
        if self.mode == "all-to-one":
            D._check_class(self.target, "target", num_classes)
            return images, D.flip_all_to_one(labels, self.target)
        if self.mode == "source-to-target":
            D._check_class(self.source, "source", num_classes)
            D._check_class(self.target, "target", num_classes)
            return images, D.flip_source_to_target(labels, self.source, self.target)
        return images, D.flip_permutation(labels, num_classes, rng)


class Backdoor(DataAttack):
    """BadNets backdoor: stamps a trigger on ``poison_fraction`` of the images and labels
    them ``target`` (see :func:`hospitrust.attacks.data.backdoor`). Measure success with
    :func:`~hospitrust.attacks.data.apply_trigger` on test images and
    :func:`~hospitrust.attacks.metrics.backdoor_success_rate`; the trigger parameters
    are exposed as :meth:`trigger`."""

    name = "backdoor"

    def __init__(
        self,
        target: int = 0,
        poison_fraction: float = 0.5,
        patch_size: int = 3,
        patch_value: int = 255,
        position: str = "bottom-right",
    ) -> None:
        D._check_class(target, "target")
        D._check_rate(poison_fraction, "poison_fraction")
        self.target, self.poison_fraction = int(target), float(poison_fraction)
        self.patch_size, self.patch_value, self.position = int(patch_size), int(patch_value), position

    def poison(self, images, labels, *, rng, num_classes):
        D._check_class(self.target, "target", num_classes)
        imgs, labs, _ = D.backdoor(
            images, labels, self.target, self.poison_fraction, rng, self.patch_size, self.patch_value, self.position
        )
        return imgs, labs

    def trigger(self, images: np.ndarray) -> np.ndarray:
        """The same trigger stamped on all ``images`` (for attack-success evaluation)."""
        return D.apply_trigger(images, self.patch_size, self.patch_value, self.position)


class Corruption(DataAttack):
    """A hospital with persistently corrupted images (FedAgain's faulty clients):
    :func:`hospitrust.attacks.data.corrupt`; labels unchanged."""

    name = "corruption"

    def __init__(self, kind: str = "gaussian_noise", severity: int = 5) -> None:
        kind = str(kind).replace("-", "_")
        if kind not in D.CORRUPTIONS:
            raise ValueError(f"kind must be one of {', '.join(D.CORRUPTIONS)}, got {kind!r}")
        if int(severity) != severity or not 1 <= int(severity) <= 5:
            raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
        self.corruption, self.severity = kind, int(severity)

    def poison(self, images, labels, *, rng, num_classes):
        return D.corrupt(images, self.corruption, self.severity, rng), np.asarray(labels).copy()


class LabelNoise(DataAttack):
    """An honest but careless hospital: symmetric label noise at ``rate``."""

    name = "label-noise"

    def __init__(self, rate: float = 0.2) -> None:
        self.rate = D._check_rate(rate, "rate")

    def poison(self, images, labels, *, rng, num_classes):
        return images, D.symmetric_label_noise(labels, num_classes, self.rate, rng)


# ============================================================== update attacks
class SignFlip(UpdateAttack):
    """Sends ``-update`` (:func:`~hospitrust.attacks.update_math.sign_flip`)."""

    name = "sign-flip"

    def apply(self, update, *, server_round, generator=None):
        return U.sign_flip(update)


class Scaling(UpdateAttack):
    """Sends ``gamma * update``: boosting / model replacement (Bagdasaryan et al.)."""

    name = "scaling"

    def __init__(self, gamma: float = 10.0) -> None:
        self.gamma = U._check_finite_number(gamma, "gamma")

    def apply(self, update, *, server_round, generator=None):
        return U.scale(update, self.gamma)


class GaussianNoise(UpdateAttack):
    """Sends N(0, sigma^2 I) (``additive=False``) or ``update + N(0, sigma^2 I)``."""

    name = "gaussian-noise"

    def __init__(self, sigma: float = 1.0, additive: bool = False) -> None:
        self.sigma = U._check_finite_number(sigma, "sigma", nonneg=True)
        self.additive = bool(additive)

    def apply(self, update, *, server_round, generator=None):
        return U.gaussian_noise(update, self.sigma, generator, additive=self.additive)


class FreeRider(UpdateAttack):
    """Sends a zero update (the global model back), or N(0, noise^2 I) to disguise it."""

    name = "free-rider"

    def __init__(self, noise: float = 0.0) -> None:
        self.noise = U._check_finite_number(noise, "noise", nonneg=True)

    def apply(self, update, *, server_round, generator=None):
        return U.free_ride(update, self.noise, generator)


class NonFinite(UpdateAttack):
    """A broken hospital, not a clever one: its update is all NaN (training diverged, a bad
    GPU, a corrupted checkpoint). Reply validation must reject it; used as fault injection."""

    name = "nan-update"

    def apply(self, update, *, server_round, generator=None):
        return torch.full_like(update, float("nan"))


# =========================================================== colluding attacks
class _SameForAll(ColludingAttack):
    """Colluding attack whose attackers all send one crafted ``(d,)`` update; with
    ``copy_noise`` > 0 each adds its own noise of that norm relative to the update
    (:func:`~hospitrust.attacks.update_math.jittered_copies`), so no two are identical."""

    copy_noise: float = 0.0

    def one(self, honest: torch.Tensor, *, generator=None) -> torch.Tensor:
        raise NotImplementedError

    def with_copy_noise(self, relative_noise: float) -> "_SameForAll":
        self.copy_noise = U._check_finite_number(relative_noise, "copy_noise", nonneg=True)
        return self

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        m = U._check_count(num_malicious, "num_malicious")
        return U.jittered_copies(self.one(honest, generator=generator), m, self.copy_noise, generator)


class ALIE(_SameForAll):
    """A Little Is Enough: ``mean - z * std`` (:func:`~hospitrust.attacks.update_math.alie`)."""

    name = "alie"

    def __init__(self, z: float = 1.0) -> None:
        self.z = U._check_finite_number(z, "z")

    def one(self, honest, *, generator=None):
        return U.alie(honest, self.z)


class IPM(_SameForAll):
    """Inner product manipulation: ``-eps * mean``."""

    name = "ipm"

    def __init__(self, eps: float = 0.5) -> None:
        self.eps = U._check_finite_number(eps, "eps", nonneg=True)

    def one(self, honest, *, generator=None):
        return U.ipm(honest, self.eps)


class MinMax(_SameForAll):
    """Min-Max (NDSS'21) with perturbation ``std``, ``unit`` or ``sign``."""

    name = "min-max"

    def __init__(self, perturbation: str = "std") -> None:
        if perturbation not in U.PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {', '.join(U.PERTURBATIONS)}, got {perturbation!r}")
        self.perturbation = perturbation

    def one(self, honest, *, generator=None):
        return U.min_max(honest, self.perturbation)


class MinSum(MinMax):
    """Min-Sum (NDSS'21) with perturbation ``std``, ``unit`` or ``sign``."""

    name = "min-sum"

    def one(self, honest, *, generator=None):
        return U.min_sum(honest, self.perturbation)


class FangTrimmedMean(ColludingAttack):
    """Fang et al. (USENIX'20) full-knowledge attack on trimmed mean; attackers differ."""

    name = "fang-trimmed-mean"

    def __init__(self, b: float = 2.0) -> None:
        self.b = float(b)
        if not self.b > 1.0:
            raise ValueError(f"b must be > 1, got {b}")

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return U.fang_trimmed_mean(honest, num_malicious, b=self.b, generator=generator)


class FangMedian(FangTrimmedMean):
    """Fang et al. (USENIX'20) full-knowledge attack on coordinate-wise median."""

    name = "fang-median"

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return U.fang_median(honest, num_malicious, b=self.b, generator=generator)


class Mimic(_SameForAll):
    """All attackers copy honest row ``target_index`` of the honest stack (ICLR'22)."""

    name = "mimic"

    def __init__(self, target_index: int = 0) -> None:
        if int(target_index) != target_index or int(target_index) < 0:
            raise ValueError(f"target_index must be an integer >= 0, got {target_index!r}")
        self.target_index = int(target_index)

    def one(self, honest, *, generator=None):
        return U.mimic(honest, self.target_index)


class Sybil(ColludingAttack):
    """Sybils: every attacker sends the *same* update. ``base="mean"``: the honest mean
    (harmless on its own, but captures agreement-based trust and medians); an
    :class:`UpdateAttack` (applied to the honest mean) or a :class:`ColludingAttack`
    (its first crafted row) makes the identical copies malicious."""

    name = "sybil"

    def __init__(self, base: str | UpdateAttack | ColludingAttack = "mean") -> None:
        if isinstance(base, str):
            if base != "mean":
                raise ValueError(f"Sybil base must be 'mean' or an UpdateAttack/ColludingAttack, got {base!r}")
        elif not isinstance(base, (UpdateAttack, ColludingAttack)):
            raise TypeError(f"Sybil base must be 'mean' or an UpdateAttack/ColludingAttack, got {base!r}")
        self.base = base

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        m = U._check_count(num_malicious, "num_malicious")
        honest = U._check_stack(honest)
        mean = honest.double().mean(dim=0).to(honest.dtype)
        if isinstance(self.base, UpdateAttack):
            one = self.base.apply(mean, server_round=server_round, generator=generator)
        elif isinstance(self.base, ColludingAttack):
            one = self.base.craft(honest, 1, server_round=server_round, generator=generator)[0]
        else:
            one = mean
        return _replicate(one, m)


# ============================================================= wiring helpers
def attack_update_stack(
    attack: UpdateAttack | ColludingAttack,
    updates: torch.Tensor,
    malicious_rows: Iterable[int],
    *,
    server_round: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Server-side (simulation) step between reply collection and aggregation.

    ``updates`` is the ``(n, d)`` stack of *all* replies' updates (returned - global),
    ``malicious_rows`` the rows sent by malicious hospitals. Returns a new ``(n, d)``
    stack whose malicious rows are replaced:

    * :class:`ColludingAttack`: rows = ``attack.craft(honest rows, m)``, where the honest
      rows are all rows not in ``malicious_rows`` (full knowledge of benign updates);
    * :class:`UpdateAttack`: each malicious row = ``attack.apply(its own row)`` (handy in
      an in-process loop that keeps attacks off the ClientApp);
    * inactive attack (``not attack.active(server_round)``), or no malicious rows: the
      stack is returned unchanged (a copy), so inactive colluders send their own
      honest updates.
    """
    updates = U._check_stack(updates)
    n = updates.shape[0]
    rows = sorted({int(r) for r in malicious_rows})
    if any(not 0 <= r < n for r in rows):
        raise ValueError(f"malicious rows {rows} out of range for {n} updates")
    out = updates.clone()
    if not rows or not attack.active(server_round):
        return out
    kind = attack_kind(attack)
    if kind == "update":
        for r in rows:
            out[r] = attack.apply(updates[r], server_round=server_round, generator=generator)
        return out
    if kind != "colluding":
        raise TypeError(f"attack_update_stack needs an UpdateAttack or ColludingAttack, got a {kind} attack")
    honest_rows = [i for i in range(n) if i not in set(rows)]
    if not honest_rows:
        raise ValueError("every reply is malicious: a colluding attack needs at least one honest update")
    crafted = attack.craft(updates[honest_rows], len(rows), server_round=server_round, generator=generator)
    if tuple(crafted.shape) != (len(rows), updates.shape[1]):
        raise ValueError(f"{attack!r} crafted shape {tuple(crafted.shape)}, expected {(len(rows), updates.shape[1])}")
    out[rows] = crafted.to(dtype=updates.dtype, device=updates.device)
    return out


def attack_state_dict(
    attack: UpdateAttack,
    global_state: Mapping[str, torch.Tensor],
    local_state: Mapping[str, torch.Tensor],
    *,
    server_round: int,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """ClientApp helper: ``global + attack.apply(local - global)`` over the floating-point
    entries of two state dicts (same keys, same shapes), flattened in key order.
    Non-float entries (e.g. BatchNorm's ``num_batches_tracked``) keep their local values.
    Returns the state dict to send; inactive attacks return the local weights."""
    if set(global_state) != set(local_state):
        raise ValueError("global and local state dicts have different keys")
    keys = [k for k in local_state if torch.is_floating_point(local_state[k])]
    out = {k: v.detach().clone() for k, v in local_state.items()}
    if not keys or not attack.active(server_round):
        return out
    for k in keys:
        if global_state[k].shape != local_state[k].shape:
            raise ValueError(f"{k}: global shape {tuple(global_state[k].shape)} != local {tuple(local_state[k].shape)}")
    g = torch.cat([global_state[k].detach().reshape(-1).to(torch.float32).cpu() for k in keys])
    w = torch.cat([local_state[k].detach().reshape(-1).to(torch.float32).cpu() for k in keys])
    attacked = attack.apply(w - g, server_round=server_round, generator=generator)
    if tuple(attacked.shape) != tuple(g.shape):
        raise ValueError(f"{attack!r} returned shape {tuple(attacked.shape)}, expected {tuple(g.shape)}")
    new = g + attacked.to(torch.float32).cpu()
    offset = 0
    for k in keys:
        ref = local_state[k]
        size = ref.numel()
        out[k] = new[offset : offset + size].reshape(ref.shape).to(dtype=ref.dtype, device=ref.device)
        offset += size
    return out


__all__ = [
    "ALIE",
    "Attack",
    "Backdoor",
    "ColludingAttack",
    "Corruption",
    "DataAttack",
    "DelayedStart",
    "FangMedian",
    "FangTrimmedMean",
    "FreeRider",
    "GaussianNoise",
    "INTERFACES",
    "IPM",
    "LABEL_FLIP_MODES",
    "LabelFlip",
    "LabelNoise",
    "Mimic",
    "MinMax",
    "MinSum",
    "OnOff",
    "Scaling",
    "Schedule",
    "SignFlip",
    "Sybil",
    "UpdateAttack",
    "attack_kind",
    "attack_state_dict",
    "attack_update_stack",
]

"""Colluding attacks: an omniscient adversary (a simulation step on the server) crafts the
malicious updates from the honest ones.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator

from hospitrust.attacks.interfaces import ColludingAttack, UpdateAttack
from hospitrust.attacks.math import update as U
from hospitrust.options import Options


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"must be finite, got {v}")
    return v


COPY_NOISE = ("Each attacker adds its own random noise of this norm (relative to the crafted update) so the copies are "
              "not identical (two copies then have cosine about 1 / (1 + x^2)): the adaptive answer to HTA's "
              "near-duplicate grouping. 0: exact copies.")


class ALIEOptions(Options):
    """ALIE's options: z and the copy noise."""

    z: float = Field(1.0, description="z in mean - z x std (sweep 0.5, 1.0, 1.5).")
    copy_noise: float = Field(0.0, ge=0.0, description=COPY_NOISE)
    _finite = field_validator("z", "copy_noise")(_finite)


class IPMOptions(Options):
    """IPM's options: epsilon and the copy noise."""

    eps: float = Field(0.5, ge=0.0, description="epsilon in -epsilon x the honest mean.")
    copy_noise: float = Field(0.0, ge=0.0, description=COPY_NOISE)
    _finite = field_validator("eps", "copy_noise")(_finite)


class MinMaxOptions(Options):
    """Min-Max's and Min-Sum's options: the perturbation direction and the copy noise."""

    perturbation: Literal["std", "unit", "sign"] = Field("std", description=(
        "The perturbation direction: std, unit or sign."
    ))
    copy_noise: float = Field(0.0, ge=0.0, description=COPY_NOISE)
    _finite = field_validator("copy_noise")(_finite)


class MimicOptions(Options):
    """Mimic's options: the honest row copied."""

    index: int = Field(0, ge=0, description="The row of the honest stack every attacker copies.")


class SybilOptions(Options):
    """Sybil's options: what the identical copies send."""

    base: str = Field("mean", description=(
        "What the identical copies send: 'mean' (the honest mean) or the name of an update or colluding "
        "attack (with that attack's own options)."
    ))


class SameForAll(ColludingAttack):
    """Colluding attack whose attackers all send one crafted ``(d,)`` update; with
    ``copy_noise`` > 0 each adds its own noise of that norm relative to the update
    (:func:`~hospitrust.attacks.math.update.jittered_copies`), so no two are identical.
    """

    copy_noise: float = 0.0

    def one(self, honest: torch.Tensor, *, generator=None) -> torch.Tensor:
        raise NotImplementedError

    def with_copy_noise(self, relative_noise: float) -> "SameForAll":
        self.copy_noise = U.check_finite_number(relative_noise, "copy_noise", nonneg=True)
        return self

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        m = U.check_count(num_malicious, "num_malicious")
        return U.jittered_copies(self.one(honest, generator=generator), m, self.copy_noise, generator)


class ALIE(SameForAll):
    """A Little Is Enough: ``mean - z * std`` (:func:`~hospitrust.attacks.math.update.alie`).

    Parameters
    ----------
    z : float
        The standard deviations below the honest mean, per coordinate (finite).
    """

    name = "alie"
    Options = ALIEOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.z).with_copy_noise(options.copy_noise)

    def __init__(self, z: float = 1.0) -> None:
        self.z = U.check_finite_number(z, "z")

    def one(self, honest, *, generator=None):
        return U.alie(honest, self.z)


class IPM(SameForAll):
    """Inner product manipulation: ``-eps * mean``.

    Parameters
    ----------
    eps : float
        The factor on the negated honest mean (>= 0).
    """

    name = "ipm"
    Options = IPMOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.eps).with_copy_noise(options.copy_noise)

    def __init__(self, eps: float = 0.5) -> None:
        self.eps = U.check_finite_number(eps, "eps", nonneg=True)

    def one(self, honest, *, generator=None):
        return U.ipm(honest, self.eps)


class MinMax(SameForAll):
    """Min-Max (NDSS'21) with perturbation ``std``, ``unit`` or ``sign``.

    Parameters
    ----------
    perturbation : {"std", "unit", "sign"}
        The direction added to the honest mean
        (:func:`~hospitrust.attacks.math.update.perturbation_vector`).
    """

    name = "min-max"
    Options = MinMaxOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.perturbation).with_copy_noise(options.copy_noise)

    def __init__(self, perturbation: str = "std") -> None:
        if perturbation not in U.PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {', '.join(U.PERTURBATIONS)}, got {perturbation!r}")
        self.perturbation = perturbation

    def one(self, honest, *, generator=None):
        return U.min_max(honest, self.perturbation)


class MinSum(MinMax):
    """Min-Sum (NDSS'21) with perturbation ``std``, ``unit`` or ``sign``.

    Parameters
    ----------
    perturbation : {"std", "unit", "sign"}
        The direction added to the honest mean
        (:func:`~hospitrust.attacks.math.update.perturbation_vector`).
    """

    name = "min-sum"
    Options = MinMaxOptions

    def one(self, honest, *, generator=None):
        return U.min_sum(honest, self.perturbation)


class FangTrimmedMean(ColludingAttack):
    """Fang et al. (USENIX'20) full-knowledge attack on trimmed mean; attackers differ.

    Parameters
    ----------
    b : float
        How far beyond the honest extremes the attackers draw (> 1; the paper's 2).
    """

    name = "fang-trimmed-mean"

    @classmethod
    def from_options(cls, options, build):
        return cls()

    def __init__(self, b: float = 2.0) -> None:
        self.b = float(b)
        if not self.b > 1.0:
            raise ValueError(f"b must be > 1, got {b}")

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return U.fang_trimmed_mean(honest, num_malicious, b=self.b, generator=generator)


class FangMedian(FangTrimmedMean):
    """Fang et al. (USENIX'20) full-knowledge attack on coordinate-wise median.

    Parameters
    ----------
    b : float
        How far beyond the honest extremes the attackers draw (> 1; the paper's 2).
    """

    name = "fang-median"

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        return U.fang_median(honest, num_malicious, b=self.b, generator=generator)


class Mimic(SameForAll):
    """All attackers copy honest row ``target_index`` of the honest stack (ICLR'22).

    Parameters
    ----------
    target_index : int
        The row of the honest stack every attacker copies (>= 0).
    """

    name = "mimic"
    Options = MimicOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.index)

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
    (its first crafted row) makes the identical copies malicious.

    Parameters
    ----------
    base : str or UpdateAttack or ColludingAttack
        ``"mean"``, or the attack whose output the copies send.
    """

    name = "sybil"
    Options = SybilOptions

    @classmethod
    def composes(cls, options) -> tuple[str, ...]:
        return () if options.base == "mean" else (options.base,)

    @classmethod
    def from_options(cls, options, build):
        return cls("mean" if options.base == "mean" else build(options.base))

    def __init__(self, base: str | UpdateAttack | ColludingAttack = "mean") -> None:
        if isinstance(base, str):
            if base != "mean":
                raise ValueError(f"Sybil base must be 'mean' or an UpdateAttack/ColludingAttack, got {base!r}")
        elif not isinstance(base, (UpdateAttack, ColludingAttack)):
            raise TypeError(f"Sybil base must be 'mean' or an UpdateAttack/ColludingAttack, got {base!r}")
        self.base = base

    def craft(self, honest, num_malicious, *, server_round, generator=None):
        m = U.check_count(num_malicious, "num_malicious")
        honest = U.check_stack(honest)
        mean = honest.double().mean(dim=0).to(honest.dtype)
        if isinstance(self.base, UpdateAttack):
            one = self.base.apply(mean, server_round=server_round, generator=generator)
        elif isinstance(self.base, ColludingAttack):
            one = self.base.craft(honest, 1, server_round=server_round, generator=generator)[0]
        else:
            one = mean
        return U.sybil(one, m)

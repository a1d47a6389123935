"""Update attacks: a malicious hospital alone rewrites its own update after local training."""

from __future__ import annotations

import math

import torch
from pydantic import Field, field_validator

from hospitrust.attacks.interfaces import UpdateAttack
from hospitrust.attacks.math import update as U
from hospitrust.options import Options


def finite(v: float) -> float:
    """A pydantic check: the value is a finite number.

    Parameters
    ----------
    v : float
        The option's value.

    Returns
    -------
    float
        ``v``, when finite (else ValueError).
    """
    if not math.isfinite(v):
        raise ValueError(f"must be finite, got {v}")
    return v


class ScalingOptions(Options):
    """Scaling's options: the factor."""

    gamma: float = Field(10.0, gt=0.0, description=(
        "The factor the update is multiplied by (boosting / model replacement; about n / server learning "
        "rate)."
    ))
    _finite = field_validator("gamma")(finite)


class GaussianNoiseOptions(Options):
    """The Gaussian attack's options: the noise's standard deviation."""

    sigma: float = Field(1.0, ge=0.0, description="Standard deviation of the Gaussian update sent instead.")
    _finite = field_validator("sigma")(finite)


class FreeRiderOptions(Options):
    """The free-rider's options: the disguising noise."""

    noise: float = Field(0.0, ge=0.0, description=(
        "Standard deviation of the noise that disguises the zero update (0: an exact zero update)."
    ))
    _finite = field_validator("noise")(finite)


class SignFlip(UpdateAttack):
    """Sends ``-update`` (:func:`~hospitrust.attacks.math.update.sign_flip`)."""

    name = "sign-flip"

    def apply(self, update, *, server_round, generator=None):
        return U.sign_flip(update)


class Scaling(UpdateAttack):
    """Sends ``gamma * update``: boosting / model replacement (Bagdasaryan et al.).

    Parameters
    ----------
    gamma : float
        The factor the update is multiplied by (finite).
    """

    name = "scaling"
    Options = ScalingOptions

    def __init__(self, gamma: float = 10.0) -> None:
        self.gamma = U.check_finite_number(gamma, "gamma")

    def apply(self, update, *, server_round, generator=None):
        return U.scale(update, self.gamma)


class GaussianNoise(UpdateAttack):
    """Sends N(0, sigma^2 I) (``additive=False``) or ``update + N(0, sigma^2 I)``.

    Parameters
    ----------
    sigma : float
        Standard deviation of the noise (>= 0).
    additive : bool
        Add the noise to the update instead of sending the noise alone.
    """

    name = "gaussian-noise"
    Options = GaussianNoiseOptions

    @classmethod
    def from_options(cls, options, build):
        return cls(options.sigma)

    def __init__(self, sigma: float = 1.0, additive: bool = False) -> None:
        self.sigma = U.check_finite_number(sigma, "sigma", nonneg=True)
        self.additive = bool(additive)

    def apply(self, update, *, server_round, generator=None):
        return U.gaussian_noise(update, self.sigma, generator, additive=self.additive)


class FreeRider(UpdateAttack):
    """Sends a zero update (the global model back), or N(0, noise^2 I) to disguise it.

    Parameters
    ----------
    noise : float
        Standard deviation of the noise sent instead of a zero update (>= 0; 0: exactly zero).
    """

    name = "free-rider"
    Options = FreeRiderOptions

    def __init__(self, noise: float = 0.0) -> None:
        self.noise = U.check_finite_number(noise, "noise", nonneg=True)

    def apply(self, update, *, server_round, generator=None):
        return U.free_ride(update, self.noise, generator)


class NonFinite(UpdateAttack):
    """A broken hospital, not a clever one: its update is all NaN (training diverged, a bad
    GPU, a corrupted checkpoint). Reply validation must reject it; used as fault injection.
    """

    name = "nan-update"

    def apply(self, update, *, server_round, generator=None):
        return torch.full_like(update, float("nan"))

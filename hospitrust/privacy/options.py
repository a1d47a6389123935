"""Differential privacy's options (the ``privacy`` section) and the checks that tie it to the rest
of the run config.

Modes: ``local`` (DP-SGD at every hospital with Opacus: per-sample clipping, Gaussian noise,
Poisson sampling, Opacus's RDP accountant), ``central`` (Flower's server-side fixed-clipping
wrapper around FedAvg: each hospital's update clipped, Gaussian noise on the mean, Flower's RDP
accountant), ``both``, or ``off`` (the default: nothing changes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from hospitrust.contribution.options import ContributionScoringOptions
from hospitrust.extras import extra_problem
from hospitrust.options import Options

#: The modes that run DP-SGD at the hospitals, and those that add noise at the server.
LOCAL_MODES = ("local", "both")
CENTRAL_MODES = ("central", "both")
#: The run-config section of differential privacy (the round feature ``hospitrust.features.privacy``).
SECTION = "privacy"


class PrivacyOptions(Options):
    """Differential privacy: DP-SGD at each hospital (local), Gaussian noise on the mean at the
    server (central), or both; off by default.
    """

    mode: Literal["off", "local", "central", "both"] = Field("off", description=(
        "off; local: DP-SGD at every hospital (Opacus: per-sample clipping, noise, Poisson sampling); central: "
        "Flower's server-side clipping and noise on FedAvg's mean; both. See docs/privacy.md."
    ))
    target_epsilon: float = Field(8.0, description=(
        "Local DP: the epsilon each hospital spends over this run's num-server-rounds; its noise multiplier is "
        "calibrated for it from its own training-set size, batch-size and local-epochs (unless noise-multiplier "
        "is set). Must be > 0."
    ))
    delta: float = Field(1e-5, description=(
        "The delta of every (epsilon, delta) reported, local and central; in (0, 1), and below 1 / (a "
        "hospital's training-set size) (checked for every hospital before training)."
    ))
    noise_multiplier: float = Field(0.0, ge=0.0, description=(
        "Local DP: the noise multiplier sigma of DP-SGD (noise std = sigma x max-grad-norm); 0: calibrated for "
        "target-epsilon."
    ))
    max_grad_norm: float = Field(1.0, gt=0.0, description="Local DP: each example's gradient is clipped to this L2 norm.")
    central_noise_multiplier: float = Field(1.0, gt=0.0, description=(
        "Central DP: the noise multiplier z; the mean of n clipped updates gets Gaussian noise of std "
        "z x central-clipping-norm / n."
    ))
    central_clipping_norm: float = Field(1.0, gt=0.0, description=(
        "Central DP: each hospital's update (returned model - global model) is clipped to this L2 norm by the "
        "server."
    ))

    @field_validator("target_epsilon")
    @classmethod
    def _epsilon(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"epsilon must be > 0 (got {v}): epsilon 0 or less would promise that the model learns "
                             "nothing from any patient")
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"delta must lie in (0, 1) (got {v}): it is the probability that the epsilon guarantee "
                             "fails; a common choice is below 1 / (training-set size)")
        return v

    @property
    def local(self) -> bool:
        return self.mode in LOCAL_MODES

    @property
    def central(self) -> bool:
        return self.mode in CENTRAL_MODES


def check_privacy_settings(cfg: Any) -> list[str]:
    """What cannot work with differential privacy in this run config; messages name the keys.

    Parameters
    ----------
    cfg : RunConfig
        The parsed run config (duck-typed: ``options(section)``, ``strategy``, ``rule`` (its class), ``model``,
        ``image_size``).

    Returns
    -------
    list[str]
        One message per problem (empty when the settings fit together).
    """
    privacy = cfg.section(PrivacyOptions)
    if privacy.mode == "off":
        return []
    mode = f"privacy.mode = {privacy.mode!r}"
    # Opacus trains (local) and checks the model (both modes), dp-accounting counts central DP's epsilon: at the
    # server and at every hospital the run config is checked, one line instead of an ImportError in a round
    if (missing := extra_problem("dp", mode)) is not None:
        return [missing]
    out: list[str] = []
    rule = cfg.rule
    reasons = []
    if privacy.local and not rule.local_dp_compatible:
        reasons.append(rule.why_not("local_dp_compatible", "its hospitals do not train as Opacus's DP-SGD accounts "
                                                           "for; use fedavg"))
    if privacy.central and not rule.central_dp_compatible:
        # the equal-weight mean of n clipped updates has sensitivity clipping-norm / n: Flower's noise is for that
        reasons.append(rule.why_not(
            "central_dp_compatible", "central DP's noise (z x clipping-norm / n) is calibrated for the equal-weight "
            "mean of n clipped updates, which only fedavg computes; a rule that selects or reweighs hospitals has "
            "another sensitivity. Use strategy 'fedavg', or privacy.mode 'local' (DP-SGD at each hospital works under "
            "every rule)"))
    out += [f"{mode} with strategy {cfg.strategy!r}: {reason}" for reason in dict.fromkeys(reasons)]
    if privacy.central:
        if cfg.options("secagg").enabled:
            out.append(f"{mode} with secagg.enabled: Flower's server-side clipping must see each hospital's update, "
                       "which SecAgg+ hides from the server; use privacy.mode 'local' with SecAgg+ (each hospital "
                       "noises its own training)")
        if cfg.section(ContributionScoringOptions).enabled:
            out.append(f"{mode} with contribution-scoring.enabled: the scores assume the aggregate is the weighted "
                       "mean of the updates, which central noise changes; disable one of them")
    # local: per-sample gradients; central: noise on every array (BatchNorm's integer counter cannot take it)
    problem = opacus_model_problem(cfg.model, cfg.image_size)
    if problem:
        out.append(f"model = {cfg.model!r} with {mode}: {problem}")
    return out



def opacus_model_problem(model: str, image_size: int) -> str:
    """Why Opacus cannot train ``model`` with per-sample gradients ('' when it can)."""
    from hospitrust.privacy.local import model_problem

    return model_problem(model, image_size)


__all__ = ["CENTRAL_MODES", "LOCAL_MODES", "PrivacyOptions", "SECTION", "check_privacy_settings", "opacus_model_problem"]

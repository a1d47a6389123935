"""Run config keys of the attacks, as a standalone pydantic model.

The run config uses kebab-case keys (``malicious-fraction``); fields are snake_case
(``malicious_fraction``). ``extra="ignore"``: build it from the full flat run config with
:meth:`AttackSettings.from_run_config`; keys that are not attack keys are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


def parse_int_list(raw: str, what: str, *, minimum: int = 0) -> tuple[int, ...]:
    """``"1, 3,5"`` -> ``(1, 3, 5)``; ``""`` -> ``()``; ValueError names the bad item."""
    out: list[int] = []
    for part in str(raw).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not an integer (expected comma-separated integers)") from None
        if v < minimum:
            raise ValueError(f"{what}: {v} must be >= {minimum}")
        if v in out:
            raise ValueError(f"{what}: {v} is listed twice")
        out.append(v)
    return tuple(out)


class AttackSettings(BaseModel):
    """Every attack key of the run config, with defaults and bounds."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    attack: str = Field("none", description="Attack by registry name, 'package.module:Class' (plugin), or 'none'.")
    malicious_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="Share of hospitals that are malicious (fixed set drawn by seed; >0 gives at least 1).")
    malicious_hospitals: str = Field("", description="Comma-separated malicious hospital indices (instead of malicious-fraction).")
    attack_target: int = Field(0, ge=0, description="Target class (label-flip all-to-one / source-to-target, backdoor).")
    attack_source: int = Field(1, ge=0, description="Source class (label-flip source-to-target).")
    attack_gamma: float = Field(10.0, gt=0.0, description="Scaling factor (scaling / model replacement; ~ n / server lr).")
    attack_z: float = Field(1.0, description="ALIE z (mean - z * std); sweep 0.5, 1.0, 1.5.")
    attack_eps: float = Field(0.5, ge=0.0, description="IPM epsilon (-eps * honest mean).")
    attack_sigma: float = Field(1.0, ge=0.0, description="Gaussian attack standard deviation.")
    attack_free_rider_noise: float = Field(0.0, ge=0.0, description="Free-rider disguise noise std (0: exact zero update).")
    attack_severity: int = Field(5, ge=1, le=5, description="Corruption severity 1..5.")
    attack_corruption: Literal["gaussian_noise", "blur", "contrast", "occlusion"] = Field(
        "gaussian_noise", description="Corruption kind (kebab-case accepted)."
    )
    attack_poison_fraction: float = Field(0.5, ge=0.0, le=1.0, description="Share of a backdoor attacker's samples poisoned.")
    attack_patch_size: int = Field(3, ge=1, description="Backdoor trigger side in pixels (bottom-right square, value 255).")
    attack_noise_rate: float = Field(0.2, ge=0.0, le=1.0, description="Label-noise rate (careless hospital).")
    attack_perturbation: Literal["std", "unit", "sign"] = Field("std", description="Min-Max/Min-Sum perturbation direction.")
    attack_copy_noise: float = Field(0.0, ge=0.0, description="ALIE, IPM, min-max, min-sum: each attacker adds its own random noise of this norm (relative to the crafted update) so the copies are not identical (two copies then have cosine about 1 / (1 + x^2)): the adaptive answer to hta-merge-duplicates. 0: exact copies.")
    attack_mimic_index: int = Field(0, ge=0, description="Mimic: row of the honest stack to copy.")
    attack_sybil_base: str = Field("mean", description="Sybil: 'mean' or the name of an update/colluding attack the copies send.")
    attack_start_round: int = Field(0, ge=0, description="Honest for this many rounds first (0: attack from round 1).")
    attack_period: int = Field(0, ge=0, description="On-off period in rounds (0: always on).")
    attack_on_for: int = Field(1, ge=1, description="On-off: attacking rounds at the end of each period.")
    attack_on_rounds: str = Field("", description="Comma-separated rounds to attack in ('': all).")
    label_flip_mode: Literal["all-to-one", "source-to-target", "permutation"] = Field(
        "all-to-one", description="Label-flip mode."
    )

    @classmethod
    def from_run_config(cls, mapping: Mapping[str, Any]) -> "AttackSettings":
        """Build from a flat run config (kebab-case keys; other keys are ignored).
        Raises ValueError naming the key and value on a bad value."""
        data = {str(k).replace("-", "_"): v for k, v in mapping.items()}
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            lines = ["invalid attack settings:"]
            for e in err.errors():
                loc = e.get("loc") or ()
                key = str(loc[0]).replace("_", "-") if loc else "(config)"
                msg = e["msg"].removeprefix("Value error, ")
                lines.append(f"  - {key} = {e.get('input')!r}: {msg}" if loc else f"  - {msg}")
            raise ValueError("\n".join(lines)) from None

    def to_flat(self) -> dict[str, Any]:
        """The kebab-case dict (run config form)."""
        return {k.replace("_", "-"): v for k, v in self.model_dump().items()}

    # ---- validators ------------------------------------------------------------
    @field_validator("attack_corruption", mode="before")
    @classmethod
    def _corruption(cls, v: Any) -> Any:
        return v.replace("-", "_") if isinstance(v, str) else v

    @field_validator("attack")
    @classmethod
    def _attack(cls, v: str) -> str:
        v = v.strip()
        if v == "none" or ":" in v:
            if ":" in v:
                mod, _, attr = v.partition(":")
                if not mod or not attr:
                    raise ValueError(f"plugin attack must look like 'package.module:ClassName', got {v!r}")
            return v
        from hospitrust.attacks.registry import ATTACKS

        if v not in ATTACKS:
            raise ValueError(
                f"unknown attack {v!r}; allowed: none, {', '.join(sorted(ATTACKS))}, or 'package.module:ClassName'"
            )
        return v

    @field_validator("attack_sybil_base")
    @classmethod
    def _sybil_base(cls, v: str) -> str:
        v = v.strip()
        if v == "mean":
            return v
        from hospitrust.attacks.registry import ATTACKS, KINDS

        if v not in ATTACKS or v == "sybil" or KINDS.get(v) == "data":
            allowed = sorted(k for k, kind in KINDS.items() if kind != "data" and k != "sybil")
            raise ValueError(f"sybil base must be 'mean' or one of {', '.join(allowed)}, got {v!r}")
        return v

    @field_validator("malicious_hospitals")
    @classmethod
    def _hospitals(cls, v: str) -> str:
        parse_int_list(v, "malicious-hospitals", minimum=0)
        return v

    @field_validator("attack_on_rounds")
    @classmethod
    def _on_rounds(cls, v: str) -> str:
        parse_int_list(v, "attack-on-rounds", minimum=1)
        return v

    @field_validator("attack_z", "attack_gamma", "attack_eps", "attack_sigma", "attack_free_rider_noise",
                     "attack_copy_noise")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "AttackSettings":
        if self.malicious_fraction > 0 and self.hospital_indices:
            raise ValueError("set either malicious-fraction or malicious-hospitals, not both")
        if self.attack_on_rounds.strip() and self.attack_period > 0:
            raise ValueError("set either attack-on-rounds or attack-period (on-off schedule), not both")
        if self.attack_period > 0 and self.attack_on_for > self.attack_period:
            raise ValueError(f"attack-on-for ({self.attack_on_for}) must be <= attack-period ({self.attack_period})")
        if self.label_flip_mode == "source-to-target" and self.attack == "label-flip" and self.attack_source == self.attack_target:
            raise ValueError(f"label-flip source-to-target needs attack-source != attack-target (both {self.attack_source})")
        return self

    # ---- conveniences ----------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.attack != "none"

    @property
    def hospital_indices(self) -> tuple[int, ...]:
        return parse_int_list(self.malicious_hospitals, "malicious-hospitals", minimum=0)

    @property
    def on_rounds(self) -> frozenset[int]:
        return frozenset(parse_int_list(self.attack_on_rounds, "attack-on-rounds", minimum=1))

    def build(self):
        """The configured attack (with its schedule), or None when ``attack == "none"``."""
        from hospitrust.attacks.registry import build_attack

        return build_attack(self.attack, self)


def malicious_set(num_hospitals: int, settings: AttackSettings | Mapping[str, Any], seed: int) -> frozenset[int]:
    """The fixed set of malicious hospital indices (0-based partition ids).

    * ``malicious-hospitals`` given: exactly those (each must be < ``num_hospitals``);
    * else ``malicious-fraction`` f > 0: ``max(1, round(f * n))`` indices drawn without
      replacement by ``seed`` (deterministic; at least one hospital stays honest);
    * else the empty set.

    The set is fixed for the whole run (not resampled per round).
    """
    if not isinstance(settings, AttackSettings):
        settings = AttackSettings.from_run_config(settings)
    if isinstance(num_hospitals, bool) or int(num_hospitals) != num_hospitals or num_hospitals < 1:
        raise ValueError(f"num_hospitals must be an integer >= 1, got {num_hospitals!r}")
    n = int(num_hospitals)
    named = settings.hospital_indices
    if named and settings.malicious_fraction > 0:
        raise ValueError("set either malicious-fraction or malicious-hospitals, not both")
    if named:
        bad = [h for h in named if h >= n]
        if bad:
            raise ValueError(f"malicious-hospitals {bad} out of range: hospitals are 0..{n - 1}")
        return frozenset(named)
    f = settings.malicious_fraction
    if f <= 0:
        return frozenset()
    m = max(1, int(round(f * n)))
    if m >= n:
        raise ValueError(
            f"malicious-fraction {f} of {n} hospitals makes {m} malicious, leaving no honest hospital"
        )
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xA77AC]))
    return frozenset(int(i) for i in rng.choice(n, size=m, replace=False))


__all__ = ["AttackSettings", "malicious_set", "parse_int_list"]

"""The node config: what a SuperNode tells its ClientApp (``--node-config``).

Simulation injects ``partition-id`` and ``num-partitions``; a hospital's real SuperNode passes
``data-path`` (its own images) and ``hospital`` (its name), and a red team's simulated attacker
``malicious = true``.
"""

from __future__ import annotations

import functools

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from hospitrust.errors import ConfigError, HospitalError, did_you_mean
from hospitrust.options import Options, OptionsError, memo_key


class NodeConfigError(HospitalError, ConfigError):
    """A bad node config: the public text names the keys and what is wrong, the detail also their
    values (a data-path or cache-dir value is a path on the hospital's machine).
    """


class NodeConfig(Options):
    """A hospital's node config, validated."""

    partition_id: int | None = Field(None, ge=0, description=(
        "Simulation: this hospital's partition of the training split."
    ))
    num_partitions: int | None = Field(None, ge=1, description="Simulation: the number of partitions (hospitals).")
    data_path: str | None = Field(None, description=(
        "A hospital's own images: a folder of class folders (images or DICOM), a CSV manifest or a .npz archive."
    ))
    data_format: str = Field("auto", description="How data-path is laid out: auto (detected), folder, csv or npz.")
    cache_dir: str | None = Field(None, description=(
        "Where decoded images are cached (default $HOSPITRUST_CACHE_DIR, else ~/.cache/hospitrust/images)."
    ))
    skip_unreadable: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "The share of the hospital's listed files that may be unreadable (or, in a manifest, missing) and is then "
        "left out: 0.05 skips up to 5 %. The count skipped is reported, never the names. 0 (default): any such "
        "file leaves the hospital out of the run, with the reason."
    ))
    hospital: str | None = Field(None, description="The hospital's name, as the federation records it.")
    malicious: bool | None = Field(None, description=(
        "A red team's hospital that carries out the run's attack (deployment tests)."
    ))
    privacy_max_epsilon: float | None = Field(None, description=(
        "The hospital's own privacy budget: the most epsilon local DP may spend on its data, summed over every "
        "round of every run (its ledger); the ClientApp refuses to train a round that would pass it. Unset: no cap "
        "(the spending is still kept)."
    ))
    privacy_ledger: str | None = Field(None, description=(
        "The JSON file that keeps the hospital's privacy spending, keyed by its data's content hash (default "
        "$HOSPITRUST_PRIVACY_LEDGER, else ~/.local/share/hospitrust/privacy-ledger.json; a simulated hospital keeps "
        "one only when this is set)."
    ))

    @field_validator("privacy_max_epsilon")
    @classmethod
    def _max_epsilon(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"epsilon must be > 0 (got {v}): a budget of 0 or less allows no training at all; leave "
                             "the key out for no cap")
        return v

    @field_validator("data_format")
    @classmethod
    def _format(cls, v: str) -> str:
        from hospitrust.datasets.local import FORMATS

        if v not in FORMATS:
            raise ValueError(f"data-format {v!r}; allowed: {', '.join(FORMATS)}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "NodeConfig":
        if self.data_path is None and (self.partition_id is None or self.num_partitions is None):
            raise ValueError(
                "node config needs either data-path (a hospital's own images: class folders, a CSV manifest or a .npz) "
                "or partition-id and num-partitions (simulation)"
            )
        if self.partition_id is not None and self.num_partitions is not None and self.partition_id >= self.num_partitions:
            raise ValueError(f"partition-id {self.partition_id} must be < num-partitions {self.num_partitions}")
        return self

    @property
    def hospital_name(self) -> str:
        if self.hospital:
            return str(self.hospital)
        return f"hospital-{self.partition_id}"


def parse_node_config(raw: Mapping[str, Any]) -> NodeConfig:
    """Validate a node config; ConfigError naming each bad key (unknown keys with a "did you mean")."""
    try:
        return NodeConfig.from_flat(dict(raw))  # type: ignore[return-value]
    except OptionsError as err:
        known = list(NodeConfig.flat_fields())
        lines, public = [], []
        for key, value, msg in err.problems:
            if msg == "unknown key":
                lines.append(f"  - unknown key {key!r}{did_you_mean(key, known)} (known: {', '.join(known)})")
                public.append(lines[-1])
            else:
                lines.append(f"  - {key} = {value!r}: {msg}" if key else f"  - {msg}")
                public.append(f"  - {key}: {msg}" if key else f"  - {msg}")
        raise NodeConfigError("invalid node config:\n" + "\n".join(public),
                              "invalid node config:\n" + "\n".join(lines)) from None


@functools.lru_cache(maxsize=4096)
def _memoised_node_config(items: tuple) -> NodeConfig:
    return parse_node_config(dict(items))


def memoised_node_config(raw: Mapping[str, Any]) -> NodeConfig:
    """:func:`parse_node_config`, memoised on the values (one entry per simulated hospital)."""
    items = memo_key(raw)
    return parse_node_config(raw) if items is None else _memoised_node_config(items)

"""A hospital's site policy: what its SuperNode accepts, whatever a run config asks.

One TOML file on the hospital's machine (``hospitrust deploy supernode --policy PATH``), checked by the
warm launcher before any code of the run's app bundle is imported: from the message's type, its
``config`` record and the run config, nothing else. An unset rule allows anything.

```toml
max-local-epochs = 5
max-batch-size = 64
max-images-per-round = 20000   # local epochs x the images the run trains on (this hospital's count x train-subsample)
require-local-dp = true
max-epsilon = 8.0
min-hospitals = 3              # needs SecAgg+: a count the server merely states is not a guarantee
messages = ["query", "train", "evaluate"]   # "contribution": evaluate messages asking for contribution scores
allow-attacks = false          # runs that configure a simulated attack (red-team exercises)
tasks = ["chest-xray"]
classes = ["normal", "pneumonia"]
max-signature-age-days = 90    # a consortium signature older than this is refused
```
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from hospitrust.options import Options
from hospitrust.errors import DeployError

MessageKind = Literal["query", "train", "evaluate", "contribution"]
ALL_KINDS: tuple[MessageKind, ...] = ("query", "train", "evaluate", "contribution")
CONTRIBUTION_KEY = "contribution-weight"  # hospitrust.contribution.interface.WEIGHT_KEY: an evaluate asking for scores
TASK_KEY = "task"  # hospitrust.tasks.task.TASK_KEY: the task the server sends with its messages


class SitePolicy(Options):
    """What this hospital accepts (every rule optional)."""

    max_local_epochs: int | None = Field(None, ge=1, description="The most local epochs a train message may ask for.")
    max_batch_size: int | None = Field(None, ge=1, description="The largest batch size.")
    max_images_per_round: int | None = Field(None, ge=1, description=(
        "The most images a round may train on: local epochs x this hospital's images x train-subsample."))
    require_local_dp: bool = Field(False, description="Train only with local differential privacy (privacy.mode local or both).")
    max_epsilon: float | None = Field(None, gt=0, description="The largest local-DP target epsilon a run may set.")
    min_hospitals: int | None = Field(None, ge=2, description=(
        "The fewest hospitals an aggregation may have; requires SecAgg+ (secagg.enabled) and a run min-hospitals "
        "at least this large."))
    messages: list[MessageKind] = Field(default_factory=lambda: list(ALL_KINDS),
                                        description="The message kinds this hospital answers.")
    allow_attacks: bool = Field(False, description="Accept runs that configure a simulated attack.")
    tasks: list[str] = Field(default_factory=list, description="The task names this hospital joins (empty: any).")
    classes: list[str] = Field(default_factory=list, description="The classes it agrees to train on (empty: any).")
    max_signature_age_days: float | None = Field(None, gt=0, description="A consortium signature older than this is refused.")


def load_policy(path: Path) -> SitePolicy:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DeployError(f"site policy {path} not found")
    try:
        raw = tomllib.loads(path.read_text())
        return SitePolicy.model_validate(raw)
    except tomllib.TOMLDecodeError as exc:
        raise DeployError(f"site policy {path}: not valid TOML ({exc})") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in exc.errors())
        raise DeployError(f"site policy {path}: {problems}") from None


def message_kind(message_type: str, config: Mapping[str, object]) -> str:
    kind = message_type.split(".", 1)[0]
    return "contribution" if kind == "evaluate" and CONTRIBUTION_KEY in config else kind


def _number(values: Mapping[str, object], key: str, default: object = None) -> float | None:
    value = values.get(key, default)
    try:
        return float(value) if value is not None and value != "" else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


SECAGG_CONFIGS, SECAGG_STAGE, SHARE_KEYS = "secaggplus_configs", "stage", "share_keys"  # flwr's SecAgg+ constants


def refusal(policy: SitePolicy, message_type: str, config: Mapping[str, object], run_config: Mapping[str, object], *,
            hospital_images: int | None = None, secagg: Mapping[str, object] | None = None) -> str | None:
    """None when the policy accepts this message, else the rule it breaks (said to the server and in the audit).

    ``secagg`` is the message's SecAgg+ config record, when it has one: at its key-sharing stage it lists the
    public keys of every hospital the masked sum will cover, the one count a hospital can check itself.
    """
    kind = message_kind(message_type, config)
    if kind not in policy.messages:
        return f"messages: {kind} messages are not answered here"
    attack = str(run_config.get("attack", "none") or "none")
    if attack != "none" and not policy.allow_attacks:
        return f"allow-attacks: the run configures attack {attack!r}"
    task = _task(config, run_config)
    if policy.tasks and task[0] not in policy.tasks:
        return f"tasks: task {task[0]!r} is not one this hospital joins"
    if policy.classes and task[1] and not set(task[1]) <= set(policy.classes):
        return f"classes: {sorted(set(task[1]) - set(policy.classes))} not agreed"
    mode = str(run_config.get("privacy.mode", "off"))
    if policy.require_local_dp and mode not in ("local", "both"):
        return f"require-local-dp: the run trains with privacy.mode {mode!r}"
    if policy.max_epsilon is not None and mode in ("local", "both"):
        eps = _number(run_config, "privacy.target-epsilon")
        if eps is None or eps > policy.max_epsilon:
            return f"max-epsilon: the run's target epsilon {eps} > {policy.max_epsilon:g}"
    if policy.min_hospitals is not None:
        if not bool(run_config.get("secagg.enabled", False)):
            return f"min-hospitals: {policy.min_hospitals} needs SecAgg+ (secagg.enabled), the only count a hospital can check"
        stated = _number(run_config, "min-hospitals")
        if stated is None or stated < policy.min_hospitals:
            return f"min-hospitals: the run's min-hospitals {stated} < {policy.min_hospitals}"
        if secagg is not None and secagg.get(SECAGG_STAGE) == SHARE_KEYS:
            peers = sum(1 for k in secagg if k != SECAGG_STAGE)  # this hospital's key among them
            if peers < policy.min_hospitals:
                return f"min-hospitals: SecAgg+ shares keys among {peers} hospitals < {policy.min_hospitals}"
    if kind == "train":
        epochs = _number(config, "local-epochs", run_config.get("local-epochs"))
        batch = _number(config, "batch-size", run_config.get("batch-size"))
        if policy.max_local_epochs is not None and (epochs is None or epochs > policy.max_local_epochs):
            return f"max-local-epochs: {epochs:g} > {policy.max_local_epochs}" if epochs else "max-local-epochs: not stated"
        if policy.max_batch_size is not None and (batch is None or batch > policy.max_batch_size):
            return f"max-batch-size: {batch:g} > {policy.max_batch_size}" if batch else "max-batch-size: not stated"
        if policy.max_images_per_round is not None:
            if hospital_images is None:
                return "max-images-per-round: this hospital's image count is unknown (start it with its data check)"
            share = _number(run_config, "train-subsample", 1.0) or 1.0
            images = (epochs or 1) * hospital_images * min(share, 1.0)
            if images > policy.max_images_per_round:
                return f"max-images-per-round: {images:.0f} > {policy.max_images_per_round}"
    return None


def _task(config: Mapping[str, object], run_config: Mapping[str, object]) -> tuple[str, list[str]]:
    """The task's name and classes: from the message (the server sends the resolved task), else the run config."""
    text = config.get(TASK_KEY)
    if isinstance(text, str):
        try:
            raw = json.loads(text)
            return str(raw.get("name", "")), [str(c) for c in raw.get("class_names", [])]
        except (ValueError, AttributeError):
            return "", []
    classes = [c.strip() for c in str(run_config.get("task.classes", "")).split(",") if c.strip()]
    return str(run_config.get("task.name") or run_config.get("dataset") or ""), classes


def describe(policy: SitePolicy) -> str:
    """What the policy allows, one line a rule, in the file's own key names."""
    lines = []
    for name, field in SitePolicy.model_fields.items():
        value = getattr(policy, name)
        key = name.replace("_", "-")
        if value is None or value == [] or (name == "messages" and list(value) == list(ALL_KINDS)):
            shown = "any" if name not in ("allow_attacks", "require_local_dp") else str(value).lower()
        else:
            shown = ", ".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else f"{value:g}"
        lines.append(f"  {key:<24} {shown:<20} {field.description}")
    return "\n".join(lines)

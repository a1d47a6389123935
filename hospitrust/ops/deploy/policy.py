"""A hospital's site policy: what its SuperNode accepts, whatever a run config asks.

One TOML file on the hospital's machine (``hospitrust deploy supernode --policy PATH``), checked by the
warm launcher before any code of the run's app bundle is imported: from the message's type, its
``config`` record and the run config, nothing else. An unset rule allows anything.

```toml
max-local-epochs = 5
max-batch-size = 64
max-images-per-round = 20000   # local epochs x this hospital's images (its data check; train-subsample does not apply),
                               # summed over the train messages of a run's round (RoundLedger)
max-images-per-run = 200000    # the same, summed over every round of a run
require-local-dp = true
max-epsilon = 8.0
min-hospitals = 3              # SecAgg+ key entries: the server makes that list (see docs/security.md)
messages = ["query", "train", "evaluate"]   # "contribution": evaluate messages asking for contribution scores
allow-attacks = false          # runs that configure a simulated attack (red-team exercises)
tasks = ["chest-xray"]
classes = ["normal", "pneumonia"]
max-signature-age-days = 90    # a consortium signature older than this is refused
max-cpu-seconds = 3600         # an approved ClientApp's limits, set by the launcher on its child
max-memory-mb = 16384
max-wall-seconds = 7200
```

:func:`resolve` turns a message into the values the ClientApp will use (:class:`Agreed`): the gate checks the
policy against those and hands them to the ClientApp (``context.node_config[GATE_KEY]``), which uses them and
nothing else, so what was checked is what runs.

``max-images-per-round`` holds for a round, not for one message: :class:`RoundLedger` (a file of the service user's,
0600, updated under a lock and replaced atomically) keeps the images each accepted train message of a run's round
trains on, and the gate refuses a message that would take the round past the limit (issue 61, finding 4: a ServerApp
sending three train messages in one round got three accepted). The round is the server's number: a ServerApp that
numbers each message as a new round gets the round's limit once per message; ``max-images-per-run`` bounds what a
run trains here, whatever its rounds are numbered (the same ledger sums a run's rounds).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, cast

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
        "The most images a round may train on: local epochs x this hospital's images (its data check's count; "
        "train-subsample does not apply to a hospital's own data), summed over the round's train messages."))
    max_images_per_run: int | None = Field(None, ge=1, description=(
        "The most images a run may train on here, summed over all its rounds' train messages (however the server "
        "numbers its rounds)."))
    require_local_dp: bool = Field(False, description="Train only with local differential privacy (privacy.mode local or both).")
    max_epsilon: float | None = Field(None, gt=0, description="The largest local-DP target epsilon a run may set.")
    min_hospitals: int | None = Field(None, ge=2, description=(
        "The fewest public-key entries SecAgg+'s key-sharing stage must list (requires secagg.enabled and a run "
        "min-hospitals at least this large). The server makes that list: it holds against a server running Flower's "
        "SecAgg+ unmodified, not against one that adds keys it made itself."))
    messages: list[MessageKind] = Field(default_factory=lambda: list(ALL_KINDS),
                                        description="The message kinds this hospital answers.")
    allow_attacks: bool = Field(False, description="Accept runs that configure a simulated attack.")
    tasks: list[str] = Field(default_factory=list, description="The task names this hospital joins (empty: any).")
    classes: list[str] = Field(default_factory=list, description="The classes it agrees to train on (empty: any).")
    max_signature_age_days: float | None = Field(None, gt=0, description="A consortium signature older than this is refused.")
    max_cpu_seconds: int | None = Field(None, ge=1, description=(
        "CPU seconds one ClientApp may use (RLIMIT_CPU, set by the launcher on its child before the bundle "
        "is imported, on every process it starts too; all threads count), and all its processes together (its "
        "keeper sums them): past it the process, or the whole tree, is ended and the message fails."))
    max_memory_mb: int | None = Field(None, ge=64, description=(
        "Memory one ClientApp process may allocate, in MiB (RLIMIT_DATA: its heap and private writable mappings, "
        "the ~1.1 GiB it inherits from the warm launcher included; not its resident size; set like max-cpu-seconds); "
        "past it an allocation fails."))
    max_wall_seconds: float | None = Field(None, gt=0, description=(
        "Seconds one ClientApp may run: the launcher ends it and every process it started (SIGKILL) past this, and "
        "the audit entry says so."))

    def child_limits(self) -> ChildLimits:
        return ChildLimits(self.max_cpu_seconds, self.max_memory_mb, self.max_wall_seconds)


@dataclass(frozen=True)
class ChildLimits:
    """What the launcher sets on a ClientApp's process (the site policy's ``max-cpu-seconds``, ``max-memory-mb``,
    ``max-wall-seconds``; None: no limit).
    """

    cpu_seconds: int | None = None
    memory_mb: int | None = None
    wall_seconds: float | None = None

    def apply(self) -> None:
        """Set the CPU and memory limits on this process (the forked child, before it imports the bundle).

        CPU: the kernel sends SIGXCPU at ``cpu_seconds`` (which ends the process) and SIGKILL one second later (a
        process that catches SIGXCPU); memory: soft and hard alike. A process without CAP_SYS_RESOURCE cannot raise
        a hard limit, so the bundle's code cannot lift them (a ClientApp running as root could: see
        ``deploy supernode --clientapp-user``).
        """
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of a ClientApp (SIGXCPU dumps one): it holds images
        if self.cpu_seconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds + 1))
        if self.memory_mb is not None:
            limit = self.memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


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


COUNT_KEYS = ("local-epochs", "batch-size")  # what a train message states as counts (the message's, else the run's)


def count_refusal(message_type: str, config: Mapping[str, object], run_config: Mapping[str, object]) -> str | None:
    """None unless a train message states a count that is not one: local epochs or batch size NaN, infinite, below 1
    or not a number. Then the key, the value and what was expected. The gate checks it with or without a site policy:
    NaN made the gate raise before it decided (no reply, no decision on the record), and no rule can compare it.
    """
    if message_kind(message_type, config) != "train":
        return None
    for key in COUNT_KEYS:
        value = config.get(key, run_config.get(key))
        if value is None or value == "":
            continue  # not stated: the ClientApp's default
        stated = _number(config, key, run_config.get(key))
        if isinstance(value, bool) or stated is None or not (math.isfinite(stated) and stated >= 1):
            shown = f"{stated:g}" if stated is not None and not isinstance(value, bool) else repr(value)
            return f"{key}: {shown} is not a finite positive integer (expected a count of at least 1)"
    return None


SECAGG_CONFIGS, SECAGG_STAGE, SHARE_KEYS = "secaggplus_configs", "stage", "share_keys"  # flwr's SecAgg+ constants
#: SecAgg+'s stages whose train message trains nothing (Flower's secaggplus_mod answers them without the train handler)
KEY_STAGES = ("setup", SHARE_KEYS, "unmask")


def trains(message_type: str, config: Mapping[str, object], secagg: Mapping[str, object] | None = None) -> bool:
    """Whether the ClientApp trains on this hospital's images for this message: a train message, but for SecAgg+'s key
    stages (``secagg``: the message's SecAgg+ config record; its collect-masked-vectors stage trains).
    """
    if message_kind(message_type, config) != "train":
        return False
    return not (secagg is not None and secagg.get(SECAGG_STAGE) in KEY_STAGES)


def refusal(policy: SitePolicy, message_type: str, config: Mapping[str, object], run_config: Mapping[str, object], *,
            hospital_images: int | None = None, secagg: Mapping[str, object] | None = None,
            remembered_task: str | None = None, agreed: Agreed | None = None) -> str | None:
    """None when the policy accepts this message, else the rule it breaks (said to the server and in the audit).

    The rules are checked against :func:`resolve`'s values (``agreed``, or resolved here from the same inputs), the
    ones the ClientApp will use. ``secagg`` is the
    message's SecAgg+ config record, when it has one: at its key-sharing stage it lists one public-key entry per
    hospital the masked sum will cover, as the server states it (it can add entries: see ``min-hospitals``).
    """
    kind = message_kind(message_type, config)
    if kind not in policy.messages:
        return f"messages: {kind} messages are not answered here"
    attack = str(run_config.get("attack", "none") or "none")
    if attack != "none" and not policy.allow_attacks:
        return f"allow-attacks: the run configures attack {attack!r}"
    if agreed is None:
        agreed = resolve(message_type, config, run_config, hospital_images=hospital_images, remembered_task=remembered_task)
    if (policy.tasks or policy.classes) and not agreed.task:
        return ("tasks: the message names no task (this hospital's policy names "
                f"{'its tasks' if policy.tasks else 'its classes'}; the server sends the task with its messages)")
    if agreed.task and not agreed.task_name and (policy.tasks or policy.classes):
        return "tasks: the message's task is not a task description"
    if policy.tasks and agreed.task_name not in policy.tasks:
        return f"tasks: task {agreed.task_name!r} is not one this hospital joins"
    if policy.classes and not agreed.classes:
        return f"classes: task {agreed.task_name!r} names no classes"
    if policy.classes and not set(agreed.classes) <= set(policy.classes):
        return f"classes: {sorted(set(agreed.classes) - set(policy.classes))} not agreed"
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
            # the key entries the server lists, this hospital's among them: the server makes this list, so it can add
            # entries of key pairs it made itself (docs/security.md: what a hospital can and cannot verify)
            entries = sum(1 for k in secagg if k != SECAGG_STAGE)
            if entries < policy.min_hospitals:
                return f"min-hospitals: SecAgg+ shares keys among {entries} key entries < {policy.min_hospitals}"
    if kind == "train":
        if (bad := count_refusal(message_type, config, run_config)) is not None:
            return bad
        epochs, batch = agreed.local_epochs, agreed.batch_size
        if policy.max_local_epochs is not None and (epochs is None or epochs > policy.max_local_epochs):
            return f"max-local-epochs: {epochs} > {policy.max_local_epochs}" if epochs else "max-local-epochs: not stated"
        if policy.max_batch_size is not None and (batch is None or batch > policy.max_batch_size):
            return f"max-batch-size: {batch} > {policy.max_batch_size}" if batch else "max-batch-size: not stated"
        if policy.max_images_per_round is not None or policy.max_images_per_run is not None:
            key = "max-images-per-round" if policy.max_images_per_round is not None else "max-images-per-run"
            if agreed.images_per_epoch is None:
                return f"{key}: this hospital's image count is unknown (start it with its data check)"
            if epochs is None:
                return f"{key}: the local epochs are not stated"
            if policy.max_images_per_round is not None and agreed.images_per_round is not None and \
                    agreed.images_per_round > policy.max_images_per_round:
                return (f"max-images-per-round: {epochs} epochs x {agreed.images_per_epoch} images = "
                        f"{agreed.images_per_round} > {policy.max_images_per_round}")
    return None


@dataclass(frozen=True)
class Agreed:
    """What the ClientApp uses for one message, resolved by the gate before any of the bundle's code runs.

    The gate checks the policy against these values and writes them into ``context.node_config[GATE_KEY]``
    (:meth:`to_json`); a bundle that declares ``[tool.hospitrust] gate-values = 1`` uses them and nothing else.
    """

    task: str = ""  # the task's JSON (the message's, or the one accepted earlier in this run); "" when none was sent
    task_name: str = ""
    classes: tuple[str, ...] = ()
    local_epochs: int | None = None
    batch_size: int | None = None
    images_per_epoch: int | None = None  # the most images it trains on per epoch: its data check's count

    @property
    def images_per_round(self) -> int | None:
        if self.images_per_epoch is None or self.local_epochs is None:
            return None
        return self.local_epochs * self.images_per_epoch

    def to_json(self) -> str:
        return json.dumps({"version": GATE_VALUES_VERSION, **asdict(self)}, sort_keys=True)

    def summary(self) -> dict[str, object]:
        """The values for the audit log (the task by name and classes, not its whole description)."""
        return {"task": self.task_name, "classes": list(self.classes), "local-epochs": self.local_epochs,
                "batch-size": self.batch_size, "images-per-epoch": self.images_per_epoch,
                "images-per-round": self.images_per_round}


GATE_KEY = "hospitrust-gate"  # the node_config key the gate writes and a bundle that honours it reads
GATE_VALUES_VERSION = 1  # what a bundle declares in its pyproject.toml: [tool.hospitrust] gate-values = 1


def _int(value: float | None) -> int | None:
    if value is None or not math.isfinite(value):  # NaN or inf epochs: no count (count_refusal() refuses the message)
        return None
    return int(value)  # the ClientApp's own int(): 2.9 epochs train 2


def resolve(message_type: str, config: Mapping[str, object], run_config: Mapping[str, object], *,
            hospital_images: int | None = None, remembered_task: str | None = None) -> Agreed:
    """The values the ClientApp will use for this message.

    The task: the message's (the server resolves it once and sends it with its messages), else the task the gate
    accepted earlier in this run (``remembered_task``: SecAgg+'s key stages carry none), else none: with no task
    named in the policy the ClientApp then resolves it from the run config, as before; a policy that names tasks or
    classes refuses such a message. Epochs and batch size: the message's, else the run config's. Images per epoch:
    ``hospital_images``, every image of this hospital's data check (its own data: ``train-subsample`` applies to
    simulated hospitals only, and the validation split is counted too, so this is an upper bound).
    """
    text = config.get(TASK_KEY)
    task = text if isinstance(text, str) else (remembered_task or "")
    name, classes = "", cast(tuple[str, ...], ())
    if task:
        try:
            raw = json.loads(task)
            name, classes = str(raw.get("name", "")), tuple(str(c) for c in raw.get("class_names", []))
        except (ValueError, AttributeError, TypeError):
            name, classes = "", ()
    return Agreed(task=task, task_name=name, classes=classes,
                  local_epochs=_int(_number(config, "local-epochs", run_config.get("local-epochs"))),
                  batch_size=_int(_number(config, "batch-size", run_config.get("batch-size"))),
                  images_per_epoch=hospital_images)


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


LEDGER_VERSION = 1
LEDGER_RUNS = 64  # the runs a ledger keeps (the latest charged): an older run's count is dropped


class RoundLedger:
    """What this hospital trained in the latest round of each run, across that round's train messages: the count
    behind ``max-images-per-round`` (each message runs in its own forked ClientApp, so it is a file, not a variable).

    One JSON file, the service user's (0600 in a 0700 folder, like the audit log's state): for each (hospital, run)
    its latest round, the images the accepted train messages of that round train on, and those of all its rounds
    (``run_images``, behind ``max-images-per-run``; a file written before it was kept counts the latest round's). It is read and replaced
    (written, fsync'd, renamed) under an exclusive lock (``flock`` of ``PATH.lock``), so two messages in flight
    cannot both take the last of a round's images. It does not grow without bound: a run keeps only its latest round
    (a train message of an earlier round than the latest is refused: a round is not opened again), and only the
    ``LEDGER_RUNS`` runs charged last are kept.
    """

    def __init__(self, path: Path, keep_runs: int = LEDGER_RUNS) -> None:
        self.path, self.keep_runs = Path(path), keep_runs

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DeployError(f"site policy's round count {self.path}: cannot open it ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def load(self) -> list[dict]:
        """The entries (oldest charged first); a file this class did not write is a DeployError, never a fresh start
        (that would open every round's count again).
        """
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise DeployError(f"site policy's round count {self.path}: not readable ({exc}); it holds the images each "
                              "run's round has trained: move it aside only once no run is under way") from None
        entries = raw.get("rounds") if isinstance(raw, dict) and raw.get("v") == LEDGER_VERSION else None
        fields = {"hospital": str, "run": int, "round": int, "images": int}
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and all(isinstance(e.get(k), t) and not isinstance(e.get(k), bool) for k, t in fields.items())
                for e in entries):
            raise DeployError(f"site policy's round count {self.path}: not a file hospitrust wrote (edited or damaged); "
                              "it holds the images each run's round has trained: move it aside only once no run is "
                              "under way")
        return entries

    def _save(self, entries: list[dict]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps({"v": LEDGER_VERSION, "rounds": entries[-self.keep_runs:]}, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DeployError(f"site policy's round count {self.path}: cannot write it ({exc.strerror})") from None

    def charge(self, *, hospital: str, run_id: int, server_round: int, images: int, limit: int | None,
               run_limit: int | None = None) -> tuple[str | None, int]:
        """Add ``images`` to round ``server_round`` of ``run_id`` unless that takes the round past ``limit`` or the
        run past ``run_limit`` (None: no such limit): (None, the round's images now), or (the rule it breaks, naming
        the key, the count so far and the limit; the round's images so far), nothing added.
        """
        with self._locked():
            entries = self.load()
            mine = next((e for e in entries if e["hospital"] == hospital and e["run"] == run_id), None)
            if mine is not None and server_round < mine["round"]:
                return (f"max-images-per-round: round {server_round} of run {run_id} comes after its round "
                        f"{mine['round']} here; an earlier round's count is not opened again"), 0
            so_far = mine["images"] if mine is not None and mine["round"] == server_round else 0
            run_so_far = int(mine.get("run_images", mine["images"])) if mine is not None else 0
            if limit is not None and so_far + images > limit:
                return (f"max-images-per-round: round {server_round} of run {run_id} has trained {so_far} images here "
                        f"already; this message's {images} would make {so_far + images} > {limit}"), so_far
            if run_limit is not None and run_so_far + images > run_limit:
                return (f"max-images-per-run: run {run_id} has trained {run_so_far} images here already; this "
                        f"message's {images} would make {run_so_far + images} > {run_limit}"), so_far
            if mine is not None:
                entries.remove(mine)
            entries.append({"hospital": hospital, "run": run_id, "round": server_round, "images": so_far + images,
                            "run_images": run_so_far + images, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            self._save(entries)
            return None, so_far + images

    def refund(self, *, hospital: str, run_id: int, server_round: int, images: int) -> None:
        """Take back a charge whose message did not run after all (its ClientApp could not be confined)."""
        with self._locked():
            entries = self.load()
            for entry in entries:
                if entry["hospital"] == hospital and entry["run"] == run_id and entry["round"] == server_round:
                    entry["images"] = max(0, entry["images"] - images)
                    entry["run_images"] = max(0, int(entry.get("run_images", images)) - images)
                    self._save(entries)
                    return

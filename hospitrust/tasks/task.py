"""A task: what the federation learns. Its classes in label order, the image shape, the
normalization, the model, training augmentation and the clinically rare classes.

A run's task comes from one of three places, checked in this order:

1. ``task.file``: a TOML file (the keys of the ``task`` section, with lists allowed), inside the
   app folder (it ships with the app bundle) or at an absolute path on the SuperLink machine;
2. ``task.classes`` (and the other ``task.*`` keys) in the run config;
3. the ``dataset`` flag's built-in task (every MedMNIST 2D flag, mnist, cifar10), with the
   ``task.*`` keys that refine it (normalization, augmentation, rare classes, a pretrained
   checkpoint).

The ServerApp resolves the task once and sends it with every message (``TASK_KEY`` in the
message's config), so a hospital needs no file of its own.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from pydantic import Field, field_validator

from hospitrust.errors import ConfigError
from hospitrust.options import Options

#: The run config's defaults of the keys a task file may set (CoreOptions declares the same; a test keeps them equal).
RUN_DEFAULTS: dict[str, Any] = {"image-size": 28, "model": "small-cnn"}
#: The key of a message's config record that carries the task as JSON.
TASK_KEY = "task"
#: Bumped when the decoding of hospital images changes, so cached decoded images are rebuilt.
DECODE_VERSION = 1
#: The default normalization: uint8 x -> x / 127.5 - 1, i.e. mean 0.5 and std 0.5 per channel on [0, 1].
DEFAULT_MEAN, DEFAULT_STD = 0.5, 0.5


def split_list(text: str | list | tuple) -> list[str]:
    """A comma-separated string (Flower's run config has no lists) or a TOML list -> stripped items."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


class TaskOptions(Options):
    """The federation's task (the ``task`` section): its classes and preprocessing, or a task file.
    Empty keys fall back to the ``dataset`` flag's built-in task.
    """

    file: str = Field("", description=(
        "A task file (TOML, the keys of this section; lists allowed): a path inside the app folder (it ships "
        "with the app bundle) or an absolute path on the SuperLink machine. Empty: the keys below, or the "
        "dataset's built-in task."
    ))
    name: str = Field("", description="The task's name, as runs and logs show it; empty: the dataset flag (or 'task').")
    classes: str = Field("", description=(
        "Class names in label order, comma-separated (e.g. 'normal,pneumonia'); set: a task of the "
        "consortium's own (no dataset flag). Empty: the dataset's classes."
    ))
    channels: int = Field(0, ge=0, le=4, description="Image channels: 1 (grey) or 3 (RGB); 0: the dataset's, or 1.")
    mean: str = Field("", description=(
        "Normalization mean per channel on [0, 1], comma-separated (one value: every channel); empty: 0.5."
    ))
    std: str = Field("", description=(
        "Normalization standard deviation per channel, comma-separated; empty: 0.5 (images in [-1, 1])."
    ))
    augmentation: str = Field("", description=(
        "Training augmentation (torchvision transforms v2), comma-separated: horizontal-flip, vertical-flip, "
        "rotation=DEGREES, resized-crop=MIN_SCALE, brightness=F, contrast=F, translate=FRACTION (per image); "
        "affine-rotation=DEGREES, affine-translate=FRACTION, affine-crop=MIN_SHARE (drawn and resampled for a "
        "whole batch at once: far cheaper on a CPU). Empty: none."
    ))
    rare_classes: str = Field("", description=(
        "The clinically rare classes (names or indices, comma-separated) for the rare-class metrics and "
        "EARN; empty: found from the federation's class counts."
    ))
    dicom_frame: int = Field(-1, ge=-1, description=(
        "The frame of a multi-frame DICOM file to use (0-based); -1: multi-frame files are refused."
    ))
    pretrained: str = Field("", description=(
        "A checkpoint (state dict) on the SuperLink machine that round 1's global model starts from, read "
        "with torch.load(weights_only=True); tensors whose name and shape match are loaded. Empty: random "
        "initialization."
    ))

    @field_validator("augmentation")
    @classmethod
    def _augmentation(cls, v: str) -> str:
        from hospitrust.models.augment import parse_augmentation

        parse_augmentation(split_list(v), image_size=28)  # ValueError naming the bad item
        return v

    @field_validator("mean", "std")
    @classmethod
    def _floats(cls, v: str) -> str:
        try:
            values = [float(x) for x in split_list(v)]
        except ValueError:
            raise ValueError(f"expected comma-separated numbers, e.g. '0.5' or '0.485,0.456,0.406'; got {v!r}") from None
        if any(x != x for x in values):
            raise ValueError(f"NaN in {v!r}")
        return v

    @property
    def custom(self) -> bool:
        """Whether this is a task of the consortium's own (a task file or class names), not a dataset's."""
        return bool(self.file.strip() or self.classes.strip())


@dataclass(frozen=True)
class Task:
    """A resolved task: everything a hospital and the server need to agree on.

    Parameters
    ----------
    name : str
        How runs and logs name it.
    class_names : tuple[str, ...]
        The classes, in label order.
    channels : int
        Image channels (1 grey, 3 RGB).
    image_size : int
        Images are resized to image_size x image_size.
    model : str
        The model registry name.
    mean, std : tuple[float, ...]
        Normalization per channel, on images scaled to [0, 1].
    augmentation : tuple[str, ...]
        Training augmentation items (``hospitrust.models.augment``).
    rare_classes : tuple[int, ...]
        Clinically rare classes given by the task (empty: found from the federation's counts).
    dicom_frame : int
        The frame of a multi-frame DICOM file; -1: multi-frame files are refused.
    pretrained : str
        A checkpoint on the SuperLink machine the first global model starts from ("" none).
    dataset : str
        The built-in dataset flag the task comes from; "" for a task of the consortium's own.
    source : str
        Where it was defined: "dataset FLAG", "run config" or the task file's path.
    """

    name: str
    class_names: tuple[str, ...]
    channels: int
    image_size: int
    model: str
    mean: tuple[float, ...] = (DEFAULT_MEAN,)
    std: tuple[float, ...] = (DEFAULT_STD,)
    augmentation: tuple[str, ...] = ()
    rare_classes: tuple[int, ...] = ()
    dicom_frame: int = -1
    pretrained: str = ""
    dataset: str = ""
    source: str = field(default="", compare=False)

    # what the code that took a DatasetInfo reads
    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def in_channels(self) -> int:
        return self.channels

    @property
    def flag(self) -> str:
        return self.name

    @property
    def default_normalization(self) -> bool:
        """Whether images are scaled to [-1, 1] (mean = std = 0.5 everywhere): the code's plain path."""
        return all(m == DEFAULT_MEAN for m in self.mean) and all(s == DEFAULT_STD for s in self.std)

    def normalization(self) -> tuple[list[float], list[float]]:
        """Mean and std, one value per channel."""
        def per_channel(values: tuple[float, ...], what: str) -> list[float]:
            if len(values) == 1:
                return list(values) * self.channels
            if len(values) != self.channels:
                raise ConfigError(f"task {self.name}: {what} has {len(values)} values for {self.channels} channels")
            return list(values)
        return per_channel(self.mean, "task.mean"), per_channel(self.std, "task.std")

    def preprocessing_key(self) -> str:
        """What the decoded pixels depend on (cache key part): size, channels, DICOM frame, decoder version."""
        return f"s{self.image_size}-c{self.channels}-f{self.dicom_frame}-v{DECODE_VERSION}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        raw = json.loads(text)
        for key in ("class_names", "mean", "std", "augmentation", "rare_classes"):
            raw[key] = tuple(raw[key])
        return cls(**raw)

    def fingerprint(self) -> str:
        """A short digest of what hospitals must agree on (classes and preprocessing)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def describe(self) -> str:
        """One line for logs: name, classes, shape, model and where the task came from."""
        classes = ", ".join(f"{i}={n}" for i, n in enumerate(self.class_names))
        extra = []
        if not self.default_normalization:
            extra.append(f"mean {list(self.mean)} std {list(self.std)}")
        if self.augmentation:
            extra.append("augmentation " + ", ".join(self.augmentation))
        if self.rare_classes:
            extra.append("rare classes " + ", ".join(self.class_names[c] for c in self.rare_classes))
        if self.pretrained:
            extra.append(f"pretrained {self.pretrained}")
        return (f"task {self.name} ({self.source}): {self.num_classes} classes ({classes}), {self.channels} channel(s), "
                f"{self.image_size}x{self.image_size}, model {self.model}" + ("; " + "; ".join(extra) if extra else ""))


def _class_indices(items: list[str], class_names: tuple[str, ...], what: str) -> tuple[int, ...]:
    by_name = {n.lower(): i for i, n in enumerate(class_names)}
    out = []
    for item in items:
        if item.lower() in by_name:
            out.append(by_name[item.lower()])
        elif item.isdigit() and int(item) < len(class_names):
            out.append(int(item))
        else:
            raise ConfigError(f"{what}: {item!r} is not one of the task's classes "
                              f"({', '.join(f'{i}={n}' for i, n in enumerate(class_names))})")
    return tuple(sorted(set(out)))


def app_folder() -> Path:
    """The app folder: where the running hospitrust package was loaded from (Flower puts the app
    bundle's folder first on sys.path, so in a deployment this is the bundle's copy).
    """
    import hospitrust

    return Path(hospitrust.__file__).resolve().parent.parent


def find_task_file(path: str) -> Path:
    """A task file's path: absolute as given, relative against the app folder (then the working folder)."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [app_folder() / p, Path.cwd() / p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise ConfigError(f"task.file {path!r} not found (looked at {', '.join(str(c) for c in candidates)}); a relative "
                      "path is read inside the app folder, which ships with the app bundle")


def read_task_file(path: Path) -> dict[str, Any]:
    """A task file's keys as a ``task`` section (lists joined to comma-separated strings), plus the
    run-level ``image-size`` and ``model`` it may set; ConfigError naming the file and the bad key.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"task file {path}: {exc}") from None
    raw = raw.get("task", raw)  # a file may hold a [task] table or the keys at its top level
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out[key] = ",".join(str(v) for v in value) if isinstance(value, list) else value
    if "file" in out:
        raise ConfigError(f"task file {path}: 'file' cannot be set inside a task file")
    return out


class TaskRequest(Protocol):
    """What :func:`resolve_task` reads of a run config (``RunConfig`` is one)."""

    @property
    def task(self) -> TaskOptions: ...
    @property
    def dataset(self) -> str: ...
    @property
    def image_size(self) -> int: ...
    @property
    def model(self) -> str: ...


def resolve_task(cfg: TaskRequest) -> Task:
    """The run's task from its config (``RunConfig``): a task file, the task section, or the
    dataset's built-in task. ConfigError naming what is wrong.
    """
    from hospitrust.datasets.registry import dataset_info

    opts: TaskOptions = cfg.task
    image_size, model, source = cfg.image_size, cfg.model, ""
    if opts.file.strip():
        path = find_task_file(opts.file)
        values = read_task_file(path)
        image_size = _file_override(values.pop("image-size", None), image_size, "image-size", path)
        model = _file_override(values.pop("model", None), model, "model", path)
        try:
            file_opts = TaskOptions.from_flat(values)
        except ValueError as err:
            raise ConfigError(f"task file {path}: {err}") from None
        set_in_run = {k for k, v in opts.to_flat().items() if k != "file" and v != TaskOptions().to_flat()[k]}
        if set_in_run:
            raise ConfigError(f"task.file is set, and so is {', '.join('task.' + k for k in sorted(set_in_run))}: put "
                              f"them in the task file {path}")
        opts, source = cast(TaskOptions, file_opts), str(path)
        if not opts.classes.strip():
            raise ConfigError(f"task file {path} has no 'classes' (the class names in label order)")
    if opts.classes.strip():
        class_names = tuple(split_list(opts.classes))
        if len(class_names) < 2:
            raise ConfigError(f"task.classes {opts.classes!r}: a classifier needs at least two classes")
        if len({c.lower() for c in class_names}) != len(class_names):
            raise ConfigError(f"task.classes {opts.classes!r}: class names must be distinct")
        channels = opts.channels or 1
        name, dataset = opts.name or "task", ""
        source = source or "run config"
    else:
        info = dataset_info(cfg.dataset)
        class_names, channels = info.class_names, info.in_channels
        if opts.channels and opts.channels != channels:
            raise ConfigError(f"task.channels {opts.channels} differs from dataset {cfg.dataset}'s {channels}; "
                              "leave task.channels at 0 or define the task's classes")
        name, dataset, source = opts.name or cfg.dataset, cfg.dataset, f"dataset {cfg.dataset}"
    mean = tuple(float(x) for x in split_list(opts.mean)) or (DEFAULT_MEAN,)
    std = tuple(float(x) for x in split_list(opts.std)) or (DEFAULT_STD,)
    if any(s <= 0 for s in std):
        raise ConfigError(f"task.std {opts.std!r}: every value must be > 0")
    task = Task(
        name=name, class_names=class_names, channels=channels, image_size=int(image_size), model=str(model),
        mean=mean, std=std, augmentation=tuple(split_list(opts.augmentation)),
        rare_classes=_class_indices(split_list(opts.rare_classes), class_names, "task.rare-classes"),
        dicom_frame=opts.dicom_frame, pretrained=opts.pretrained, dataset=dataset, source=source,
    )
    task.normalization()  # mean/std lengths against the channels
    return task


def _file_override(value: Any, run_value: Any, key: str, path: Path) -> Any:
    """A task file's ``image-size`` / ``model``: it wins over the run config's default; a run config
    that sets another value explicitly is a conflict.
    """
    if value is None:
        return run_value
    if run_value != RUN_DEFAULTS[key] and run_value != value:
        raise ConfigError(f"task file {path} sets {key} = {value!r} but the run config sets {key} = {run_value!r}: "
                          "remove one")
    return value

"""The server's own images: its test set (central evaluation) and its reference cohort (the
rules that judge updates on data: HTA's v, EARN's audit, FLTrust, FedAgain's server benchmark,
FED-FBD's detection).

Both come from paths on the SuperLink machine (``server-data.test-path``, ``.cohort-path``), in
any format a hospital may use (``hospitrust.datasets.local``). For a built-in task (a dataset
flag) a path left empty falls back to the dataset file: its test split, and a class-balanced
sample of its val split as the cohort. For a task of the consortium's own, an empty test path
means federated evaluation (the hospitals' held-out images, pooled), and an empty cohort path
means no cohort: a rule that needs one refuses to start, naming its cohort-free setting.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from hospitrust.datasets.federation import LabelledImages, reference_set, test_set
from hospitrust.options import Options


class ServerDataOptions(Options):
    """The operator's own test set and reference cohort, from paths on the SuperLink machine
    (the ``server-data`` section).
    """

    test_path: str = Field("", description=(
        "The server's test set: a folder of class folders, a CSV manifest or a .npz archive on the SuperLink "
        "machine. Empty: the dataset's test split (built-in task), else federated evaluation."
    ))
    cohort_path: str = Field("", description=(
        "The server's reference cohort (the rules that judge updates on data need it), in the same formats. "
        "Empty: a class-balanced sample of the dataset's val split (built-in task), else none."
    ))
    data_format: str = Field("auto", description="Format of both paths: auto (detected), folder, csv or npz.")
    cache_dir: str = Field("", description=(
        "Where the server's decoded images are cached; empty: $HOSPITRUST_CACHE_DIR, else "
        "~/.cache/hospitrust/images."
    ))
    evaluation: Literal["auto", "central", "federated"] = Field("auto", description=(
        "How the global model is evaluated each round: central (on the server's test set), federated (on the "
        "hospitals' held-out images, pooled), or auto: central when there is a test set."
    ))

    @field_validator("data_format")
    @classmethod
    def _format(cls, v: str) -> str:
        from hospitrust.datasets.local import FORMATS

        if v not in FORMATS:
            raise ValueError(f"data-format {v!r}; allowed: {', '.join(FORMATS)}")
        return v


def has_test_set(cfg: Any) -> bool:
    """Whether the run has a server-side test set (a path, or a built-in task's dataset file)."""
    return bool(cfg.server_data.test_path.strip()) or not cfg.task.custom


def has_cohort(cfg: Any) -> bool:
    """Whether the run has a reference cohort (a path, or a built-in task's dataset file)."""
    return bool(cfg.server_data.cohort_path.strip()) or not cfg.task.custom


def evaluation_mode(cfg: Any) -> str:
    """``central`` or ``federated`` for this run."""
    mode = cfg.server_data.evaluation
    if mode == "auto":
        return "central" if has_test_set(cfg) else "federated"
    return mode


def check_server_data(cfg: Any) -> list[str]:
    """What the run's rule and evaluation need of the server's data and do not get; messages name the keys."""
    from hospitrust.strategies.registry import strategy_class

    out = []
    if cfg.server_data.evaluation == "central" and not has_test_set(cfg):
        out.append("server-data.evaluation = 'central' needs a test set: set server-data.test-path (a task of the "
                   "consortium's own has no dataset file to fall back to), or use 'auto' / 'federated'")
    cls = strategy_class(cfg.strategy)
    options = cfg.strategy_options
    composed = {name: cfg.options(name) for name in cls.composes(options)}
    needs = cls.needs(options, composed)
    if needs and not has_cohort(cfg):
        free = cls.cohort_free_setting(options, composed)
        out.append(f"strategy {cfg.strategy} needs the server's reference cohort ({', '.join(sorted(needs))}), and this "
                   "run has none: set server-data.cohort-path (the operator's cohort on the SuperLink machine)"
                   + (f", or {free} to run it without one" if free else f"; {cfg.strategy} has no cohort-free setting"))
    return out


@dataclass(frozen=True)
class ServerSets:
    """The server's test set and reference cohort (None where the run has none), and where they came from."""

    test: LabelledImages | None
    cohort: LabelledImages | None
    test_source: str
    cohort_source: str


def _load(path: str, cfg: Any, task: Any) -> tuple[LabelledImages, str]:
    from hospitrust.datasets.local import HospitalDataError, load_local

    try:
        data = load_local(path, cfg.server_data.data_format, task, cfg.server_data.cache_dir or None)
    except HospitalDataError as exc:  # the operator's own files, in the operator's log: the detail, with the paths
        raise HospitalDataError(exc.detail) from None
    # in memory (the server's sets are evaluated every round), and writable for torch
    return LabelledImages(np.array(data.images), np.asarray(data.labels)), f"{data.root} ({data.format}, {len(data)} images)"


@functools.lru_cache(maxsize=4)
def server_sets(cfg: Any, task: Any) -> ServerSets:
    """The run's server-side images (cached per process); files are read and decoded once.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (``server-data`` section, dataset).
    task : Task
        The resolved task (classes, image size, channels).

    Returns
    -------
    ServerSets
        Test set and cohort, or None for each the run does not have.
    """
    sd = cfg.server_data
    test: LabelledImages | None = None
    cohort: LabelledImages | None = None
    test_source = cohort_source = "none"
    if sd.test_path.strip():
        test, test_source = _load(sd.test_path, cfg, task)
    elif not cfg.task.custom:
        test, test_source = test_set(cfg.federation), f"dataset {cfg.dataset} test split"
    if sd.cohort_path.strip():
        cohort, cohort_source = _load(sd.cohort_path, cfg, task)
    elif not cfg.task.custom:
        cohort = reference_set(cfg.federation)
        cohort_source = f"dataset {cfg.dataset} val split, {cfg.reference_cohort_per_class} per class"
    if evaluation_mode(cfg) == "federated":
        test, test_source = None, "none (federated evaluation)"
    return ServerSets(test, cohort, test_source, cohort_source)

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

from hospitrust.datasets.federation import (LabelledImages, SimulatedFederation, reference_set, test_set,
                                          validation_set)
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
    test_split: Literal["test", "val"] = Field("test", description=(
        "A built-in task's split the server evaluates on when test-path is empty: test, or val (its images "
        "outside the reference cohort) to choose learning rates and rounds without looking at the test split."
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

    def has_test_set(self, custom_task: bool) -> bool:
        """Whether the run has a server-side test set (a path, or a built-in task's dataset file)."""
        return bool(self.test_path.strip()) or not custom_task

    def has_cohort(self, custom_task: bool, per_class: int = 1) -> bool:
        """Whether the run has a reference cohort (a path, or a built-in task's dataset file with
        ``reference-cohort-per-class`` = ``per_class`` >= 1).
        """
        return bool(self.cohort_path.strip()) or (not custom_task and per_class > 0)

    def evaluation_mode(self, custom_task: bool) -> str:
        """``central`` or ``federated`` for this run."""
        if self.evaluation == "auto":
            return "central" if self.has_test_set(custom_task) else "federated"
        return self.evaluation


@dataclass(frozen=True)
class ServerSets:
    """The server's test set and reference cohort (None where the run has none), and where they came from."""

    test: LabelledImages | None
    cohort: LabelledImages | None
    test_source: str
    cohort_source: str


def _load(path: str, options: ServerDataOptions, task: Any) -> tuple[LabelledImages, str]:
    from hospitrust.datasets.local import HospitalDataError, load_local

    try:
        data = load_local(path, options.data_format, task, options.cache_dir or None)
    except HospitalDataError as exc:  # the operator's own files, in the operator's log: the detail, with the paths
        raise HospitalDataError(exc.detail) from None
    # in memory (the server's sets are evaluated every round), and writable for torch
    return LabelledImages(np.array(data.images), np.asarray(data.labels)), f"{data.root} ({data.format}, {len(data)} images)"


@functools.lru_cache(maxsize=4)
def server_sets(options: ServerDataOptions, task: Any, federation: SimulatedFederation, custom_task: bool) -> ServerSets:
    """The run's server-side images (cached per process); files are read and decoded once.

    Parameters
    ----------
    options : ServerDataOptions
        The run's ``server-data`` section.
    task : Task
        The resolved task (classes, image size, channels).
    federation : SimulatedFederation
        The dataset's federation (a built-in task's test split and val split).
    custom_task : bool
        Whether the task is the consortium's own (no dataset file to fall back to).

    Returns
    -------
    ServerSets
        Test set and cohort, or None for each the run does not have.
    """
    test: LabelledImages | None = None
    cohort: LabelledImages | None = None
    test_source = cohort_source = "none"
    if options.test_path.strip():
        test, test_source = _load(options.test_path, options, task)
    elif not custom_task:
        if options.test_split == "val":
            test = validation_set(federation)
            test_source = (f"dataset {federation.dataset} val split without the reference cohort "
                           f"({len(test.labels)} images)")
        else:
            test, test_source = test_set(federation), f"dataset {federation.dataset} test split"
    if options.cohort_path.strip():
        cohort, cohort_source = _load(options.cohort_path, options, task)
    elif not custom_task and federation.reference_cohort_per_class > 0:
        cohort = reference_set(federation)
        cohort_source = f"dataset {federation.dataset} val split, {federation.reference_cohort_per_class} per class"
    if options.evaluation_mode(custom_task) == "federated":
        test, test_source = None, "none (federated evaluation)"
    return ServerSets(test, cohort, test_source, cohort_source)

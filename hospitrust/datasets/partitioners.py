"""Deterministic partitioners that split one labelled dataset over simulated hospitals.

Every partitioner has the signature::

    fn(labels: np.ndarray, num_hospitals: int, *, seed: int, **params) -> list[np.ndarray]

and returns, for each hospital, the **sorted int64 indices into ``labels``** it
holds. Guarantees (enforced here and covered by ``tests/test_partitioners.py``):

* every sample index lands in exactly one hospital (nothing dropped, nothing
  duplicated);
* the result is a pure function of ``(labels, num_hospitals, seed, params)``;
* every hospital gets at least ``min_size`` samples (default 1), otherwise a
  ``ValueError`` naming the numbers is raised.

Why numpy and not ``flwr_datasets.partitioner``
-----------------------------------------------
flwr-datasets (0.6.1) is installed and was evaluated, but none of its
partitioners meets the guarantees above as-is:

* ``IidPartitioner`` takes *contiguous* shards without shuffling, so a dataset
  stored in label or acquisition order would not be iid at all.
* ``PathologicalPartitioner`` drops the samples of classes no partition drew
  (``"random"`` mode), and its ``"deterministic"`` mode only covers every class
  when ``num_partitions + k - 1 >= num_classes``; we need coverage whenever
  ``num_hospitals * k >= num_classes``.
* ``DirichletPartitioner`` is the same algorithm as :func:`dirichlet` below,
  but retries at most 10 times (hard-coded, with a ``UserWarning`` per retry),
  splits each class in dataset order rather than shuffled, and cannot enforce
  ``min_size`` on a hospital's *total* when some classes are placed by another
  rule, which :func:`specialist` needs. One numpy core shared by both keeps
  ``specialist(..., specialist_classes={})`` identical to ``dirichlet``.

Numpy is also much lighter: no ``datasets``/``pyarrow`` import in every
simulated client process. ``tests/test_partitioners.py`` cross-checks that
:func:`dirichlet` draws the same per-class hospital counts as flwr-datasets'
``DirichletPartitioner`` for the same ``alpha`` and ``seed`` (same RNG stream and
cut rule); only which samples of a class go where differs (we shuffle first).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, field_validator

from hospitrust.options import NoOptions
from hospitrust.options import Options as OptionsModel

__all__ = [
    "PARTITIONERS",
    "Partitioner",
    "iid",
    "dirichlet",
    "quantity_skew",
    "pathological",
    "specialist",
    "parse_specialist_classes",
    "partition",
    "split_train_val",
    "class_counts",
    "label_distribution_divergence",
    "reference_cohort",
]

#: Default number of Dirichlet redraws before :func:`dirichlet` / :func:`specialist` give up.
DEFAULT_MAX_ATTEMPTS = 1000



# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
def _check_labels(labels: Any) -> np.ndarray:
    """Return ``labels`` as a 1-D int64 array of non-negative class ids."""
    arr = np.asarray(labels)
    # MedMNIST stores labels as (n, 1); accept that shape for convenience.
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D (or (n, 1)), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            pass  # whole-number floats are fine
        else:
            raise ValueError(f"labels must be integer class ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"labels must be non-negative class ids, found {int(arr.min())}")
    return arr


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_alpha(alpha: Any, name: str = "alpha") -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {alpha!r}") from None
    if not np.isfinite(a) or a <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {alpha!r}")
    return a


def _setup(labels: Any, num_hospitals: Any, seed: Any, min_size: Any) -> tuple[np.ndarray, int, int, np.random.Generator]:
    """Common checks; returns (labels, num_hospitals, min_size, rng)."""
    y = _check_labels(labels)
    h = _check_int(num_hospitals, "num_hospitals", 1)
    m = _check_int(min_size, "min_size", 0)
    seed = _check_int(seed, "seed", 0)
    if h * m > y.size:
        raise ValueError(
            f"cannot give each of {h} hospitals at least {m} sample(s): only {y.size} samples "
            f"(need {h * m}); use fewer hospitals, a smaller min_size or more data"
        )
    return y, h, m, np.random.default_rng(seed)


def _finish(assign_lists: Sequence[Sequence[np.ndarray]], min_size: int, what: str) -> list[np.ndarray]:
    """Concatenate per-hospital index chunks, sort, and check ``min_size``."""
    parts = []
    for chunks in assign_lists:
        idx = np.concatenate(chunks) if len(chunks) else np.empty(0, dtype=np.int64)
        parts.append(np.sort(idx).astype(np.int64, copy=False))
    sizes = [p.size for p in parts]
    if min(sizes) < min_size:
        h = int(np.argmin(sizes))
        raise ValueError(f"{what}: hospital {h} got {sizes[h]} samples, fewer than min_size={min_size}")
    return parts


def _split_even(idx: np.ndarray, holders: Sequence[int], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Split ``idx`` (shuffled here) as evenly as possible among ``holders``.

    Which holders receive the one extra sample is also drawn at random, so
    no hospital is systematically favoured by its id.
    """
    idx = rng.permutation(idx)
    order = rng.permutation(np.asarray(holders, dtype=np.int64))
    return {int(h): chunk for h, chunk in zip(order, np.array_split(idx, len(order)))}


def _dirichlet_draw(rng: np.random.Generator, alpha: float, k: int) -> np.ndarray:
    """One Dir(alpha * 1_k) draw, robust to the underflow very small alpha can cause."""
    p = rng.dirichlet(np.full(k, alpha))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:
        # All gamma variates underflowed: the limit of Dir(alpha -> 0) is a
        # one-hot vector, so give everything to one random hospital.
        p = np.zeros(k)
        p[rng.integers(k)] = 1.0
    return p


def _dirichlet_counts(
    class_sizes: np.ndarray,
    num_hospitals: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    base: np.ndarray,
    min_size: int,
    max_attempts: int,
    what: str,
) -> np.ndarray:
    """Draw per-class hospital counts until every hospital reaches ``min_size``.

    Parameters
    ----------
    class_sizes : (C,) int
        Samples per class to distribute.
    base : (H,) int
        Samples hospitals already hold from elsewhere (specialist classes);
        ``min_size`` applies to ``base + drawn``.

    Returns
    -------
    (C, H) int array of counts; each row sums to its class size.
    """
    c = class_sizes.size
    if c == 0:  # nothing left to draw (e.g. every class is a specialist class)
        if base.min() < min_size:
            h = int(np.argmin(base))
            raise ValueError(f"{what}: hospital {h} got {int(base[h])} samples, fewer than min_size={min_size}")
        return np.zeros((0, num_hospitals), dtype=np.int64)
    best_min = -1
    for _ in range(max_attempts):
        counts = np.zeros((c, num_hospitals), dtype=np.int64)
        for j, n_c in enumerate(class_sizes):
            p = _dirichlet_draw(rng, alpha, num_hospitals)
            # Cumulative rounding (as in the FedAvg/NIID-bench code): rows sum
            # exactly to n_c, so no sample is lost or duplicated.
            cuts = np.floor(np.cumsum(p) * n_c).astype(np.int64)
            cuts[-1] = n_c
            counts[j] = np.diff(np.concatenate([[0], cuts]))
        totals = base + counts.sum(axis=0)
        if totals.min() >= min_size:
            return counts
        best_min = max(best_min, int(totals.min()))
    raise ValueError(
        f"{what}: no Dirichlet draw with alpha={alpha} gave each of {num_hospitals} hospitals "
        f"at least min_size={min_size} samples in {max_attempts} attempts (best smallest hospital: "
        f"{best_min} samples of {int(class_sizes.sum() + base.sum())}); increase alpha, lower "
        f"min_size or use fewer hospitals"
    )


def _place_by_counts(
    class_indices: Sequence[np.ndarray], counts: np.ndarray, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """Hand out each class's (shuffled) indices according to a (C, H) count matrix."""
    h = counts.shape[1]
    out: list[list[np.ndarray]] = [[] for _ in range(h)]
    for idx, row in zip(class_indices, counts):
        # Shuffle within class so hospitals don't get contiguous blocks of
        # the dataset's storage order.
        idx = rng.permutation(idx)
        for hosp, chunk in enumerate(np.split(idx, np.cumsum(row)[:-1])):
            if chunk.size:
                out[hosp].append(chunk)
    return out


# --------------------------------------------------------------------------- #
# partitioners
# --------------------------------------------------------------------------- #
def iid(labels: np.ndarray, num_hospitals: int, *, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Uniformly random split into near-equal shares.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
        Class id of every sample.
    num_hospitals : int
    seed : int
    min_size : int, default 1
        Fewest samples any hospital may get.

    Returns
    -------
    list of np.ndarray
        Per hospital, sorted int64 indices into ``labels``; sizes differ by at
        most one.
    """
    y, h, m, rng = _setup(labels, num_hospitals, seed, min_size)
    perm = rng.permutation(y.size)
    return _finish([[c] for c in np.array_split(perm, h)], m, "iid")


def dirichlet(
    labels: np.ndarray,
    num_hospitals: int,
    *,
    seed: int,
    alpha: float,
    min_size: int = 1,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[np.ndarray]:
    """Label-skewed split: per class, hospital shares ~ Dir(alpha).

    For every class independently, proportions ``p ~ Dir(alpha, ..., alpha)``
    over the hospitals are drawn and the (shuffled) class samples are cut at
    ``floor(cumsum(p) * n_class)``. The draw is repeated (up to
    ``max_attempts`` times) until every hospital holds at least ``min_size``
    samples.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    num_hospitals : int
    seed : int
    alpha : float
        Concentration > 0. Small (e.g. 0.1): each class sits mostly at a
        few hospitals. Large (e.g. 100): close to iid.
    min_size : int, default 1
    max_attempts : int, default 1000

    Returns
    -------
    list of np.ndarray
        Per hospital, sorted int64 indices into ``labels``.

    Raises
    ------
    ValueError
        For ``alpha <= 0``, more ``num_hospitals * min_size`` than samples, or
        when no draw satisfies ``min_size`` within ``max_attempts``.
    """
    y, h, m, rng = _setup(labels, num_hospitals, seed, min_size)
    a = _check_alpha(alpha)
    attempts = _check_int(max_attempts, "max_attempts", 1)
    classes = np.unique(y)
    class_indices = [np.flatnonzero(y == c) for c in classes]
    sizes = np.array([i.size for i in class_indices], dtype=np.int64)
    counts = _dirichlet_counts(
        sizes, h, a, rng, base=np.zeros(h, dtype=np.int64), min_size=m, max_attempts=attempts, what="dirichlet"
    )
    return _finish(_place_by_counts(class_indices, counts, rng), m, "dirichlet")


def quantity_skew(
    labels: np.ndarray,
    num_hospitals: int,
    *,
    seed: int,
    alpha: float = 1.0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Size-skewed split: hospital sizes ~ Dir(alpha), labels iid within each.

    Every hospital first gets ``min_size`` samples; the remaining
    ``n - num_hospitals * min_size`` samples are divided in proportions
    ``p ~ Dir(alpha)``. Reserving ``min_size`` up front (instead of redrawing)
    means this never fails once ``n >= num_hospitals * min_size``, even for
    tiny ``alpha``. Samples are taken from one random permutation, so each
    hospital's label mix is an iid sample of the global one.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    num_hospitals : int
    seed : int
    alpha : float, default 1.0
        Concentration > 0 of the size proportions; small means very unequal sizes.
    min_size : int, default 1

    Returns
    -------
    list of np.ndarray
        Per hospital, sorted int64 indices into ``labels``.
    """
    y, h, m, rng = _setup(labels, num_hospitals, seed, min_size)
    a = _check_alpha(alpha)
    rest = y.size - h * m
    p = _dirichlet_draw(rng, a, h)
    cuts = np.floor(np.cumsum(p) * rest).astype(np.int64)
    cuts[-1] = rest
    sizes = m + np.diff(np.concatenate([[0], cuts]))
    perm = rng.permutation(y.size)
    chunks = np.split(perm, np.cumsum(sizes)[:-1])
    return _finish([[c] for c in chunks], m, "quantity-skew")


def pathological(
    labels: np.ndarray,
    num_hospitals: int,
    *,
    seed: int,
    classes_per_hospital: int,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Each hospital holds exactly ``classes_per_hospital`` classes.

    Classes (those present in ``labels``) are put in a seeded random order and
    dealt round-robin: hospital ``h`` gets positions ``h*k, ..., h*k + k - 1``
    (mod the number of classes). With ``num_hospitals * k >= num_classes``
    this covers every class, and since ``k < num_classes`` a hospital never
    gets the same class twice. Each class's samples are then split evenly
    (randomly) among the hospitals holding it. If ``k >= num_classes`` every
    hospital holds every class.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    num_hospitals : int
    seed : int
    classes_per_hospital : int
        ``k >= 1``.
    min_size : int, default 1

    Returns
    -------
    list of np.ndarray
        Per hospital, sorted int64 indices into ``labels``.

    Raises
    ------
    ValueError
        If ``num_hospitals * k < num_classes`` (some class would have no
        holder), or a class has fewer samples than hospitals holding it
        (some holder would not actually have it).
    """
    y, h, m, rng = _setup(labels, num_hospitals, seed, min_size)
    k = _check_int(classes_per_hospital, "classes_per_hospital", 1)
    classes = np.unique(y)
    c = classes.size
    if k >= c:
        holders_of = {int(cl): list(range(h)) for cl in classes}
    else:
        if h * k < c:
            raise ValueError(
                f"pathological: {h} hospitals x {k} classes each = {h * k} slots cannot cover "
                f"all {c} classes; raise classes_per_hospital or num_hospitals"
            )
        order = rng.permutation(classes)
        holders_of = {int(cl): [] for cl in classes}
        for hosp in range(h):
            for j in range(k):
                holders_of[int(order[(hosp * k + j) % c])].append(hosp)
    out: list[list[np.ndarray]] = [[] for _ in range(h)]
    for cl, holders in holders_of.items():
        idx = np.flatnonzero(y == cl)
        if idx.size < len(holders):
            raise ValueError(
                f"pathological: class {cl} has only {idx.size} samples but {len(holders)} hospitals "
                f"hold it; use fewer hospitals or fewer classes_per_hospital"
            )
        for hosp, chunk in _split_even(idx, holders, rng).items():
            out[hosp].append(chunk)
    return _finish(out, m, "pathological")


def specialist(
    labels: np.ndarray,
    num_hospitals: int,
    *,
    seed: int,
    specialist_classes: Mapping[int, Sequence[int]],
    alpha: float = 1.0,
    min_size: int = 1,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[np.ndarray]:
    """Some classes live only at named "specialist" hospitals; the rest are Dirichlet-split.

    Models e.g. a rare disease seen only at a referral centre.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    num_hospitals : int
    seed : int
    specialist_classes : Mapping[int, Sequence[int]]
        Class id -> the hospital ids that hold it. That class's samples are
        split evenly (randomly) among exactly those hospitals. Parse the
        run-config string with :func:`parse_specialist_classes`.
    alpha : float, default 1.0
        Dirichlet concentration for all other classes, which are spread over
        *all* hospitals (holders included) as in :func:`dirichlet`.
    min_size : int, default 1
        Applies to each hospital's total (specialist + other classes).
    max_attempts : int, default 1000

    Returns
    -------
    list of np.ndarray
        Per hospital, sorted int64 indices into ``labels``.

    Raises
    ------
    ValueError
        Unknown class ids (not in ``labels``), hospital ids outside
        ``[0, num_hospitals)``, empty or duplicate holder lists, bad ``alpha``,
        or ``min_size`` unreachable.
    """
    y, h, m, rng = _setup(labels, num_hospitals, seed, min_size)
    a = _check_alpha(alpha)
    attempts = _check_int(max_attempts, "max_attempts", 1)
    if not isinstance(specialist_classes, Mapping):
        raise ValueError(
            f"specialist_classes must be a mapping class -> list of hospital ids, got "
            f"{type(specialist_classes).__name__}; parse strings with parse_specialist_classes()"
        )
    classes = np.unique(y)
    present = {int(c) for c in classes}
    spec: dict[int, list[int]] = {}
    for cl, holders in specialist_classes.items():
        cl_i = _check_int(cl, "specialist class id", 0)
        if cl_i not in present:
            raise ValueError(
                f"specialist class {cl_i} does not occur in labels (classes present: {sorted(present)})"
            )
        holder_ids: Sequence[Any] = [holders] if isinstance(holders, (int, np.integer)) else holders
        hl = [_check_int(x, f"hospital id for class {cl_i}", 0) for x in holder_ids]
        if not hl:
            raise ValueError(f"specialist class {cl_i} has no holder hospitals")
        if len(set(hl)) != len(hl):
            raise ValueError(f"specialist class {cl_i} lists a hospital twice: {hl}")
        bad = [x for x in hl if x >= h]
        if bad:
            raise ValueError(
                f"specialist class {cl_i}: hospital id(s) {bad} out of range for num_hospitals={h} "
                f"(valid ids 0..{h - 1})"
            )
        spec[cl_i] = hl

    out: list[list[np.ndarray]] = [[] for _ in range(h)]
    base = np.zeros(h, dtype=np.int64)
    for cl in sorted(spec):
        for hosp, chunk in _split_even(np.flatnonzero(y == cl), spec[cl], rng).items():
            out[hosp].append(chunk)
            base[hosp] += chunk.size

    other = [int(c) for c in classes if int(c) not in spec]
    class_indices = [np.flatnonzero(y == c) for c in other]
    sizes = np.array([i.size for i in class_indices], dtype=np.int64)
    counts = _dirichlet_counts(sizes, h, a, rng, base=base, min_size=m, max_attempts=attempts, what="specialist")
    for hosp, chunks in enumerate(_place_by_counts(class_indices, counts, rng)):
        out[hosp].extend(chunks)
    return _finish(out, m, "specialist")


_SPEC_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*(\d+(?:\s*,\s*\d+)*)\s*$")


def parse_specialist_classes(text: str) -> dict[int, list[int]]:
    """Parse the run-config form of ``specialist_classes``.

    Format: ``class:hospital[,hospital...]`` entries separated by ``;``,
    e.g. ``"4:0"`` (class 4 only at hospital 0) or ``"4:0,1;3:2"``.
    Whitespace around numbers is ignored. Blank text means no specialist
    classes and gives ``{}``.

    Parameters
    ----------
    text : str

    Returns
    -------
    dict[int, list[int]]
        Class id -> hospital ids, in the order written.

    Raises
    ------
    ValueError
        For anything else (empty entries, missing ``:``, non-integers,
        negative numbers, a class listed twice, a hospital repeated within
        one class), naming the offending entry.
    """
    if not isinstance(text, str):
        raise ValueError(f"specialist classes must be a string like '4:0,1;3:2', got {type(text).__name__}")
    if not text.strip():
        return {}
    result: dict[int, list[int]] = {}
    for entry in text.split(";"):
        match = _SPEC_ENTRY.match(entry)
        if match is None:
            raise ValueError(
                f"malformed specialist entry {entry.strip()!r} in {text!r}: expected "
                f"'class:hospital[,hospital...]' entries separated by ';', e.g. '4:0,1;3:2'"
            )
        cl = int(match.group(1))
        hospitals = [int(x) for x in match.group(2).split(",")]
        if cl in result:
            raise ValueError(f"class {cl} is listed twice in specialist classes {text!r}")
        if len(set(hospitals)) != len(hospitals):
            raise ValueError(f"class {cl} lists a hospital twice in specialist classes {text!r}")
        result[cl] = hospitals
    return result


# --------------------------------------------------------------------------- #
# the registry: each partitioner a class with its options (its run-config section)
# --------------------------------------------------------------------------- #
class Partitioner:
    """How a labelled training split is divided over simulated hospitals: a registry ``name``,
    its ``Options`` (the ``[tool.flwr.app.config.<name>]`` section) and ``split``.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[OptionsModel]] = NoOptions

    def __init__(self, options: OptionsModel | None = None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def check_run_config(cls, cfg: Any) -> None:
        """Checks of this partitioner's section when it is the selected one (ValueError naming the key)."""

    def split(self, labels: np.ndarray, num_hospitals: int, *, seed: int, min_size: int = 1) -> list[np.ndarray]:
        raise NotImplementedError


class IIDPartitioner(Partitioner):
    """Uniformly random near-equal shares (:func:`iid`)."""

    name = "iid"

    def split(self, labels, num_hospitals, *, seed, min_size=1):
        return iid(labels, num_hospitals, seed=seed, min_size=min_size)


class AlphaOptions(OptionsModel):
    alpha: float = Field(0.5, gt=0.0, description=(
        "Dirichlet concentration of each class over the hospitals (smaller: more skewed)."
    ))


class DirichletPartitioner(Partitioner):
    """Label skew: per class, hospital shares ~ Dir(alpha) (:func:`dirichlet`)."""

    name = "dirichlet"
    Options = AlphaOptions
    options: AlphaOptions

    def split(self, labels, num_hospitals, *, seed, min_size=1):
        return dirichlet(labels, num_hospitals, seed=seed, alpha=self.options.alpha, min_size=min_size)


class QuantitySkewOptions(OptionsModel):
    alpha: float = Field(1.0, gt=0.0, description=(
        "Dirichlet concentration of the hospitals' sizes (labels IID within each)."
    ))


class QuantitySkewPartitioner(Partitioner):
    """Size skew: hospital sizes ~ Dir(alpha), labels IID within each (:func:`quantity_skew`)."""

    name = "quantity-skew"
    Options = QuantitySkewOptions
    options: QuantitySkewOptions

    def split(self, labels, num_hospitals, *, seed, min_size=1):
        return quantity_skew(labels, num_hospitals, seed=seed, alpha=self.options.alpha, min_size=min_size)


class PathologicalOptions(OptionsModel):
    classes_per_hospital: int = Field(1, ge=1, description="The number of classes each hospital holds.")


class PathologicalPartitioner(Partitioner):
    """Each hospital holds exactly k classes (:func:`pathological`)."""

    name = "pathological"
    Options = PathologicalOptions
    options: PathologicalOptions

    def split(self, labels, num_hospitals, *, seed, min_size=1):
        return pathological(labels, num_hospitals, seed=seed, classes_per_hospital=self.options.classes_per_hospital,
                            min_size=min_size)


class SpecialistOptions(OptionsModel):
    classes: str = Field("", description=(
        "'class:hospital[,hospital];...': each class held only by those hospitals, e.g. '4:0' (class 4 only "
        "at hospital 0)."
    ))
    alpha: float = Field(0.5, gt=0.0, description="Dirichlet concentration of the other classes over all hospitals.")

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: str) -> str:
        if v.strip():
            parse_specialist_classes(v)  # raises ValueError with the reason
        return v


class SpecialistPartitioner(Partitioner):
    """Some classes only at named specialist hospitals, the rest Dirichlet-split (:func:`specialist`)."""

    name = "specialist"
    Options = SpecialistOptions
    options: SpecialistOptions

    @classmethod
    def check_run_config(cls, cfg: Any) -> None:
        if not cfg.options(cls.name).classes.strip():  # no usable default: they name this federation's hospitals
            raise ValueError("partitioner 'specialist' needs specialist.classes, e.g. '4:0' (class 4 only at hospital 0)")

    def split(self, labels, num_hospitals, *, seed, min_size=1):
        return specialist(labels, num_hospitals, seed=seed, specialist_classes=parse_specialist_classes(self.options.classes),
                          alpha=self.options.alpha, min_size=min_size)


#: Partitioners by run-config name (derived from the classes).
PARTITIONERS: dict[str, type[Partitioner]] = {
    cls.name: cls for cls in (IIDPartitioner, DirichletPartitioner, QuantitySkewPartitioner, PathologicalPartitioner,
                              SpecialistPartitioner)
}

_FUNCTIONS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid, "dirichlet": dirichlet, "quantity-skew": quantity_skew, "pathological": pathological, "specialist": specialist,
}


def partition(name: str, labels: np.ndarray, num_hospitals: int, *, seed: int, **params: Any) -> list[np.ndarray]:
    """Run the partitioner function registered as ``name`` (``_`` and ``-`` are interchangeable)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in _FUNCTIONS:
        raise ValueError(f"unknown partitioner {name!r}; choose one of {sorted(_FUNCTIONS)}")
    return _FUNCTIONS[key](labels, num_hospitals, seed=seed, **params)


# --------------------------------------------------------------------------- #
# local splits and diagnostics
# --------------------------------------------------------------------------- #
def split_train_val(indices: np.ndarray, val_fraction: float, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of one hospital's indices into local train and validation.

    ``round(val_fraction * n)`` samples go to validation, but whenever
    ``val_fraction > 0`` and ``n >= 2`` validation gets at least 1 and train
    keeps at least 1. A one-sample hospital keeps its sample for training
    (validation empty); ``val_fraction == 0`` gives an empty validation set.

    Parameters
    ----------
    indices : np.ndarray of int, shape (n,)
        The hospital's sample indices (any index space).
    val_fraction : float
        In ``[0, 1)``.
    seed : int

    Returns
    -------
    (train_idx, val_idx) : tuple of np.ndarray
        Disjoint, sorted int64 arrays whose union is ``indices``.
    """
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    try:
        f = float(val_fraction)
    except (TypeError, ValueError):
        raise ValueError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}") from None
    if not 0.0 <= f < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    seed = _check_int(seed, "seed", 0)
    n = idx.size
    n_val = int(round(f * n))
    if f > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)  # both sides non-empty
    elif n < 2:
        n_val = 0  # a lone sample is more useful for training
    perm = np.random.default_rng(seed).permutation(idx)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def class_counts(labels: np.ndarray, partitions: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples per class at each hospital.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    partitions : sequence of index arrays into ``labels``
    num_classes : int

    Returns
    -------
    np.ndarray of int64, shape (num_hospitals, num_classes)
    """
    y = _check_labels(labels)
    nc = _check_int(num_classes, "num_classes", 1)
    if y.size and y.max() >= nc:
        raise ValueError(f"labels contain class {int(y.max())}, out of range for num_classes={nc}")
    out = np.zeros((len(partitions), nc), dtype=np.int64)
    for i, part in enumerate(partitions):
        out[i] = np.bincount(y[np.asarray(part, dtype=np.int64)], minlength=nc)
    return out


def _js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (base-2 log), in ``[0, 1]``."""
    mix = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        nz = a > 0  # 0 * log 0 = 0; b > 0 wherever a > 0 since b is a mixture with a
        return float(np.sum(a[nz] * np.log2(a[nz] / b[nz])))

    return 0.5 * kl(p, mix) + 0.5 * kl(q, mix)


def label_distribution_divergence(labels: np.ndarray, partitions: Sequence[np.ndarray], num_classes: int) -> float:
    """Mean Jensen-Shannon divergence between hospital and global label distributions.

    Uses JSD with base-2 logs, so each term lies in ``[0, 1]``: 0 when a
    hospital's class mix equals the global one, 1 when they share no class.
    JSD (rather than KL) stays finite when a hospital lacks a class.
    The global distribution is that of all samples in ``partitions``
    together; hospitals with no samples are skipped.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
    partitions : sequence of index arrays into ``labels``
    num_classes : int

    Returns
    -------
    float
        Unweighted mean over (non-empty) hospitals.
    """
    counts = class_counts(labels, partitions, num_classes).astype(np.float64)
    sizes = counts.sum(axis=1)
    if not np.any(sizes > 0):
        raise ValueError("label_distribution_divergence: all partitions are empty")
    glob = counts.sum(axis=0) / sizes.sum()
    divs = [_js_divergence(row / s, glob) for row, s in zip(counts, sizes) if s > 0]
    return float(np.mean(divs))


def reference_cohort(labels: np.ndarray, per_class: int, *, seed: int) -> np.ndarray:
    """A class-balanced random sample: ``per_class`` indices of every class.

    Classes with fewer than ``per_class`` samples contribute all of them.

    Parameters
    ----------
    labels : np.ndarray of int, shape (n,)
        E.g. the labels of the validation split, from which the server's
        reference cohort is drawn.
    per_class : int
        ``>= 0`` (0: no cohort, the empty sample).
    seed : int

    Returns
    -------
    np.ndarray of int64
        Sorted indices into ``labels``.
    """
    y = _check_labels(labels)
    k = _check_int(per_class, "per_class", 0)
    seed = _check_int(seed, "seed", 0)
    rng = np.random.default_rng(seed)
    picks = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        picks.append(rng.choice(idx, size=min(k, idx.size), replace=False))
    if not picks:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(picks)).astype(np.int64)

"""A hospital's (or the operator's) own images, in any of the formats a federation accepts,
decoded once into a local cache.

Formats (``data-format``; ``auto`` detects them from the path):

- ``folder``: one sub-folder per class, named by class name or index; images (png, jpg, tif, bmp,
  webp) and DICOM files (``.dcm``, or files with the DICOM marker), nested folders allowed;
- ``csv``: a manifest with columns ``path,label`` and optional ``patient_id`` and ``split``
  (``train`` / ``val``); relative paths are resolved against the CSV's folder; labels by class
  name or index;
- ``npz``: arrays ``images`` (N, H, W[, C]) uint8, ``labels`` (N,), optional ``patient_ids`` and
  ``split``.

Decoded images (resized to the task's size, its channels) are written once to
``<cache-dir>/<key>/``: ``images.npy`` (uint8, read back memory-mapped) with labels, patient ids
and per-image digests, every file 0600 in a 0700 folder (``hospitrust.private``). The key covers
every file's path, size and modification time, the labels, and the task's preprocessing, so
changing a file or the task decodes again. Samples are kept in the order of their pixel digests:
the same images give the same arrays in every format.

Every error is a :class:`HospitalDataError` with two texts: ``public`` (its ``str``), which the
ClientApp may send, names the problem, a count and where by index ("file not found (rows 4, 17 of
the manifest)", "file 3 in the folder of class 'normal'"); ``detail``, with paths and file names,
is for the hospital's own log and ``hospitrust data check``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np

from hospitrust.errors import HospitalError
from hospitrust.private import private_dir, save_private_npy, tighten_path, write_private_text


FORMATS = ("auto", "folder", "csv", "npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
CACHE_ENV = "HOSPITRUST_CACHE_DIR"
DICOM_SUFFIXES = (".dcm", ".dicom")
#: Suffixes never read as images (not even checked for the DICOM marker).
NOT_IMAGES = (".txt", ".csv", ".json", ".md", ".xml", ".html", ".pdf", ".zip", ".npz", ".npy", ".db", ".ini", ".log")
MAX_LISTED = 5  # files named per problem in an error message
SPLIT_VALUES = ("train", "val")
NOT_FOUND = " (file not found)"  # how a FileProblem's detail ends for a manifest row whose file is missing


class HospitalDataError(HospitalError, ValueError):
    """Data that does not fit the task: ``public`` (also ``str``) names the problem and where by index,
    ``detail`` names the file and what was expected.
    """


def _default_root(cache_dir: str | Path | None) -> bool:
    """Whether the cache root is hospitrust's own default folder (which it may tighten to 0700)."""
    return cache_dir is None and not os.environ.get(CACHE_ENV, "")


def default_cache_dir() -> Path:
    """Where decoded images are cached: $HOSPITRUST_CACHE_DIR, else ~/.cache/hospitrust/images."""
    raw = os.environ.get(CACHE_ENV, "")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "hospitrust" / "images"


@dataclass(frozen=True)
class Sample:
    """One image file and what the layout says about it; ``place`` and ``number`` say where it is
    without naming it (``number`` of ``place``: row 14 of "the manifest", file 3 of "the folder of
    class 'normal'" in name order, image 5 of "the archive").
    """

    path: Path
    label: int
    patient: str = ""
    split: str = ""  # "", "train" or "val"
    place: str = ""
    number: int = 0


@dataclass(frozen=True)
class FileProblem:
    """A listed file the federation cannot use: where it is (as a Sample says it), the problem in
    public words, and the detail with its path.
    """

    sample: Sample
    problem: str
    detail: str


_UNITS = {"the manifest": "row", "the archive": "image"}  # any other place: a class folder, counted in files


def where_public(samples: Sequence[Sample]) -> str:
    """Samples located without names: "rows 4, 17 of the manifest; file 3 in the folder of class 'normal'"."""
    by_place: dict[str, list[int]] = {}
    for s in samples:
        by_place.setdefault(s.place, []).append(s.number)
    parts = []
    for place, numbers in by_place.items():
        unit = _UNITS.get(place, "file")
        shown = ", ".join(str(n) for n in sorted(numbers)[:MAX_LISTED])
        more = f", ... ({len(numbers) - MAX_LISTED} more)" if len(numbers) > MAX_LISTED else ""
        parts.append(f"{unit}{'s' if len(numbers) > 1 else ''} {shown}{more} {'in' if unit == 'file' else 'of'} {place}")
    return "; ".join(parts)


def problems_error(problems: Sequence[FileProblem], listed: int, skip_unreadable: float = 0.0) -> HospitalDataError:
    """One error for the files that cannot be used: public by problem and index, detail with every file."""
    by_problem: dict[str, list[FileProblem]] = {}
    for p in problems:
        by_problem.setdefault(p.problem, []).append(p)
    allowed = f" (skip-unreadable = {skip_unreadable:g} allows {allowed_skips(listed, skip_unreadable)})" \
        if skip_unreadable > 0 else ""
    head = f"{len(problems)} of {listed} images cannot be used{allowed}: "
    public = head + "; ".join(f"{what} ({where_public([p.sample for p in group])})" for what, group in by_problem.items())
    public += "; hospitrust data check on the hospital's machine names the files"
    details = [p.detail for p in problems]
    detail = head + "; ".join(details[:MAX_LISTED]) + (f"; ... ({len(details) - MAX_LISTED} more)"
                                                     if len(details) > MAX_LISTED else "")
    return HospitalDataError(public, detail)


def allowed_skips(listed: int, skip_unreadable: float) -> int:
    """How many unreadable files ``skip-unreadable`` (a share of the listed files) lets a hospital skip."""
    return int(np.floor(listed * skip_unreadable + 1e-9))


@dataclass(frozen=True)
class Listing:
    """The samples a path holds, and how they were found."""

    root: Path
    layout: str  # folder | csv | npz
    samples: tuple[Sample, ...]
    arrays: dict[str, np.ndarray] | None = None  # npz only: the archive's arrays


def _listed(items: Sequence[str]) -> str:
    head = ", ".join(items[:MAX_LISTED])
    return head + (f", ... ({len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else "")


def detect_format(path: Path) -> str:
    """``csv`` for a .csv file, ``npz`` for a .npz file, ``folder`` for a folder."""
    if path.is_dir():
        return "folder"
    if path.suffix.lower() == ".csv":
        return "csv"
    if path.suffix.lower() == ".npz":
        return "npz"
    if not path.exists():
        raise HospitalDataError("the data path does not exist (expected a folder of class folders, a .csv manifest or "
                                "a .npz archive)",
                                f"data path {path} does not exist (expected a folder of class folders, a .csv manifest "
                                "or a .npz archive)")
    raise HospitalDataError("cannot tell the data path's format from its name (expected a folder, a .csv manifest or "
                            "a .npz archive); name it with data-format",
                            f"data path {path}: cannot tell its format from the name (expected a folder, a .csv "
                            "manifest or a .npz archive); name it with data-format")


def class_index(value: str, class_names: Sequence[str]) -> int | None:
    """A label given by class name (any case) or index -> the index; None when it is neither."""
    text = str(value).strip()
    by_name = {n.lower(): i for i, n in enumerate(class_names)}
    if text.lower() in by_name:
        return by_name[text.lower()]
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(class_names):
        return int(text)
    return None


def is_image_file(path: Path) -> bool:
    """An image or DICOM file this module decodes (DICOM also without a suffix, as PACS exports them)."""
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES or suffix in DICOM_SUFFIXES:
        return True
    if suffix not in NOT_IMAGES and path.is_file():  # PACS names files by UID ("1.2.840.113619.2.55.7"): the marker decides
        from hospitrust.datasets.dicom import is_dicom

        return is_dicom(path)
    return False


def _expected(class_names: Sequence[str]) -> str:
    return ", ".join(f"{i}={n}" for i, n in enumerate(class_names))


def list_folder(root: Path, class_names: Sequence[str], problems: list[str] | None = None) -> Listing:
    """Class-per-folder samples; HospitalDataError when the folders are not the task's classes (with
    ``problems``: appended there instead, and the folders that do match are listed).
    """
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    mapping: dict[str, int] = {}
    unknown = []
    unknown_numbers = []  # 1-based among the sub-folders in name order: how the public text names them
    for number, folder in enumerate(folders, start=1):
        idx = class_index(folder.name, class_names)
        if idx is None:
            unknown.append(folder.name)
            unknown_numbers.append(number)
        else:
            mapping[folder.name] = idx
    missing = sorted(set(range(len(class_names))) - set(mapping.values()))
    doubled = sorted({n for n in mapping.values() if list(mapping.values()).count(n) > 1})
    if (unknown or missing or doubled) and problems is None:
        parts, public = [], []
        if unknown:
            parts.append(f"unknown class folder(s) {unknown}")
            public.append(f"class folder{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown_numbers))} of "
                          f"{len(folders)}: unknown class")
        if missing:
            parts.append(f"no folder for class(es) {[class_names[i] for i in missing]}")
            public.append(parts[-1])
        if doubled:
            parts.append(f"several folders for class(es) {[class_names[i] for i in doubled]}")
            public.append(parts[-1])
        expected = f"expected one folder per class, named by name or index: {_expected(class_names)}"
        raise HospitalDataError(f"class folders do not match the task's classes: {'; '.join(public)}; {expected}",
                                f"class folders in {root} do not match the task's classes: {'; '.join(parts)}; {expected}")
    if problems is not None:
        problems += [f"unknown class folder '{u}': the task's classes are {_expected(class_names)}" for u in unknown]
        problems += [f"missing class {i}={class_names[i]}: no folder '{class_names[i]}' or '{i}'" for i in missing]
        problems += [f"class {i}={class_names[i]} has several folders: {sorted(f for f, c in mapping.items() if c == i)}"
                     for i in doubled]
    samples = []
    for folder_name, cls in sorted(mapping.items()):
        place = f"the folder of class '{class_names[cls]}'"
        files = sorted((root / folder_name).rglob("*"))
        numbered = [f for f in files if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)
                    and is_image_file(f)]  # not .thumbnails/ and the like
        samples += [Sample(file, cls, place=place, number=i) for i, file in enumerate(numbered, start=1)]
    return Listing(root, "folder", tuple(samples))


def list_manifest(path: Path, class_names: Sequence[str], problems: list[str] | None = None,
                  not_found: list[FileProblem] | None = None) -> Listing:
    """A CSV manifest's samples; HospitalDataError naming the row of each problem (with ``problems``:
    appended there instead, and the usable rows are listed; with ``not_found``: rows whose file is
    missing are appended there, for the caller to skip or refuse).
    """
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # Excel's "CSV UTF-8" starts with a byte-order mark
            reader = csv.DictReader(f)
            columns = [c.strip() for c in (reader.fieldnames or [])]
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise HospitalDataError(f"the manifest is not readable as CSV ({type(exc).__name__})",
                                f"manifest {path}: not readable as CSV ({exc})") from None
    for required in ("path", "label"):
        if required not in columns:
            expected = "expected path,label[,patient_id][,split]"
            raise HospitalDataError(f"the manifest has no '{required}' column ({len(columns)} columns); {expected}",
                                    f"manifest {path}: no '{required}' column (columns: {columns}); {expected}")
    samples, missing, bad_labels, bad_splits = [], [], [], []
    missing_rows, label_rows, split_rows = [], [], []
    for row_no, raw in enumerate(rows, start=2):  # row 1 is the header
        row = {str(k).strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        here = Sample(path, -1, place="the manifest", number=row_no)
        if not row["path"]:
            missing.append(f"row {row_no}: empty path")
            missing_rows.append(here)
            continue
        file = Path(row["path"]).expanduser()
        file = file if file.is_absolute() else path.parent / file
        label = class_index(row["label"], class_names)
        split = row.get("split", "").lower()
        if label is None:
            bad_labels.append(f"row {row_no}: {row['label']!r}")
            label_rows.append(here)
        if split and split not in SPLIT_VALUES:
            bad_splits.append(f"row {row_no}: {split!r}")
            split_rows.append(here)
        if not file.is_file():
            if not_found is not None and label is not None and split in ("", *SPLIT_VALUES):
                not_found.append(FileProblem(here, "file not found", f"row {row_no}: {row['path']}{NOT_FOUND}"))
                continue
            missing.append(f"row {row_no}: {row['path']}")
            missing_rows.append(here)
        if file.is_file() and label is not None and split in ("", *SPLIT_VALUES):
            samples.append(Sample(file.resolve(), label, row.get("patient_id", ""), split, "the manifest", row_no))
    found, public = [], []
    if missing:
        found.append(f"{len(missing)} file(s) not found: {_listed(missing)}")
        public.append(f"{len(missing)} file(s) not found ({where_public(missing_rows)})")
    if bad_labels:
        classes = f"label(s) outside the task's classes ({_expected(class_names)})"
        found.append(f"{len(bad_labels)} {classes}: {_listed(bad_labels)}")
        public.append(f"{len(bad_labels)} {classes} ({where_public(label_rows)})")
    if bad_splits:
        found.append(f"{len(bad_splits)} split value(s) not 'train' or 'val': {_listed(bad_splits)}")
        public.append(f"{len(bad_splits)} split value(s) not 'train' or 'val' ({where_public(split_rows)})")
    if found and problems is None:
        raise HospitalDataError("manifest: " + "; ".join(public), f"manifest {path}: " + "; ".join(found))
    if problems is not None:
        problems += [f"manifest {path.name}: {f}" for f in found]
    return Listing(path.parent, "csv", tuple(samples))


def list_npz(path: Path, class_names: Sequence[str]) -> Listing:
    """An archive's samples (images stay in the archive's arrays)."""
    def refuse(public: str, detail: str | None = None) -> HospitalDataError:
        return HospitalDataError(f"the archive: {public}", f"{path}: {detail or public}")

    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise refuse(f"not a readable .npz archive ({type(exc).__name__})", f"not a readable .npz archive ({exc})") from None
    for key in ("images", "labels"):
        if key not in arrays:
            expected = "expected images, labels[, patient_ids][, split]"
            raise refuse(f"no '{key}' array; {expected}", f"no '{key}' array (arrays: {sorted(arrays)}); {expected}")
    images, labels = arrays["images"], arrays["labels"].reshape(-1)
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or images.shape[0] != labels.shape[0]:
        raise refuse(f"images must be uint8 (N, H, W[, C]) with one label each; got {images.dtype} {images.shape} and "
                     f"{labels.shape[0]} labels")
    if not np.issubdtype(labels.dtype, np.integer):
        expected = f"labels must be integer class indices ({_expected(class_names)}), got {labels.dtype}"
        raise refuse(expected, f"{expected} values such as {labels[:3].tolist()}")
    bad = sorted({int(v) for v in labels if not (0 <= int(v) < len(class_names))})
    if bad:
        raise refuse(f"labels {bad} outside the task's classes ({_expected(class_names)})")
    patients = arrays.get("patient_ids", np.full(labels.shape, "", dtype=object)).reshape(-1)
    splits = arrays.get("split", np.full(labels.shape, "", dtype=object)).reshape(-1)
    for name, values in (("patient_ids", patients), ("split", splits)):
        if values.shape[0] != labels.shape[0]:
            raise refuse(f"{name} has {values.shape[0]} entries for {labels.shape[0]} images")
    wrong = sorted({str(v) for v in splits if str(v) not in ("", *SPLIT_VALUES)})
    if wrong:
        raise refuse(f"{sum(str(v) not in ('', *SPLIT_VALUES) for v in splits)} split values are not 'train' or 'val'",
                     f"split values {wrong} are not 'train' or 'val'")
    samples = tuple(Sample(path, int(lab), str(pat), str(spl), "the archive", i)
                    for i, (lab, pat, spl) in enumerate(zip(labels, patients, splits)))
    return Listing(path, "npz", samples, arrays={"images": images})


def list_samples(path: str | Path, data_format: str, class_names: Sequence[str],
                 not_found: list[FileProblem] | None = None) -> Listing:
    """The samples under ``path`` in ``data_format`` (``auto``: detected).

    Parameters
    ----------
    path : str or Path
        A folder of class folders, a CSV manifest or a .npz archive.
    data_format : str
        One of ``FORMATS``.
    class_names : sequence of str
        The task's classes, in label order.
    not_found : list of FileProblem, optional
        A manifest's rows whose file is missing are appended here instead of refused.

    Returns
    -------
    Listing
        The samples; HospitalDataError naming the file and what was expected otherwise.
    """
    p = Path(path).expanduser().resolve()
    if data_format not in FORMATS:
        raise HospitalDataError(f"data-format {data_format!r}; allowed: {', '.join(FORMATS)}")
    fmt = detect_format(p) if data_format == "auto" else data_format
    if fmt == "folder":
        if not p.is_dir():
            raise HospitalDataError("the data path is not a folder (data-format folder: one sub-folder per class)",
                                    f"data path {p} is not a folder (data-format folder: one sub-folder per class)")
        listing = list_folder(p, class_names)
    elif fmt == "csv":
        if not p.is_file():
            raise HospitalDataError("the manifest (the data path) was not found", f"manifest {p} not found")
        listing = list_manifest(p, class_names, not_found=not_found)
    else:
        if not p.is_file():
            raise HospitalDataError("the archive (the data path) was not found", f"archive {p} not found")
        listing = list_npz(p, class_names)
    if not listing.samples and not not_found:
        suffixes = ", ".join(IMAGE_SUFFIXES + DICOM_SUFFIXES)
        raise HospitalDataError(f"no images in the data path ({suffixes})", f"no images under {p} ({suffixes})")
    return listing


def decode_file(path: Path, image_size: int, channels: int, dicom_frame: int = -1) -> np.ndarray:
    """One image file -> uint8 (S, S, C) at the task's size and channels.

    DICOM goes through ``hospitrust.datasets.dicom.read_dicom`` (rescale, VOI LUT / window,
    MONOCHROME1); then every format the same way: converted to grey (L) or RGB and resized
    bilinearly, as PIL does for the other images.
    """
    from PIL import Image, UnidentifiedImageError

    from hospitrust.datasets.dicom import DicomError, is_dicom, read_dicom

    mode = "L" if channels == 1 else "RGB"
    try:
        if path.suffix.lower() in DICOM_SUFFIXES or (path.suffix.lower() not in IMAGE_SUFFIXES and is_dicom(path)):
            pixels = read_dicom(path, frame=dicom_frame if dicom_frame >= 0 else None)
            img = Image.fromarray(pixels)
        else:
            img = Image.open(path)
            if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit grey PNG / TIFF: convert("L") would clip at 255
                img = Image.fromarray(_min_max(np.asarray(img)))
        with img:
            arr = np.asarray(img.convert(mode).resize((image_size, image_size), Image.Resampling.BILINEAR), dtype=np.uint8)
    except DicomError as exc:
        raise HospitalDataError(exc.public, exc.detail) from None
    except Image.DecompressionBombError as exc:
        raise HospitalDataError("an image too large to decode (decompression bomb guard)", f"{path}: {exc}"[:400]) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise HospitalDataError("not a readable image",
                                f"{path}: not a readable image ({type(exc).__name__}: {exc})"[:400]) from None
    return arr if arr.ndim == 3 else arr[..., None]


def _min_max(x: np.ndarray) -> np.ndarray:
    """A high-bit-depth grey image -> uint8 over its own range (as DICOM without a window); constant -> 0."""
    x = x.astype(np.float64)
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return np.zeros(x.shape, dtype=np.uint8)
    return np.floor((x - lo) / (hi - lo) * 255.0 + 0.5).astype(np.uint8)


def decode_array(image: np.ndarray, image_size: int, channels: int) -> np.ndarray:
    """An archive's uint8 image -> (S, S, C), as ``decode_file`` treats a decoded file."""
    from PIL import Image

    img = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    arr = np.asarray(img.convert("L" if channels == 1 else "RGB").resize((image_size, image_size),
                                                                         Image.Resampling.BILINEAR), dtype=np.uint8)
    return arr if arr.ndim == 3 else arr[..., None]


class RowView:
    """Rows ``index`` of an array (a memory-mapped cache), read on access: a hospital's train and
    validation splits without copying its images into memory. Indexing returns arrays.
    """

    def __init__(self, base: np.ndarray, index: np.ndarray) -> None:
        self.base, self.index = base, np.asarray(index, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.index.size), *self.base.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def ndim(self) -> int:
        return self.base.ndim

    def __len__(self) -> int:
        return int(self.index.size)

    def __getitem__(self, key: Any) -> np.ndarray:
        rows = self.index[key]
        if np.ndim(rows) == 0:
            return np.asarray(self.base[int(rows)])
        order = np.argsort(rows, kind="stable")  # read the file forwards, return in the asked order
        out = np.empty((len(rows), *self.base.shape[1:]), dtype=self.base.dtype)
        out[order] = self.base[rows[order]]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[np.arange(len(self))]
        return out.astype(dtype) if dtype is not None else out


@dataclass(frozen=True)
class LocalData:
    """A path's decoded images (memory-mapped), labels, patient ids, given splits and digests."""

    root: Path
    layout: str
    file_types: tuple[str, ...]  # e.g. ("dicom",), ("png",)
    images: np.ndarray  # uint8 (N, S, S, C), memory-mapped from the cache
    labels: np.ndarray  # int64 (N,)
    patients: np.ndarray  # str (N,), "" where unknown
    splits: np.ndarray  # str (N,), "" where not given
    digests: np.ndarray  # str (N,): sha1 of each decoded image (duplicates, canonical order)
    cache: Path | None  # None: decoded in memory, no cache written
    decoded: bool  # False when read from the cache
    skipped: int = 0  # unreadable or missing files left out (node config skip-unreadable)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def format(self) -> str:
        """How logs and data cards name it: layout and file types (``folder (png)``, ``csv (dicom)``)."""
        return f"{self.layout} ({', '.join(self.file_types)})" if self.file_types else self.layout


def _dicom_patient(path: Path) -> str:
    """A DICOM file's PatientID ("" for another file, or a header without one)."""
    if _file_type(path) != "dicom":
        return ""
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=["PatientID"])
    except Exception:  # decoding already succeeded; a header we cannot re-read just gives no id
        return ""
    return str(getattr(ds, "PatientID", "") or "").strip()


def _file_type(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in IMAGE_SUFFIXES:  # .dcm, none, or a UID's last digits: read as DICOM by its marker
        return "dicom"
    return {".jpeg": "jpg", ".tiff": "tif"}.get(suffix, suffix.lstrip("."))


def _cache_key(listing: Listing, preprocessing: str) -> str:
    h = hashlib.sha256()
    h.update(f"{listing.layout}|{listing.root}|{preprocessing}".encode())
    seen: set[Path] = set()
    for s in listing.samples:
        if s.path not in seen:  # an npz: one file
            st = s.path.stat()
            h.update(f"{s.path}|{st.st_size}|{st.st_mtime_ns}".encode())
            seen.add(s.path)
        h.update(f"|{s.label}|{s.patient}|{s.split}".encode())
    return h.hexdigest()[:32]


def load_local(path: str | Path, data_format: str, task: Any, cache_dir: str | Path | None = None,
               progress_every: int = 2000, *, skip_unreadable: float = 0.0, write_cache: bool = True) -> LocalData:
    """Decode (once) the images under ``path`` for ``task``; later calls read the cache.

    Parameters
    ----------
    path : str or Path
        A folder of class folders, a CSV manifest or a .npz archive.
    data_format : str
        One of ``FORMATS``.
    task : Task
        The task (classes, image size, channels, DICOM frame).
    cache_dir : str or Path, optional
        The cache folder; default :func:`default_cache_dir`.
    progress_every : int
        Log a progress line every this many decoded images.
    skip_unreadable : float
        The share of the listed files that may be unreadable (or, in a manifest, missing) and is
        then left out, counted in ``LocalData.skipped``; 0 (default): any such file refuses the data.
    write_cache : bool
        False: decode in memory and write nothing (an existing cache entry is still read).

    Returns
    -------
    LocalData
        The decoded images; HospitalDataError naming every file that could not be used otherwise
        (by index in its public text, by path in its detail).
    """
    from flwr.common import log

    not_found: list[FileProblem] = []
    listing = list_samples(path, data_format, task.class_names, not_found=not_found)
    cache_root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    key = _cache_key(listing, task.preprocessing_key())
    entry = cache_root / key
    listed = len(listing.samples) + len(not_found)
    file_types = tuple(sorted({_file_type(s.path) for s in listing.samples})) if listing.layout != "npz" else ("arrays",)
    if (entry / "complete").is_file():
        _tighten_entry(entry, cache_root, _default_root(cache_dir))
        meta = json.loads((entry / "meta.json").read_text())
        stored = [FileProblem(listing.samples[p["index"]], p["problem"], p["detail"]) for p in meta.get("unreadable", [])
                  if p["index"] < len(listing.samples)]
        _refuse_or_skip([*not_found, *stored], listed, skip_unreadable, listing.root)
        return _read_entry(entry, listing, file_types, decoded=False, skipped=len(not_found) + len(stored))

    start = time.perf_counter()
    n = len(listing.samples)
    images = np.empty((n, task.image_size, task.image_size, task.channels), dtype=np.uint8)
    unreadable: list[tuple[int, FileProblem]] = []
    for i, s in enumerate(listing.samples):
        try:
            if listing.arrays is not None:
                images[i] = decode_array(listing.arrays["images"][i], task.image_size, task.channels)
            else:
                images[i] = decode_file(s.path, task.image_size, task.channels, task.dicom_frame)
        except HospitalDataError as exc:
            unreadable.append((i, FileProblem(s, exc.public, exc.detail)))
        if progress_every and (i + 1) % progress_every == 0:
            log(INFO, "hospitrust: decoded %d/%d images of %s (%.0f s)", i + 1, n, listing.root, time.perf_counter() - start)
    _refuse_or_skip([*not_found, *(p for _, p in unreadable)], listed, skip_unreadable, listing.root)
    kept = np.setdiff1d(np.arange(n), [i for i, _ in unreadable]).astype(np.int64)
    samples = [listing.samples[i] for i in kept]
    images = images[kept]
    digests = np.array([hashlib.sha1(img.tobytes()).hexdigest() for img in images])
    labels = np.array([s.label for s in samples], dtype=np.int64)
    patients = [s.patient for s in samples]
    if listing.layout == "folder" and not any(patients):
        # DICOM headers name the patient: with every image's PatientID the local split is by patient
        header_ids = [_dicom_patient(s.path) for s in samples]
        if all(header_ids):
            patients = header_ids
    # canonical order: by pixels and label, so that the same images give the same arrays in any format
    order = np.lexsort((labels, digests))
    arrays = {"images": images[order], "labels": labels[order],
              "patients": np.array([patients[i] for i in order], dtype=str),
              "splits": np.array([samples[i].split for i in order], dtype=str), "digests": digests[order]}
    skipped = len(not_found) + len(unreadable)
    if not write_cache:
        return LocalData(root=listing.root, layout=listing.layout, file_types=file_types, images=arrays["images"],
                         labels=arrays["labels"], patients=arrays["patients"], splits=arrays["splits"],
                         digests=arrays["digests"], cache=None, decoded=True, skipped=skipped)
    # every file 0600 in 0700 folders: patients.npy holds patient ids, meta.json the data's paths
    private_dir(cache_root, tighten=_default_root(cache_dir))
    tmp = cache_root / f".{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    private_dir(tmp)
    for name, array in arrays.items():
        save_private_npy(tmp / f"{name}.npy", array)
    write_private_text(tmp / "meta.json", json.dumps({
        "root": str(listing.root), "layout": listing.layout, "images": n, "file_types": list(file_types),
        "decode_seconds": time.perf_counter() - start,
        # a later run with another skip-unreadable decides again from these, without decoding
        "unreadable": [{"index": i, "problem": p.problem, "detail": p.detail} for i, p in unreadable]}))
    write_private_text(tmp / "complete", "")
    try:
        tmp.rename(entry)  # atomic: a crash mid-decode leaves no half entry behind
    except OSError:  # another process of the same hospital finished first: use its entry
        shutil.rmtree(tmp, ignore_errors=True)
    return _read_entry(entry, listing, file_types, decoded=True, skipped=skipped)


def _refuse_or_skip(problems: Sequence[FileProblem], listed: int, skip_unreadable: float, root: Path) -> None:
    """Raise for unreadable files beyond what ``skip_unreadable`` allows; log the ones skipped (locally)."""
    if not problems:
        return
    if len(problems) > allowed_skips(listed, skip_unreadable):
        raise problems_error(problems, listed, skip_unreadable)
    from logging import WARNING

    from flwr.common import log

    log(WARNING, "hospitrust: %d of %d files under %s skipped (skip-unreadable %g): %s", len(problems), listed, root,
        skip_unreadable, "; ".join(p.detail for p in problems[:MAX_LISTED]))


def _tighten_entry(entry: Path, cache_root: Path, default_root: bool) -> None:
    """An entry written before caches were private (0644): 0600 files in a 0700 folder."""
    if default_root:
        private_dir(cache_root, tighten=True)
    tighten_path(entry, 0o700)
    for file in entry.iterdir():
        tighten_path(file, 0o600)


def _read_entry(entry: Path, listing: Listing, file_types: tuple[str, ...], decoded: bool, skipped: int) -> LocalData:
    return LocalData(
        root=listing.root, layout=listing.layout, file_types=file_types,
        images=np.load(entry / "images.npy", mmap_mode="r"), labels=np.load(entry / "labels.npy"),
        patients=np.load(entry / "patients.npy"), splits=np.load(entry / "splits.npy"),
        digests=np.load(entry / "digests.npy"), cache=entry, decoded=decoded, skipped=skipped,
    )


def split_local(data: LocalData, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Local train and validation indices: the data's own split where given, else by patient
    (no patient on both sides) where patient ids are given (a manifest's column, an archive's
    array, or every DICOM header's PatientID), else by image.

    Parameters
    ----------
    data : LocalData
        The decoded data.
    val_fraction : float
        Share of the images for validation (by patient: whole patients, until the share is reached).
    seed : int
        Seeds the draw.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        Sorted int64 train and validation indices.
    """
    from hospitrust.datasets.partitioners import split_train_val

    n = len(data)
    if (data.splits != "").all():
        return (np.flatnonzero(data.splits == "train").astype(np.int64),
                np.flatnonzero(data.splits == "val").astype(np.int64))
    if (data.splits != "").any():
        message = "the split column is set for some images only; set it for every row or none"
        raise HospitalDataError(message, f"{data.root}: {message}")
    if (data.patients != "").all() and np.unique(data.patients).size < n:
        patients = np.unique(data.patients)
        rng = np.random.default_rng([seed, 11])
        target = int(round(val_fraction * n))
        val_patients: list[str] = []
        count = 0
        for p in rng.permutation(patients):
            if count >= target or len(val_patients) == len(patients) - 1:
                break
            val_patients.append(str(p))
            count += int((data.patients == p).sum())
        val = np.isin(data.patients, val_patients)
        return np.flatnonzero(~val).astype(np.int64), np.flatnonzero(val).astype(np.int64)
    if (data.patients != "").any() and not (data.patients != "").all():
        message = "patient_id is set for some images only; set it for every row or none"
        raise HospitalDataError(message, f"{data.root}: {message}")
    # no patient ids, or one image per patient: by image (the same split either way)
    return split_train_val(np.arange(n), val_fraction, seed=seed)


def data_card(data: LocalData, train_idx: np.ndarray, val_idx: np.ndarray, num_classes: int) -> dict[str, Any]:
    """What a hospital reports about its data: counts and pixel statistics, never an image, a path or
    a patient id.

    Parameters
    ----------
    data : LocalData
        The decoded data.
    train_idx, val_idx : np.ndarray
        The local split.
    num_classes : int
        The task's classes.

    Returns
    -------
    dict
        ``images``, ``train-class-counts``, ``val-class-counts``, ``pixel-mean`` and ``pixel-std``
        (per channel, on [0, 1]), ``patients`` (0 when not given), ``format``, ``skipped-files``
        (unreadable files left out under skip-unreadable: a count, never a name).
    """
    images = data.images
    mean, sq = np.zeros(images.shape[-1]), np.zeros(images.shape[-1])
    for start in range(0, len(data), 4096):  # in chunks: the memory map is read once, not held
        chunk = np.asarray(images[start:start + 4096], dtype=np.float64) / 255.0
        mean += chunk.sum(axis=(0, 1, 2))
        sq += (chunk ** 2).sum(axis=(0, 1, 2))
    pixels = max(len(data) * images.shape[1] * images.shape[2], 1)
    mean /= pixels
    std = np.sqrt(np.maximum(sq / pixels - mean ** 2, 0.0))
    return {
        "images": len(data),
        "train-class-counts": [int(c) for c in np.bincount(data.labels[train_idx], minlength=num_classes)[:num_classes]],
        "val-class-counts": [int(c) for c in np.bincount(data.labels[val_idx], minlength=num_classes)[:num_classes]],
        "pixel-mean": [round(float(m), 4) for m in mean],
        "pixel-std": [round(float(s), 4) for s in std],
        "patients": int(np.unique(data.patients).size) if (data.patients != "").all() else 0,
        "format": data.format,
        "skipped-files": int(data.skipped),
    }

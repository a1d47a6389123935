"""``hospitrust data check PATH``: is a hospital's data what the ClientApp will accept?

It reads the data the way the ClientApp does (``hospitrust.datasets.local``), for every format: a
folder of class folders (images and DICOM files), a CSV manifest (``path,label[,patient_id][,split]``)
or a ``.npz`` archive (``images``, ``labels``[, ``patient_ids``][, ``split``]). Unlike the
ClientApp it does not stop at the first problem: the layout is listed in the lenient mode of
``list_folder`` / ``list_manifest`` and every file is decoded, so the report names every problem
at once:

- the layout: unknown or missing class folders, manifest rows whose file is missing, labels outside
  the task, bad split values;
- every file: unreadable images, DICOM files the federation cannot use (``read_dicom``'s own
  reason: no pixel data, unsupported photometric interpretation, more than 16 bits, multi-frame
  without the task's ``dicom-frame``, a compressed transfer syntax without a decoder), 16-bit
  PNG / TIFF images (scaled over their own range: a warning);
- the classes: an empty class, the same image content under two classes (label noise; the same
  content twice in one class is a warning);
- the local split: a patient on both sides of a given split, patient ids or split values on some
  rows only;
- image sizes: non-square images and images smaller than the task's image size (problems unless
  ``allow_odd_sizes``: the ClientApp squashes or upsamples them).

Unreadable files (and a manifest's rows whose file is missing) are problems, unless
``skip_unreadable`` (the node config's ``skip-unreadable``: a share of the listed files) allows
that many: then they are warnings saying the ClientApp will skip them.

This report is for the hospital's own terminal: it names files and folders. What the ClientApp
sends names none (``hospitrust.errors.HospitalError``).

It never raises on bad data: :func:`check_path` returns a :class:`DataReport` whose ``problems``
are empty when the data is ready; ``format()`` is the report table the CLI prints.
"""

from __future__ import annotations

import hashlib
import io
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hospitrust.datasets.local import IMAGE_SUFFIXES
from hospitrust.datasets.local import (
    DICOM_SUFFIXES,
    FORMATS,
    NOT_FOUND,
    SPLIT_VALUES,
    FileProblem,
    HospitalDataError,
    allowed_skips,
    class_index,
    decode_file,
    is_image_file,
    list_folder,
    list_manifest,
    list_samples,
)
from hospitrust.tasks.task import Task

MAX_LISTED = 5  # names listed per problem in the report
READY = "OK: ready to join the federation"
# PIL modes of more than 8 bits per sample: PIL's convert to L / RGB clips them at 255
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
GREY_MODES = ("1", "L", "LA", "La", "DICOM grey", "grey", "grey+alpha", *WIDE_MODES)


@dataclass
class ClassRow:
    """One row of the report table: a class folder (folder layout) or a class (manifest, archive)."""

    name: str  # the folder's name, or the class name
    index: int | None  # the task's class index; None: a folder that is no class of the task
    where: str  # how problems name it: "in 'pneumonia'", "of class 1=pneumonia"
    images: int = 0  # readable images (an unknown folder: image files, not decoded)
    unreadable: int = 0
    not_square: list[str] = field(default_factory=list)
    too_small: list[str] = field(default_factory=list)
    other_files: list[str] = field(default_factory=list)  # folder layout: files that are no image
    splits: Counter = field(default_factory=Counter)  # readable images per given split
    patients: set[str] = field(default_factory=set)


@dataclass
class _Item:
    """One listed image: a file, or an archive's row."""

    name: str  # as the report shows it: relative to the data path
    label: int
    row: ClassRow
    path: Path | None = None  # the file (None: an archive's row)
    patient: str = ""
    split: str = ""
    ok: bool = False
    digest: str = ""


@dataclass
class DataReport:
    """What :func:`check_path` found; ``ok`` when there is no problem."""

    path: Path
    task: Task
    layout: str = ""  # folder | csv | npz; "" when the path could not be read at all
    rows: list[ClassRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the ClientApp will split, and other facts
    file_types: Counter = field(default_factory=Counter)  # png, jpg, dicom, arrays, ...
    sizes: Counter = field(default_factory=Counter)  # (width, height) -> readable images
    modes: Counter = field(default_factory=Counter)  # PIL mode, "DICOM grey" / "DICOM RGB", archive grey / RGB
    dicom_photometric: Counter = field(default_factory=Counter)  # every DICOM file's header
    dicom_bits: Counter = field(default_factory=Counter)
    dicom_syntaxes: Counter = field(default_factory=Counter)
    skippable: list[str] = field(default_factory=list)  # unreadable / missing files: problems or, if allowed, skipped
    skippable_files: int = 0
    listed_files: int = 0
    split_given: bool = False
    patients: int = 0  # distinct patient ids (0: none given)
    dicom_patients: int = 0  # distinct PatientIDs in the DICOM headers
    dicom_patient_files: int = 0  # DICOM files whose header names a PatientID

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def classes(self) -> list[ClassRow]:
        return self.rows

    @property
    def class_counts(self) -> dict[str, int]:
        """Readable images per task class (by class name)."""
        counts = dict.fromkeys(self.task.class_names, 0)
        for r in self.rows:
            if r.index is not None:
                counts[self.task.class_names[r.index]] += r.images
        return counts

    @property
    def split_counts(self) -> dict[str, dict[str, int]]:
        """Readable images per given split and class: ``{"train": {"normal": 3, ...}, "val": {...}}``."""
        out = {s: dict.fromkeys(self.task.class_names, 0) for s in SPLIT_VALUES}
        for r in self.rows:
            if r.index is not None:
                for s in SPLIT_VALUES:
                    out[s][self.task.class_names[r.index]] += r.splits[s]
        return out

    def format(self) -> str:
        t = self.task
        classes = ", ".join(f"{i}={n}" for i, n in enumerate(t.class_names))
        channels = f"{t.channels} channel{'s' if t.channels != 1 else ''} ({'grey' if t.channels == 1 else 'RGB'})"
        frame = f", dicom-frame {t.dicom_frame}" if t.dicom_frame >= 0 else ""
        lines = [f"data check: {self.path}",
                 f"task: {t.name} ({t.source or 'given'}): {t.num_classes} classes ({classes}), image size "
                 f"{t.image_size}x{t.image_size}, {channels}{frame}"]
        if self.layout:
            layout = {"folder": "folder of class folders", "csv": "CSV manifest", "npz": ".npz archive"}[self.layout]
            types = ", ".join(f"{k} {n}" for k, n in sorted(self.file_types.items()))
            lines.append(f"layout: {layout}" + (f" ({types})" if types else ""))
        if self.rows:
            lines += [""] + self._table()
        facts = []
        if self.sizes:
            shown = ", ".join(f"{w}x{h}: {n}" for (w, h), n in self.sizes.most_common(8))
            more = f", ... ({len(self.sizes) - 8} more sizes)" if len(self.sizes) > 8 else ""
            facts.append(f"image sizes (width x height: count): {shown}{more}")
        if self.modes:
            facts.append("colour modes: " + _counts(self.modes))
        if self.dicom_photometric:
            facts.append("DICOM photometric interpretations: " + _counts(self.dicom_photometric))
            facts.append("DICOM bits stored: " + _counts(self.dicom_bits))
            facts.append("DICOM transfer syntaxes: " + _counts(self.dicom_syntaxes))
        if self.patients:
            facts.append(f"patients: {self.patients}")
        facts += self.notes
        if facts:
            lines += [""] + facts
        for title, items in (("WARNING", self.warnings), ("PROBLEM", self.problems)):
            if items:
                lines.append("")
                lines += [f"{title}: {p}" for p in items]
        lines += ["", READY if self.ok else f"NOT READY: {len(self.problems)} problem(s)"]
        return "\n".join(lines)

    def _table(self) -> list[str]:
        folder = self.layout == "folder"
        cols: list[tuple[str, Any]] = []
        if folder:
            cols.append(("folder", lambda r: r.name))
        cols.append(("class", lambda r: "UNKNOWN" if r.index is None else f"{r.index}={self.task.class_names[r.index]}"))
        cols.append(("images", lambda r: r.images))
        if self.layout != "npz":
            cols.append(("unreadable", lambda r: r.unreadable))
        if self.split_given:
            cols += [("train", lambda r: r.splits["train"]), ("val", lambda r: r.splits["val"])]
        if self.patients:
            cols.append(("patients", lambda r: len(r.patients)))
        cols += [("not-square", lambda r: len(r.not_square)), ("too-small", lambda r: len(r.too_small))]
        if folder:
            cols.append(("other", lambda r: len(r.other_files)))
        cells = [[str(get(r)) for _, get in cols] for r in self.rows]
        total = ["total" if i == 0 else "" for i in range(len(cols))]
        for j, (head, get) in enumerate(cols):
            if j > 0 and all(isinstance(get(r), int) for r in self.rows):
                total[j] = str(sum(int(get(r)) for r in self.rows)) if head != "patients" else str(self.patients)
        cells.append(total)
        text_cols = 2 if folder else 1  # left-aligned
        widths = [max(len(h), *(len(c[j]) for c in cells)) for j, (h, _) in enumerate(cols)]

        def line(values: Sequence[str]) -> str:
            return "  ".join(v.ljust(w) if j < text_cols else v.rjust(w) for j, (v, w) in enumerate(zip(values, widths))).rstrip()

        head = line([h for h, _ in cols])
        return [head, "-" * len(head)] + [line(c) for c in cells]


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k}: {n}" for k, n in counter.most_common())


def _listed(items: Sequence[str]) -> str:
    head = ", ".join(items[:MAX_LISTED])
    return head + (f", ... ({len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else "")


def _expected(class_names: Sequence[str]) -> str:
    return ", ".join(f"{i}={n}" for i, n in enumerate(class_names))


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- one file --------------------------------------------------------------------------------


@dataclass
class _FileResult:
    error: str = ""  # why the ClientApp cannot use it ("" readable)
    dicom: bool = False
    size: tuple[int, int] | None = None  # width, height of the image as stored
    mode: str = ""
    digest: str = ""  # sha1 of the file's bytes (DICOM: of its decoded pixels)
    clipped: str = ""  # a >8-bit image: the ClientApp scales it over its own range
    blank: bool = False  # one grey level after decoding
    header: dict[str, str] = field(default_factory=dict)  # DICOM header tags


def _is_dicom_file(path: Path) -> bool:
    """The ClientApp's own rule (``decode_file``): a DICOM suffix, or no image suffix and the DICM marker."""
    from hospitrust.datasets.dicom import is_dicom

    suffix = path.suffix.lower()
    return suffix in DICOM_SUFFIXES or (suffix not in IMAGE_SUFFIXES and is_dicom(path))


def _dicom_header(path: Path) -> dict[str, str]:
    """Photometric interpretation, bits stored, transfer syntax and patient id, from the header only."""
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
    except Exception:  # pydicom raises many kinds on a bad file; read_dicom names the reason
        return {}
    syntax = getattr(ds, "file_meta", None)
    uid = syntax.get("TransferSyntaxUID") if syntax is not None else None
    return {
        "photometric": str(ds.get("PhotometricInterpretation", "") or "missing").strip(),
        "bits": str(ds.get("BitsStored", "") or "missing"),
        "syntax": (pydicom.uid.UID(str(uid)).name if uid else "missing"),
        "patient": str(ds.get("PatientID", "") or ""),
    }


def _check_file(path: Path, task: Task) -> _FileResult:
    """Decode one file as the ClientApp does; never raises."""
    from PIL import Image

    res = _FileResult()
    try:
        res.dicom = _is_dicom_file(path)
    except OSError as exc:
        res.error = f"cannot be read ({type(exc).__name__}: {exc})"
        return res
    mode = "L" if task.channels == 1 else "RGB"
    if res.dicom:
        from hospitrust.datasets.dicom import DicomError, read_dicom

        res.header = _dicom_header(path)
        try:
            pixels = read_dicom(path, frame=task.dicom_frame if task.dicom_frame >= 0 else None)
            # the rest of decode_file for a DICOM: to the task's channels and size
            with Image.fromarray(pixels) as img:
                img.convert(mode).resize((task.image_size, task.image_size), Image.Resampling.BILINEAR)
        except DicomError as exc:
            message = exc.detail  # the hospital's own terminal: the file's name may be shown here
            res.error = message[len(f"{path}: "):] if message.startswith(f"{path}: ") else message
            return res
        except Exception as exc:  # anything else pydicom or PIL raises is a file the ClientApp cannot use
            res.error = _short(f"cannot be decoded ({type(exc).__name__}: {exc})")
            return res
        res.size = (int(pixels.shape[1]), int(pixels.shape[0]))
        res.mode = "DICOM RGB" if pixels.ndim == 3 else "DICOM grey"
        res.digest = "p" + hashlib.sha1(f"{pixels.shape}".encode() + pixels.tobytes()).hexdigest()
        res.blank = bool(pixels.min() == pixels.max())
        return res

    data = b""
    try:
        data = path.read_bytes()
        res.digest = "f" + hashlib.sha1(data).hexdigest()
        decoded = decode_file(path, task.image_size, task.channels, task.dicom_frame)  # what the ClientApp runs
        with Image.open(io.BytesIO(data)) as img:  # the header: size and mode as stored
            res.size, res.mode = (int(img.size[0]), int(img.size[1])), img.mode
            if img.mode in WIDE_MODES:
                hi = float(np.asarray(img).max())
                if hi > 255:
                    res.clipped = f"{img.mode}, values up to {hi:g}"
    except Exception as exc:  # HospitalDataError; PIL raises many kinds (and DecompressionBombError) on bad files
        message = exc.detail if isinstance(exc, HospitalDataError) else f"{type(exc).__name__}: {exc}"
        message = message[len(f"{path}: "):] if message.startswith(f"{path}: ") else message
        res.error = _short(message.replace(str(path), path.name))
        if data[128:132] == b"DICM":
            res.error += f"; it is a DICOM file named {path.suffix}: rename it to .dcm"
        return res
    res.blank = bool(decoded.min() == decoded.max())
    return res


def _file_type(path: Path, dicom: bool) -> str:
    if dicom:
        return "dicom"
    suffix = path.suffix.lower()
    return {".jpeg": "jpg", ".tiff": "tif"}.get(suffix, suffix.lstrip(".") or "no suffix")


# --- the layouts -----------------------------------------------------------------------------


def _folder_items(root: Path, report: DataReport) -> list[_Item] | None:
    """Class folders: the listing's problems, the table's rows, and the listed images."""
    from hospitrust.datasets.dicom import is_dicom

    names = report.task.class_names
    listing_problems: list[str] = []
    try:
        listing = list_folder(root, names, listing_problems)
    except OSError as exc:
        report.problems.append(f"{root}: cannot list the folder ({exc})")
        return None
    report.problems += listing_problems
    rows: dict[str, ClassRow] = {}
    listed = {s.path for s in listing.samples}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        row = ClassRow(folder.name, class_index(folder.name, names), f"in '{folder.name}'")
        rows[folder.name] = row
        report.rows.append(row)
        hidden_dicom = []
        for file in sorted(folder.rglob("*")):
            if not file.is_file() or file.name.startswith("."):
                continue
            if row.index is None:
                row.images += is_image_file(file)
            elif file not in listed:
                row.other_files.append(_rel(file, root))
                if is_dicom(file):  # by its DICM marker: its suffix is no image suffix
                    hidden_dicom.append(_rel(file, root))
        others = [f for f in row.other_files if f not in hidden_dicom]
        if others:
            report.warnings.append(f"{len(others)} non-image file(s) in '{folder.name}' are ignored (the ClientApp reads "
                                   f"{', '.join(IMAGE_SUFFIXES + DICOM_SUFFIXES)} and DICOM files without a suffix): "
                                   f"{_listed(others)}")
        if hidden_dicom:
            report.warnings.append(f"{len(hidden_dicom)} DICOM file(s) in '{folder.name}' have a suffix the ClientApp does "
                                   f"not read as DICOM (e.g. a UID-like name), so they are ignored; rename them to .dcm: "
                                   f"{_listed(hidden_dicom)}")
    loose = sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(".") and is_image_file(p))
    if loose:
        report.warnings.append(f"{len(loose)} image(s) directly in {root} are ignored (images must be inside a class "
                               f"folder): {_listed(loose)}")
    return [_Item(_rel(s.path, root), s.label, rows[s.path.relative_to(root).parts[0]], s.path) for s in listing.samples]


def _class_rows(report: DataReport) -> list[ClassRow]:
    rows = [ClassRow(n, i, f"of class {i}={n}") for i, n in enumerate(report.task.class_names)]
    report.rows += rows
    return rows


def _manifest_items(path: Path, report: DataReport) -> list[_Item] | None:
    listing_problems: list[str] = []
    not_found: list[FileProblem] = []
    try:
        listing = list_manifest(path, report.task.class_names, listing_problems, not_found=not_found)
    except HospitalDataError as exc:
        report.problems.append(exc.detail)
        return None
    report.problems += listing_problems
    if not_found:
        missing = [p.detail.removesuffix(NOT_FOUND) for p in not_found]
        report.skippable.append(f"manifest {path.name}: {len(not_found)} file(s) not found: {_listed(missing)}")
        report.skippable_files += len(not_found)
        report.listed_files += len(not_found)
    rows = _class_rows(report)
    base = path.parent.resolve()
    return [_Item(_rel(s.path, base), s.label, rows[s.label], s.path, s.patient, s.split) for s in listing.samples]


def _npz_items(path: Path, report: DataReport) -> list[_Item] | None:
    """An archive: the same checks as ``list_npz``, but every problem at once, and the ones it misses."""
    from hospitrust.datasets.local import decode_array

    task, problems = report.task, report.problems
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:  # numpy raises OSError, ValueError, zipfile errors, ...
        hint = ("; save patient ids and split values as string arrays (np.array(values, dtype=str)), not Python objects"
                if "allow_pickle" in str(exc) else "")
        problems.append(f"{path.name}: not a readable .npz archive ({_short(str(exc))}){hint}")
        return None
    missing = [k for k in ("images", "labels") if k not in arrays]
    if missing:
        problems.append(f"{path.name}: no {' and no '.join(repr(k) for k in missing)} array (arrays: {sorted(arrays)}); "
                        "expected images, labels[, patient_ids][, split]")
        return None
    extra = sorted(set(arrays) - {"images", "labels", "patient_ids", "split"})
    if extra:
        report.warnings.append(f"{path.name}: array(s) {extra} are ignored (the ClientApp reads images, labels, "
                               "patient_ids, split)")
    images, labels = arrays["images"], arrays["labels"].reshape(-1)
    n = labels.shape[0]
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or images.shape[0] != n:
        problems.append(f"{path.name}: images must be uint8 (N, H, W[, C]) with one label each; got {images.dtype} "
                        f"{images.shape} and {n} labels")
        return None
    if n == 0:
        problems.append(f"{path.name}: the archive holds no images")
        return None
    try:
        decode_array(images[0], task.image_size, task.channels)
    except Exception as exc:  # what PIL raises on an array it cannot take
        problems.append(f"{path.name}: images of shape {images.shape[1:]} cannot be decoded ({_short(str(exc))})")
        return None

    values: list[int | None] = []
    raw_labels = labels.tolist()
    for v in raw_labels:
        try:
            f = float(v)
            values.append(int(f) if f == int(f) else None)
        except (TypeError, ValueError, OverflowError):
            values.append(None)
    not_int = [f"image {i}: {raw_labels[i]!r}" for i, v in enumerate(values) if v is None]
    if not_int:
        problems.append(f"{path.name}: {len(not_int)} label(s) are not class indices (integers 0 to {task.num_classes - 1}; "
                        f"the ClientApp reads labels as integers): {_listed(not_int)}")
    outside = [f"image {i}: {v}" for i, v in enumerate(values) if v is not None and not 0 <= v < task.num_classes]
    if outside:
        problems.append(f"{path.name}: {len(outside)} label(s) outside the task's classes ({_expected(task.class_names)}): "
                        f"{_listed(outside)}")

    def strings(key: str) -> list[str]:
        if key not in arrays:
            return [""] * n
        arr = arrays[key].reshape(-1)
        if arr.shape[0] != n:
            problems.append(f"{path.name}: '{key}' has {arr.shape[0]} entries for {n} images (the ClientApp pairs them "
                            "in order and drops the images without one); give one per image")
        out = [x.decode() if isinstance(x, bytes) else str(x) for x in arr.tolist()][:n]
        return [x.strip() for x in out] + [""] * (n - len(out))

    patients, splits = strings("patient_ids"), strings("split")
    bad_split = [f"image {i}: {s!r}" for i, s in enumerate(splits) if s and s not in SPLIT_VALUES]
    if bad_split:
        problems.append(f"{path.name}: {len(bad_split)} split value(s) not 'train' or 'val' (the ClientApp puts those "
                        f"images on neither side): {_listed(bad_split)}")

    rows = _class_rows(report)
    h, w = int(images.shape[1]), int(images.shape[2])
    channels = 1 if images.ndim == 3 else int(images.shape[3])
    mode = {1: "grey", 2: "grey+alpha", 3: "RGB", 4: "RGBA"}.get(channels, f"{channels} channels")
    flat = images.reshape(n, -1)
    blank = flat.min(axis=1) == flat.max(axis=1)
    report.file_types["arrays"] = n
    items = []
    for i, v in enumerate(values):
        if v is None or not 0 <= v < task.num_classes or (splits[i] and splits[i] not in SPLIT_VALUES):
            continue
        item = _Item(f"image {i}", v, rows[v], None, patients[i], splits[i], ok=True,
                     digest="a" + hashlib.sha1(images[i].tobytes()).hexdigest())
        items.append(item)
        item.row.images += 1
        report.sizes[(w, h)] += 1
        report.modes[mode] += 1
    _size_checks(items, (w, h), task)
    if blank.any():
        report.warnings.append(f"{int(blank.sum())} image(s) are blank (a single grey level): "
                               f"{_listed([f'image {i}' for i in np.flatnonzero(blank)])}")
    return items


def _size_checks(items: Iterable[_Item], size: tuple[int, int], task: Task) -> None:
    w, h = size
    for item in items:
        if w != h:
            item.row.not_square.append(f"{item.name} ({w}x{h})")
        if min(w, h) < task.image_size:
            item.row.too_small.append(f"{item.name} ({w}x{h})")


def _decode_items(items: list[_Item], report: DataReport) -> None:
    """Decode every listed file: unreadable images, DICOM reasons, sizes, modes, digests."""
    task = report.task
    unreadable: dict[str, list[str]] = defaultdict(list)  # row.where -> names
    dicom_bad: dict[str, list[str]] = defaultdict(list)  # reason -> names
    clipped: list[str] = []
    blank: list[str] = []
    dicom_patients: set[str] = set()
    for item in items:
        assert item.path is not None  # a listed file
        path = item.path
        res = _check_file(path, task)
        report.file_types[_file_type(path, res.dicom)] += 1
        if res.header:
            report.dicom_photometric[res.header["photometric"]] += 1
            report.dicom_bits[res.header["bits"]] += 1
            report.dicom_syntaxes[res.header["syntax"]] += 1
            if res.header["patient"]:
                dicom_patients.add(res.header["patient"])
                report.dicom_patient_files += 1
        if res.error:
            item.row.unreadable += 1
            if res.dicom:
                dicom_bad[res.error].append(item.name)
            else:
                unreadable[item.row.where].append(f"{item.name} ({res.error})")
            continue
        assert res.size is not None  # a readable file has its size
        item.ok, item.digest = True, res.digest
        item.row.images += 1
        report.sizes[res.size] += 1
        report.modes[res.mode] += 1
        _size_checks([item], res.size, task)
        if res.clipped:
            clipped.append(f"{item.name} ({res.clipped})")
        if res.blank:
            blank.append(item.name)
    report.listed_files += len(items)
    for where, names in unreadable.items():
        report.skippable.append(f"{len(names)} unreadable image(s) {where}: {_listed(names)}")
        report.skippable_files += len(names)
    for reason, names in dicom_bad.items():
        report.skippable.append(f"{len(names)} DICOM file(s) cannot be used: {reason}: {_listed(names)}")
        report.skippable_files += len(names)
    if clipped:
        report.warnings.append(f"{len(clipped)} image(s) have more than 8 bits per sample: the ClientApp scales each "
                               "over its own range (no window, unlike DICOM); export DICOM to keep a window: "
                               f"{_listed(clipped)}")
    if blank:
        report.warnings.append(f"{len(blank)} image(s) are blank (a single grey level after decoding): {_listed(blank)}")
    report.dicom_patients = len(dicom_patients)


# --- checks over all images ------------------------------------------------------------------


def _class_checks(report: DataReport, allow_odd_sizes: bool) -> None:
    task = report.task
    for row in report.rows:
        if row.index is None:
            continue
        if row.images == 0:
            if report.layout == "folder":
                report.problems.append(f"empty class: folder '{row.name}' ({task.class_names[row.index]}) has no readable images")
            else:
                where = "in the manifest" if report.layout == "csv" else "in the archive"
                report.problems.append(f"empty class: {row.index}={row.name} has no readable image {where}")
    odd = report.warnings if allow_odd_sizes else report.problems
    size = task.image_size
    for row in report.rows:
        if row.not_square:
            odd.append(f"{len(row.not_square)} image(s) {row.where} are not square (the ClientApp squashes them to "
                       f"{size}x{size}): {_listed(row.not_square)}")
        if row.too_small:
            odd.append(f"{len(row.too_small)} image(s) {row.where} are smaller than the federation's image-size {size} "
                       f"(the ClientApp upsamples them): {_listed(row.too_small)}")
    grey = sum(n for m, n in report.modes.items() if m in GREY_MODES)
    colour = sum(report.modes.values()) - grey
    if task.channels == 1 and colour:
        report.warnings.append(f"{colour} colour image(s): the task is grey (1 channel), so the ClientApp converts them to grey")
    if task.channels == 3 and grey:
        report.warnings.append(f"{grey} grey image(s): the task is RGB (3 channels), so the ClientApp repeats the grey "
                               "level in every channel")


def _duplicate_checks(items: list[_Item], report: DataReport) -> None:
    names = report.task.class_names
    groups: dict[str, list[_Item]] = defaultdict(list)
    for item in items:
        if item.ok:
            groups[item.digest].append(item)
    across: list[str] = []
    within: list[str] = []
    kinds: dict[str, set[str]] = {"across": set(), "within": set()}
    for digest, group in groups.items():
        if len(group) < 2:
            continue
        text = " = ".join(f"{i.name} ({names[i.label]})" for i in group[:4]) + (f" (+{len(group) - 4} more)" if len(group) > 4 else "")
        side = "across" if len({i.label for i in group}) > 1 else "within"
        (across if side == "across" else within).append(text)
        kinds[side].add({"f": "the same file bytes", "p": "the same DICOM pixel data", "a": "the same image array"}[digest[0]])

    def joined(texts: list[str]) -> str:
        return "; ".join(texts[:MAX_LISTED]) + (f"; ... ({len(texts) - MAX_LISTED} more)" if len(texts) > MAX_LISTED else "")

    if across:
        report.problems.append(f"{len(across)} image(s) appear under two or more classes ({' or '.join(sorted(kinds['across']))}; "
                               f"label noise the federation would train on): {joined(across)}")
    if within:
        report.warnings.append(f"{len(within)} image(s) appear twice or more in one class ({' or '.join(sorted(kinds['within']))}): "
                               f"{joined(within)}")


def _split_checks(items: list[_Item], report: DataReport, val_fraction: float) -> None:
    """The local split, as ``split_local`` will make it: problems where it refuses or leaks."""
    if report.layout == "folder":
        listed = sum(report.file_types.values())
        if report.dicom_patient_files and report.dicom_patient_files == listed:  # split_local uses the headers' ids
            if report.dicom_patients < listed:
                report.notes.append(f"local split: by patient (the DICOM headers' PatientID: {report.dicom_patients} "
                                    f"patients), val-fraction {val_fraction:g}: no patient on both sides")
            else:
                report.notes.append(f"local split: by image (every DICOM header names another patient), val-fraction "
                                    f"{val_fraction:g}")
            return
        why = "a folder layout has no patient ids"
        if report.dicom_patients:
            why = ("the DICOM headers name patients, but not every image is a DICOM file with a PatientID; a CSV "
                   "manifest with a patient_id column splits by patient")
        report.notes.append(f"local split: by image, at random (val-fraction {val_fraction:g}): images of one patient may "
                            f"land on both sides; {why}")
        return
    n = len(items)
    with_split = [i for i in items if i.split]
    with_patient = [i for i in items if i.patient]
    patients = {i.patient for i in with_patient}
    report.split_given, report.patients = bool(with_split), len(patients)
    for item in items:
        if item.ok and item.split:
            item.row.splits[item.split] += 1
        if item.patient:
            item.row.patients.add(item.patient)
    if with_patient and len(with_patient) < n:
        without = [i.name for i in items if not i.patient]
        why = ("the leak check below cannot cover the others" if with_split else "the ClientApp refuses this")
        report.problems.append(f"patient_id is set for {len(with_patient)} of {n} images only ({why}): set it for every "
                               f"row or none; without one: {_listed(without)}")
    if with_split:
        if len(with_split) < n:
            without = [i.name for i in items if not i.split]
            report.problems.append(f"the split column is set for {len(with_split)} of {n} images only (the ClientApp "
                                   f"refuses this): set it for every row or none; without one: {_listed(without)}")
        sides: dict[str, Counter] = defaultdict(Counter)
        for item in with_split:
            if item.patient:
                sides[item.patient][item.split] += 1
        both = sorted(p for p, c in sides.items() if c["train"] and c["val"])
        if both:
            named = [f"{p} ({sides[p]['train']} train, {sides[p]['val']} val)" for p in both]
            report.problems.append(f"{len(both)} patient(s) have images on both sides of the split (train and val), so "
                                   f"local validation sees patients it trained on: {_listed(named)}")
        train = sum(1 for i in with_split if i.split == "train")
        if train == 0:
            report.problems.append("the split column puts no image in train: the hospital would train on nothing")
        if train == len(with_split):
            report.warnings.append("the split column puts no image in val: the hospital's local validation is empty")
        report.notes.append("local split: the split column (train / val) as given")
    elif with_patient:
        report.notes.append(f"local split: no split column, so the ClientApp splits by patient (whole patients go to "
                            f"validation until val-fraction {val_fraction:g} of the images): no patient lands on both sides")
        if len(patients) < 2 or int(round(val_fraction * n)) == 0:
            report.warnings.append(f"{len(patients)} patient(s) and {n} image(s) at val-fraction {val_fraction:g}: the "
                                   "hospital's local validation split will be empty")
    else:
        report.notes.append(f"local split: no split column and no patient ids, so the ClientApp splits by image at random "
                            f"(val-fraction {val_fraction:g}); images of one patient may land on both sides")


# --- entry points ----------------------------------------------------------------------------


def _resolve_format(path: Path, data_format: str, report: DataReport) -> str | None:
    if data_format not in FORMATS:
        report.problems.append(f"data-format {data_format!r}; allowed: {', '.join(FORMATS)}")
        return None
    if data_format == "auto":
        if path.is_dir():
            return "folder"
        if not path.exists():
            report.problems.append(f"data path {path} is not a folder, a .csv manifest or a .npz archive: it does not "
                                   "exist (expected a folder of class folders, a .csv manifest or a .npz archive)")
            return None
        if path.suffix.lower() in (".csv", ".npz"):
            return path.suffix.lower()[1:]
        report.problems.append(f"data path {path} is a file but not a .csv manifest or a .npz archive; name its format "
                               "with --format csv or --format npz")
        return None
    if data_format == "folder" and not path.is_dir():
        report.problems.append(f"data path {path} is not a folder (data-format folder: one sub-folder per class)")
        return None
    if data_format in ("csv", "npz") and not path.is_file():
        what = "manifest" if data_format == "csv" else "archive"
        report.problems.append(f"{what} {path} not found" + (" (it is a folder)" if path.is_dir() else ""))
        return None
    return data_format


def _settle_skippable(report: DataReport, skip_unreadable: float) -> None:
    """Unreadable and missing files: warnings when ``skip_unreadable`` allows that many, else problems."""
    if not report.skippable:
        return
    allowed = allowed_skips(report.listed_files, skip_unreadable)
    if skip_unreadable > 0 and report.skippable_files <= allowed:
        report.warnings += [f"{msg} (the ClientApp skips them: skip-unreadable {skip_unreadable:g} allows {allowed} of "
                            f"{report.listed_files} files)" for msg in report.skippable]
        return
    report.problems += report.skippable
    if skip_unreadable > 0:
        report.problems.append(f"{report.skippable_files} of {report.listed_files} files cannot be used: more than "
                               f"skip-unreadable {skip_unreadable:g} allows ({allowed})")


def check_path(path: Path, task: Task, *, data_format: str = "auto", allow_odd_sizes: bool = False,
               val_fraction: float = 0.1, skip_unreadable: float = 0.0) -> DataReport:
    """Check a hospital's data against the task as the ClientApp will read it; never raises on bad data.

    Parameters
    ----------
    path : Path
        A folder of class folders, a CSV manifest or a .npz archive.
    task : Task
        The federation's task (classes, image size, channels, DICOM frame).
    data_format : str
        One of ``hospitrust.datasets.local.FORMATS`` (``auto``: from the path).
    allow_odd_sizes : bool
        Non-square images and images smaller than the task's size are warnings instead of problems.
    val_fraction : float
        The run's ``val-fraction``, for what the report says about the local split.
    skip_unreadable : float
        The node config's ``skip-unreadable``: up to this share of the listed files may be
        unreadable or missing (warnings: the ClientApp skips them); more is a problem.

    Returns
    -------
    DataReport
        What was found; ``report.ok`` when the hospital is ready to join.
    """
    path = Path(path).expanduser().resolve()
    report = DataReport(path, task)
    fmt = _resolve_format(path, data_format, report)
    if fmt is None:
        return report
    report.layout = fmt
    items: list[_Item] | None
    try:
        if fmt == "folder":
            items = _folder_items(path, report)
            if items is not None:
                _decode_items(items, report)
        elif fmt == "csv":
            items = _manifest_items(path, report)
            if items is not None:
                _decode_items(items, report)
        else:
            items = _npz_items(path, report)
    except OSError as exc:  # a folder or file that vanished or cannot be read while checking
        report.problems.append(f"{path}: cannot be read ({exc})")
        return report
    _settle_skippable(report, skip_unreadable)
    if items is None:
        return report
    _class_checks(report, allow_odd_sizes)
    _duplicate_checks(items, report)
    _split_checks(items, report, val_fraction)
    if report.ok:
        # the ClientApp's own listing, as a cross-check: it must accept what passed here
        try:
            list_samples(path, fmt, task.class_names, not_found=[])
        except Exception as exc:  # pragma: no cover - the rules above mirror it
            report.problems.append(f"the ClientApp's reader refuses the data: {getattr(exc, 'detail', exc)}")
    return report


def check_folder(root: Path, dataset: str = "pneumoniamnist", image_size: int = 28, *,
                 allow_odd_sizes: bool = False) -> DataReport:
    """A class-per-folder dataset against a built-in dataset's task (kept for older callers)."""
    from hospitrust.config import parse_run_config
    from hospitrust.tasks.task import resolve_task

    task = resolve_task(parse_run_config({"dataset": dataset, "image-size": image_size, "strategy": "fedavg"}))
    return check_path(Path(root), task, data_format="folder", allow_odd_sizes=allow_odd_sizes)


def main(path: str | Path, task: Task, data_format: str = "auto", allow_odd_sizes: bool = False,
         out: TextIO | None = None, skip_unreadable: float = 0.0) -> int:
    """Print the report; 0 when the data is ready, 1 when it has problems."""
    stream = out if out is not None else sys.stdout
    report = check_path(Path(path), task, data_format=data_format, allow_odd_sizes=allow_odd_sizes,
                        skip_unreadable=skip_unreadable)
    print(report.format(), file=stream, flush=True)
    return 0 if report.ok else 1

"""Find what identifies a patient or a hospital's files in text that left the hospital.

Reusable by any test that has hospital data on disk and something the server, the console or
``flwr log`` showed: :func:`identifiers_under` lists what must never appear (every file and
folder name under the hospitals' data roots except the task's class folders, the roots' own
paths, DICOM header values that name a patient, a manifest's ``patient_id`` and ``path`` values,
and whatever the test planted), and :func:`find_identifiers` says which of them a text holds.

    forbidden = identifiers_under([site_a, site_b], class_names=("normal", "pneumonia"),
                                  planted=["DOE^JANE", "PID-31337"])
    assert not find_identifiers(flwr_log_output, forbidden)

Matching is case-insensitive, on the text as given and with JSON's escaping undone. Names
shorter than ``MIN_LENGTH`` characters are left out (a file named ``1.png`` would match every
number): plant identifiers at least that long.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MIN_LENGTH = 5
#: DICOM keywords whose values name a patient or a study (read from every DICOM file found).
DICOM_KEYWORDS = ("PatientID", "PatientName", "AccessionNumber", "OtherPatientIDs", "PatientBirthDate",
                  "StudyID", "ReferringPhysicianName", "InstitutionName")


def _dicom_values(path: Path) -> list[str]:
    try:
        import pydicom

        ds = pydicom.dcmread(path, stop_before_pixels=True, force=True)
    except Exception:  # not a DICOM file we can read: its name is still on the list
        return []
    values = []
    for keyword in DICOM_KEYWORDS:
        value = str(ds.get(keyword, "") or "").strip()
        if value:
            values += [value, value.replace("^", " ")]
    return values


def _manifest_values(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    out = []
    for row in rows:
        for column in ("path", "patient_id"):
            value = (row.get(column) or "").strip()
            if value:
                out += [value, *Path(value).parts]
    return out


def identifiers_under(roots: Iterable[str | Path], class_names: Sequence[str] = (),
                      planted: Iterable[str] = ()) -> set[str]:
    """Everything under ``roots`` that must never leave a hospital.

    Parameters
    ----------
    roots : iterable of str or Path
        Hospitals' data folders (or a manifest's / archive's own path), and their cache folders.
    class_names : sequence of str
        The task's classes: folders named by a class name or index are allowed to be named.
    planted : iterable of str
        Identifiers a test planted (DICOM header values, names inside file names, ...).

    Returns
    -------
    set of str
        The forbidden strings, each at least ``MIN_LENGTH`` characters.
    """
    allowed = {c.lower() for c in class_names} | {str(i) for i in range(len(class_names))}
    found: set[str] = set(planted)
    for raw in roots:
        root = Path(raw).resolve()
        found |= {str(root), root.name}
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*"))
        for path in files:
            if path.is_dir():
                if path.name.lower() not in allowed:
                    found.add(path.name)
                continue
            found |= {path.name, path.stem, str(path)}
            if path.suffix.lower() == ".csv":
                found |= set(_manifest_values(path))
            elif path.suffix.lower() in (".dcm", ".dicom", ""):
                found |= set(_dicom_values(path))
    return {s for s in found if len(s) >= MIN_LENGTH and s.lower() not in allowed}


def find_identifiers(text: str, identifiers: Iterable[str]) -> list[str]:
    """The identifiers ``text`` holds (sorted); [] when it is clean."""
    haystack = text.lower()
    try:  # JSON escapes ("\\/", "\\u00e9"): compare with the decoded text as well
        decoded = json.dumps(json.loads(text), ensure_ascii=False).lower()
    except (ValueError, TypeError):
        decoded = haystack
    return sorted(i for i in set(identifiers) if i.lower() in haystack or i.lower() in decoded)


def as_text(value: Any) -> str:
    """Records, dicts and lists as JSON text (anything else by ``str``), for :func:`find_identifiers`."""
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)

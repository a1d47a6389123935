"""Nothing that identifies a patient leaves a hospital: a run with three hospitals whose data is
bad, each with patient-like names planted in file names, folder names and DICOM headers, and a
hospital that skips one unreadable file; every reply, the server's records and the console's
API are scanned for any of those names, the data folders' paths and the files' names.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from starlette.testclient import TestClient

from hospitrust.datasets.dicom import write_dicom
from hospitrust.console.app import create_app
from hospitrust.ops.inprocess import run_inprocess
from identifier_scan import as_text, find_identifiers, identifiers_under

CLASSES = ("healthy", "lesion")
PLANTED = ("P-SECRET-4711", "DOE_JANE", "DOE^JANE", "PID-31337", "ACC-99812", "MRN-5550123", "ROE_RICHARD",
           "P-SECRET-0815", "SMITH_JOHN", "ACC-77120", "PID-424242", "KEEP-OUT-9931")


def _pixels(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable grey 28x28 images: class 1 has a bright square."""
    rng = np.random.default_rng(seed)
    labels = np.array([i % 2 for i in range(n)])
    x = rng.integers(0, 90, (n, 28, 28)).astype(np.uint8)
    x[labels == 1, 7:21, 7:21] += 140
    return x, labels


def _png_site(root: Path, n: int, seed: int, prefix: str) -> Path:
    for c in CLASSES:
        (root / c).mkdir(parents=True, exist_ok=True)
    images, labels = _pixels(n, seed)
    for i, (img, y) in enumerate(zip(images, labels)):
        Image.fromarray(img).save(root / CLASSES[y] / f"{prefix}-{i:04d}_PATIENT.png")
    return root


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bad_dicom_site(root: Path) -> Path:
    """DICOM files with patient ids in their headers; one, in an accession-numbered folder and named
    after its patient, has no pixel data.
    """
    images, labels = _pixels(12, 21)
    for c in CLASSES:
        (root / c).mkdir(parents=True, exist_ok=True)
    for i, (img, y) in enumerate(zip(images, labels)):
        write_dicom(root / CLASSES[y] / f"IMG-{i:04d}.dcm", img, patient_id=f"PID-7{i:04d}")
    bad = root / "healthy" / "ACC-99812" / "P-SECRET-4711_DOE_JANE.dcm"
    bad.parent.mkdir()
    write_dicom(bad, images[0], patient_id="PID-31337")
    ds = pydicom.dcmread(bad)
    ds.PatientName = "DOE^JANE"
    del ds.PixelData
    ds.save_as(bad)
    return root


def _bad_png_site(root: Path) -> Path:
    _png_site(root, 12, 22, "SCAN-ROE")
    bad = root / "lesion" / "MRN-5550123_ROE_RICHARD.png"
    Image.fromarray(_pixels(1, 23)[0][0]).save(bad)
    _truncate(bad)
    return root


def _bad_manifest_site(root: Path) -> Path:
    """A CSV manifest with patient ids; one row's file is missing."""
    (root / "scans").mkdir(parents=True)
    images, labels = _pixels(12, 24)
    with (root / "export-list.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "patient_id"])
        for i, (img, y) in enumerate(zip(images, labels)):
            Image.fromarray(img).save(root / "scans" / f"SCAN-{i:04d}-WHITE.png")
            w.writerow([f"scans/SCAN-{i:04d}-WHITE.png", CLASSES[y], f"PID-42{i:04d}"])
        w.writerow(["scans/ACC-77120/P-SECRET-0815_SMITH_JOHN.png", "lesion", "PID-424242"])
    return root / "export-list.csv"


def _skipping_site(root: Path) -> Path:
    """Good data but for one truncated file, which its node config allows to be skipped."""
    _png_site(root, 24, 25, "SCAN-GREEN")
    _truncate(root / "healthy" / "SCAN-GREEN-0002_PATIENT.png")
    (root / "lesion" / "KEEP-OUT-9931.png").write_bytes(b"not an image at all")
    return root


def _scan_records(run_dir: Path) -> dict[str, str]:
    return {name: (run_dir / name).read_text() for name in ("config.json", "summary.json", "rounds.jsonl")}


def _console_texts(runs_root: Path) -> dict[str, str]:
    client = TestClient(create_app(runs_root))
    runs = client.get("/api/runs").json()
    out = {"/api/runs": json.dumps(runs)}
    for row in runs["runs"]:
        state = client.get("/api/state", params={"run": row["id"]})
        out[f"/api/state?run={row['id']}"] = state.text
        for rnd in range(1, int(state.json()["rounds"]) + 1):
            out[f"/api/round?run={row['id']}&round={rnd}"] = client.get(
                "/api/round", params={"run": row["id"], "round": rnd}).text
    return out


#: Where the in-process run's hospital-side log lines come from (a deployment writes them on the
#: hospital's machine); every other line is the ServerApp's, which `flwr log` would show.
HOSPITAL_SIDE = ("hospitrust/client_app/", "hospitrust/datasets/", "hospitrust/privacy/", "hospitrust/client_app/contribution",
                 "hospitrust/ops/inprocess.py", "flwr/clientapp/")


def _hospital_side(record: logging.LogRecord) -> bool:
    return any(part in record.pathname for part in HOSPITAL_SIDE)


def test_no_path_file_name_or_patient_id_leaves_a_hospital(tmp_path, caplog):
    """Every reply, the server's records, its log and the console API: no identifier of the planted ones."""
    sites = tmp_path / "site-files-ZX81"  # every hospital's files and caches; the server's are elsewhere
    cache = sites / "hcache-QX7"
    hospitals = {
        "good-a": _png_site(sites / "good-a-export", 24, 11, "SCAN-BLACK"),
        "good-b": _png_site(sites / "good-b-export", 24, 12, "SCAN-BROWN"),
        "bad-dicom": _bad_dicom_site(sites / "pacs-export-2291"),
        "bad-png": _bad_png_site(sites / "png-export-7730"),
        "bad-manifest": _bad_manifest_site(sites / "csv-export-5512"),
        "skipping": _skipping_site(sites / "png-export-1187"),
    }
    nodes = [{"data-path": str(path), "hospital": name, "cache-dir": str(cache)} for name, path in hospitals.items()]
    nodes[-1]["skip-unreadable"] = 0.1  # up to 2 of its 25 files
    forbidden = identifiers_under([sites], CLASSES, PLANTED)
    assert {"P-SECRET-4711_DOE_JANE.dcm", "ACC-99812", "DOE^JANE", "PID-31337", "export-list.csv", str(sites)} <= forbidden

    replies: list[tuple[str, str, str]] = []  # (hospital, message type, what it sent)

    def capture(index, incoming, reply):
        sender = nodes[index]["hospital"]
        if reply.has_error():
            replies.append((sender, incoming.metadata.message_type, reply.error.reason or ""))
        else:
            records = {**{f"metrics:{k}": dict(v) for k, v in reply.content.metric_records.items()},
                       **{f"config:{k}": dict(v) for k, v in reply.content.config_records.items()}}
            replies.append((sender, incoming.metadata.message_type, as_text(records)))
        return reply

    runs_root = tmp_path / "server" / "runs"
    raw = {"num-server-rounds": 1, "local-epochs": 1, "batch-size": 16, "output-dir": str(runs_root),
           "run-name": "scan", "task.classes": ",".join(CLASSES), "strategy": "fedavg"}
    with caplog.at_level(logging.INFO):
        run_inprocess(raw, len(nodes), node_configs=nodes, reply_filter=capture)
    run_dir = runs_root / "scan"

    leaks = {}
    for sender, kind, text in replies:
        if hit := find_identifiers(text, forbidden):
            leaks[f"{sender}'s {kind} reply"] = (hit, text[:300])
    server_log = "\n".join(caplog.handler.format(r) for r in caplog.records if not _hospital_side(r))
    for name, text in {**_scan_records(run_dir), **_console_texts(runs_root), "the ServerApp's log": server_log}.items():
        if hit := find_identifiers(text, forbidden):
            leaks[name] = (hit, "")
    assert not leaks, f"identifying names left the hospitals: {leaks}"

    # the run went on without the three bad hospitals, each left out with a reason that names the problem and where
    config = json.loads((run_dir / "config.json").read_text())
    reasons = {f["hospital"]: f["reason"] for f in config["failed-hospitals"]}
    assert sorted(reasons) == ["bad-dicom", "bad-manifest", "bad-png"], reasons
    assert "1 of 13 images cannot be used: a DICOM file without pixel data (file 1 in the folder of class 'healthy')" \
        in reasons["bad-dicom"], reasons["bad-dicom"]
    assert "not a readable image (file 1 in the folder of class 'lesion')" in reasons["bad-png"], reasons["bad-png"]
    assert "1 of 13 images cannot be used: file not found (row 14 of the manifest)" in reasons["bad-manifest"]
    assert set(config["hospital-data"]) == {"good-a", "good-b", "skipping"}
    assert config["hospital-data"]["skipping"]["skipped-files"] == 2
    assert config["hospital-data"]["skipping"]["images"] == 23  # 25 files listed, 2 unreadable
    assert config["hospital-data"]["good-a"]["skipped-files"] == 0
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 1
    # the full detail stays in the hospital's own log
    assert "P-SECRET-4711_DOE_JANE.dcm" in caplog.text and "MRN-5550123_ROE_RICHARD.png" in caplog.text
    assert "P-SECRET-0815_SMITH_JOHN.png" in caplog.text and "KEEP-OUT-9931.png" in caplog.text
    assert "could not join" in server_log  # the scan saw the ServerApp's lines


def test_the_scanner_finds_file_names_folders_paths_and_header_values(tmp_path):
    """The scan is not vacuous: each kind of identifier it lists is found in a text that holds it."""
    site = _bad_dicom_site(tmp_path / "pacs-export-2291")
    forbidden = identifiers_under([site], CLASSES)
    assert {"P-SECRET-4711_DOE_JANE.dcm", "ACC-99812", "DOE^JANE", "PID-31337", str(site)} <= forbidden
    assert not {"healthy", "lesion"} & forbidden  # the task's class folders may be named
    for leak in ("patient doe^jane", f"read {site}/x", '{"reason": "IMG-0003.dcm unreadable"}', "acc-99812/"):
        assert find_identifiers(leak, forbidden), leak
    assert find_identifiers("2 of 13 images cannot be used (file 1 in the folder of class 'healthy')", forbidden) == []

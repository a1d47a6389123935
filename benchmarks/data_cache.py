"""How long a hospital's images take to load: the first run (decode every file) against the next
(read the decoded cache), each in a fresh process as a SuperNode's ClientApp is.

Writes a synthetic hospital: ``--images`` 16-bit DICOM files (``--pixels`` square, with a
rescale and a window, as CT/CR exports carry) in class folders, and the same images as PNG
folders; then times ``load_local`` for the task's size (``--image-size``) twice per format in
a new Python process, with an empty cache the first time.

    python benchmarks/data_cache.py --images 1000 --pixels 256 --image-size 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from hospitrust.config import parse_run_config
from hospitrust.datasets.local import load_local
from hospitrust.tasks.task import resolve_task
task = resolve_task(parse_run_config({"task.classes": "normal,abnormal", "image-size": int(sys.argv[3]), "strategy": "fedavg"}))
t1 = time.perf_counter()
data = load_local(sys.argv[1], "auto", task, sys.argv[2])
n = int(data.images.shape[0]); checksum = int(data.images[::max(n // 10, 1)].sum())  # touch the pixels
print(json.dumps({"seconds": time.perf_counter() - t1, "decoded": data.decoded, "images": n, "checksum": checksum}))
"""


def write_hospital(root: Path, n: int, pixels: int, seed: int = 0) -> tuple[Path, Path]:
    """``n`` 16-bit DICOM files (rescale + window) and the same images as 8-bit PNG, in class folders."""
    import pydicom
    from PIL import Image
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    rng = np.random.default_rng(seed)
    dicom_root, png_root = root / "dicom", root / "png"
    for i in range(n):
        label = ("normal", "abnormal")[i % 2]
        raw = rng.integers(0, 4096, (pixels, pixels), dtype=np.uint16)  # 12 bits stored
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        path = dicom_root / label / f"{i}.dcm"
        path.parent.mkdir(parents=True, exist_ok=True)
        ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
        ds.PatientID, ds.Modality = f"p{i}", "CT"
        ds.Rows = ds.Columns = pixels
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.RescaleSlope, ds.RescaleIntercept = 1, -1024
        ds.WindowCenter, ds.WindowWidth = 40, 400
        ds.PixelData = raw.tobytes()
        ds.save_as(path, enforce_file_format=True)
        png = png_root / label / f"{i}.png"
        png.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((raw >> 4).astype(np.uint8)).save(png)
    assert pydicom  # imported for its writer
    return dicom_root, png_root


def timed_load(path: Path, cache: Path, image_size: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(cache), str(image_size)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--pixels", type=int, default=256, help="the files' width and height")
    parser.add_argument("--image-size", type=int, default=64, help="the task's image size")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hospitrust-cache-bench-") as tmp:
        work = Path(tmp)
        dicom, png = write_hospital(work / "hospital", args.images, args.pixels)
        results = {}
        for name, path in (("dicom", dicom), ("png", png)):
            cache = work / f"cache-{name}"
            first = timed_load(path, cache, args.image_size)
            second = timed_load(path, cache, args.image_size)
            assert first["decoded"] and not second["decoded"] and first["checksum"] == second["checksum"]
            results[name] = {"first_s": first["seconds"], "second_s": second["seconds"],
                             "speedup": first["seconds"] / max(second["seconds"], 1e-9)}
            print(f"{name:>5}: {args.images} images {args.pixels}x{args.pixels} -> {args.image_size}: first run "
                  f"{first['seconds']:.2f} s (decode), second run {second['seconds']:.3f} s (cache), "
                  f"{results[name]['speedup']:.0f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()

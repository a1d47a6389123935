"""Inputs a docs-test marker's setup makes for a documented command (tests/docs_commands.py).

    python tests/docs_setup.py upscale fed/hospital-1/manifest.csv big 64

writes BIG/manifest.csv and its PNG images at SIZE x SIZE from a CSV manifest's images (MedMNIST ships
28 px here; a documented `--image-size 64` check needs images that large).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from PIL import Image


def upscale(manifest: Path, out: Path, size: int) -> None:
    (out / "images").mkdir(parents=True, exist_ok=True)
    with manifest.open() as src, (out / "manifest.csv").open("w", newline="") as dst:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(dst, fieldnames=reader.fieldnames or [])
        writer.writeheader()
        for row in reader:
            name = Path(row["path"]).name
            Image.open(manifest.parent / row["path"]).resize((size, size)).save(out / "images" / name)
            writer.writerow({**row, "path": f"images/{name}"})


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "upscale":
        sys.exit("usage: python tests/docs_setup.py upscale MANIFEST.csv OUT SIZE")
    upscale(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))

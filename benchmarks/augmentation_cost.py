"""Training augmentation's cost per image: today's per-image v2 items against the batch affine items.

Times ``rotation=10,translate=0.1,resized-crop=0.8`` (each image through torchvision v2) and
``affine-rotation=10,affine-translate=0.1,affine-crop=0.8`` (one draw and one grid_sample per batch) on
the same uint8 batches in one process, and prints microseconds per image and their ratio.

    python benchmarks/augmentation_cost.py --batches 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    import torch

    from hospitrust.models.augment import augment_batch, parse_augmentation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--size", type=int, default=28)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [torch.randint(0, 256, (args.batch_size, 1, args.size, args.size), dtype=torch.uint8)
               for _ in range(args.batches)]
    rows = {}
    for label, items in (("per image (v2)", ["rotation=10", "translate=0.1", "resized-crop=0.8"]),
                         ("batch affine", ["affine-rotation=10", "affine-translate=0.1", "affine-crop=0.8"])):
        aug = parse_augmentation(items, args.size)
        augment_batch(batches[0], aug)  # warm-up
        start = time.perf_counter()
        for b in batches:
            augment_batch(b, aug)
        rows[label] = (time.perf_counter() - start) / (args.batches * args.batch_size) * 1e6
        print(f"{label:15s} {rows[label]:9.1f} us per image  ({','.join(items)})")
    print(f"ratio per image / batch affine: {rows['per image (v2)'] / rows['batch affine']:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

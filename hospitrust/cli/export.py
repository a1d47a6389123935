"""``hospitrust task export``: a built-in dataset written out as a consortium's own federation, so a
deployment can be tried on one machine from the guide alone.

It writes, under ``--out``:

- ``task.toml``: the task (classes, channels, image size), for ``task.file``;
- ``hospital-<i>/``: each hospital's share (the same partition a simulation gives), in its format:
  ``png`` (class folders), ``csv`` (``manifest.csv`` with ``path,label,patient_id`` and an
  ``images/`` folder), ``dicom`` (class folders of ``.dcm`` files) or ``npz`` (one archive);
- ``server/test/`` and ``server/cohort/``: the operator's test set (the dataset's test split) and
  reference cohort (a class-balanced sample of its val split, as a simulation's), as PNG folders
  (``--server-format``);
- ``README.txt``: the node config and run config that use them.

MedMNIST images have no patient ids; each exported image is its own patient (``p<index>``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

EXPORT_FORMATS = ("png", "csv", "dicom", "npz")


def _safe(name: str) -> str:
    """A class name as a folder name (class folders are matched by name, case-insensitively)."""
    return "".join(ch if ch.isalnum() or ch in "-_. " else "_" for ch in name).strip() or "class"


def write_images(root: Path, images: np.ndarray, labels: np.ndarray, ids: np.ndarray, class_names: Sequence[str],
                 fmt: str) -> Path:
    """One set of images in ``fmt`` under ``root``; returns the path a node config's data-path names.

    Parameters
    ----------
    root : Path
        The folder to write (created).
    images : np.ndarray
        uint8 (N, H, W, C).
    labels : np.ndarray
        int (N,).
    ids : np.ndarray
        int (N,): each image's index in its dataset split (file names and patient ids).
    class_names : sequence of str
        The classes, in label order.
    fmt : str
        One of ``EXPORT_FORMATS``.

    Returns
    -------
    Path
        The folder (png, dicom), the manifest (csv) or the archive (npz).
    """
    import numpy as np

    from PIL import Image

    from hospitrust.datasets.dicom import write_dicom

    root.mkdir(parents=True, exist_ok=True)
    grey = images.shape[-1] == 1

    def pixels(i: int) -> np.ndarray:
        return images[i][..., 0] if grey else images[i]

    if fmt == "npz":
        path = root / f"{root.name}.npz"
        np.savez(path, images=images, labels=labels.astype(np.int64),
                 patient_ids=np.array([f"p{int(i)}" for i in ids]))
        return path
    if fmt == "csv":
        (root / "images").mkdir(exist_ok=True)
        path = root / "manifest.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "label", "patient_id"])
            for i in range(len(labels)):
                rel = f"images/{int(ids[i])}.png"
                Image.fromarray(pixels(i)).save(root / rel)
                writer.writerow([rel, class_names[int(labels[i])], f"p{int(ids[i])}"])
        return path
    for c, name in enumerate(class_names):
        (root / _safe(name)).mkdir(exist_ok=True)
    for i in range(len(labels)):
        folder = root / _safe(class_names[int(labels[i])])
        if fmt == "png":
            Image.fromarray(pixels(i)).save(folder / f"{int(ids[i])}.png")
        elif fmt == "dicom":
            write_dicom(folder / f"{int(ids[i])}.dcm", pixels(i), patient_id=f"p{int(ids[i])}",
                        label=class_names[int(labels[i])])
        else:
            raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(EXPORT_FORMATS)}")
    return root


def _stratified(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    import numpy as np

    if fraction >= 1.0:
        return np.arange(labels.size)
    rng = np.random.default_rng([seed, 23])
    keep = [rng.choice(np.flatnonzero(labels == c), max(1, int(round(fraction * int((labels == c).sum())))), replace=False)
            for c in np.unique(labels)]
    return np.sort(np.concatenate(keep))


def export(flag: str, out: Path, *, formats: Sequence[str], hospitals: int, overrides: dict[str, object],
           server_format: str = "png", test_fraction: float = 1.0) -> dict[str, Path]:
    """Write dataset ``flag`` as a federation of ``hospitals`` (see the module docstring).

    Parameters
    ----------
    flag : str
        A built-in dataset (MedMNIST 2D flag, mnist, cifar10).
    out : Path
        The folder to write.
    formats : sequence of str
        Hospital formats, assigned in turn (``png,csv,dicom``: hospital-0 png, hospital-1 csv, ...).
    hospitals : int
        How many hospitals.
    overrides : dict
        Run config keys for the partition (``partitioner``, ``seed``, ``train-subsample``,
        ``image-size``, ``reference-cohort-per-class``, a partitioner's section).
    server_format : str
        Format of the server's test set and cohort.
    test_fraction : float
        Share of the test split exported (stratified), for quick trials.

    Returns
    -------
    dict[str, Path]
        What each hospital's data-path and the server's paths are, by name ("hospital-0", ..., "test",
        "cohort", "task").
    """
    import numpy as np

    from hospitrust.config import parse_run_config
    from hospitrust.datasets.federation import load_arrays, partitions, reference_set, test_set
    from hospitrust.tasks.task import resolve_task

    bad = [f for f in [*formats, server_format] if f not in EXPORT_FORMATS]
    if bad:
        raise ValueError(f"unknown format(s) {bad}; allowed: {', '.join(EXPORT_FORMATS)}")
    if hospitals < 1:
        raise ValueError("--hospitals must be at least 1")
    cfg = parse_run_config({**overrides, "dataset": flag, "strategy": "fedavg"})
    task = resolve_task(cfg)
    arrays = load_arrays(cfg.federation)
    shares = partitions(cfg.federation, hospitals)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    x, y = arrays.images["train"], arrays.labels["train"]
    for h, share in enumerate(shares):
        fmt = formats[h % len(formats)]
        paths[f"hospital-{h}"] = write_images(out / f"hospital-{h}", x[share], y[share], share, task.class_names, fmt)
        print(f"hospital-{h}: {len(share)} images as {fmt} -> {paths[f'hospital-{h}']}", flush=True)
    test = test_set(cfg.federation)
    keep = _stratified(test.labels, test_fraction, cfg.seed)
    paths["test"] = write_images(out / "server" / "test", test.images[keep], test.labels[keep], keep, task.class_names,
                                 server_format)
    cohort = reference_set(cfg.federation)
    paths["cohort"] = write_images(out / "server" / "cohort", cohort.images, cohort.labels, np.arange(len(cohort)),
                                   task.class_names, server_format)
    print(f"server: test set {len(keep)} images -> {paths['test']}; cohort {len(cohort)} images -> {paths['cohort']}")
    classes = ", ".join(f'"{n}"' for n in task.class_names)
    paths["task"] = out / "task.toml"
    paths["task"].write_text(
        f"# exported from {flag} by `hospitrust task export`\n"
        f'name = "{flag}-export"\nclasses = [{classes}]\nchannels = {task.channels}\nimage-size = {task.image_size}\n'
    )
    lines = [f"A {flag} federation of {hospitals} hospitals, exported by hospitrust task export.", "",
             f"task file: {paths['task']}", "", "hospitals (node config data-path):"]
    lines += [f"  hospital-{h}: {paths[f'hospital-{h}']}" for h in range(hospitals)]
    lines += ["", "run config:", f'  task.file="{paths["task"]}"',
              f'  server-data.test-path="{paths["test"]}"', f'  server-data.cohort-path="{paths["cohort"]}"', "",
              "a hospital joins with:",
              f"  hospitrust deploy supernode --data-path {paths['hospital-0']} --task {paths['task']} --hospital hospital-0 "
              "--superlink HOST:PORT --ca ca.crt --key hospital-0.key"]
    (out / "README.txt").write_text("\n".join(lines) + "\n")
    print(f"task file: {paths['task']}\nwhat to do with it: {out / 'README.txt'}")
    return paths


def cmd_export(args: argparse.Namespace) -> int:
    """``hospitrust task export``: exit 0 written, 2 for a bad option or missing data."""
    from hospitrust.datasets.base import DataMissingError
    from hospitrust.errors import ConfigError
    from hospitrust.ops.simulate import parse_overrides

    overrides = parse_overrides(args.run_config)
    overrides.update({"partitioner": args.partitioner, "seed": args.seed, "train-subsample": args.train_subsample,
                      "image-size": args.image_size})
    try:
        export(args.flag, Path(args.out).expanduser().resolve(), formats=[f.strip() for f in args.format.split(",")],
               hospitals=args.hospitals, overrides=overrides, server_format=args.server_format,
               test_fraction=args.test_subsample)
    except (ConfigError, DataMissingError, ValueError) as exc:
        print(f"hospitrust task export: {exc}", file=sys.stderr)
        return 2
    return 0


def add_task_parser(sub) -> None:
    """Add ``hospitrust task export`` to the command's sub-parsers."""
    task = sub.add_parser("task", help="tasks: export a built-in dataset as a federation of hospitals' own files")
    tsub = task.add_subparsers(dest="task_command", required=True)
    p = tsub.add_parser("export", help="write a dataset as per-hospital folders (png, csv, dicom, npz), plus the "
                                       "server's test set, cohort and a task file",
                        description="Write a built-in dataset as a federation of hospitals' own data, partitioned as a "
                                    "simulation would, to try a deployment on one machine.")
    p.add_argument("flag", help="a built-in dataset, e.g. pneumoniamnist")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--hospitals", type=int, default=3, help="number of hospitals (default 3)")
    p.add_argument("--format", default="png", help="hospital formats, comma-separated, assigned in turn: png, csv, dicom, "
                                                   "npz (default png; e.g. png,csv,dicom)")
    p.add_argument("--server-format", default="png", choices=EXPORT_FORMATS, help="the server's sets (default png)")
    p.add_argument("--partitioner", default="dirichlet", help="how the training split is divided (default dirichlet)")
    p.add_argument("--seed", type=int, default=42, help="seeds the partition (default 42)")
    p.add_argument("--train-subsample", type=float, default=1.0, help="share of the training split (default 1.0)")
    p.add_argument("--test-subsample", type=float, default=1.0, help="share of the test split (default 1.0)")
    p.add_argument("--image-size", type=int, default=28, help="image size (a size the dataset ships; default 28)")
    p.add_argument("-c", "--run-config", action="append", default=[], metavar="'KEY=VALUE ...'",
                   help="partitioner options and other run config keys, e.g. -c 'dirichlet.alpha=0.3'")
    p.set_defaults(func=cmd_export)

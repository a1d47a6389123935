"""``hospitrust data check PATH``: is a hospital's image folder ready to join the federation?

It checks what the ClientApp will read (``hospitrust.datasets.image_folder``): one folder
per federation class (named by class name or index), every image file readable, no empty
class, and image sizes (the distribution is reported; images that are not square or are
smaller than the federation's ``image-size`` are flagged, since the ClientApp squashes or
upsamples them). It prints a report table and returns the problems found: none means the
folder is fine.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hospitrust.datasets.image_folder import IMAGE_SUFFIXES, ClassMismatchError, folder_class_index
from hospitrust.datasets.registry import dataset_info

MAX_LISTED = 5  # file names listed per problem in the report


@dataclass
class ClassReport:
    folder: str
    index: int | None  # federation class index; None: unknown folder
    images: int = 0
    unreadable: list[str] = field(default_factory=list)
    not_square: list[str] = field(default_factory=list)
    too_small: list[str] = field(default_factory=list)
    other_files: int = 0
    sizes: Counter = field(default_factory=Counter)
    modes: Counter = field(default_factory=Counter)


@dataclass
class DataReport:
    root: Path
    dataset: str
    image_size: int
    class_names: tuple[str, ...]
    classes: list[ClassReport]
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sizes(self) -> Counter:
        total: Counter = Counter()
        for c in self.classes:
            total.update(c.sizes)
        return total

    def format(self) -> str:
        lines = [f"data check: {self.root}", f"federation: {self.dataset}, {len(self.class_names)} classes "
                 f"({', '.join(f'{i}={n}' for i, n in enumerate(self.class_names))}), image-size {self.image_size}", ""]
        width = max([len("folder"), len("total")] + [len(c.folder) for c in self.classes])
        head = (f"{'folder':<{width}}  {'class':<14} {'images':>7} {'unreadable':>10} {'not-square':>10} "
                f"{'too-small':>9} {'other':>6}")
        lines += [head, "-" * len(head)]
        for c in self.classes:
            cls = "UNKNOWN" if c.index is None else f"{c.index}={self.class_names[c.index]}"[:14]
            lines.append(f"{c.folder:<{width}}  {cls:<14} {c.images:>7} {len(c.unreadable):>10} "
                         f"{len(c.not_square):>10} {len(c.too_small):>9} {c.other_files:>6}")
        lines.append(f"{'total':<{width}}  {'':<14} {sum(c.images for c in self.classes):>7} "
                     f"{sum(len(c.unreadable) for c in self.classes):>10} {sum(len(c.not_square) for c in self.classes):>10} "
                     f"{sum(len(c.too_small) for c in self.classes):>9} {sum(c.other_files for c in self.classes):>6}")
        sizes = self.sizes
        if sizes:
            shown = ", ".join(f"{w}x{h}: {n}" for (w, h), n in sizes.most_common(8))
            more = f", ... ({len(sizes) - 8} more sizes)" if len(sizes) > 8 else ""
            lines += ["", f"image sizes (width x height: count): {shown}{more}"]
            modes: Counter = Counter()
            for c in self.classes:
                modes.update(c.modes)
            lines.append("colour modes: " + ", ".join(f"{m}: {n}" for m, n in modes.most_common()))
        for title, items in (("WARNING", self.warnings), ("PROBLEM", self.problems)):
            if items:
                lines.append("")
                lines += [f"{title}: {p}" for p in items]
        lines += ["", "OK: ready to join the federation" if self.ok else f"NOT READY: {len(self.problems)} problem(s)"]
        return "\n".join(lines)


def _listed(paths: list[str]) -> str:
    head = ", ".join(paths[:MAX_LISTED])
    return head + (f", ... ({len(paths) - MAX_LISTED} more)" if len(paths) > MAX_LISTED else "")


def check_folder(root: Path, dataset: str = "pneumoniamnist", image_size: int = 28, *,
                 allow_odd_sizes: bool = False) -> DataReport:
    """Check a class-per-folder dataset against the federation's classes; never raises on bad data."""
    from PIL import Image, UnidentifiedImageError

    info = dataset_info(dataset)
    root = Path(root).expanduser().resolve()
    problems: list[str] = []
    warnings: list[str] = []
    report = DataReport(root, dataset, image_size, info.class_names, [], problems, warnings)
    if not root.is_dir():
        problems.append(f"{root} is not a folder (expected one sub-folder per class)")
        return report

    by_name = {n.lower(): i for i, n in enumerate(info.class_names)}
    by_index = {str(i): i for i in range(info.num_classes)}
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = sorted(p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if loose:
        warnings.append(f"{len(loose)} image(s) directly in {root} are ignored (images must be inside a class folder): "
                        f"{_listed(loose)}")
    expected = ", ".join(f"'{n}' or '{i}'" for i, n in enumerate(info.class_names))
    for folder in folders:
        key = folder.name.lower()
        index = by_name.get(key, by_index.get(key))
        rep = ClassReport(folder.name, index)
        report.classes.append(rep)
        if index is None:
            problems.append(f"unknown class folder '{folder.name}': {dataset} classes are {expected}")
        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            rel = str(path.relative_to(root))
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                rep.other_files += 1
                continue
            try:
                with Image.open(path) as img:
                    img.load()
                    w, h = img.size
                    rep.modes[img.mode] += 1
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
                rep.unreadable.append(f"{rel} ({type(exc).__name__})")
                continue
            rep.images += 1
            rep.sizes[(w, h)] += 1
            if w != h:
                rep.not_square.append(f"{rel} ({w}x{h})")
            if min(w, h) < image_size:
                rep.too_small.append(f"{rel} ({w}x{h})")
        if rep.other_files:
            warnings.append(f"{rep.other_files} non-image file(s) in '{folder.name}' are ignored "
                            f"(images are {', '.join(IMAGE_SUFFIXES)})")

    known = [c for c in report.classes if c.index is not None]
    for i, name in enumerate(info.class_names):
        if not any(c.index == i for c in known):
            problems.append(f"missing class {i}={name}: no folder '{name}' or '{i}'")
    for i in sorted({c.index for c in known if c.index is not None}):  # known: every index is set
        same = [c.folder for c in known if c.index == i]
        if len(same) > 1:
            problems.append(f"class {i}={info.class_names[i]} has several folders: {same}")
    for c in known:
        if c.images == 0:
            assert c.index is not None  # known: the folders with a class index
            problems.append(f"empty class: folder '{c.folder}' ({info.class_names[c.index]}) has no readable images")
    for c in report.classes:
        if c.unreadable:
            problems.append(f"{len(c.unreadable)} unreadable image(s) in '{c.folder}': {_listed(c.unreadable)}")
    odd = problems if not allow_odd_sizes else warnings
    for c in report.classes:
        if c.not_square:
            odd.append(f"{len(c.not_square)} image(s) in '{c.folder}' are not square (the ClientApp squashes them to "
                       f"{image_size}x{image_size}): {_listed(c.not_square)}")
        if c.too_small:
            odd.append(f"{len(c.too_small)} image(s) in '{c.folder}' are smaller than the federation's image-size "
                       f"{image_size} (the ClientApp upsamples them): {_listed(c.too_small)}")
    if not problems:
        # the ClientApp's own rule, as a cross-check: it must accept what passed here
        try:
            folder_class_index(root, info)
        except (ClassMismatchError, FileNotFoundError) as exc:  # pragma: no cover - the rules above mirror it
            problems.append(str(exc))
    return report


def main(path: str, dataset: str, image_size: int, allow_odd_sizes: bool = False, out=None) -> int:
    out = out if out is not None else sys.stdout
    report = check_folder(Path(path), dataset, image_size, allow_odd_sizes=allow_odd_sizes)
    print(report.format(), file=out, flush=True)
    return 0 if report.ok else 1

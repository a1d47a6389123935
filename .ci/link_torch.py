"""Link torch and torchvision, with everything they require, from this interpreter's environment into a fresh
venv's site-packages, so that .ci/fresh_install.sh need not unpack torch's CUDA build (5-6 GB) a second time.

Run with the donor environment's python (CI's .venv, which pins torch 2.14.1 / torchvision 0.29.1):

    .venv/bin/python .ci/link_torch.py FRESH_VENV/lib/python3.11/site-packages

Only the requirement closure of torch and torchvision is linked, each distribution's top-level entries and its
.dist-info (so pip sees them installed), but none the fresh venv has already (its pip); a top-level folder that another distribution outside the closure also
fills is refused, so nothing else leaks into the fresh venv and a missing dependency of hospitrust still fails there.
Prints the linked distributions, one line.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOTS = ("torch", "torchvision")


def closure(roots: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` require, transitively, with the extras they ask of each other
    (torch asks cuda-toolkit for its CUDA libraries by extras); markers evaluated here.
    """
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(root, "") for root in roots]
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        dist = found.setdefault(name, metadata.distribution(name))
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo.extend((req.name, e) for e in ("", *req.extras))
    return found


def top_levels(dist: metadata.Distribution) -> set[str]:
    """The entries directly under site-packages that ``dist`` installed (not its scripts in bin/)."""
    return {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] not in ("..", "__pycache__")}


def main(target: Path) -> int:
    """Link the closure into ``target`` (a site-packages folder); 1 when something else would leak in."""
    linked = closure(ROOTS)
    owners: dict[str, set[str]] = defaultdict(set)
    for dist in metadata.distributions():
        for top in top_levels(dist):
            owners[top].add(canonicalize_name(dist.metadata["Name"]))
    site = Path(next(iter(linked.values())).locate_file("")).resolve()
    # the fresh venv's own pip and setuptools stay its own
    there = {canonicalize_name(d.name.split("-")[0]) for d in target.glob("*.dist-info")}
    linked = {name: dist for name, dist in linked.items() if name not in there}
    for name, dist in sorted(linked.items()):
        for top in sorted(top_levels(dist)):
            if others := owners[top] - set(linked):
                print(f"link_torch: {top} is also filled by {', '.join(sorted(others))}, outside torch's closure",
                      file=sys.stderr)
                return 1
            if not (target / top).exists():
                (target / top).symlink_to(site / top)
    print(f"{len(linked)} distributions linked from {site}: {', '.join(sorted(linked))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

"""The leaderboard v2's grid time: each part's wall time (its starts' spans in bench.jsonl, summed) and the total.

A part's bench.jsonl is read from its grid folder, else from its committed archive (without unpacking), so a fresh
clone sums the archived parts. Grids that were neither kept nor archived are added from the cost table by name.

    python benchmarks/leaderboard/v2/grid_time.py runs/leaderboard-v2
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCHIVES = HERE.parents[2] / "docs" / "results" / "leaderboard" / "v2" / "grids"
# grids not archived (stopped, or superseded designs of issue 45's rule): their minutes as summed from their folders
# in runs/leaderboard-v2 when they ran (the class-weight probe: its log), so a fresh clone sums the same total
UNARCHIVED_MINUTES = {
    "probe-class-weights": 4.9, "plateau-pneumonia-a": 13.7,
    "probe-anchored-trust-design2": 9.7, "probe-anchored-trust-design3": 5.4, "probe-anchored-trust-design4": 13.1,
    "tune-aug-anchored-trust-design1": 1.9, "tune-aug-anchored-trust-design2": 1.8,
    "tune-aug-anchored-trust-design3": 2.0, "tune-aug-anchored-trust-design4": 2.0,
}


def wall_seconds(lines: list[str]) -> float:
    """The sum, over a grid's starts, of the time from the start to the last event before the next start.

    Not the `end` events' wall_seconds the results page sums (hospitrust.bench.leaderboard): a start killed without
    an `end` (a stopped session) spent grid time too.
    """
    total, start, last = 0.0, None, None
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("event") == "start":
            if start is not None:
                total += last - start
            start = last = event["time"]
        elif start is not None:
            last = event["time"]
    if start is not None:
        total += last - start
    return total


def bench_lines(name: str, grids: Path, archives: Path) -> list[str] | None:
    """A part's bench.jsonl lines, from its folder or its archive; None where neither has one."""
    log = grids / name / "bench.jsonl"
    if log.is_file():
        return log.read_text().splitlines()
    archive = archives / f"{name}.tar.xz"
    if archive.is_file():
        with tarfile.open(archive) as tar:
            member = next((m for m in tar.getmembers() if m.name.lstrip("./") == "bench.jsonl"), None)
            if member is not None:
                return tar.extractfile(member).read().decode().splitlines()  # type: ignore[union-attr]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grids", type=Path, help="the parts' grid folders (runs/leaderboard-v2); may be missing")
    ap.add_argument("--archives", type=Path, default=ARCHIVES, help="the committed archives (default: %(default)s)")
    args = ap.parse_args(argv)
    names = {p.parent.name for p in args.grids.glob("*/bench.jsonl")} | {
        p.name.removesuffix(".tar.xz") for p in args.archives.glob("*.tar.xz")}
    if not names:
        print(f"grid_time: no bench.jsonl under {args.grids} and no archive in {args.archives}", file=sys.stderr)
        return 2
    minutes = {}
    for name in sorted(names):
        lines = bench_lines(name, args.grids, args.archives)
        if lines is not None:
            minutes[name] = wall_seconds(lines) / 60
    minutes.update({k: v for k, v in UNARCHIVED_MINUTES.items() if k not in minutes})
    width = max(map(len, minutes))
    for name, m in minutes.items():
        print(f"{name:<{width}}  {m:7.1f} min")
    groups = {"condition": "condition parts", "ranked": "ranked parts"}
    for prefix, label in groups.items():
        part = [m for n, m in minutes.items() if n.startswith(prefix)]
        print(f"{label}: {len(part)}, {sum(part) / 60:.2f} h")
    print(f"every grid: {len(minutes)}, {sum(minutes.values()) / 60:.2f} h")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

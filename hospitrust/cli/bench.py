"""``hospitrust bench GRID.toml`` and ``hospitrust report GRID_DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hospitrust.bench.names import METRICS


def _bench(args: argparse.Namespace) -> int:
    from hospitrust.extras import extra_problem

    if (missing := extra_problem("bench", "hospitrust bench")) is not None:
        print(missing, file=sys.stderr)
        return 2
    from hospitrust.bench.grid import GridError, parse_grid
    from hospitrust.bench.runner import GridLocked, run_grid
    from hospitrust.ops.simulate import SimulationError

    try:
        grid = parse_grid(args.grid)
    except GridError as exc:
        print(f"hospitrust bench: {exc}", file=sys.stderr)
        return 2
    if args.backend:
        grid.backend = args.backend
    if args.no_shared_superlink:
        grid.shared_superlink = False
    if args.ray_address and grid.backend != "simulation":
        print("hospitrust bench: --ray-address needs the simulation backend (grid backend = \"simulation\" "
              "or --backend simulation): in-process cells do not use Ray", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / "bench" / grid.name
    if not args.dry_run:
        from hospitrust.envcheck import torch_pair_problem

        if (problem := torch_pair_problem()) is not None:  # before any cell starts Flower
            print(f"hospitrust bench: {problem}", file=sys.stderr)
            return 2
    if args.dry_run:
        from hospitrust.bench.runner import cell_state

        for cell in grid.cells:
            print(f"{cell_state(out.resolve(), cell):8s} {cell.name}")
        print(f"{len(grid.cells)} cells ({grid.duplicates} duplicate combinations merged, {grid.skipped} skipped by "
              f"[[when]] rules); every cell's run config is valid; results would go to {out.resolve()}")
        return 0
    try:
        outcome = run_grid(grid, out, workers=args.workers, retry_failed=args.retry_failed,
                           ray_address=args.ray_address or "", limit=args.limit)
    except (GridLocked, SimulationError) as exc:
        print(f"hospitrust bench: {exc}", file=sys.stderr)
        return 2
    if args.report:
        from hospitrust.bench.report import make_report

        html_path, md_path = make_report(out)
        print(f"report: {html_path}\n        {md_path}")
    if args.leaderboard:
        from hospitrust.bench.leaderboard import LAST_K
        from hospitrust.bench.stats import RESAMPLES

        _leaderboard([str(out)], None, metric=grid.metric, baseline=grid.baseline, last_k=LAST_K, resamples=RESAMPLES,
                     who="bench")
    if outcome.interrupted:
        return 130
    return 0 if outcome.failed == 0 else 1


def _leaderboard(folders: list[str], out: str | None, *, metric: str | None, baseline: str | None, last_k: int,
                 resamples: int, who: str = "report", without_attacks: str = "", statistics: str = "v1") -> int:
    from hospitrust.bench.leaderboard import LeaderboardError, make_leaderboard

    if out is None and len(folders) > 1:
        print(f"hospitrust {who}: several grid folders make one leaderboard: say where it goes with --out", file=sys.stderr)
        return 2
    out_dir = Path(out) if out else Path(folders[0]) / "leaderboard"
    meta_path = Path(folders[0]) / "grid.json"  # the first grid's headline metric and baseline, unless given
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except ValueError:
        meta = {}
    try:
        path = make_leaderboard(folders, out_dir, metric=metric or meta.get("metric") or "balanced_accuracy",
                                baseline=baseline or meta.get("baseline") or "fedavg",
                                last_k=last_k, resamples=resamples, progress=lambda line: print(line, flush=True),
                                without_attacks=[a.strip() for a in without_attacks.split(",") if a.strip()],
                                statistics=statistics)
    except LeaderboardError as exc:
        print(f"hospitrust {who}: {exc}", file=sys.stderr)
        return 2
    print(f"leaderboard: {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from hospitrust.extras import extra_problem

    one_run = len(args.grid_dir) == 1 and not args.leaderboard and (Path(args.grid_dir[0]) / "rounds.jsonl").is_file()
    # one run's page needs the figures only; a grid's report and the leaderboard the bench's tables and statistics
    # (not its Ray: nothing is simulated)
    missing = (extra_problem("plots", "hospitrust report") if one_run else
               extra_problem("bench", "hospitrust report", distributions=("matplotlib", "pandas", "scipy")))
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    if args.leaderboard:
        return _leaderboard(args.grid_dir, args.out, metric=args.metric, baseline=args.baseline, last_k=args.last_k,
                            resamples=args.resamples, without_attacks=args.without_attacks,
                            statistics=args.statistics)
    if len(args.grid_dir) > 1:
        print("hospitrust report: several folders are read together only as one leaderboard: "
              "hospitrust report --leaderboard GRID_DIR [GRID_DIR ...] --out FOLDER", file=sys.stderr)
        return 2
    grid_dir = Path(args.grid_dir[0])
    if not grid_dir.is_dir():
        print(f"hospitrust report: {grid_dir} is not a folder (give the --out folder of `hospitrust bench`)", file=sys.stderr)
        return 2
    if (grid_dir / "rounds.jsonl").is_file():  # one run directory: the console's page as a file, and its figures
        from hospitrust.console.report import write_report

        try:
            written = write_report(grid_dir, args.out)
        except ValueError as exc:
            print(f"hospitrust report: {exc}", file=sys.stderr)
            return 2
        print("report: " + "\n        ".join(str(p) for p in written))
        from hospitrust.bench.reference import gap_line

        print(gap_line(grid_dir))  # the gap to the pooled reference, or how to make it
        return 0
    from hospitrust.bench.report import make_report

    if args.store:
        from hospitrust.bench.store import build_store

        build_store(grid_dir)
    html_path, md_path = make_report(grid_dir, metric=args.metric, baseline=args.baseline, out_dir=args.out,
                                     max_scenarios=args.max_scenarios)
    print(f"report: {html_path}\n        {md_path}")
    return 0


def _archive(args: argparse.Namespace) -> int:
    from hospitrust.bench.archive import ArchiveError, pack, unpack

    try:
        if args.action == "pack":
            cells, size = pack(args.source, args.target)
            print(f"{args.target}: {cells} finished cells, {size / 1024:.1f} KiB"
                  f"{f' ({size / cells / 1024:.1f} KiB per cell)' if cells else ''}")
        else:
            cells = unpack(args.source, args.target)
            print(f"{args.target}: {cells} finished cells (`hospitrust bench GRID.toml --out {args.target}` runs the rest)")
    except (ArchiveError, OSError) as exc:
        print(f"hospitrust bench-archive {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def add_bench_parsers(sub) -> None:
    bench = sub.add_parser(
        "bench", help="run a benchmark grid (resumable, parallel)",
        description="Run every cell of a grid file (strategies x attacks x ... x seeds); finished cells are skipped, "
                    "so a stopped grid can be started again. See docs/benchmark.md.")
    bench.add_argument("grid", help="the grid file, e.g. benchmarks/smoke.toml")
    bench.add_argument("--out", help="grid folder (default runs/bench/<grid name>)")
    bench.add_argument("--workers", type=int, help="cells in flight (default: the grid's `workers`)")
    bench.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    bench.add_argument("--backend", choices=["inprocess", "simulation"], help="override the grid's backend")
    bench.add_argument("--no-shared-superlink", action="store_true",
                       help="simulation backend: one SuperLink per cell (hospitrust simulate) instead of one per grid")
    bench.add_argument("--ray-address", help="simulation backend: run on this existing Ray cluster (e.g. 10.0.0.5:6379)")
    bench.add_argument("--limit", type=int, help="run at most this many unfinished cells, then stop")
    bench.add_argument("--report", action="store_true", help="write the report when the grid is done")
    bench.add_argument("--leaderboard", action="store_true",
                       help="write the leaderboard (GRID_DIR/leaderboard/leaderboard.md) when the grid is done")
    bench.add_argument("--dry-run", action="store_true", help="validate the grid and list its cells and their state")
    bench.set_defaults(func=_bench)

    report = sub.add_parser("report", help="the report of one run (the console's page as one file) or of a grid folder",
                            description="One run directory: report/report.html (the console's page, self-contained), "
                                        "metrics.png and trust.png. A grid folder (or any folder of run directories): "
                                        "figures and tables over its cells. --leaderboard GRID_DIR [GRID_DIR ...]: "
                                        "the leaderboard over one or several grid folders (leaderboard.md and PNGs).")
    report.add_argument("grid_dir", nargs="+",
                        help="one run directory, or a grid folder (`hospitrust bench --out`); with --leaderboard, "
                             "one or several grid folders (the parts of one leaderboard)")
    report.add_argument("--leaderboard", action="store_true",
                        help="the leaderboard: per condition, rules x attacks with 95%% bootstrap CIs over seeds, the "
                             "per-seed worst case, the worst-case ranking with ties, mean ranks, Friedman and "
                             "Wilcoxon-Holm tests, critical-difference diagrams (docs/benchmark.md)")
    report.add_argument("--last-k", type=int, default=3, help="leaderboard: rounds averaged at the end of a run (default 3)")
    report.add_argument("--resamples", type=int, default=10_000, help="leaderboard: bootstrap resamples (default 10000)")
    report.add_argument("--without-attacks", default="", metavar="A,B",
                        help="leaderboard: leave these attacks (their labels, comma-separated) out, for a threat model "
                             "without them (e.g. no omniscient attacker: tailored-ipm,hta-aware)")
    report.add_argument("--statistics", choices=["v1", "v2"], default="v1",
                        help="leaderboard: v2 adds the v2 protocol's statistics (per-seed worst cases, t intervals, "
                             "Holm-corrected sign-flip tests, Friedman over (condition, seed) blocks, rank ranges; "
                             "docs/leaderboard.md)")
    report.add_argument("--metric", choices=list(METRICS),
                        help="headline metric (default: the grid's, else balanced_accuracy)")
    report.add_argument("--baseline", help="strategy for paired differences (default: the grid's, else fedavg)")
    report.add_argument("--out", help="report folder (default GRID_DIR/report; a leaderboard: GRID_DIR/leaderboard, "
                                      "required for several folders)")
    report.add_argument("--max-scenarios", type=int, default=6, help="scenarios drawn (default 6)")
    report.add_argument("--store", action="store_true", help="also (re)write results.csv / cells.csv / results.sqlite")
    report.set_defaults(func=_report)

    archive = sub.add_parser(
        "bench-archive", help="a grid folder's finished cells as one small .tar.xz, and back (grids across sessions)",
        description="pack: the finished cells of a grid folder (config.json, summary.json, rounds.jsonl slimmed to "
                    "what the report and the leaderboard read), its grid.json, grid.toml, bench.jsonl and failed/ "
                    "into one deterministic .tar.xz to commit. unpack: that archive into a new grid folder, which "
                    "`hospitrust report` reads and `hospitrust bench --out` resumes. See docs/benchmark.md.")
    actions = archive.add_subparsers(dest="action", required=True)
    pack = actions.add_parser("pack", help="grid folder -> archive")
    pack.add_argument("source", metavar="GRID_DIR", help="the grid folder (`hospitrust bench --out`)")
    pack.add_argument("target", metavar="ARCHIVE", help="the archive to write, e.g. benchmarks/archive/part1.tar.xz")
    unpack = actions.add_parser("unpack", help="archive -> grid folder")
    unpack.add_argument("source", metavar="ARCHIVE", help="an archive written by `hospitrust bench-archive pack`")
    unpack.add_argument("target", metavar="GRID_DIR", help="a new (or empty) folder to write the grid folder into")
    archive.set_defaults(func=_archive)

"""``hospitrust simulate``: the Flower app in simulation on this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hospitrust.errors import ConfigError


def _simulate(args: argparse.Namespace) -> int:
    from hospitrust.extras import extra_problem

    if (missing := extra_problem("simulation", "hospitrust simulate")) is not None:  # before Flower starts a SuperLink
        print(missing, file=sys.stderr)
        return 2
    from hospitrust.datasets.base import DataMissingError
    from hospitrust.ops import flwr
    from hospitrust.ops.simulate import COMPLETED, SimulationError, simulate

    flwr.stop_on_signals()  # a stopped `hospitrust simulate` stops its SuperLink and what that started
    try:
        status, run_dir = simulate(
            hospitals=args.hospitals,
            overrides=args.run_config,
            app_dir=Path(args.app) if args.app else None,
            timeout=args.timeout,
            ray_address=args.ray_address or "",
            verbose=args.verbose,
            keep=args.keep,
            environment_problem=_environment_problem,  # after the run config's checks: a typo is told in a second
        )
    except (ConfigError, SimulationError, DataMissingError) as exc:
        print(f"hospitrust simulate: {exc}", file=sys.stderr)
        return 2
    if status != COMPLETED:
        return 1
    if run_dir is not None:
        return _after_the_run(Path(run_dir), args.pooled_reference)
    return 0


def _after_the_run(run_dir: Path, pooled: bool) -> int:
    """The pooled reference (with --pooled-reference) and the line with the gap to it, or how to make it."""
    from hospitrust.bench.reference import gap_line

    if pooled:
        from hospitrust.cli.reference import pooled_reference

        return pooled_reference(run_dir, who="hospitrust simulate --pooled-reference")  # prints the gap
    print(gap_line(run_dir), flush=True)
    return 0


def _environment_problem() -> str | None:
    """The torch/torchvision pair's problem, checked before any Flower process starts (see `hospitrust doctor`)."""
    from hospitrust import envcheck

    return envcheck.torch_pair_problem()


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run the Flower app in simulation on this machine",
        description="Run the app in Flower's simulation with its own SuperLink; exits 0 only if the run completed.",
    )
    sim.add_argument("--hospitals", type=int, default=10, help="number of simulated hospitals (default 10)")
    sim.add_argument(
        "-c", "--run-config", action="append", default=[], metavar="'KEY=VALUE ...'",
        help="run config overrides, as for `flwr run` (e.g. -c 'num-server-rounds=3 dataset=retinamnist')",
    )
    sim.add_argument("--app", help="your own Flower app folder (default: the hospitrust project above the current "
                                  "folder, else the app the installed package carries)")
    sim.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped (default 3600)")
    sim.add_argument("--ray-address", help="run the hospitals on this existing Ray cluster (e.g. 10.0.0.5:6379) "
                                           "instead of a Ray instance started for this run")
    sim.add_argument("-v", "--verbose", action="store_true",
                     help="the run's log as Flower streams it: Ray's and torch's warnings, Flower's install line, "
                          "colour codes also when piped")
    sim.add_argument("--keep", action="store_true",
                     help="a run that fails keeps its scratch folder (/tmp/hospitrust-sim-*: the SuperLink's log) "
                          "and prints where it is; without it the folder is removed")
    sim.add_argument("--pooled-reference", action="store_true",
                     help="after a completed run, train its pooled reference (`hospitrust reference pooled RUN_DIR`: "
                          "the same model and recipe on the hospitals' training images in one place, for the run's "
                          "budget) and print the gap to it")
    sim.set_defaults(func=_simulate)

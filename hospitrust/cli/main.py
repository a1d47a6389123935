"""The ``hospitrust`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hospitrust.errors import ConfigError


def _simulate(args: argparse.Namespace) -> int:
    from hospitrust.datasets.base import DataMissingError
    from hospitrust.ops import flwr
    from hospitrust.ops.simulate import COMPLETED, SimulationError, simulate

    if (problem := _environment_problem()) is not None:
        print(f"hospitrust simulate: {problem}", file=sys.stderr)
        return 2
    flwr.stop_on_signals()  # a stopped `hospitrust simulate` stops its SuperLink and what that started
    try:
        status, _ = simulate(
            hospitals=args.hospitals,
            overrides=args.run_config,
            app_dir=Path(args.app) if args.app else None,
            timeout=args.timeout,
            ray_address=args.ray_address or "",
            verbose=args.verbose,
            keep=args.keep,
        )
    except (ConfigError, SimulationError, DataMissingError) as exc:
        print(f"hospitrust simulate: {exc}", file=sys.stderr)
        return 2
    return 0 if status == COMPLETED else 1


def _environment_problem() -> str | None:
    """The torch/torchvision pair's problem, checked before any Flower process starts (see `hospitrust doctor`)."""
    from hospitrust import envcheck

    return envcheck.torch_pair_problem()


def _doctor(args: argparse.Namespace) -> int:
    from hospitrust import envcheck

    checks = envcheck.all_checks()
    for check in checks:
        mark = "ok" if check.ok else ("PROBLEM" if check.required else "missing")
        print(f"{mark:8s} {check.name}: {check.detail}")
    failed = [c for c in checks if not c.ok and c.required]
    if failed:
        print(f"hospitrust doctor: {len(failed)} problem{'s' if len(failed) > 1 else ''} to fix before "
              "`hospitrust simulate` can run", file=sys.stderr)
    return 1 if failed else 0


def _config(args: argparse.Namespace) -> int:
    from hospitrust.config import reference
    from hospitrust.ops.simulate import find_app_dir

    root = Path(args.app).resolve() if args.app else find_app_dir(packaged=False)  # never an installed copy
    if args.config_command == "generate":
        changed = reference.generate(root)
        print("\n".join(f"wrote {p.relative_to(root)}" for p in changed) or "everything was current")
        return 0
    stale = reference.stale(root)
    for path in stale:
        print(f"{path.relative_to(root)} is stale: run `hospitrust config generate`", file=sys.stderr)
    return 1 if stale else 0


def _console(args: argparse.Namespace) -> int:
    from hospitrust.ops.console.app import serve

    path = Path(args.path)
    if not path.is_dir():
        print(f"hospitrust console: {path} is not a folder (give a run directory or an output directory of runs)",
              file=sys.stderr)
        return 2
    if bool(args.certfile) != bool(args.keyfile):
        print("hospitrust console: give both --certfile and --keyfile for TLS, or neither", file=sys.stderr)
        return 2
    try:
        serve(path, host=args.host, port=args.port, token=args.token, certfile=args.certfile, keyfile=args.keyfile)
    except KeyboardInterrupt:
        pass
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    from hospitrust.server_app.checkpoint import CheckpointError, upgrade_checkpoint

    print(f"{args.file}: an earlier hospitrust's checkpoint is a pickle; converting it loads it with pickle, which runs "
          "any code a crafted file holds. Convert only a checkpoint your own runs wrote.", file=sys.stderr)
    if not args.yes:
        answer = input("Do you trust this file? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("hospitrust checkpoint upgrade: not converted", file=sys.stderr)
            return 1
    try:
        path = upgrade_checkpoint(args.file)
    except (CheckpointError, OSError) as exc:
        print(f"hospitrust checkpoint upgrade: {exc}", file=sys.stderr)
        return 2
    print(f"converted {path} (the original is kept beside it as {path.name}.v1)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hospitrust", description="Trust-aware federated learning across hospitals.")
    sub = parser.add_subparsers(dest="command", required=True)

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
    sim.set_defaults(func=_simulate)

    doc = sub.add_parser("doctor", help="check this environment: torch and torchvision together, Flower, data, Chromium",
                         description="One line per check: torch and torchvision load together (the same build), "
                                     "Flower's version, which MedMNIST files are in the data folder, and Chromium "
                                     "for the browser tests. Exits 1 when simulate could not run.")
    doc.set_defaults(func=_doctor)

    con = sub.add_parser("console", help="a live web page of runs: hospitals, trust decisions and why, round by round",
                         description="Serve a read-only page that follows a run directory (or an output directory of "
                                     "runs) from its files, live. Loopback by default; on another address every "
                                     "request needs the token printed at start.")
    con.add_argument("path", help="a run directory, or an output directory holding runs")
    con.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    con.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    con.add_argument("--token", help="the access token off loopback (default: a new one, printed)")
    con.add_argument("--certfile", help="TLS certificate (e.g. the deployment's server.pem)")
    con.add_argument("--keyfile", help="TLS private key (e.g. the deployment's server.key)")
    con.set_defaults(func=_console)

    cfg = sub.add_parser("config", help="generate or check pyproject's run config and the config reference",
                         description="The run config's tables in pyproject.toml, docs/config.md and the rules' option "
                                     "tables come from the components' Options: `generate` writes them, `check` exits 1 "
                                     "when one is stale.")
    cfg.add_argument("config_command", choices=("generate", "check"))
    cfg.add_argument("--app", help="the project folder (default: found from the current folder)")
    cfg.set_defaults(func=_config)

    ck = sub.add_parser("checkpoint", help="convert a checkpoint written by an earlier hospitrust",
                        description="Checkpoints are read with torch.load(weights_only=True); one written before "
                                    "format 2 is refused until converted (after you confirm you trust it).")
    ck.add_argument("checkpoint_command", choices=("upgrade",))
    ck.add_argument("file", help="a checkpoint.pt, or the run directory holding it")
    ck.add_argument("--yes", action="store_true", help="do not ask: you trust the file")
    ck.set_defaults(func=_checkpoint)

    from hospitrust.ops.data_cli import add_data_parser
    from hospitrust.ops.deploy.cli import add_app_parser, add_deploy_parser

    add_deploy_parser(sub)
    add_app_parser(sub)
    add_data_parser(sub)

    from hospitrust.cli.export import add_task_parser

    add_task_parser(sub)

    from hospitrust.cli.fbd import add_unlearn_parser

    add_unlearn_parser(sub)

    from hospitrust.bench.cli import add_bench_parsers

    add_bench_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("deploy", "data"):
        from hospitrust.ops.deploy import DeployError

        try:
            return int(args.func(args))
        except (DeployError, ValueError, OSError) as exc:
            print(f"hospitrust {args.command}: {exc}", file=sys.stderr)
            return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

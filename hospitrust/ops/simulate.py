"""``hospitrust simulate``: one Flower simulation run on this machine, done right.

It owns its SuperLink (a free port on 127.0.0.1, runtime dependency installation off,
its own FLWR_HOME, cwd in a scratch folder so Ray actors cannot import a stale copy of
the package), sizes per-hospital resources to the machine, streams the run's log, waits
with a finite timeout, stops the SuperLink, and exits non-zero unless the run ended
``finished:completed`` (``flwr run --stream`` itself exits 0 on a failed run).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hospitrust.tasks.task import resolve_task
from hospitrust.config import DATA_DIR_ENV, ConfigError, legacy, parse_run_config
from hospitrust.datasets.registry import ensure_dataset
from hospitrust.ops import flwr
from hospitrust.ops.flwr import COMPLETED, FlowerProcessError

CONNECTION = "sim"  # the connection name in this run's own FLWR_HOME


class SimulationError(FlowerProcessError):
    """The simulation could not be started or did not complete."""


# Flower's simulation logs these for every run: they tell how to resize the federation with
# `flwr federation simulation-config`, while here `--hospitals` sets it (and did)
MISLEADING = ("default simulated SuperNodes changed from 10 to 2", "To change federation size, use the following command",
              "flwr federation simulation-config")


CLEAR_LINE = "\r\x1b[K"  # back to the line's start and clear it: a progress line redrawn in place
# Noise left out unless -v: Ray's tip about a future default (on every run), torch's deprecation of
# script_method (a library HTA's imports load), Flower unpacking the app bundle into this run's FLWR_HOME,
# Flower stopping its actors at the end of every run
NOISE = ("FutureWarning: Tip: In future versions of Ray", "`torch.jit.script_method` is deprecated",
         "Successfully installed hospitrust to ", "Manually terminating ClientAppActor")  # the last: a normal end
_WARNING_HEADER = re.compile(r"\S+\.py:\d+: \w*Warning: ")  # Python's warning line; its source line follows, indented
_ACTOR_PREFIX = re.compile(r"^\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ")  # Ray's prefix on an actor's output
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def copy_lines(src, dst, *, tty: bool | None = None, verbose: bool = False) -> None:
    """Copy a run's log stream line by line, leaving out Flower's lines about resizing the federation.

    On a terminal (``tty``; default: whether ``dst`` is one) the ServerApp's "k/n hospitals replied"
    lines are redrawn in place, one line that counts up; piped, they stay plain lines. Unless
    ``verbose``, the ``NOISE`` lines (a warning with the source line Python prints under it) are
    left out, and piped output has no ANSI colour codes.
    """
    from hospitrust.server_app.transport import PROGRESS_MARK

    tty = _isatty(dst) if tty is None else tty
    progress_shown = skip_source_line = False
    for line in iter(src.readline, ""):
        if any(text in line for text in MISLEADING):
            continue
        if not verbose:
            if skip_source_line:
                skip_source_line = False
                if _ACTOR_PREFIX.sub("", _ANSI.sub("", line)).startswith((" ", "\t")):
                    continue
            if any(text in line for text in NOISE):
                skip_source_line = bool(_WARNING_HEADER.search(_ANSI.sub("", line)))
                continue
            if not tty:
                line = _ANSI.sub("", line)
        if tty and PROGRESS_MARK in line:
            dst.write(CLEAR_LINE + line.rstrip("\n"))
            progress_shown = True
        else:
            if progress_shown:
                dst.write(CLEAR_LINE)
                progress_shown = False
            dst.write(line)
        dst.flush()
    if progress_shown:
        dst.write("\n")
        dst.flush()


SOURCE_CHECKOUT = Path(__file__).resolve().parents[2]  # the project folder, when the package runs from a clone


def find_app_dir(start: Path | None = None, *, packaged: bool = True) -> Path:
    """The Flower app folder (the pyproject.toml with [tool.flwr.app]): from cwd upwards, else beside
    the package (a source checkout), else, with ``packaged``, the app an installed wheel carries
    (``flwr.PACKAGED_APP``: its pyproject.toml and task files; ``stage_app`` adds the package).
    """
    candidates = []
    here = (start or Path.cwd()).resolve()
    candidates += [here, *here.parents]
    candidates.append(SOURCE_CHECKOUT)
    if packaged:
        candidates.append(flwr.PACKAGED_APP)
    for folder in candidates:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            try:
                data = tomllib.loads(pyproject.read_text())
            except tomllib.TOMLDecodeError:
                continue
            if data.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {}).get("serverapp", "").startswith(
                "hospitrust."
            ):
                return folder
    raise SimulationError(
        "cannot find the hospitrust Flower app (a pyproject.toml with [tool.flwr.app]); "
        "run from the project folder or pass --app PATH (an installed hospitrust carries its app in "
        f"{flwr.PACKAGED_APP}: reinstall it if that folder is missing)"
    )


def flatten_sections(table: dict, prefix: str = "") -> dict:
    """Nested TOML tables as Flower flattens them: ``{"hta": {"ema-rate": 0.3}}`` -> ``{"hta.ema-rate": 0.3}``."""
    out: dict = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flatten_sections(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def app_config_defaults(app_dir: Path | None = None) -> dict:
    """The app's run config defaults: ``[tool.flwr.app.config]`` of its pyproject.toml, flat (dotted keys)."""
    folder = app_dir or find_app_dir()
    return flatten_sections(tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def translate_overrides(values: dict[str, object], out=None) -> dict[str, object]:
    """Old flat keys under their new names, with one line each saying so (on ``out``, else on the stderr of the
    moment: a default bound at import would keep the stream of whoever imported this module first).
    """
    translated, notes = legacy.translate(values)
    for note in notes:
        print(f"hospitrust: {note}", file=out or sys.stderr)
    return translated


_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


def parse_overrides(texts: list[str], defaults: dict | None = None) -> dict[str, object]:
    """``-c 'k=v k2=v2'`` as flwr parses it (TOML values), but a bare word is taken as a string,
    so ``-c dataset=retinamnist`` works without shell-quoted quotes; and where ``defaults`` say a
    key is a string, ``malicious-hospitals=1`` means the string "1".
    """
    out: dict[str, object] = {}
    for text in texts:
        matches = _PAIR.findall(text)
        leftover = _PAIR.sub("", text).strip()
        if leftover:
            raise ConfigError(f"cannot read run config override {leftover!r}: write key=value pairs, e.g. 'num-server-rounds=3'")
        for key, raw in matches:
            try:
                out[key] = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                out[key] = raw.strip("'\"")
            names = [key, *legacy.new_names(key)]
            default = next((defaults[n] for n in names if n in defaults), None) if defaults is not None else None
            if isinstance(default, str) and not isinstance(out[key], str):
                out[key] = raw.strip("'\"")
    return out


def to_toml_overrides(values: dict[str, object]) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            parts.append(f"{key}={value!r}")
        else:
            parts.append(f"{key}={json.dumps(str(value))}")
    return " ".join(parts)


@dataclass
class Resources:
    cpus_per_hospital: float
    gpus_per_hospital: float
    concurrency: int


def size_resources(hospitals: int, cpus: int | None = None, gpus: int | None = None) -> Resources:
    """One CPU per simulated hospital (so all cores train in parallel); GPUs shared between
    the hospitals that run at once (a zero GPU share would hide the GPU from the actors).
    """
    cpus = cpus if cpus is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if gpus is None:
        try:
            import torch

            gpus = torch.cuda.device_count()
        except Exception:
            gpus = 0
    concurrency = max(1, min(hospitals, cpus))
    gpu_share = round(min(1.0, gpus / concurrency), 4) if gpus else 0.0
    return Resources(1.0, gpu_share, concurrency)


def simulate(
    *,
    hospitals: int = 10,
    overrides: list[str] | None = None,
    app_dir: Path | None = None,
    timeout: float = 3600.0,
    gpus: int | None = None,
    out=None,
    ray_address: str = "",
    verbose: bool = False,
    keep: bool = False,
    environment_problem: Callable[[], str | None] | None = None,
) -> tuple[str, Path | None]:
    """Run one simulation; returns (final status, run directory or None).

    ``verbose``: the run's log as Flower streams it (see :func:`copy_lines` for what is left out otherwise).
    ``keep``: a run that did not complete keeps its scratch folder (the SuperLink's log, its FLWR_HOME,
    the staged app), and says where; without it the folder is removed like a completed run's.

    ``ray_address``: an existing Ray cluster (``host:port``) for the hospitals' actors; Flower's
    simulation joins it through ``RAY_ADDRESS`` instead of starting a Ray instance of its own.

    ``environment_problem``: asked after the run config and the data are checked, before any Flower process starts;
    what it returns (a broken torch / torchvision pair, say) stops the run as a SimulationError. It comes last
    because it imports torchvision (2-3 s): a mistyped key is told without it.
    """
    out = out or sys.stdout  # the stdout of the moment, not the one at import
    if hospitals < 1:
        raise ConfigError(f"--hospitals must be >= 1, got {hospitals}")
    app = (app_dir or find_app_dir()).resolve()
    defaults = app_config_defaults(app)
    values = translate_overrides(parse_overrides(overrides or [], defaults), out)
    explicit = set(values)

    # Paths must be absolute: the ServerApp's cwd is not this shell's.
    merged = {**defaults, **values}
    values["output-dir"] = str(Path(str(merged["output-dir"])).expanduser().resolve())
    if merged.get("data-dir"):
        values["data-dir"] = str(Path(str(merged["data-dir"])).expanduser().resolve())
    elif os.environ.get(DATA_DIR_ENV):
        values["data-dir"] = str(Path(os.environ[DATA_DIR_ENV]).expanduser().resolve())
    if merged.get("resume-from"):
        values["resume-from"] = str(Path(str(merged["resume-from"])).expanduser().resolve())
    for key in ("server-data.test-path", "server-data.cohort-path", "server-data.cache-dir", "task.pretrained"):
        if merged.get(key):
            values[key] = str(Path(str(merged[key])).expanduser().resolve())
    if not merged.get("run-name"):
        values["run-name"] = time.strftime("%Y%m%d-%H%M%S") + f"-{merged['dataset']}-{merged['strategy']}-{secrets.token_hex(2)}"
    # every config error surfaces here, before anything starts (unknown keys with a "did you mean")
    cfg = parse_run_config({**defaults, **values}, explicit=explicit)
    if cfg.min_hospitals > hospitals:
        raise ConfigError(f"min-hospitals = {cfg.min_hospitals} but only --hospitals {hospitals} are simulated")
    if cfg.task.custom:
        raise ConfigError("hospitrust simulate makes its hospitals from a dataset (dataset = FLAG), and this run config "
                          "defines a task of its own (task.file / task.classes): run it on real hospitals (their SuperNodes"
                          " with data-path, see docs/operators.md), or try it on one machine with `hospitrust task export`")
    ensure_dataset(cfg.dataset, cfg.image_size, cfg.resolved_data_dir())  # a missing file stops us before Flower or Ray
    try:  # a split that cannot be drawn (too many hospitals for the data) stops us here, not in every ClientApp
        from hospitrust.datasets.federation import partitions

        partitions(cfg.federation, hospitals)
    except ValueError as exc:
        raise ConfigError(f"cannot split {cfg.dataset} over {hospitals} hospitals: {exc}") from None
    resolve_task(cfg)  # a task file or a bad task key stops us here too
    for key, path in (("server-data.test-path", cfg.server_data.test_path), ("server-data.cohort-path",
                      cfg.server_data.cohort_path), ("task.pretrained", cfg.task.pretrained)):
        if path and not Path(path).exists():  # read by the ServerApp, on this machine
            raise ConfigError(f"{key} {path!r} does not exist")
    if environment_problem is not None and (problem := environment_problem()) is not None:
        raise SimulationError(problem)

    res = size_resources(hospitals, gpus=gpus)
    work = Path(tempfile.mkdtemp(prefix="hospitrust-sim-"))
    # inherited by the SuperLink -> flwr-simulation -> ray.init(), which then joins that cluster
    env = flwr.flower_env(work, {"RAY_ADDRESS": ray_address} if ray_address else None)
    port = flwr.free_port()
    flwr.write_local_connection(work, CONNECTION, port)
    where = f"on the Ray cluster at {ray_address}" if ray_address else f"up to {res.concurrency} at once"
    print(
        f"hospitrust simulate: {hospitals} hospitals, {res.cpus_per_hospital:g} CPU"
        f"{f' + {res.gpus_per_hospital:g} GPU' if res.gpus_per_hospital else ''} each, {where}; "
        f"SuperLink on 127.0.0.1:{port} (the federation's size is --hospitals)",
        file=out,
        flush=True,
    )
    try:
        superlink = flwr.start("flower-superlink", flwr.simulation_superlink_command(port), env=env, cwd=work,
                               log_file=work / "superlink.log")
    except FlowerProcessError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise SimulationError(str(exc)) from None
    status, details, run_dir = "not-started", "", None
    try:
        try:
            flwr.wait_healthy(f"127.0.0.1:{port}", proc=superlink)
        except FlowerProcessError as exc:
            raise SimulationError(str(exc)) from None
        federation = (
            f"num-supernodes={hospitals} client-resources-num-cpus={res.cpus_per_hospital:g} "
            f"client-resources-num-gpus={res.gpus_per_hospital:g}"
        )
        try:
            run_id = flwr.submit_run(app, CONNECTION, run_config=to_toml_overrides(values), env=env, cwd=work,
                                     federation_config=federation)
        except FlowerProcessError as exc:
            raise SimulationError(str(exc)) from None
        print(f"hospitrust simulate: run {run_id} submitted; streaming its log (timeout {timeout:.0f} s)", file=out, flush=True)
        deadline = time.monotonic() + timeout
        stream = subprocess.Popen(["flwr", "log", str(run_id), CONNECTION, "--stream"], env=env, cwd=work,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                  start_new_session=True)
        reader = threading.Thread(target=copy_lines, args=(stream.stdout, out), kwargs={"verbose": verbose}, daemon=True)
        reader.start()
        try:
            stream.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            if stream.poll() is None:
                os.killpg(stream.pid, signal.SIGTERM)
                stream.wait(timeout=10)
            reader.join(timeout=5)
        # the log stream can end a moment before the status is final
        for _ in range(60):
            status, details = flwr.run_status(run_id, CONNECTION, env=env, cwd=work)
            if status.startswith("finished") or time.monotonic() > deadline:
                break
            time.sleep(1)
        if not status.startswith("finished"):
            flwr.stop_run(run_id, CONNECTION, env=env, cwd=work)
            details = f"timed out after {timeout:.0f} s (status was {status}); the run was stopped"
            status = "timeout"
        if values.get("resume-from"):  # a resumed run goes on in the checkpoint's directory
            resumed = Path(str(values["resume-from"]))  # made a resolved path string above
            run_dir = resumed if resumed.is_dir() else resumed.parent
        else:
            candidates = sorted(Path(str(values["output-dir"])).glob(f"{values['run-name']}*"))
            run_dir = candidates[-1] if candidates else None
    finally:
        superlink.stop()
        if status != COMPLETED and keep:
            print(f"hospitrust simulate: run folder kept at {work} (SuperLink log {superlink.log_file})", file=out)
        else:
            shutil.rmtree(work, ignore_errors=True)
            if status != COMPLETED:
                print(f"hospitrust simulate: removed the run folder {work}; rerun with --keep to keep it "
                      "(the SuperLink's log)", file=out)
    print(f"hospitrust simulate: run ended {status}" + (f": {details}" if details and status != COMPLETED else ""),
          file=out, flush=True)
    if run_dir is not None and (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
        f = summary["final"]
        print(
            f"final ({summary['dataset']}, {summary['strategy']}, {summary['rounds']} rounds, "
            f"{summary['wall_seconds']:.0f} s): accuracy {f['accuracy']:.4f}  balanced accuracy {f['balanced_accuracy']:.4f}  "
            f"AUC {f['auc']:.4f}  worst-class recall {f['worst_class_recall']:.4f}\nresults: {run_dir}",
            file=out,
            flush=True,
        )
    return status, run_dir

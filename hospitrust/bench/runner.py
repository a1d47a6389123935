"""Run a grid: resumable, parallel, with progress, failures on the record and a results store.

The grid directory:

``GRID_DIR/``
  - ``grid.toml``       the grid file as it was last run; ``grid.json`` its expanded cells
  - ``cells/<cell>/``   one run directory per cell (config.json, rounds.jsonl, summary.json)
  - ``logs/<cell>.log`` the cell's output (the ServerApp's round lines, or the simulation's log)
  - ``failed/<cell>.json`` a failed cell: its error and traceback (removed once it succeeds)
  - ``bench.jsonl``     events: worker start-up, cell done / failed with timings, interruptions
  - ``results.csv``, ``cells.csv``, ``results.sqlite`` the results store (hospitrust.bench.store)

A cell is finished when ``cells/<cell>/summary.json`` exists (written atomically as the run's
last act). A cell that was running when the grid was killed has no summary: its partial folder
is removed and it runs again. A failed cell is skipped until ``retry_failed``.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import shutil
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hospitrust.bench.events import append_event, code_version, read_events
from hospitrust.bench.grid import Cell, Grid, grid_fingerprint

_WORKER: dict[str, Any] = {}


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cell_state(out: Path, cell: Cell | str) -> str:
    name = cell if isinstance(cell, str) else cell.name
    if (out / "cells" / name / "summary.json").is_file():
        return "done"
    if (out / "failed" / f"{name}.json").is_file():
        return "failed"
    return "pending"


def _worker_init(threads: int, backend: str, started: float) -> None:
    import logging

    if backend == "inprocess":
        import torch

        torch.set_num_threads(threads)
        import hospitrust.client_app  # noqa: F401  (imports paid once per worker)
        import hospitrust.server_app  # noqa: F401
    for handler in logging.getLogger("flwr").handlers:  # the console: warnings only (cells' round lines
        handler.setLevel(logging.WARNING)               # would interleave); each cell's log gets them all
    _WORKER.update(ready=time.time(), spawned=started, cells=0)


def _run_cell(task: dict[str, Any]) -> dict[str, Any]:
    """In a worker: run one cell; never raises (the error is returned and recorded)."""
    started = time.time()
    name, run_dir, log_path = task["name"], Path(task["run_dir"]), Path(task["log"])
    _WORKER["cells"] = _WORKER.get("cells", 0) + 1
    result = {"cell": name, "pid": os.getpid(), "started": started, "worker_cell_index": _WORKER["cells"],
              "worker_setup_seconds": (_WORKER.get("ready", started) - _WORKER.get("spawned", started))
              if _WORKER["cells"] == 1 else 0.0}
    # A worker orphaned by a SIGKILLed bench may still be running this cell: wait for it (its lock)
    # rather than run the cell twice into the same folder.
    cell_lock = open(log_path.with_suffix(".lock"), "a+")
    fcntl.flock(cell_lock, fcntl.LOCK_EX)
    if (run_dir / "summary.json").is_file():
        cell_lock.close()  # finished by that orphan meanwhile: not run again, not timed again
        result.update(status="done", error="", traceback="", ended=time.time(), finished_earlier=True)
        result["seconds"] = result["ended"] - started
        return result
    if run_dir.exists():
        shutil.rmtree(run_dir)  # left by a killed or failed attempt: start the cell afresh
    try:
        with open(log_path, "w") as log:
            if task.get("control"):  # no federation: trained in this worker, whatever the grid's backend
                from hospitrust.bench.controls import Control, run_control

                control = Control.from_keys(task["control"])
                assert control is not None  # a cell with control keys names its control (checked by parse_grid)
                run_control(task["run_config"], task["hospitals"], control, say=lambda line: print(line, file=log, flush=True))
            elif task["backend"] == "inprocess":
                from hospitrust.bench.backends import run_inprocess_cell

                run_inprocess_cell(task["run_config"], task["hospitals"], log)
            else:
                from hospitrust.bench.backends import run_simulation_cell

                run_simulation_cell(task["run_config"], task["hospitals"], log, timeout=task["timeout"],
                                    superlink=task.get("superlink"), ray_address=task.get("ray_address", ""))
        if not (run_dir / "summary.json").is_file():
            raise RuntimeError(f"the run ended without {run_dir / 'summary.json'} (see {log_path})")
        if not task["keep_models"]:
            for heavy in ("model.pt", "checkpoint.pt"):
                (run_dir / heavy).unlink(missing_ok=True)
        result.update(status="done", error="", traceback="")
    except BaseException as exc:  # recorded; the other cells go on
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}"[-4000:], traceback=traceback.format_exc()[-8000:])
    result["ended"] = time.time()
    result["seconds"] = result["ended"] - started
    cell_lock.close()
    return result


def _fmt_seconds(s: float | None) -> str:
    if s is None or s != s:
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@dataclass
class BenchOutcome:
    total: int
    done: int
    failed: int
    ran: int
    skipped_done: int
    skipped_failed: int
    wall_seconds: float
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.done == self.total and not self.interrupted


class GridLocked(RuntimeError):
    """Another ``hospitrust bench`` is running on this grid directory."""


def run_grid(grid: Grid, out: str | Path, *, workers: int | None = None, retry_failed: bool = False,
             ray_address: str = "", limit: int | None = None, progress: Callable[[str], None] | None = None,
             heartbeat: float = 60.0, build_store: bool = True) -> BenchOutcome:
    """Run every unfinished cell of ``grid`` into ``out``; returns counts. ``limit`` stops after that many cells."""
    say = progress or (lambda line: print(line, flush=True))
    out = Path(out).resolve()
    for sub in ("cells", "logs", "failed"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    lock = open(out / ".bench.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise GridLocked(f"another `hospitrust bench` is running on {out} (it holds {out / '.bench.lock'})") from None
    try:
        return _run_locked(grid, out, workers=workers, retry_failed=retry_failed, ray_address=ray_address,
                           limit=limit, say=say, heartbeat=heartbeat, build_store=build_store)
    finally:
        lock.close()


def _run_locked(grid: Grid, out: Path, *, workers, retry_failed, ray_address, limit, say, heartbeat, build_store):
    if grid.path is not None:
        shutil.copyfile(grid.path, out / "grid.toml")
    (out / "grid.json").write_text(json.dumps({
        "name": grid.name, "backend": grid.backend, "metric": grid.metric, "baseline": grid.baseline,
        "axes": grid.axes, "fingerprint": grid_fingerprint(grid),
        "cells": [{"cell": c.name, "axes": c.axes, "hospitals": c.hospitals} for c in grid.cells],
    }, indent=1, default=str) + "\n")

    states = {c.name: cell_state(out, c) for c in grid.cells}
    if retry_failed:
        for name, state in states.items():
            if state == "failed":
                states[name] = "pending"
    todo = [c for c in grid.cells if states[c.name] == "pending"]
    if limit is not None:
        todo = todo[:limit]
    done_before = sum(s == "done" for s in states.values())
    failed_before = sum(s == "failed" for s in states.values())
    workers = max(1, min(workers or grid.workers, len(todo) or 1))
    threads = grid.threads_per_worker or max(1, _cpus() // workers)
    say(f"[bench {grid.name}] {len(grid.cells)} cells: {done_before} done, {failed_before} failed earlier"
        f"{' (re-run now)' if retry_failed and failed_before else ' (skipped; --retry-failed runs them)' if failed_before else ''}, "
        f"{len(todo)} to run on {workers} worker(s) x {threads} thread(s), backend {grid.backend}"
        f"{f' on Ray {ray_address}' if ray_address else ''} -> {out}")

    started = time.time()
    append_event(out, {"event": "start", "cells": len(grid.cells), "todo": len(todo), "workers": workers,
                        "backend": grid.backend, "ray_address": ray_address, "pid": os.getpid(), "code": code_version()})
    # a cell can finish in the moment a bench is killed, before its event is written: log it now
    recorded = _recorded_done(out)
    for name in [n for n, state in states.items() if state == "done" and n not in recorded]:
        append_event(out, {"event": "cell", "cell": name, "status": "done", "seconds": None,
                            "recorded_late": "finished while an earlier start was interrupted"})
    outcome = BenchOutcome(total=len(grid.cells), done=done_before, failed=failed_before if not retry_failed else 0,
                           ran=0, skipped_done=done_before, skipped_failed=0 if retry_failed else failed_before,
                           wall_seconds=0.0)
    if not todo:
        outcome.wall_seconds = time.time() - started
        if build_store:
            _store(out, grid, say)
        return outcome

    superlink_proc, superlink = None, None
    if grid.backend == "simulation" and grid.shared_superlink:
        from hospitrust.bench.backends import SharedSuperLink

        t0 = time.time()
        info, superlink_proc = SharedSuperLink.start(ray_address)
        superlink = {"address": info.address, "flwr_home": info.flwr_home}
        append_event(out, {"event": "superlink", "seconds": time.time() - t0, "address": info.address})
        say(f"[bench {grid.name}] one SuperLink for the grid on {info.address} (started in {time.time() - t0:.1f} s)")

    def task(cell: Cell) -> dict[str, Any]:
        cfg = {**cell.run_config, "output-dir": str(out / "cells"), "run-name": cell.name}
        if grid.aggregation_backend != "auto":  # the run applies it when it sets up (a worker runs many cells)
            cfg["aggregation.backend"] = grid.aggregation_backend
        return {"name": cell.name, "run_config": cfg, "hospitals": cell.hospitals, "backend": grid.backend,
                "run_dir": str(out / "cells" / cell.name), "log": str(out / "logs" / f"{cell.name}.log"),
                "timeout": grid.timeout, "keep_models": grid.keep_models, "superlink": superlink,
                "ray_address": ray_address, "control": cell.control}

    # earlier sessions' cell times seed the estimate of time left
    durations = _earlier_durations(out)
    pending = deque(todo)
    inflight: dict[str, tuple[Any, float]] = {}  # cell name -> (its AsyncResult, start time)
    failed_now, done_now = 0, 0
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(threads, grid.backend, time.time()),
                    maxtasksperchild=None if grid.reuse_workers else 1)
    import threading

    previous_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None

    def _term(signum, frame):
        raise KeyboardInterrupt  # a killed bench stops its workers; running cells run again next time

    if previous_term is not None:
        signal.signal(signal.SIGTERM, _term)
    last_beat = time.time()

    def line(extra: str) -> str:
        elapsed = time.time() - started
        remaining = len(pending) + len(inflight)
        mean = sum(durations) / len(durations) if durations else None
        eta = None if mean is None else mean * (len(pending) + 0.5 * len(inflight)) / workers
        return (f"[bench {grid.name}] {done_before + done_now}/{len(grid.cells)} done, {len(inflight)} running, "
                f"{failed_now + (outcome.skipped_failed)} failed, {remaining - len(inflight)} queued; "
                f"elapsed {_fmt_seconds(elapsed)}, about {_fmt_seconds(eta)} left" + (f" | {extra}" if extra else ""))

    try:
        while pending or inflight:
            while pending and len(inflight) < workers:
                cell = pending.popleft()
                inflight[cell.name] = (pool.apply_async(_run_cell, (task(cell),)), time.time())
            time.sleep(0.2)
            finished_lines = []
            for name in [n for n, (res, _) in inflight.items() if res.ready()]:
                res, _ = inflight.pop(name)
                try:
                    result = res.get()
                except Exception as exc:  # the worker itself died
                    result = {"cell": name, "status": "failed", "error": f"worker failed: {type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc(), "seconds": float("nan")}
                if not result.get("finished_earlier"):
                    append_event(out, {"event": "cell", **{k: v for k, v in result.items() if k != "traceback"}})
                fail_file = out / "failed" / f"{name}.json"
                if result["status"] == "done":
                    done_now += 1
                    durations.append(result["seconds"])
                    fail_file.unlink(missing_ok=True)
                    extra = f"{name} done in {_fmt_seconds(result['seconds'])}"
                else:
                    failed_now += 1
                    fail_file.write_text(json.dumps(result, indent=1) + "\n")
                    extra = f"{name} FAILED after {_fmt_seconds(result['seconds'])}: {result['error'][:300]}"
                finished_lines.append(extra)
            while pending and len(inflight) < workers:  # refill before reporting, so `running` is current
                cell = pending.popleft()
                inflight[cell.name] = (pool.apply_async(_run_cell, (task(cell),)), time.time())
            for extra in finished_lines:
                say(line(extra))
                last_beat = time.time()
            if time.time() - last_beat > heartbeat:
                say(line("running: " + ", ".join(f"{n} ({_fmt_seconds(time.time() - t)})" for n, (_, t) in inflight.items())))
                last_beat = time.time()
        pool.close()
        pool.join()
    except KeyboardInterrupt:
        pool.terminate()
        pool.join()
        outcome.interrupted = True
        append_event(out, {"event": "interrupted", "running": list(inflight), "pid": os.getpid()})
        say(f"[bench {grid.name}] interrupted: {len(inflight)} running cell(s) dropped "
            f"({', '.join(inflight)}); they run again on the next start")
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        if superlink_proc is not None:
            from hospitrust.bench.backends import SharedSuperLink

            assert superlink is not None  # started with the process
            SharedSuperLink.stop(superlink_proc, superlink["flwr_home"])

    outcome.ran = done_now + failed_now
    outcome.done = done_before + done_now
    outcome.failed = (outcome.skipped_failed) + failed_now
    outcome.wall_seconds = time.time() - started
    append_event(out, {"event": "end", "done": done_now, "failed": failed_now, "wall_seconds": outcome.wall_seconds,
                        "interrupted": outcome.interrupted})
    say(f"[bench {grid.name}] {'stopped' if outcome.interrupted else 'finished'}: {outcome.done}/{outcome.total} done, "
        f"{outcome.failed} failed, {done_now + failed_now} ran this time in {_fmt_seconds(outcome.wall_seconds)}")
    if build_store:
        _store(out, grid, say)
    return outcome


def _recorded_done(out: Path) -> set[str]:
    """Cells whose finish is in the event log."""
    return {str(ev.get("cell")) for ev in read_events(out) if ev.get("event") == "cell" and ev.get("status") == "done"}


def _earlier_durations(out: Path) -> list[float]:
    times = [float(ev["seconds"]) for ev in read_events(out)
             if ev.get("event") == "cell" and ev.get("status") == "done" and isinstance(ev.get("seconds"), (int, float))]
    return times[-50:]


def _store(out: Path, grid: Grid, say) -> None:
    from hospitrust.bench.store import build_store, overhead_summary

    paths = build_store(out, grid)
    say(f"[bench {grid.name}] results store: {', '.join(str(p) for p in paths)}")
    text = overhead_summary(out)
    if text:
        say(text)

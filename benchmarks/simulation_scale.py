"""Simulation start-up and scale: the same images split over 10, 100 (and 1,000) hospitals, in one invocation.

Every size runs ``hospitrust simulate --hospitals N`` on the same run config (the same dataset,
``train-subsample`` and local epochs, so the training compute over all hospitals is the same
and only the number of hospitals changes) and reads the run's ``rounds.jsonl``. Per size it prints:

- **to round 1**: from launching ``hospitrust simulate`` until the ServerApp pushed round 1's
  train messages (our start-up: CLI, data check, SuperLink, FAB, ServerApp set-up);
- **round 1**: round 1's time, which also pays Ray's start and the actors' imports;
- **round**: the median of the later rounds, and its ratio to the smallest size's;
- **peak RSS / hospital**: the largest resident memory of the whole process tree (SuperLink,
  simulation engine, Ray and its actors) divided by N, sampled every 0.5 s.

Ray's own start is measured once beforehand: ``ray.init`` of a local instance with as many CPUs
as the simulation uses, in a fresh interpreter, and ``ray.shutdown``.

    python benchmarks/simulation_scale.py --hospitals 10,100 --rounds 3
    python benchmarks/simulation_scale.py --hospitals 10,100,1000 --rounds 2 -c 'local-epochs=1'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from hospitrust.server_app.results import read_round_records

REPO = Path(__file__).resolve().parent.parent


def ray_start_seconds(cpus: int) -> float:
    """Seconds for ``ray.init(num_cpus=cpus)`` of a local instance in a fresh interpreter (imports excluded)."""
    code = ("import time, ray; t = time.perf_counter(); ray.init(num_cpus=%d, include_dashboard=False, "
            "log_to_driver=False); print(time.perf_counter() - t); ray.shutdown()" % cpus)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"ray.init failed:\n{res.stderr[-2000:]}")
    return float(res.stdout.strip().splitlines()[-1])


class PeakRSS:
    """The largest summed RSS of a process and all its descendants, sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.peak = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


def one_size(work: Path, hospitals: int, run_config: str, timeout: float) -> dict:
    """Run one simulation of ``hospitals`` hospitals; its start-up, round times and peak memory."""
    name = f"scale-{hospitals}"
    cmd = [sys.executable, "-m", "hospitrust.cli.main", "simulate", "--hospitals", str(hospitals), "--timeout",
           str(timeout), "-c", f'{run_config} output-dir="{work}" run-name="{name}"']
    log = work / f"{name}.log"
    launched = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, text=True)
        sampler = PeakRSS(proc.pid)
        rc = proc.wait()
        peak = sampler.stop()
    if rc != 0:
        raise SystemExit(f"{hospitals} hospitals: simulation failed (rc {rc}):\n{log.read_text()[-4000:]}")
    rounds = read_round_records(work / name)
    later = [r.round_seconds for r in rounds[1:]] or [rounds[0].round_seconds]
    return {"hospitals": hospitals, "to_round_1": rounds[0].timing["train_pushed_at"] - launched,
            "round_1": rounds[0].round_seconds, "round": statistics.median(later), "rounds": len(rounds),
            "train_seconds": statistics.median(r.timing["train_seconds"] for r in rounds[1:] or rounds),
            "peak_rss_mb": peak / 2**20, "wall": time.time() - launched}


def main() -> None:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hospitals", default="10,100", help="comma list of federation sizes (default 10,100)")
    parser.add_argument("--rounds", type=int, default=3, help="server rounds per run (default 3)")
    parser.add_argument("-c", "--run-config", default="", help="extra run config for every size, e.g. 'local-epochs=1'")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    sizes = [int(v) for v in args.hospitals.split(",") if v.strip()]
    # no central evaluation difference between sizes: the server's test set is the same
    run_config = f"num-server-rounds={args.rounds} checkpoint=false {args.run_config}".strip()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ray_s = ray_start_seconds(cpus)
    print(f"Ray's own start (ray.init, {cpus} CPUs, fresh interpreter): {ray_s:.2f} s", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hospitrust-sim-scale-") as tmp:
        for n in sizes:
            row = one_size(Path(tmp), n, run_config, args.timeout)
            rows.append(row)
            print(f"{n} hospitals: {row['wall']:.1f} s in all", flush=True)
    base = rows[0]["round"]
    print(f"\nrun config {run_config!r}, {cpus} CPUs; round = median of rounds 2..{args.rounds}")
    print(f"{'hospitals':>9} {'to round 1 s':>13} {'round 1 s':>10} {'round s':>8} {'x ' + str(sizes[0]):>7} "
          f"{'train s':>8} {'peak RSS MB':>12} {'MB/hospital':>12}")
    for r in rows:
        print(f"{r['hospitals']:>9} {r['to_round_1']:>13.2f} {r['round_1']:>10.2f} {r['round']:>8.2f} "
              f"{r['round'] / base:>7.2f} {r['train_seconds']:>8.2f} {r['peak_rss_mb']:>12.0f} "
              f"{r['peak_rss_mb'] / r['hospitals']:>12.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "ray_start_seconds": ray_s, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

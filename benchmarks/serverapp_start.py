"""What a run's ServerApp process costs before its first line of the run, fresh against forked, in one invocation.

Flower's own launcher (``flower-superexec``, ``deploy superlink --serverapp-launcher flower``) starts a fresh
``flwr-serverapp`` interpreter per run, which imports torch, numpy and Flower's ServerApp runtime; hospitrust's warm
launcher (the default, :mod:`hospitrust.supervision.serverapp_launcher`) imports them once and forks each run's
ServerApp from itself. This measures the two starts side by side, ``--repeats`` times each, on this machine:

- **fresh**: ``python -c "import <the launcher's PRELOAD>"`` in a new process (wall and CPU seconds, the child's
  rusage);
- **forked**: a child ``os.fork()``-ed from this process once it has imported the same modules (the launcher's
  ``preload``), which imports them again (already loaded: a dictionary lookup) and exits.

Both leave out what is the same either way: the run's app bundle (hospitrust's own modules), Flower's calls to the
SuperLink, the run itself. It prints the medians and the ratio fresh / forked.

    python benchmarks/serverapp_start.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh(modules: tuple[str, ...]) -> tuple[float, float]:
    """Wall and CPU seconds of a new interpreter importing ``modules``."""
    cpu, start = _child_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True)
    return time.perf_counter() - start, _child_cpu() - cpu


def forked(modules: tuple[str, ...]) -> tuple[float, float]:
    """Wall and CPU seconds of a child forked from this (preloaded) process importing ``modules`` and exiting."""
    cpu, start = _child_cpu(), time.perf_counter()
    pid = os.fork()
    if pid == 0:
        import importlib

        for name in modules:
            importlib.import_module(name)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("the forked child failed")
    return time.perf_counter() - start, _child_cpu() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="starts of each kind (default 5)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected 1 or more")
    from hospitrust.supervision.launcher import preload
    from hospitrust.supervision.serverapp_launcher import PRELOAD

    fresh(PRELOAD)  # the files in the page cache for both, as on a SuperLink that has run before
    runs = {"fresh": [fresh(PRELOAD) for _ in range(args.repeats)]}
    print(f"the launcher's preload in this process: {preload(PRELOAD):.2f} s (once per launcher start)", flush=True)
    runs["forked"] = [forked(PRELOAD) for _ in range(args.repeats)]
    print(f"{'start':<8} {'wall (s)':>9} {'CPU (s)':>8}   median of {args.repeats}")
    medians = {}
    for kind, values in runs.items():
        medians[kind] = (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        print(f"{kind:<8} {medians[kind][0]:>9.3f} {medians[kind][1]:>8.3f}")
    wall, cpu = (medians["fresh"][i] / max(medians["forked"][i], 1e-4) for i in (0, 1))
    print(f"fresh / forked: {wall:.0f}x the wall time, {cpu:.0f}x the CPU time per run's ServerApp start")
    return 0


if __name__ == "__main__":
    sys.exit(main())

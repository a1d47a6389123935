"""The simulated hospitals of a round trained one after the other (today) or together (``train.batched-hospitals``).

A leaderboard-like cell (in process, PneumoniaMNIST, Dirichlet 0.5, small CNN, 1 local epoch,
batch 32, SGD) runs twice per hospital count in this one process, today's path and the batched
one, on ``--threads`` torch threads. Per run it prints:

- **wall**: the cell's wall time (set-up, training, the server's evaluations), and batched / today;
- **train s**: the seconds spent training the hospitals (today: each hospital's loop; batched: the
  round's stacked computation), and batched / today;
- **train GFLOP**: the hospitals' training FLOPs, counted with ``torch.utils.flop_counter`` (forward and
  backward of one batch of 32, per example) times the examples trained;
- **eval GFLOP**: the evaluations' FLOPs (forward of one image, counted, times the images every
  no-grad forward of the model saw: the server's central evaluations, the hospitals' local reports,
  a judge's candidate models);
- **share of matmul**: the training FLOPs per training second, and the cell's training-and-evaluation
  FLOPs per wall second (the issue's figure), as a share of a 2048 x 2048 float32 matmul's rate
  measured in the same process with the same threads.

A warm-up pair of tiny cells runs first (imports, the dataset's cache, vmap's first call). On a
loaded machine the figures move from run to run: compare ratios from one run, with ``--repeat 3``
(each path's fastest of three interleaved cells).

    python benchmarks/batched_training.py --hospitals 10,20 --rounds 2
    python benchmarks/batched_training.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def matmul_flops_per_second(size: int = 2048, seconds: float = 1.0) -> float:
    """float32 matmul rate: 2 n^3 FLOPs per product, best of repeated timings."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best, spent = float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        t = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
    return 2 * size**3 / best


def train_flops_per_example(image_size: int, channels: int, classes: int, batch: int = 32) -> float:
    """Forward + backward FLOPs of the small CNN per training example (one batch, counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hospitrust.models.small_cnn import SmallCNN

    model = SmallCNN(channels, classes, image_size)
    x, y = torch.randn(batch, channels, image_size, image_size), torch.randint(0, classes, (batch,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def eval_flops_per_example(image_size: int, channels: int, classes: int, batch: int = 32) -> float:
    """Forward FLOPs of the small CNN per evaluated example (one batch, counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hospitrust.models.small_cnn import SmallCNN

    model = SmallCNN(channels, classes, image_size).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(batch, channels, image_size, image_size))
    return counter.get_total_flops() / batch


class TrainingClock:
    """Seconds spent and examples trained in the hospitals' training, today's path or batched."""

    def __init__(self) -> None:
        self.seconds, self.examples, self.evaluated = 0.0, 0, 0

    @contextlib.contextmanager
    def patched(self):
        from hospitrust.models import batched, training
        from hospitrust.models.small_cnn import SmallCNN

        today, group, forward = training._train_today, batched._train_group, SmallCNN.forward

        def counted_forward(model, x):
            if not torch.is_grad_enabled():  # an evaluation (training forwards record gradients)
                self.evaluated += int(x.shape[0])
            return forward(model, x)

        def timed_today(model, images, labels, **kw):
            t = time.perf_counter()
            result = today(model, images, labels, **kw)
            self.seconds += time.perf_counter() - t
            self.examples += int(labels.shape[0]) * int(kw["epochs"])
            return result

        def timed_group(jobs):
            t = time.perf_counter()
            group(jobs)
            self.seconds += time.perf_counter() - t
            self.examples += sum(int(j.labels.shape[0]) * j.epochs for j in jobs)

        training._train_today, batched._train_group, SmallCNN.forward = timed_today, timed_group, counted_forward
        try:
            yield self
        finally:
            training._train_today, batched._train_group, SmallCNN.forward = today, group, forward


def run_cell(hospitals: int, *, batched_on: bool, rounds: int, subsample: float, work: Path) -> tuple[float, TrainingClock]:
    """One cell in process: its wall seconds and its training clock."""
    from hospitrust.config import RunConfig
    from hospitrust.ops.inprocess import run_inprocess

    cfg = RunConfig().to_flat()
    cfg.update({"num-server-rounds": rounds, "train-subsample": subsample, "local-epochs": 1, "batch-size": 32,
                "partitioner": "dirichlet", "dirichlet.alpha": 0.5, "model": "small-cnn",
                "output-dir": str(work / "runs"), "run-name": f"{hospitals}-{'batched' if batched_on else 'today'}",
                "train.batched-hospitals": batched_on})
    clock = TrainingClock()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    with clock.patched(), contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter()
        run_inprocess(cfg, hospitals)
        wall = time.perf_counter() - t
    return wall, clock


def main(argv: list[str] | None = None) -> None:
    """Run the cells and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hospitals", default="10,20", help="comma-separated hospital counts (default 10,20)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--subsample", type=float, default=0.25, help="train-subsample (default 0.25, the leaderboard's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a grid worker)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="cells per path, interleaved; the fastest is shown (default 1; 3 on a shared machine)")
    ap.add_argument("--quick", action="store_true", help="a tiny run (3 hospitals, 1 round, 2 %% of the images)")
    args = ap.parse_args(argv)
    if args.quick:
        args.hospitals, args.rounds, args.subsample = "3", 1, 0.02
    if args.repeat < 1:
        raise SystemExit(f"--repeat: a count >= 1 expected, got {args.repeat}")
    counts = [int(h) for h in args.hospitals.split(",") if h.strip()]
    if not counts or min(counts) < 2:
        raise SystemExit(f"--hospitals: comma-separated counts >= 2 expected, got {args.hospitals!r}")
    torch.set_num_threads(args.threads)
    rate = matmul_flops_per_second(seconds=0.3 if args.quick else 2.0)
    per_example, per_eval = train_flops_per_example(28, 1, 2), eval_flops_per_example(28, 1, 2)
    print(f"torch {torch.__version__}, {args.threads} thread(s); 2048x2048 float32 matmul: {rate / 1e9:.1f} GFLOP/s; "
          f"small CNN: {per_example / 1e6:.2f} MFLOP per training example (forward + backward), "
          f"{per_eval / 1e6:.2f} per evaluated one")
    print(f"{'hospitals':>9} {'path':>8} {'wall s':>8} {'ratio':>6} {'train s':>8} {'ratio':>6} {'train GFLOP':>11} "
          f"{'eval GFLOP':>10} {'share/train':>11} {'(train+eval)/wall':>17}")
    with tempfile.TemporaryDirectory(prefix="hospitrust-batched-bench-") as tmp:
        # warm-up: imports, the dataset and its partitions (cached per process), vmap's first call
        for batched_on in (False, True):
            run_cell(counts[0], batched_on=batched_on, rounds=1, subsample=min(args.subsample, 0.02), work=Path(tmp))
        for n in counts:
            runs: dict[bool, list[tuple[float, TrainingClock]]] = {False: [], True: []}
            for _ in range(args.repeat):  # interleaved: a load that comes and goes touches both paths
                for batched_on in (False, True):
                    runs[batched_on].append(run_cell(n, batched_on=batched_on, rounds=args.rounds,
                                                     subsample=args.subsample, work=Path(tmp)))
            base: tuple[float, float] | None = None
            for batched_on in (False, True):
                wall, clock = min(runs[batched_on], key=lambda run: run[0])  # the fastest of the repeats
                flops, eval_flops = per_example * clock.examples, per_eval * clock.evaluated
                if base is None:
                    base = (wall, clock.seconds)
                print(f"{n:>9} {'batched' if batched_on else 'today':>8} {wall:>8.2f} {wall / base[0]:>6.2f} "
                      f"{clock.seconds:>8.2f} {clock.seconds / base[1]:>6.2f} {flops / 1e9:>11.2f} "
                      f"{eval_flops / 1e9:>10.2f} {flops / clock.seconds / rate:>11.1%} "
                      f"{(flops + eval_flops) / wall / rate:>17.1%}")

if __name__ == "__main__":
    main()

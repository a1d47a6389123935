"""``hospitrust reference pooled RUN_DIR``: how far a simulated run is from pooling the hospitals' data.

Trains the leaderboard's ``pooled`` control for the run's own config (same dataset, partition,
model and recipe; the union of the honest hospitals' training partitions) and writes
``RUN_DIR/pooled-reference.json`` (:mod:`hospitrust.bench.reference`); ``hospitrust report RUN_DIR``
and the end of ``hospitrust simulate`` then show the gap.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP_BUDGET = ("epochs over the pooled images (default: matched to the run, num-server-rounds x local-epochs: the "
               "passes over its data each hospital makes when every hospital trains every round, so the gap compares "
               "the same training at the same budget; the leaderboard's pooled control takes control-epochs chosen on "
               "tuning seeds instead, give those here to reproduce it)")


class _Progress:
    """One line per epoch: redrawn in place on a terminal, plain lines when piped (as simulate's round progress)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.started = self.last = 0.0
        self.shown = False

    def __call__(self, epoch: int, epochs: int, report: dict[str, Any]) -> None:
        import time

        now = time.monotonic()
        if not self.started:
            self.started = now
        line = (f"pooled reference: epoch {epoch:>3}/{epochs}  bal-acc {report['balanced_accuracy']:.4f}  "
                f"auc {report['auc']:.4f}  acc {report['accuracy']:.4f}")
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.shown = True
            if epoch == epochs:
                self.stream.write("\n")
                self.shown = False
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def pooled_reference(run_dir: Path, *, epochs: int | None = None, learning_rate: float | None = None,
                     force: bool = False, who: str = "hospitrust reference pooled") -> int:
    """Train and write the run's pooled reference, printing progress and the gap; returns the exit code.

    Parameters
    ----------
    run_dir : Path
        A simulated run's directory.
    epochs, learning_rate : int or float or None
        The budget (None: matched to the run) and the learning rate (None: the run's).
    force : bool
        Train again where the run has a reference already.
    who : str
        The command named in messages.

    Returns
    -------
    int
        0 written (or there already), 2 for input that cannot be pooled or a missing data file.
    """
    from hospitrust.bench.controls import ControlError
    from hospitrust.bench.reference import (PooledReferenceError, count, gap_line, matched_epochs, read_reference,
                                            reference_path, run_setting)
    from hospitrust.datasets.base import DataMissingError
    from hospitrust.errors import ConfigError

    try:
        if epochs is not None and not 1 <= epochs <= 100_000:
            raise PooledReferenceError(f"--epochs must be an integer in [1, 100000], got {epochs}")
        if learning_rate is not None and not 0 < learning_rate < 10:
            raise PooledReferenceError(f"--learning-rate must be a number in (0, 10), got {learning_rate}")
        run_config, hospitals = run_setting(run_dir)
        if read_reference(run_dir) is not None and not force:
            print(f"{who}: {reference_path(run_dir)} exists (--force trains it again)")
            print(gap_line(run_dir))
            return 0
        total = epochs if epochs is not None else matched_epochs(run_config)
        budget = (f"matched to the run: num-server-rounds {run_config['num-server-rounds']} x local-epochs "
                  f"{run_config['local-epochs']}" if epochs is None else "given")
        print(f"{who}: {run_config.get('dataset')}, {run_config.get('model')}, seed {run_config.get('seed')}; the "
              f"training partitions of the run's {hospitals} simulated hospitals (less any it simulated as attackers) "
              f"in one place; {count(total, 'epoch')} ({budget}), learning rate "
              f"{learning_rate or run_config.get('learning-rate')}",
              flush=True)
        from hospitrust.bench.reference import make_pooled_reference

        progress = _Progress()
        try:
            record = make_pooled_reference(run_dir, epochs=epochs, learning_rate=learning_rate, on_epoch=progress)
        finally:
            progress.close()
    except (PooledReferenceError, ControlError, ConfigError, DataMissingError) as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return 2
    recall = ", ".join(f"{name} {r:.4f}" if isinstance(r, float) else f"{name} n/a"
                       for name, r in record["per_class_recall"].items())
    print(f"{who}: {count(record['pooled_images'], 'image')} of {count(len(record['pooled_hospitals']), 'hospital')}, "
          f"{count(record['epochs'], 'epoch')}, {record['wall_seconds']:.0f} s on {record['device']}: balanced accuracy "
          f"{record['final']['balanced_accuracy']:.4f}, AUC {record['final']['auc']:.4f}, per-class recall {recall}\n"
          f"written: {reference_path(run_dir)}")
    print(gap_line(run_dir))
    return 0


def _reference(args: argparse.Namespace) -> int:
    return pooled_reference(Path(args.run_dir).expanduser().resolve(), epochs=args.epochs,
                            learning_rate=args.learning_rate, force=args.force)


def add_reference_parser(sub) -> None:
    """Add ``hospitrust reference pooled`` to the command's sub-parsers."""
    ref = sub.add_parser("reference", help="references a run is measured against: the hospitals' data pooled",
                         description="What a run would reach without federating. See docs/getting-started.md.")
    rsub = ref.add_subparsers(dest="reference_command", required=True)
    p = rsub.add_parser(
        "pooled", help="train the run's model on the hospitals' training images in one place (the gap to federating)",
        description="Train the same model with the hospitals' recipe on the union of the simulated hospitals' training "
                    "partitions (the honest ones, under a simulated attack), for the run config RUN_DIR/config.json "
                    "records, evaluate it on the run's test split after each epoch, and write "
                    "RUN_DIR/pooled-reference.json (balanced accuracy, AUC, per-class recall, each epoch's). "
                    "`hospitrust report RUN_DIR` then shows the gap. Only a simulated run has a pooled reference: "
                    "real hospitals keep their data.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a simulated run's directory (`hospitrust simulate` prints it last)")
    p.add_argument("--epochs", type=int, help=HELP_BUDGET)
    p.add_argument("--learning-rate", type=float, help="learning rate (default: the run's learning-rate)")
    p.add_argument("--force", action="store_true", help="train again where RUN_DIR has a pooled reference already")
    p.set_defaults(func=_reference)

"""The controls of every leaderboard table: what the server or the hospitals get without federating.

A consortium asks first whether joining pays. A control answers with the same data, model, training
loop and central evaluation as the rules' cells, and no federation at all:

``cohort-only-rounds``
    The server's model trained on its reference cohort alone, matched to the run's rounds: FLTrust's
    root update (:class:`~hospitrust.server_app.services.ReferenceCohortTrainer`, one epoch on the cohort
    at the cell's learning rate) chained over ``num-server-rounds``.
``cohort-only-converged``
    The same model trained on the cohort to convergence: ``control-epochs`` epochs at
    ``control-learning-rate`` with the hospitals' recipe (optimizer, class weights, the task's
    augmentation), both chosen on tuning seeds on the val split outside the cohort.
``local-only-mean`` / ``local-only-best``
    Each honest hospital trains alone on its own training images to convergence (the same
    recipe). ``mean``: the honest hospitals' metrics averaged; ``best``: the hospital whose model
    scores best on the server's validation images (the val split outside the cohort), reported on
    the evaluation set (a consortium can pick its best member only with data it holds out).
``pooled``
    The honest hospitals' training images in one place, trained to convergence: the ceiling of what
    federating can reach.

The honest hospitals are the complement of the malicious set the cell's ``malicious-fraction`` and
seed draw, the same set the attacked cells of the condition use (the control cells keep the
condition's ``malicious-fraction``; they run no attack). A control writes a run directory like a
rule's (``config.json``, ``rounds.jsonl`` with one record per round or epoch, ``summary.json``), so
the benchmark's store, reports and leaderboard read it as one more row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hospitrust.aggregation import flatten_state, unflatten_state
from hospitrust.server_app.converge import COHORT_SALT

#: the control kinds, in the order tables show them
CONTROLS = ("cohort-only-rounds", "cohort-only-converged", "local-only-mean", "local-only-best", "pooled")
#: the ceiling of what federating can reach: reported, never the "best control" a rule is set against
CEILING = "pooled"
#: the cell keys that describe a control (grid files: in an axis table, [base] or a [[when]] set)
CONTROL_KEYS = ("control", "control-epochs", "control-learning-rate")
#: the kinds trained to convergence: they need control-epochs (chosen on tuning seeds)
CONVERGED = ("cohort-only-converged", "local-only-mean", "local-only-best", "pooled")


class ControlError(ValueError):
    """A control's settings are wrong; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Control:
    """One control: its kind and, for the converged kinds, its epochs and learning rate
    (None: the cell's ``learning-rate``).
    """

    kind: str
    epochs: int | None = None
    learning_rate: float | None = None

    @classmethod
    def from_keys(cls, keys: Mapping[str, Any]) -> "Control | None":
        """The control a cell's ``control*`` keys describe; None without ``control``."""
        unknown = sorted(k for k in keys if k not in CONTROL_KEYS)
        if unknown:
            raise ControlError(f"unknown control key(s) {unknown}; known: {', '.join(CONTROL_KEYS)}")
        kind = keys.get("control")
        if kind is None:
            if keys:
                raise ControlError(f"{', '.join(sorted(keys))} without control = one of {', '.join(CONTROLS)}")
            return None
        if kind not in CONTROLS:
            raise ControlError(f"control = {kind!r}; allowed: {', '.join(CONTROLS)}")
        epochs, lr = keys.get("control-epochs"), keys.get("control-learning-rate")
        if kind in CONVERGED:
            if not isinstance(epochs, int) or isinstance(epochs, bool) or not 1 <= epochs <= 100_000:
                raise ControlError(f"control = {kind!r} trains to convergence: control-epochs must be an integer in "
                                   f"[1, 100000] (chosen on tuning seeds), got {epochs!r}")
        elif epochs is not None:
            raise ControlError(f"control = {kind!r} is matched to the run's rounds (num-server-rounds): "
                               "control-epochs does not apply")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 10):
            raise ControlError(f"control-learning-rate must be a number in (0, 10), got {lr!r}")
        return cls(str(kind), epochs, None if lr is None else float(lr))

    def to_json(self) -> dict[str, Any]:
        return {"control": self.kind, "control-epochs": self.epochs, "control-learning-rate": self.learning_rate}


def honest_partitions(cfg, num_hospitals: int) -> list[int]:
    """The partition ids the cell's malicious-fraction (or malicious-hospitals) and seed leave honest."""
    from hospitrust.attacks.selection import malicious_set

    bad = malicious_set(num_hospitals, malicious_fraction=cfg.malicious_fraction,
                        malicious_hospitals=cfg.malicious_hospitals, seed=cfg.seed)
    return [i for i in range(num_hospitals) if i not in bad]


@dataclass
class _Setup:
    cfg: Any
    task: Any
    sets: Any
    device: torch.device
    evaluate: Callable[[torch.nn.Module], dict[str, Any]]


def _setup(run_config: Mapping[str, Any]) -> _Setup:
    from flwr.app import ArrayRecord

    from hospitrust.config import parse_run_config
    from hospitrust.datasets.server import server_sets
    from hospitrust.models.training import pick_device
    from hospitrust.server_app.services import CentralEvaluator
    from hospitrust.tasks.task import resolve_task

    cfg = parse_run_config(dict(run_config))
    task = resolve_task(cfg)
    sets = server_sets(cfg.server_data, task, cfg.federation, cfg.task.custom)
    if sets.test is None:
        raise ControlError("a control is evaluated centrally, as the rules' cells are: this run has no server test set")
    device = pick_device()
    evaluator = CentralEvaluator(cfg, task, device, sets.test)

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        return evaluator(ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()}))

    return _Setup(cfg, task, sets, device, evaluate)


def _fresh_model(s: _Setup) -> torch.nn.Module:
    """The run's initial global model: the task's model drawn after seeding with the cell's seed."""
    from hospitrust.server_app.converge import fresh_model

    return fresh_model(s.cfg, s.task)


def _converge(s: _Setup, images: np.ndarray, labels: np.ndarray, control: Control, salt: int,
              evaluate: Callable[[torch.nn.Module], dict[str, Any]]) -> tuple[torch.nn.Module, list[dict[str, Any]]]:
    """A fresh model trained ``control.epochs`` epochs on (images, labels); ``evaluate`` after each epoch."""
    from hospitrust.server_app.converge import converge

    assert control.epochs is not None  # a converged kind (Control.from_keys)
    return converge(s.cfg, s.task, images, labels, epochs=control.epochs,
                    learning_rate=control.learning_rate or s.cfg.learning_rate, salt=salt, device=s.device,
                    evaluate=evaluate)


def _cohort_rounds(s: _Setup) -> list[dict[str, Any]]:
    from hospitrust.server_app.services import ReferenceCohortTrainer

    if s.sets.cohort is None:
        raise ControlError("control = 'cohort-only-rounds' trains on the server's reference cohort: this run has none")
    model = _fresh_model(s)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    root = ReferenceCohortTrainer(s.cfg, s.task, s.device, s.sets.cohort)
    history = []
    for rnd in range(1, s.cfg.num_server_rounds + 1):
        vec, spec = flatten_state(state)
        state = unflatten_state(vec + root(state, rnd).to(vec.dtype), spec, state)
        model.load_state_dict(state, strict=True)
        history.append(s.evaluate(model))
    return history


def _mean_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The numeric metrics averaged over hospitals (per-class lists element-wise)."""
    out: dict[str, Any] = {}
    for key, value in reports[0].items():
        values: list[Any] = [r.get(key) for r in reports]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float(np.mean(np.asarray(values, dtype=np.float64)))
        elif all(isinstance(v, list) and len(v) == len(value) and all(isinstance(x, (int, float)) for x in v)
                 for v in values):
            out[key] = [float(x) for x in np.mean(np.asarray(values, dtype=np.float64), axis=0)]
    return out


def _validation_scorer(s: _Setup) -> Callable[[torch.nn.Module], float]:
    """Balanced accuracy on the val split outside the cohort (the images no rule judges updates on)."""
    from hospitrust import metrics
    from hospitrust.datasets.federation import validation_set
    from hospitrust.models.training import predict_proba

    val = validation_set(s.cfg.federation)

    def score(model: torch.nn.Module) -> float:
        probs = predict_proba(model, val.images, device=s.device)
        return float(metrics.balanced_accuracy(val.labels, probs.argmax(axis=1)))

    return score


def _local_only(s: _Setup, control: Control, hospitals: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from hospitrust.datasets.federation import simulated_hospital

    honest = honest_partitions(s.cfg, hospitals)
    per_hospital: dict[int, list[dict[str, Any]]] = {}
    chosen_by: dict[int, float] = {}
    score = _validation_scorer(s) if control.kind == "local-only-best" else None
    for pid in honest:
        data = simulated_hospital(s.cfg.federation, pid, hospitals).train
        model, per_hospital[pid] = _converge(s, data.images, data.labels, control, pid, s.evaluate)
        if score is not None:
            chosen_by[pid] = score(model)
    epochs = len(next(iter(per_hospital.values())))
    if control.kind == "local-only-mean":
        history = [_mean_report([per_hospital[p][e] for p in honest]) for e in range(epochs)]
        return history, {"honest_hospitals": [f"hospital-{p}" for p in honest]}
    best = max(honest, key=lambda p: (chosen_by[p], -p))  # ties: the lower partition id
    return per_hospital[best], {"honest_hospitals": [f"hospital-{p}" for p in honest], "best_hospital": f"hospital-{best}",
                                "validation_balanced_accuracy": {f"hospital-{p}": chosen_by[p] for p in honest}}


def _pooled(s: _Setup, control: Control, hospitals: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from hospitrust.datasets.federation import simulated_hospital

    honest = honest_partitions(s.cfg, hospitals)
    shares = [simulated_hospital(s.cfg.federation, p, hospitals).train for p in honest]
    images = np.concatenate([d.images for d in shares])
    labels = np.concatenate([d.labels for d in shares])
    _, history = _converge(s, images, labels, control, 0, s.evaluate)
    return history, {"honest_hospitals": [f"hospital-{p}" for p in honest], "pooled_images": int(labels.size)}


def train_pooled(run_config: Mapping[str, Any], hospitals: int, control: Control,
                 on_epoch: Callable[[int, dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``pooled`` control for ``run_config`` without a run directory of its own (``hospitrust reference
    pooled`` writes its result into the federated run's folder): the central report after each epoch, and the
    control's facts (honest hospitals, pooled images) with the task's class names and the device.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        A complete flat run config (kebab-case keys), as a run's ``config.json`` holds it.
    hospitals : int
        The simulated hospitals the training split was divided among.
    control : Control
        A ``pooled`` control (its epochs and learning rate).
    on_epoch : callable or None
        Called with (epoch, central report) after each epoch, e.g. to show progress.

    Returns
    -------
    tuple[list[dict[str, Any]], dict[str, Any]]
        The per-epoch central reports and the facts.
    """
    if control.kind != CEILING or control.epochs is None:
        raise ControlError(f"train_pooled trains control = {CEILING!r} with control-epochs, got {control.to_json()}")
    s = _setup(run_config)
    if s.cfg.task.custom:
        raise ControlError(f"control = {CEILING!r} trains on the simulated hospitals' images: a task of the "
                           "consortium's own has none on the server")
    if on_epoch is not None:
        central, done = s.evaluate, [0]

        def evaluate(model: torch.nn.Module) -> dict[str, Any]:
            report = central(model)
            done[0] += 1
            on_epoch(done[0], report)
            return report

        s.evaluate = evaluate
    history, extra = _pooled(s, control, hospitals)
    return history, {**extra, "class_names": list(s.task.class_names), "device": str(s.device)}


def run_control(run_config: Mapping[str, Any], hospitals: int, control: Control, say: Callable[[str], None] = print):
    """Train and evaluate ``control`` for the cell ``run_config`` (``hospitals`` simulated hospitals) and
    write its run directory under ``output-dir``/``run-name``; returns the directory's path.
    """
    from hospitrust.records import RoundRecord
    from hospitrust.server_app.results import RunDirectory

    started = time.time()
    s = _setup(run_config)
    cfg = s.cfg
    if control.kind in ("local-only-mean", "local-only-best", "pooled") and cfg.task.custom:
        raise ControlError(f"control = {control.kind!r} trains on the simulated hospitals' images: a task of the "
                           "consortium's own has none on the server")
    say(f"hospitrust control {control.kind}: {cfg.dataset}, {cfg.model}, seed {cfg.seed}, {hospitals} hospitals")
    if control.kind == "cohort-only-rounds":
        history, extra = _cohort_rounds(s), {"cohort_images": len(s.sets.cohort)}
        unit = "round"
    elif control.kind == "cohort-only-converged":
        if s.sets.cohort is None:
            raise ControlError("control = 'cohort-only-converged' trains on the server's reference cohort: this run has none")
        _, history = _converge(s, s.sets.cohort.images, s.sets.cohort.labels, control, COHORT_SALT, s.evaluate)
        extra, unit = {"cohort_images": len(s.sets.cohort)}, "epoch"
    elif control.kind in ("local-only-mean", "local-only-best"):
        (history, extra), unit = _local_only(s, control, hospitals), "epoch"
    else:
        (history, extra), unit = _pooled(s, control, hospitals), "epoch"

    run_dir = RunDirectory.create(cfg.output_dir, cfg.run_name or f"control-{control.kind}")
    run_dir.write_config({**cfg.to_flat(), **control.to_json()})
    for number, central in enumerate(history, start=1):
        run_dir.append_round(RoundRecord(number=number, central=central, note=f"control {control.kind}, {unit} {number}"))
    best = max(range(len(history)), key=lambda i: (history[i]["balanced_accuracy"], -i))
    run_dir.write_summary({
        "final": history[-1], "best_round": best + 1, "best": history[best], "rounds": len(history),
        "wall_seconds": time.time() - started, "dataset": cfg.dataset, "strategy": control.kind, "model": cfg.model,
        "hospitals": hospitals, "run_dir": str(run_dir.path), "attack": "none", "participation": {},
        "control": {**control.to_json(), "unit": unit, **extra},
    })
    final = history[-1]
    say(f"hospitrust control {control.kind}: {len(history)} {unit}s, final balanced accuracy "
        f"{final['balanced_accuracy']:.4f}, AUC {final['auc']:.4f}; results: {run_dir.path}")
    return run_dir.path

"""Local training and evaluation loops (plain torch, no Flower).

Images stay uint8 in memory and are turned into normalized float batches on the fly:
a 224-pixel dataset would not fit as float32 in every simulated hospital.
"""

from __future__ import annotations

import random
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
from pydantic import Field

from hospitrust.models.loop import GPU_LOADER_WORKERS, TrainResult, uint8_batches  # noqa: F401 - re-exported
from hospitrust.options import Options


class TrainOptions(Options):
    """Local training at every hospital (the ``train`` section; local-epochs, batch-size and
    learning-rate are top-level keys, the three a consortium sets most).
    """

    optimizer: Literal["sgd", "adam"] = Field("sgd", description="Local optimizer: sgd or adam.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0.0, description="L2 weight decay.")
    class_weighted_loss: bool = Field(False, description=(
        "Weigh each class's loss by n / (classes held x its count) in the hospital's own training labels "
        "(scikit-learn's 'balanced'), so rare classes are learned; also the server's own training on the "
        "reference cohort (FLTrust's root update), not FED-FBD's."
    ))
    class_weights_from: Literal["hospital", "federation"] = Field("hospital", description=(
        "With train.class-weighted-loss: 'hospital' weighs classes by the hospital's own label counts; "
        "'federation' by the federation's totals (from the query round's class counts, sent with every train "
        "message), so a specialist weighs up the rare class it holds instead of down."
    ))
    fedrs_alpha: float = Field(1.0, ge=0.0, le=1.0, description=(
        "FedRS's restricted softmax: a hospital multiplies the logits of the classes it holds none of by this"
        " in its loss (0: leaves them out of the softmax), so it does not push a class it never sees down "
        "everywhere. 1: plain softmax (off)."
    ))
    batched_hospitals: bool = Field(False, description=(
        "In-process runs only: the simulated hospitals of a round train as one computation (their stacked "
        "models, one computation of their gradients, SGD on the stacked tensors), each with its own data, batches "
        "and random draws; same math as training one after the other, within float32 rounding. Adam, local "
        "DP-SGD, FED-FBD and models with buffers train as without it (the run logs why)."
    ))


def pick_device() -> torch.device:
    """The GPU when one is visible to this process, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(*parts: int) -> None:
    """Seed python, numpy and torch from a tuple (e.g. seed, hospital, round)."""
    seed = int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def to_batch(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (N, H, W, C) -> float (N, C, H, W) in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    return x.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


def make_optimizer(params, optimizer: str, learning_rate: float, momentum: float,
                   weight_decay: float) -> torch.optim.Optimizer:
    """The hospitals' local optimizer by run config name (sgd or adam)."""
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, momentum=momentum, weight_decay=weight_decay)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=learning_rate, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {optimizer!r}; allowed: adam, sgd")


def train(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    device: torch.device | None = None,
    generator: torch.Generator | None = None,
    class_weights: torch.Tensor | None = None,
    missing_class_scale: float = 1.0,
    augment=None,
) -> TrainResult:
    """Minibatch training; with ``proximal_mu > 0`` adds FedProx's (mu/2)||w - w_global||^2;
    ``class_weights`` (one per class) weigh each sample's cross-entropy by its label's weight
    (PyTorch's weighted mean: sum w_y l / sum w_y). ``missing_class_scale`` < 1 is FedRS's
    restricted softmax: the logits of the classes absent from ``labels`` are multiplied by it
    in the loss (0: left out of the softmax), so a hospital that holds none of a class does
    not push that class's logit down everywhere. ``augment``: a per-image transform of uint8
    (C, H, W) tensors (``hospitrust.models.augment``), applied to every training batch.
    """
    if not 0.0 <= missing_class_scale <= 1.0:
        raise ValueError(f"missing_class_scale (train.fedrs-alpha) must be in [0, 1], got {missing_class_scale}")
    device = device or pick_device()
    model.to(device).train()
    if int(labels.shape[0]) == 0:
        return TrainResult(float("nan"), 0, 0)
    from hospitrust.models.batched import TrainJob, current_session

    def today() -> TrainResult:
        return _train_today(model, images, labels, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                            optimizer=optimizer, momentum=momentum, weight_decay=weight_decay, proximal_mu=proximal_mu,
                            device=device, generator=generator, class_weights=class_weights,
                            missing_class_scale=missing_class_scale, augment=augment)

    session = current_session()
    if session is not None:  # train.batched-hospitals, in process: this hospital trains with the round's others
        return session.park(TrainJob(model, images, labels, epochs, batch_size, learning_rate, optimizer, momentum,
                                     weight_decay, proximal_mu, device, generator, class_weights, missing_class_scale,
                                     augment, today))
    return today()


def _train_today(model: nn.Module, images: np.ndarray, labels: np.ndarray, *, epochs: int, batch_size: int,
                 learning_rate: float, optimizer: str, momentum: float, weight_decay: float, proximal_mu: float,
                 device: torch.device, generator: torch.Generator | None, class_weights: torch.Tensor | None,
                 missing_class_scale: float, augment) -> TrainResult:
    """One hospital's training with the one loop (``hospitrust.models.loop``)."""
    from hospitrust.models.loop import CrossEntropyStep, ShuffledBatches, restricted_softmax_scale, run_loop

    n = int(labels.shape[0])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, optimizer, learning_rate, momentum, weight_decay)
    weight = None if class_weights is None else torch.as_tensor(class_weights, dtype=torch.float32).to(device)
    loss = CrossEntropyStep(weight=weight, logit_scale=restricted_softmax_scale(model, labels, missing_class_scale, device),
                            proximal_mu=proximal_mu, params=params,
                            global_params=[p.detach().clone() for p in params] if proximal_mu > 0 else None)
    done = run_loop(model, opt, ShuffledBatches(images, labels, batch_size, device, generator), loss, epochs=epochs,
                    augment=augment)
    return TrainResult(done.totals.get("loss", 0.0) / max(done.seen, 1), n, done.steps)


def balanced_class_weights(labels: np.ndarray, num_classes: int) -> torch.Tensor:
    r"""scikit-learn's ``class_weight='balanced'`` over the classes present:
    :math:`w_c = n / (K\,n_c)` with K the number of classes present; 1 for absent classes
    (no sample carries their weight).
    """
    y = np.asarray(labels).astype(np.int64).ravel()
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {int(y.min())}..{int(y.max())}")
    return class_weights_from_counts(np.bincount(y, minlength=num_classes), num_classes)


def class_weights_from_counts(counts, num_classes: int) -> torch.Tensor:
    r"""The same weights from class counts: :math:`w_c = \sum n / (K\,n_c)` over the K classes
    with a count, 1 for the others. From the federation's totals (``train.class-weights-from =
    federation``) a specialist weighs the rare class it holds up, where its own counts would
    weigh that class, its majority, down.
    """
    c = np.asarray(counts, dtype=np.float64).ravel()
    if c.size != num_classes:
        raise ValueError(f"class counts must have one entry per class ({num_classes}), got {c.size}")
    if not np.all(np.isfinite(c)) or (c < 0).any():
        raise ValueError(f"class counts must be finite and >= 0, got {c.tolist()}")
    present = c > 0
    w = np.ones(num_classes, dtype=np.float64)
    if present.any():
        w[present] = c.sum() / (int(present.sum()) * c[present])
    return torch.from_numpy(w).float()


#: predict_proba's batch on the CPU: a small CNN's activations of 128 images stay in the caches (512 ran
#: 1.7x slower on one thread); every image's result is the same at any batch size (measured bit for bit)
CPU_EVAL_BATCH = 128


@torch.no_grad()
def predict_proba(
    model: nn.Module, images: np.ndarray, *, batch_size: int | None = None, device: torch.device | None = None
) -> np.ndarray:
    """Class probabilities (N, C) as float64 numpy (``batch_size``: 512 on a GPU, :data:`CPU_EVAL_BATCH` on the CPU)."""
    device = device or pick_device()
    batch_size = batch_size or (CPU_EVAL_BATCH if device.type == "cpu" else 512)
    model.to(device).eval()
    out = []
    for start in range(0, images.shape[0], batch_size):
        logits = model(to_batch(images[start : start + batch_size], device))
        out.append(torch.softmax(logits.float(), dim=1).cpu())
    if not out:
        return np.zeros((0, 0))
    return torch.cat(out).double().numpy()

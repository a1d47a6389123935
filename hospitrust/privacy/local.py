"""Local differential privacy: DP-SGD at a hospital with Opacus, and its accounting.

Opacus's ``PrivacyEngine.make_private`` wraps the model (per-sample gradients), the optimizer
(each example's gradient clipped to ``max_grad_norm``, Gaussian noise of std ``sigma x
max_grad_norm`` on their sum) and the data loader (Poisson sampling: every example joins each
step's batch independently with probability ``q = 1 / steps-per-epoch``). Its RDP accountant
composes one sampled Gaussian mechanism per step, which is exactly right only under that
sampling: :func:`train_private` returns the steps it took and the batch sizes it drew, so a
test can check both against the accountant (``tests/test_privacy.py``).

A round's spending is an :class:`PrivacyEvent` ``(sigma, q, steps)``; events compose by RDP
across rounds, runs and restarts (:mod:`hospitrust.privacy.ledger` keeps a hospital's).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn

#: The accountant every local epsilon is computed with (recorded in config.json).
ACCOUNTANT = "rdp"
ACCOUNTANT_DESCRIPTION = ("Opacus RDPAccountant: Poisson-sampled Gaussian mechanism per DP-SGD step, add/remove-one "
                          "neighbours, composed by Renyi DP over Opacus's default orders, converted to (epsilon, delta)")


@dataclass(frozen=True)
class PrivacyEvent:
    """``steps`` DP-SGD steps at noise multiplier ``noise_multiplier`` and sampling rate ``sample_rate``."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PrivacyEvent":
        return cls(float(d["noise_multiplier"]), float(d["sample_rate"]), int(d["steps"]))


def rdp_orders() -> list[float]:
    """Opacus's default RDP orders (alphas)."""
    return list(_orders())


@functools.lru_cache(maxsize=1)
def _orders() -> tuple[float, ...]:
    from opacus.accountants import RDPAccountant

    return tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS)


def epsilon_of(events: Iterable[PrivacyEvent], delta: float) -> float:
    """The epsilon at ``delta`` of every event composed (0 for none), as Opacus's RDP accountant
    computes it: RDP is additive over steps and events, so the steps of events at the same
    (sigma, q) are summed and each pair's per-step RDP is computed once (the accountant would
    recompute it for every round of the history, about 40 ms each).
    """
    steps: dict[tuple[float, float], int] = {}
    for e in events:
        if e.steps > 0:
            pair = (float(e.noise_multiplier), float(e.sample_rate))
            steps[pair] = steps.get(pair, 0) + int(e.steps)
    if not steps:
        return 0.0
    from opacus.accountants.analysis import rdp as analysis

    rdp = sum(np.asarray(_rdp_per_step(sigma, q)) * n for (sigma, q), n in steps.items())
    with warnings.catch_warnings():  # "optimal order is the largest alpha": a loose bound, still a bound
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = analysis.get_privacy_spent(orders=rdp_orders(), rdp=rdp, delta=delta)
    return float(eps)


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    from opacus.accountants.analysis import rdp as analysis

    return tuple(float(x) for x in analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                                                        orders=rdp_orders()))


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """The DP-SGD steps of one epoch: the batches of a plain loader; Poisson sampling keeps their number."""
    return max(1, math.ceil(num_examples / batch_size))


@functools.lru_cache(maxsize=1024)  # a hospital plans the same round every round: search once (about 0.5 s)
def calibrated_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest sigma (Opacus's binary search, tolerance 0.01) that spends at most ``target_epsilon``
    at ``delta`` in ``steps`` steps at rate ``sample_rate``.
    """
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=ACCOUNTANT))


def planned_event(num_examples: int, batch_size: int, epochs: int, *, noise_multiplier: float, target_epsilon: float,
                  delta: float, rounds: int) -> PrivacyEvent:
    """One round's DP-SGD at a hospital: its sampling rate and steps from its data size, and sigma
    (given, or calibrated so that ``rounds`` such rounds spend ``target_epsilon``).
    """
    per_epoch = steps_per_epoch(num_examples, batch_size)
    q = 1.0 / per_epoch
    steps = epochs * per_epoch
    sigma = noise_multiplier if noise_multiplier > 0 else calibrated_noise_multiplier(target_epsilon, delta, q,
                                                                                      steps * rounds)
    return PrivacyEvent(float(sigma), q, steps)


# ---- models ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def model_problem(model: str, image_size: int) -> str:
    """Why Opacus cannot compute per-sample gradients of registry model ``model`` ('' when it can)."""
    from opacus.validators import ModuleValidator

    from hospitrust.models import build_model

    errors = ModuleValidator.validate(build_model(model, 1, 2, image_size).train(), strict=False)
    if not errors:
        return ""
    kinds = sorted({type(e).__name__ for e in errors})
    first = str(errors[0]).splitlines()[0][:200]
    hint = " (use model 'resnet18-gn': ResNet-18 with GroupNorm, made by Opacus's ModuleValidator.fix)" if model == "resnet18" else ""
    return f"Opacus cannot train it with per-sample gradients: {len(errors)} module(s) fail its validator ({', '.join(kinds)}: {first}){hint}"


def check_model(model: nn.Module) -> None:
    """ValueError when Opacus cannot compute per-sample gradients of ``model``."""
    from opacus.validators import ModuleValidator

    was_training = model.training
    errors = ModuleValidator.validate(model.train(), strict=False)
    model.train(was_training)
    if errors:
        raise ValueError(f"model {type(model).__name__}: Opacus cannot train it with per-sample gradients: {errors[0]}")


# ---- training --------------------------------------------------------------------------------
class _Examples(torch.utils.data.Dataset):
    """Example i: its uint8 (H, W, C) image and its label (Opacus's Poisson loader samples examples)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, np.asarray(labels).astype(np.int64)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(np.ascontiguousarray(self.images[i])), torch.tensor(self.labels[i])


class _PoissonBatches:
    """DP-SGD's batches: Opacus's Poisson-sampling loader, as uint8 (B, C, H, W) and labels on ``device``."""

    def __init__(self, loader, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def epoch(self):
        for raw, y in self.loader:
            yield raw.to(self.device).permute(0, 3, 1, 2), y.to(self.device)


@dataclass
class PrivateTrainResult:
    """What a DP-SGD round did: the loss, its privacy event, and the batch size of every step it took."""

    loss: float
    num_examples: int
    event: PrivacyEvent
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.batch_sizes)


def train_private(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    event: PrivacyEvent,
    epochs: int,
    batch_size: int,
    max_grad_norm: float,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    device: torch.device | None = None,
    class_weights: torch.Tensor | None = None,
    missing_class_scale: float = 1.0,
    augment=None,
    poisson_sampling: bool = True,
) -> PrivateTrainResult:
    """DP-SGD with Opacus at the planned ``event``'s noise multiplier (its rate and steps follow from
    the data size and ``batch_size``, as :func:`planned_event` computed them).

    ``poisson_sampling=False`` keeps the plain shuffled loader: the accountant then assumes a
    sampling that did not happen (only tests use it, to show the check catches it).
    """
    from opacus import PrivacyEngine

    from hospitrust.models.batched import current_session, note_not_batched
    from hospitrust.models.loop import CrossEntropyStep, restricted_softmax_scale, run_loop
    from hospitrust.models.training import make_optimizer, pick_device

    if current_session() is not None:
        note_not_batched("local DP-SGD (privacy.local) clips and noises each example's gradient with Opacus")
    device = device or pick_device()
    n = int(labels.shape[0])
    for module in model.modules():  # Opacus's backward hooks cannot see through an in-place activation
        if isinstance(module, nn.ReLU):
            module.inplace = False
    model.to(device).train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], optimizer, learning_rate, momentum,
                         weight_decay)
    loader = torch.utils.data.DataLoader(_Examples(images, labels), batch_size=batch_size, shuffle=True)
    with warnings.catch_warnings():  # "secure RNG turned off": see docs/privacy.md (secure mode)
        warnings.simplefilter("ignore", UserWarning)
        engine = PrivacyEngine(accountant=ACCOUNTANT)
    dp_model, dp_opt, dp_loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                                      noise_multiplier=event.noise_multiplier,
                                                      max_grad_norm=max_grad_norm, poisson_sampling=poisson_sampling)
    weight = None if class_weights is None else torch.as_tensor(class_weights, dtype=torch.float32).to(device)
    loss = CrossEntropyStep(weight=weight, logit_scale=restricted_softmax_scale(model, labels, missing_class_scale, device))
    sizes: list[int] = []
    try:  # the one training loop, with Opacus's Poisson batches and its optimizer (clip each example's
        # gradient, add noise, step; the accountant counts every step)
        done = run_loop(dp_model, dp_opt, _PoissonBatches(dp_loader, device), loss, epochs=epochs, augment=augment,
                        on_batch=lambda _raw, y: sizes.append(int(y.shape[0])))
    finally:
        if hasattr(dp_model, "_close"):
            dp_model._close()  # Opacus's hooks off the caller's model
    history = engine.accountant.history
    if len(history) != 1 or history[0][0] != event.noise_multiplier or not math.isclose(history[0][1], event.sample_rate):
        raise RuntimeError(f"Opacus's accountant recorded {history}, not the planned {event}")
    taken = PrivacyEvent(event.noise_multiplier, float(history[0][1]), int(history[0][2]))
    return PrivateTrainResult(done.totals.get("loss", 0.0) / max(done.seen, 1), n, taken, sizes)


__all__ = ["ACCOUNTANT", "ACCOUNTANT_DESCRIPTION", "PrivacyEvent", "PrivateTrainResult", "calibrated_noise_multiplier",
           "check_model", "epsilon_of", "model_problem", "planned_event", "rdp_orders", "steps_per_epoch", "train_private"]

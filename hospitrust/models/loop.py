"""One local training loop; what differs between the hospitals' trainings are its steps.

Every local training in hospitrust has one shape: for each epoch, for each batch of uint8
images and their labels, augment the images, scale them to [-1, 1], compute the loss, step
the optimizer. The steps that differ are pluggable:

- the **data** steps (:data:`DataStep`): applied once to the training arrays before the loop
  (a simulated data attacker's poisoning: ``hospitrust.attacks.interfaces.DataAttack.data_step``);
- the **batches** (:class:`BatchSource`): today's shuffled minibatches (:class:`ShuffledBatches`)
  or DP-SGD's Poisson-sampled loader (``hospitrust.privacy.local``);
- the **loss** (:class:`LossStep`): cross-entropy with class weights, FedRS's restricted softmax
  and FedProx's proximal term (:class:`CrossEntropyStep`), or FED-FBD's cross-entropy plus KL
  to a sibling color (``hospitrust.fbd.training.SiblingLossStep``);
- the **optimizer**: a torch optimizer, or Opacus's DP optimizer (per-example clipping and noise).

:func:`run_loop` runs them. The batched path for simulated hospitals
(``hospitrust.models.batched``) runs the same steps for many hospitals at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

#: (images, labels) -> (images, labels): applied to a hospital's training arrays before the loop
DataStep = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def apply_data_steps(steps: Iterable[DataStep], images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The training arrays after every data step, in order."""
    for step in steps:
        images, labels = step(images, labels)
    return images, labels


#: DataLoader workers that gather batches for a GPU (pinned memory); on the CPU batches are
#: gathered inline: the images are decoded uint8 arrays already (a hospital's cache), not files.
GPU_LOADER_WORKERS = 2


class _IndexedBatches(torch.utils.data.Dataset):
    """Batch i of a fixed order: uint8 (B, H, W, C) gathered from (possibly memory-mapped) images."""

    def __init__(self, images: np.ndarray, batches: list[np.ndarray]) -> None:
        self.images, self.batches = images, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.images[self.batches[i]]))


def uint8_batches(images: np.ndarray, batches: list[np.ndarray], device: torch.device):
    """Yield each batch as uint8 (B, C, H, W) on ``device``: inline on the CPU, through a
    DataLoader with workers and pinned memory on a GPU, so gathering overlaps the GPU's work.
    """
    if device.type != "cuda" or len(batches) < 4:
        for idx in batches:
            yield torch.from_numpy(np.ascontiguousarray(images[idx])).to(device).permute(0, 3, 1, 2)
        return
    loader = torch.utils.data.DataLoader(_IndexedBatches(images, batches), batch_size=None, shuffle=False,
                                         num_workers=GPU_LOADER_WORKERS, pin_memory=True)
    for batch in loader:
        yield batch.to(device, non_blocking=True).permute(0, 3, 1, 2)


@dataclass
class TrainResult:
    loss: float
    num_examples: int
    steps: int



class BatchSource(Protocol):
    """Where an epoch's batches come from."""

    def epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch's batches: uint8 ``(B, C, H, W)`` images and int64 ``(B,)`` labels, on the device."""
        ...


class LossStep(Protocol):
    """A batch's loss terms: ``"loss"`` (what is minimized) first, then any term reported alongside."""

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        ...


def scale(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N, C, H, W) on its device -> float in [-1, 1] (the arithmetic of ``training.to_batch``)."""
    return x.float().div_(127.5).sub_(1.0)


class ShuffledBatches:
    """Today's minibatches: a fresh permutation per epoch (``torch.randperm`` from ``generator``, or
    torch's global generator), cut into batches of ``batch_size`` (the last one may be smaller).
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, device: torch.device,
                 generator: torch.Generator | None = None) -> None:
        self.images, self.batch_size, self.device, self.generator = images, int(batch_size), device, generator
        self.labels = torch.from_numpy(np.asarray(labels).reshape(-1)).long().to(device)
        self.n = int(self.labels.shape[0])

    def order(self) -> list[torch.Tensor]:
        """One epoch's batches of example indices (draws the permutation)."""
        order = torch.randperm(self.n, generator=self.generator)
        return [order[start : start + self.batch_size] for start in range(0, self.n, self.batch_size)]

    def epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.order()
        for idx, raw in zip(batches, uint8_batches(self.images, [b.numpy() for b in batches], self.device)):
            yield raw, self.labels[idx.to(self.device)]


def restricted_softmax_scale(model: nn.Module, labels: np.ndarray, missing_class_scale: float,
                             device: torch.device) -> torch.Tensor | None:
    """FedRS: per class, 1 for the classes in ``labels`` and ``missing_class_scale`` for the others
    (None when the scale is 1: plain softmax).
    """
    if not 0.0 <= missing_class_scale <= 1.0:
        raise ValueError(f"missing_class_scale (train.fedrs-alpha) must be in [0, 1], got {missing_class_scale}")
    if missing_class_scale >= 1.0:
        return None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("train.fedrs-alpha < 1 needs a model whose last layer is linear (its classes' logits)")
    out_dim = int(linears[-1].out_features)
    y = torch.from_numpy(np.asarray(labels).reshape(-1)).long().to(device)
    present = torch.bincount(y, minlength=out_dim)[:out_dim] > 0
    return torch.where(present, 1.0, float(missing_class_scale)).to(device)


@dataclass
class CrossEntropyStep:
    """Cross-entropy, weighted per class (``weight``: PyTorch's weighted mean), on logits multiplied
    by ``logit_scale`` (FedRS), plus FedProx's ``(mu / 2) ||w - w_global||^2`` when ``proximal_mu > 0``
    (``params`` and ``global_params``: the trained parameters and their values at the start).
    """

    weight: torch.Tensor | None = None
    logit_scale: torch.Tensor | None = None
    proximal_mu: float = 0.0
    params: Sequence[torch.Tensor] = field(default_factory=list)
    global_params: Sequence[torch.Tensor] | None = None

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = model(x)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        loss = F.cross_entropy(logits, y, weight=self.weight)
        if self.global_params is not None:
            prox = sum(((p - g) ** 2).sum() for p, g in zip(self.params, self.global_params))
            loss = loss + 0.5 * self.proximal_mu * prox
        return {"loss": loss}


@dataclass
class LoopResult:
    """Each loss term summed over the examples seen (term x batch size), the examples seen, the steps."""

    totals: dict[str, float]
    seen: int
    steps: int

    def mean(self, term: str = "loss") -> float:
        """A term's mean over the examples seen (NaN when none were)."""
        return self.totals.get(term, float("nan")) / self.seen if self.seen else float("nan")


def run_loop(model: nn.Module, optimizer: torch.optim.Optimizer, batches: BatchSource, loss: LossStep, *,
             epochs: int, augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
             on_batch: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> LoopResult:
    """The local training loop: ``epochs`` passes over ``batches``; each batch augmented (``augment``,
    per image: ``hospitrust.models.augment``), scaled to [-1, 1], its ``loss`` minimized by one
    ``optimizer`` step. ``on_batch(images, labels)`` sees every batch as drawn (DP-SGD records its sizes).
    """
    totals: dict[str, float] = {}
    seen = steps = 0
    for _ in range(epochs):
        for raw, y in batches.epoch():
            if on_batch is not None:
                on_batch(raw, y)
            if augment is not None and raw.shape[0]:
                from hospitrust.models.augment import augment_batch

                raw = augment_batch(raw, augment)
            x = scale(raw)
            optimizer.zero_grad(set_to_none=True)
            terms = loss(model, x, y)
            terms["loss"].backward()
            optimizer.step()
            b = int(y.shape[0])
            for name, value in terms.items():
                totals[name] = totals.get(name, 0.0) + float(value.detach()) * b
            seen += b
            steps += 1
    return LoopResult(totals, seen, steps)


__all__ = ["BatchSource", "CrossEntropyStep", "DataStep", "LoopResult", "LossStep", "ShuffledBatches", "TrainResult",
           "apply_data_steps", "restricted_softmax_scale", "run_loop", "scale", "uint8_batches"]

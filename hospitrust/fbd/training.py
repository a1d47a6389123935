"""A hospital's local step in FED-FBD: cross-entropy plus lambda x KL to a sibling color.

    loss = CE(student(x), y) + lambda * KL(softmax(teacher(x)) || softmax(student(x)))

The teacher is another of the hospital's colors (different parameters), frozen and in
eval mode; pulling toward its predictions keeps colors from drifting apart while their
parameters stay distinct (diversity without collapse). lambda = 0 is plain local training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from hospitrust.models.loop import ShuffledBatches, run_loop
from hospitrust.models.training import make_optimizer, pick_device


@dataclass
class SiblingTrainResult:
    """What a hospital's FED-FBD local step reports (losses averaged over the samples seen).

    Parameters
    ----------
    loss : float
        Mean total loss (CE + lambda x KL); NaN with no data.
    cross_entropy : float
        Mean cross-entropy.
    kl : float
        Mean KL to the sibling color (0 without one, or with lambda = 0).
    num_examples : int
        The training examples.
    steps : int
        Optimizer steps taken.
    """

    loss: float
    cross_entropy: float
    kl: float
    num_examples: int
    steps: int


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, labels: torch.Tensor,
                      lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, ce, kl) for one batch; kl is KL(teacher || student), averaged over the batch.

    Parameters
    ----------
    student_logits : torch.Tensor
        ``(B, C)`` logits of the color being trained.
    teacher_logits : torch.Tensor or None
        ``(B, C)`` logits of the frozen sibling color; None: no KL term.
    labels : torch.Tensor
        ``(B,)`` int64 labels.
    lam : float
        lambda, the weight of the KL term.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        Scalar total loss, cross-entropy and KL (0 without a teacher or with lambda = 0).
    """
    ce = F.cross_entropy(student_logits, labels)
    if teacher_logits is None or lam == 0.0:
        zero = ce.new_zeros(())
        return ce, ce, zero
    kl = F.kl_div(F.log_softmax(student_logits, dim=1), F.log_softmax(teacher_logits, dim=1), log_target=True,
                  reduction="batchmean")
    return ce + lam * kl, ce, kl


class SiblingLossStep:
    """FED-FBD's loss step of the training loop: cross-entropy plus lambda x KL to the frozen ``teacher``
    (its logits without gradients; none without a teacher or with lambda = 0).

    Parameters
    ----------
    teacher : nn.Module or None
        The frozen sibling model whose logits the student is pulled towards; None for plain cross-entropy.
    lam : float
        lambda, the weight of the KL term (0 turns it off).
    """

    def __init__(self, teacher: nn.Module | None, lam: float) -> None:
        self.teacher, self.lam = teacher, lam

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        teacher_logits = None
        if self.teacher is not None and self.lam > 0:
            with torch.no_grad():
                teacher_logits = self.teacher(x)
        loss, ce, kl = distillation_loss(model(x), teacher_logits, y, self.lam)
        return {"loss": loss, "cross_entropy": ce, "kl": kl}


def train_with_sibling(
    student: nn.Module,
    teacher: nn.Module | None,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    lam: float,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    device: torch.device | None = None,
) -> SiblingTrainResult:
    """Train ``student`` on the hospital's data with cross-entropy plus lambda x KL to ``teacher``.

    Parameters
    ----------
    student : torch.nn.Module
        The color the hospital writes this round (trained in place).
    teacher : torch.nn.Module or None
        Its sibling color (frozen, eval mode); None: plain local training.
    images : numpy.ndarray
        uint8 ``(N, H, W, C)`` training images.
    labels : numpy.ndarray
        ``(N,)`` their labels.
    lam : float
        lambda >= 0, the weight of the KL term.
    epochs : int
        Local epochs.
    batch_size : int
        Minibatch size.
    learning_rate : float
        The optimizer's learning rate.
    optimizer : str
        The optimizer's name (``make_optimizer``: ``"sgd"`` or ``"adam"``).
    momentum : float
        SGD momentum.
    weight_decay : float
        Weight decay.
    device : torch.device or None
        Where to train; None: :func:`pick_device`.

    Returns
    -------
    SiblingTrainResult
        The mean losses, the example count and the steps.
    """
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    from hospitrust.models.batched import current_session, note_not_batched

    if current_session() is not None:
        note_not_batched("FED-FBD trains each hospital's color blocks with its own sibling loss")
    device = device or pick_device()
    student.to(device).train()
    if teacher is not None:
        teacher.to(device).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    n = int(labels.shape[0])
    if n == 0:
        return SiblingTrainResult(float("nan"), float("nan"), float("nan"), 0, 0)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = make_optimizer(params, optimizer, learning_rate, momentum, weight_decay)
    done = run_loop(student, opt, ShuffledBatches(images, labels, batch_size, device), SiblingLossStep(teacher, lam),
                    epochs=epochs)
    seen = max(done.seen, 1)
    return SiblingTrainResult(done.totals["loss"] / seen, done.totals["cross_entropy"] / seen, done.totals["kl"] / seen,
                              n, done.steps)

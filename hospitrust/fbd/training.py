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

from hospitrust.models.training import make_optimizer, pick_device, to_batch


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
    y_all = torch.from_numpy(np.asarray(labels).reshape(-1)).long().to(device)
    tot = ce_tot = kl_tot = 0.0
    seen = steps = 0
    for _ in range(epochs):
        order = torch.randperm(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            x = to_batch(images[idx.numpy()], device)
            y = y_all[idx.to(device)]
            teacher_logits = None
            if teacher is not None and lam > 0:
                with torch.no_grad():
                    teacher_logits = teacher(x)
            loss, ce, kl = distillation_loss(student(x), teacher_logits, y, lam)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            b = int(y.shape[0])
            tot += float(loss.detach()) * b
            ce_tot += float(ce.detach()) * b
            kl_tot += float(kl.detach()) * b
            seen += b
            steps += 1
    seen = max(seen, 1)
    return SiblingTrainResult(tot / seen, ce_tot / seen, kl_tot / seen, n, steps)

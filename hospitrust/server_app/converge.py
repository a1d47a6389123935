"""A fresh model trained to convergence on one set of images, exactly as the leaderboard's converged controls
train it (``hospitrust.bench.controls``) and as sentinel's floor trains the server's own model: the run's
initial model (the task's model drawn after seeding with the run's seed), the hospitals' recipe (optimizer,
class weights, the task's augmentation), ``epochs`` epochs at ``learning_rate``, the batches' order seeded
per run and per trained set (``salt``). One function for both, so the floor is the control's model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

#: the salt of the server's reference cohort (the ``cohort-only-converged`` control and sentinel's floor)
COHORT_SALT = 10_000_019


class EpochTrainer:
    """The hospitals' training loop (:func:`hospitrust.models.loop.run_loop`) one epoch at a time, with
    one optimizer and one stream of shuffled batches throughout, so a model can be evaluated after each
    epoch and still be trained exactly as ``train(..., epochs=E)`` trains it.
    """

    def __init__(self, model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, *, cfg, learning_rate: float,
                 num_classes: int, augment, device: torch.device) -> None:
        from hospitrust.models.loop import CrossEntropyStep, ShuffledBatches, restricted_softmax_scale
        from hospitrust.models.training import balanced_class_weights, make_optimizer

        local = cfg.train
        self.model, self.augment = model.to(device), augment
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, local.optimizer, learning_rate, local.momentum, local.weight_decay)
        weight = balanced_class_weights(labels, num_classes).to(device) if local.class_weighted_loss else None
        self.loss = CrossEntropyStep(weight=weight, logit_scale=restricted_softmax_scale(model, labels, local.fedrs_alpha,
                                                                                         device))
        self.batches = ShuffledBatches(images, labels, cfg.batch_size, device)

    def epoch(self) -> None:
        from hospitrust.models.loop import run_loop

        self.model.train()
        run_loop(self.model, self.optimizer, self.batches, self.loss, epochs=1, augment=self.augment)


def fresh_model(cfg, task) -> torch.nn.Module:
    """The run's initial global model: the task's model drawn after seeding with the run's seed."""
    from hospitrust.models.training import seed_everything
    from hospitrust.tasks.model import task_model

    seed_everything(cfg.seed)
    return task_model(task)


def converge(cfg, task, images: np.ndarray, labels: np.ndarray, *, epochs: int, learning_rate: float, salt: int,
             device: torch.device, evaluate: Callable[[torch.nn.Module], dict[str, Any]] | None = None,
             ) -> tuple[torch.nn.Module, list[dict[str, Any]]]:
    """A fresh model trained ``epochs`` epochs on (images, labels); ``evaluate`` after each epoch (its reports).

    Parameters
    ----------
    cfg : RunConfig
        The run config (seed, batch size, the hospitals' training options).
    task : Task
        The run's task (model, classes, augmentation).
    images, labels : np.ndarray
        The training set.
    epochs : int
        Epochs to train.
    learning_rate : float
        The optimizer's learning rate.
    salt : int
        Seeds the batches' order with the run's seed (one per trained set).
    device : torch.device
        Where to train.
    evaluate : callable or None
        Called with the model after each epoch; its reports are returned.

    Returns
    -------
    tuple[torch.nn.Module, list[dict[str, Any]]]
        The trained model and the per-epoch reports (empty without ``evaluate``).
    """
    from hospitrust.models.augment import task_augmentation
    from hospitrust.models.training import seed_everything

    model = fresh_model(cfg, task)
    seed_everything(cfg.seed, 20_000_003, salt)  # the batches' order: per run seed and per trained set
    trainer = EpochTrainer(model, images, labels, cfg=cfg, learning_rate=learning_rate, num_classes=task.num_classes,
                           augment=task_augmentation(task.augmentation, task.image_size), device=device)
    history = []
    for _ in range(epochs):
        trainer.epoch()
        if evaluate is not None:
            history.append(evaluate(model))
    return model, history


__all__ = ["COHORT_SALT", "EpochTrainer", "converge", "fresh_model"]

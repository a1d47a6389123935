"""What the server offers the rules: central evaluation on its test split, and its reference
cohort as a trainer (FLTrust's root update) and as a judge (HTA's v, FedAgain's server
benchmark, EARN's audit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common import log

from hospitrust import metrics
from hospitrust.aggregation import flatten_state, unflatten_state
from hospitrust.aggregation.sentinel import balanced_cross_entropy
from hospitrust.attacks.data_attacks import Backdoor, LabelFlip
from hospitrust.attacks.metrics import backdoor_success_rate, targeted_flip_success
from hospitrust.config import RunConfig
from hospitrust.datasets.federation import LabelledImages
from hospitrust.datasets.server import ServerSets
from hospitrust.tasks.model import task_model
from hospitrust.tasks.task import Task
from hospitrust.models.training import balanced_class_weights, predict_proba, seed_everything, to_batch, train
from hospitrust.strategies import HospitrustStrategy, build_strategy, strategy_class
from hospitrust.strategies.registry import preset_of
from hospitrust.strategies.base import SERVICES
from hospitrust.strategies.validation import ReplyLimits


class CentralEvaluator:
    """The global model on the server's test split: the clinical metrics and, under a
    backdoor or a targeted label flip, the attack success rate.
    """

    def __init__(self, cfg: RunConfig, info: Task, device: torch.device, test: LabelledImages, attack=None) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.test = test
        self.model = task_model(info)
        inner = getattr(attack, "attack", attack)  # unwrap a schedule
        self.backdoor = inner if isinstance(inner, Backdoor) else None
        self.targeted_flip = inner if isinstance(inner, LabelFlip) and inner.mode == "source-to-target" else None
        self.triggered = self.backdoor.trigger(self.test.images) if self.backdoor is not None else None
        self.rare_classes: list[int] = []  # set from the federation's class counts

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        self.model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
        probs = predict_proba(self.model, self.test.images, device=self.device)
        report = metrics.classification_report(self.test.labels, probs, self.info.num_classes)
        if self.rare_classes:
            report["rare_class_macro_f1"] = metrics.rare_class_macro_f1(self.test.labels, probs.argmax(axis=1),
                                                                        self.rare_classes)
        if self.backdoor is not None:
            assert self.triggered is not None  # made with the backdoor
            pred = predict_proba(self.model, self.triggered, device=self.device).argmax(axis=1)
            report["attack_success_rate"] = backdoor_success_rate(pred, self.test.labels, self.backdoor.target)
        elif self.targeted_flip is not None:
            report["attack_success_rate"] = targeted_flip_success(
                probs.argmax(axis=1), self.test.labels, self.targeted_flip.source, self.targeted_flip.target
            )
        return report


class ReferenceCohortTrainer:
    """FLTrust's root update: the global model trained one local epoch on the server's
    reference cohort, with the hospitals' optimizer settings.
    """

    def __init__(self, cfg: RunConfig, info: Task, device: torch.device, cohort: LabelledImages, epochs: int = 1) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.cohort = cohort
        self.model = task_model(info)
        self.epochs = epochs
        #: the root update's optimizer steps (epochs of minibatches; anchored trust bounds a step by it)
        self.local_steps = epochs * -(-len(cohort.labels) // cfg.batch_size)

    def __call__(self, global_state: dict[str, torch.Tensor], server_round: int) -> torch.Tensor:
        seed_everything(self.cfg.seed, 10_000_019, server_round)
        self.model.load_state_dict(global_state, strict=True)
        local = self.cfg.train
        train(self.model, self.cohort.images, self.cohort.labels, epochs=self.epochs, batch_size=self.cfg.batch_size,
              learning_rate=self.cfg.learning_rate, optimizer=local.optimizer, momentum=local.momentum,
              weight_decay=local.weight_decay, device=self.device,
              class_weights=(balanced_class_weights(self.cohort.labels, self.info.num_classes)
                             if local.class_weighted_loss else None))
        trained = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return flatten_state(trained)[0] - flatten_state(global_state)[0]


class ReferenceCohortJudge:
    """The server's reference cohort as a judge of hospitals' updates (HTA's v, FedAgain's
    server benchmark, EARN's row audit): balanced accuracy of candidate models
    (global + u_h), and the global model's inputs to its last linear layer.
    """

    def __init__(self, cfg: RunConfig, info: Task, device: torch.device, cohort: LabelledImages) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.cohort = cohort
        self.model = task_model(info)
        self.head = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear)][-1]

    def score_candidates(self, global_state: dict[str, torch.Tensor], updates: torch.Tensor) -> torch.Tensor:
        """(n,) balanced accuracy on the reference cohort of each candidate global + updates[i]."""
        _, cands, labels = self.candidate_logits(global_state, updates)
        return torch.tensor([metrics.balanced_accuracy(labels.numpy(), c.argmax(dim=1).numpy()) for c in cands],
                            dtype=torch.float64)

    __call__ = score_candidates

    def candidate_losses(self, global_state: dict[str, torch.Tensor], steps: torch.Tensor) -> torch.Tensor:
        """(k,) class-balanced cross-entropy on the cohort of each candidate global + steps[i]."""
        _, cands, labels = self.candidate_logits(global_state, steps)
        return torch.tensor([balanced_cross_entropy(c, labels) for c in cands], dtype=torch.float64)

    @torch.no_grad()
    def candidate_logits(self, global_state: dict[str, torch.Tensor], updates: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits on the cohort of the global model ((m, C)) and of each candidate global +
        updates[i] ((n, m, C)), and the labels ((m,)).
        """
        global_vec, spec = flatten_state(global_state)
        batch = to_batch(self.cohort.images, self.device)  # the cohort is small: one batch

        def logits(state) -> torch.Tensor:
            self.model.load_state_dict(state, strict=True)
            self.model.to(self.device).eval()
            return self.model(batch).double().cpu()

        base = logits(global_state)
        cands = torch.stack([logits(unflatten_state(global_vec + u.detach().cpu().to(global_vec.dtype), spec, global_state))
                             for u in updates])
        return base, cands, torch.as_tensor(np.asarray(self.cohort.labels).reshape(-1), dtype=torch.long)

    @torch.no_grad()
    def head_features(self, global_state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The global model's inputs to its last linear layer on the cohort ((m, H)), and the labels ((m,))."""
        self.model.load_state_dict(global_state, strict=True)
        seen: list[torch.Tensor] = []
        hook = self.head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach().float().cpu()))
        try:
            predict_proba(self.model, self.cohort.images, device=self.device)
        finally:
            hook.remove()
        return torch.cat(seen), torch.as_tensor(np.asarray(self.cohort.labels).reshape(-1), dtype=torch.long)


def cohort_parts(cohort: LabelledImages, check_fraction: float, seed: int) -> tuple[LabelledImages, LabelledImages]:
    """The cohort split per class into a part to train on and a part to check on (disjoint, seeded):
    round(fraction x the class's images) of each class to the check part, and at least one image of a
    class to each part where the class has two or more. ``check_fraction = 0``: both parts are the whole
    cohort (the check sees the images the server trains on).
    """
    if not 0.0 <= check_fraction < 1.0:
        raise ValueError(f"check fraction must be in [0, 1), got {check_fraction}")
    if check_fraction == 0.0:
        return cohort, cohort
    labels = np.asarray(cohort.labels).reshape(-1)
    rng = np.random.default_rng([seed, 60_060])
    check: list[int] = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(check_fraction * len(idx)))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        check += idx[:k].tolist()
    held = np.zeros(len(labels), dtype=bool)
    held[check] = True
    return (LabelledImages(cohort.images[~held], cohort.labels[~held]),
            LabelledImages(cohort.images[held], cohort.labels[held]))


class CohortFloor:
    """The server's own model as a floor (sentinel's ``floor = "cohort-model"``): the model the
    ``cohort-only-converged`` control trains (the whole cohort, ``epochs`` epochs at ``learning_rate``,
    :func:`~hospitrust.server_app.converge.converge`), the same recipe on the cohort's training part
    alone (the model a check on the held-out part can compare fairly), and that check's loss.
    Both are trained on first use, with the process's random state put back after.
    """

    shared_between_copies = True  # an aware attacker's private copies of the rule share the trained models

    def __init__(self, cfg: RunConfig, info: Task, device: torch.device, cohort: LabelledImages, check_fraction: float,
                 epochs: int, learning_rate: float) -> None:
        self.cfg, self.info, self.device, self.cohort = cfg, info, device, cohort
        self.check_fraction, self.epochs, self.learning_rate = check_fraction, epochs, learning_rate
        self.train_part, check_part = cohort_parts(cohort, check_fraction, cfg.seed)
        self.judge = ReferenceCohortJudge(cfg, info, device, check_part)
        self._models: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None

    def _trained(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        if self._models is None:
            import random

            from hospitrust.server_app.converge import COHORT_SALT, converge

            saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
            try:
                states = []
                for images, labels, salt in ((self.cohort.images, self.cohort.labels, COHORT_SALT),
                                             (self.train_part.images, self.train_part.labels, COHORT_SALT + 1)):
                    model, _ = converge(self.cfg, self.info, images, labels, epochs=self.epochs,
                                        learning_rate=self.learning_rate, salt=salt, device=self.device)
                    states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
            finally:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
                torch.set_rng_state(saved[2])
            self._models = states[0], states[1]
            log(INFO, "sentinel's floor: the server's own model trained %d epochs at lr %g on the reference cohort "
                "(%d images) and on its training part (%d)", self.epochs, self.learning_rate, len(self.cohort.labels),
                len(self.train_part.labels))
        return self._models

    @property
    def whole(self) -> dict[str, torch.Tensor]:
        """The model trained on the whole cohort: the ``cohort-only-converged`` control's."""
        return self._trained()[0]

    @property
    def part(self) -> dict[str, torch.Tensor]:
        """The model trained on the cohort's training part, never on the check part."""
        return self._trained()[1]

    def check_loss(self, state: dict[str, torch.Tensor]) -> float:
        """The check part's class-balanced cross-entropy of the model ``state``."""
        d = flatten_state(state)[0].numel()
        return float(self.judge.candidate_losses(state, torch.zeros(1, d, dtype=torch.float64))[0])

    def check_balanced_accuracy(self, state: dict[str, torch.Tensor]) -> float:
        """The check part's balanced accuracy of the model ``state`` (the outcome the tables measure)."""
        d = flatten_state(state)[0].numel()
        return float(self.judge.score_candidates(state, torch.zeros(1, d, dtype=torch.float64))[0])


class ServerServices(Mapping[str, Callable[..., Any]]):
    """What this server offers the rules (``hospitrust.strategies.base.SERVICES``), each built
    on first use: the reference cohort is loaded once, and only for a rule that needs it.
    """

    def __init__(self, cfg: RunConfig, info: Task, device: torch.device, sets: ServerSets) -> None:
        self.cfg, self.info, self.device, self.sets = cfg, info, device, sets
        self._judge: ReferenceCohortJudge | None = None
        self._trainer: ReferenceCohortTrainer | None = None
        self._splits: dict[tuple[float, int], tuple[ReferenceCohortTrainer, Callable[..., torch.Tensor]]] = {}

    def _cohort_judge(self) -> ReferenceCohortJudge:
        if self._judge is None:
            assert self.sets.cohort is not None  # __getitem__ offers nothing without one
            self._judge = ReferenceCohortJudge(self.cfg, self.info, self.device, self.sets.cohort)
        return self._judge

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if self.sets.cohort is None:  # every service judges or trains on the cohort
            raise KeyError(name)
        if name == "candidate_scores":
            return self._cohort_judge().score_candidates
        if name == "head_features":
            return self._cohort_judge().head_features
        if name == "candidate_logits":
            return self._cohort_judge().candidate_logits
        if name == "candidate_losses":
            return self._cohort_judge().candidate_losses
        if name == "cohort_split":
            return self._cohort_split
        if name == "cohort_floor":
            return self._cohort_floor
        if name == "server_update":
            if self._trainer is None:
                self._trainer = ReferenceCohortTrainer(self.cfg, self.info, self.device, self.sets.cohort)
            return self._trainer
        raise KeyError(name)

    def _cohort_split(self, check_fraction: float, epochs: int = 1) -> tuple[ReferenceCohortTrainer, Callable[..., torch.Tensor]]:
        """(the root update on the cohort's training part, trained ``epochs`` epochs; the candidate losses on its
        check part).
        """
        if (check_fraction, epochs) not in self._splits:
            assert self.sets.cohort is not None
            train_part, check_part = cohort_parts(self.sets.cohort, check_fraction, self.cfg.seed)
            log(INFO, "reference cohort split for the rule: %d images to train on, %d held out to check on%s",
                len(train_part.labels), len(check_part.labels),
                " (the same images: check fraction 0)" if check_fraction == 0 else "")
            self._splits[(check_fraction, epochs)] = (
                ReferenceCohortTrainer(self.cfg, self.info, self.device, train_part, epochs=epochs),
                ReferenceCohortJudge(self.cfg, self.info, self.device, check_part).candidate_losses)
        return self._splits[(check_fraction, epochs)]

    def _cohort_floor(self, check_fraction: float, epochs: int, learning_rate: float) -> CohortFloor:
        """The server's own model as a floor: trained on the whole cohort and on its training part (first use)."""
        assert self.sets.cohort is not None
        return CohortFloor(self.cfg, self.info, self.device, self.sets.cohort, check_fraction, epochs, learning_rate)

    def __iter__(self) -> Iterator[str]:
        return iter(SERVICES if self.sets.cohort is not None else ())

    def __len__(self) -> int:
        return len(SERVICES) if self.sets.cohort is not None else 0


def _round_bound_not_applied(cfg: RunConfig, cls: type) -> list[str]:
    """Why this run's rounds cannot apply ``round-norm-bound.over-median`` (none: they do)."""
    from hospitrust.features.secagg_options import SecAggOptions
    from hospitrust.privacy.options import PrivacyOptions

    why = []
    if getattr(cls, "name", "") == "fbd":
        why.append("FED-FBD's replies are blocks, checked one by one")
    if cfg.section(SecAggOptions).enabled:
        why.append("under secure aggregation the server sees no single update")
    if cfg.section(PrivacyOptions).central:
        why.append("under central DP which replies enter must not depend on the other hospitals' norms")
    return why


def strategy_from_config(cfg: RunConfig, hospitals: Mapping[int, str], device: torch.device, task: Task,
                         sets: ServerSets, run_dir: Path | None = None, resuming: bool = False,
                         order: Sequence[str] | None = None,
                         train_values: Mapping[str, Any] | None = None) -> HospitrustStrategy:
    """The configured rule, built by the registry from its section and what it needs of the server.
    A rule's empty ``rare-classes`` option takes the task's rare classes, where the task names them.
    A preset is its rule with the run config's resolved options; the log says which values of the
    preset the run config overrode. What the rule's ``server_parts`` builds (FED-FBD's plan, in the
    hospitals' ``order``, and its warehouse, kept in ``run_dir``) is passed to its constructor.
    ``train_values``: further entries of every train message (the task).
    """
    train_config = {
        "local-epochs": cfg.local_epochs,
        "batch-size": cfg.batch_size,
        "learning-rate": cfg.learning_rate,
        **(train_values or {}),
    }
    cls = strategy_class(cfg.strategy)
    options = cfg.strategy_options
    preset = preset_of(cfg.strategy)
    if preset is not None:
        overrides = "; ".join(f"{preset.rule.name}.{k} = {now!r} instead of {was!r}" for k, (was, now) in
                              cfg.preset_overrides.items())
        log(WARNING if overrides else INFO, "Strategy %s: the preset of %s (%s)%s", cfg.strategy, preset.rule.name,
            ", ".join(f"{k} = {v!r}" for k, v in preset.values.items()), f"; overridden: {overrides}" if overrides else "")
    if task.rare_classes and "rare_classes" in type(options).model_fields and not getattr(options, "rare_classes"):
        options = options.model_copy(update={"rare_classes": ",".join(map(str, task.rare_classes))})
    strategy = build_strategy(
        cfg.strategy, hospitals, options=options,
        composed={name: cfg.options(name) for name in cls.composes(options)},
        services=ServerServices(cfg, task, device, sets),
        train_config=train_config, fraction_train=cfg.fraction_train, min_hospitals=cfg.min_hospitals,
        limits=ReplyLimits(max_update_norm=cfg.max_update_norm, max_num_examples=cfg.max_num_examples,
                           max_norm_over_median=cfg.round_norm_bound.over_median),
        seed=cfg.seed, device=device, assumed_malicious=cfg.assumed_malicious,
        # what the rule's server_parts builds at the start of a run (FED-FBD's plan and warehouse, kept in run_dir)
        **cls.server_parts(options, task=task, sets=sets, device=device, seed=cfg.seed, run_dir=run_dir, resuming=resuming,
                           hospitals=list(order) if order is not None else list(hospitals.values())),
    )
    if cfg.round_norm_bound.over_median:
        for why in _round_bound_not_applied(cfg, cls):
            log(WARNING, "round-norm-bound.over-median = %g is not applied in this run: %s; max-update-norm (%g) still "
                "bounds each reply", cfg.round_norm_bound.over_median, why, cfg.max_update_norm)
    if strategy.required_replies() > len(hospitals):
        log(WARNING, "%s with assumed-malicious %d needs %d valid replies per round but there are only %d "
            "hospitals: every round will keep the previous model", cfg.strategy, cfg.assumed_malicious,
            strategy.required_replies(), len(hospitals))
    return strategy

"""A hospital's local training step: poison its data if it is a simulated data attacker, train,
and report what the server needs (an update attacker's rewrite is a mod: ``client_app.attack``).
"""

from __future__ import annotations

from typing import cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hospitrust.attacks.threat_model import data_rng, hospital_attack
from hospitrust.client_app.context import HospitalContext, local_report
from hospitrust.privacy.options import PrivacyOptions
from hospitrust.datasets.federation import LabelledImages
from hospitrust.models.augment import task_augmentation
from hospitrust.models.loop import apply_data_steps
from hospitrust.models.training import TrainOptions, TrainResult, balanced_class_weights, class_weights_from_counts, pick_device, seed_everything, train


def loss_class_weights(options: TrainOptions, server_cfg: ConfigRecord, train_labels, num_classes: int) -> torch.Tensor | None:
    """The loss's class weights: none, the hospital's own 'balanced' weights, or, when the
    server sends the federation's class totals (train.class-weights-from = federation), from those.
    """
    if not options.class_weighted_loss:
        return None
    totals = server_cfg.get("federation-class-counts")
    if totals is None:
        return balanced_class_weights(train_labels, num_classes)
    return class_weights_from_counts(list(cast(list[int], totals)), num_classes)


def local_training_step(msg: Message, context: Context, hospital: HospitalContext) -> Message:
    """Train the global model in ``msg`` on this hospital's data; the reply carries the new
    model and its metrics (num-examples, train loss, FedAgain's benchmark error, class counts).
    """
    cfg, node, info, data = hospital.cfg, hospital.node, hospital.info, hospital.data
    # the server's train config (strategies.base.configure_train): numbers where read as numbers
    server_cfg = cast(ConfigRecord, msg.content["config"])
    server_round = int(cast(int, server_cfg.get("server-round", 0)))
    device = pick_device()
    seed_everything(cfg.seed, node.partition_id if node.partition_id is not None else 0, server_round)
    model = hospital.model_from(msg).to(device)
    attack = hospital_attack(cfg.threat_model, node)  # None unless this hospital is one of the run's attackers
    hospital.check_train_images(len(data.train))
    # the training loop's data steps (hospitrust.models.loop): a simulated data attacker's poisoning
    data_steps = [] if attack is None else attack.data_steps(server_round=server_round, rng=data_rng(cfg.seed, node),
                                                             num_classes=info.num_classes)
    train_images, train_labels = apply_data_steps(data_steps, data.train.images, data.train.labels)

    # FedAgain's benchmark error: the incoming global model's error on local validation,
    # measured before local training (reported by the hospital itself).
    val = data.val if len(data.val) else data.train
    before = local_report(model, val.images, val.labels, info.num_classes, device)

    epochs, batch_size = hospital.local_epochs(server_cfg), hospital.batch_size(server_cfg)  # the gate's, where it runs
    privacy_metrics: dict[str, float | int] = {}
    privacy = cfg.section(PrivacyOptions)
    if privacy.local:  # DP-SGD with Opacus, within the hospital's own budget
        from hospitrust.privacy.client import Refusal, commit_round, plan_round, refusal_reply, round_metrics
        from hospitrust.privacy.local import check_model, train_private

        check_model(model)
        plan = plan_round(context, hospital, privacy, num_examples=len(train_labels), batch_size=batch_size,
                          epochs=epochs, rounds=cfg.num_server_rounds)
        if isinstance(plan, Refusal):
            return refusal_reply(msg, plan, privacy, context)
        lifetime = commit_round(context, plan, privacy, hospital=node.hospital_name, server_round=server_round)
        private = train_private(
            model, train_images, train_labels, event=plan.event, epochs=epochs, batch_size=batch_size,
            max_grad_norm=privacy.max_grad_norm,
            learning_rate=float(cast(float, server_cfg.get("learning-rate", cfg.learning_rate))),
            optimizer=cfg.train.optimizer, momentum=cfg.train.momentum, weight_decay=cfg.train.weight_decay, device=device,
            class_weights=loss_class_weights(cfg.train, server_cfg, train_labels, info.num_classes),
            missing_class_scale=cfg.train.fedrs_alpha,
            augment=task_augmentation(hospital.task.augmentation, hospital.task.image_size),
        )
        result = TrainResult(private.loss, private.num_examples, private.steps)
        privacy_metrics = round_metrics(context, plan, lifetime, privacy, private.event)
    else:
        result = train(
            model,
            train_images,
            train_labels,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=float(cast(float, server_cfg.get("learning-rate", cfg.learning_rate))),
            optimizer=cfg.train.optimizer,
            momentum=cfg.train.momentum,
            weight_decay=cfg.train.weight_decay,
            proximal_mu=float(cast(float, server_cfg.get("proximal-mu", 0.0))),  # only fedprox sends it
            device=device,
            class_weights=loss_class_weights(cfg.train, server_cfg, train_labels, info.num_classes),
            missing_class_scale=cfg.train.fedrs_alpha,
            augment=task_augmentation(hospital.task.augmentation, hospital.task.image_size),
        )
    rounds_trained = (int(cast(int, cast(MetricRecord, context.state["hospital"])["rounds-trained"])) + 1
                      if "hospital" in context.state else 1)
    context.state["hospital"] = MetricRecord({"rounds-trained": rounds_trained})

    reply_metrics = MetricRecord(
        {
            "num-examples": int(result.num_examples),
            "train-loss": float(result.loss),
            "benchmark-error": float(1.0 - before["accuracy"]),
            "benchmark-loss": float(before["loss"]),
            # the labels it trained on: a data attacker reports its poisoned labels (a
            # rare-class faker claims the class it fakes); honest hospitals their own counts
            "class-counts": LabelledImages(train_images, train_labels).class_counts(info.num_classes),
            "rounds-trained": rounds_trained,
            **privacy_metrics,
        }
    )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": reply_metrics}), reply_to=msg)

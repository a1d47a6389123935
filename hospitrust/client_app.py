"""Flower ClientApp: a hospital trains the global model on its own images and reports back.

Per-hospital state lives in ``context.state`` (a SuperNode starts a fresh process per
message); the module-level caches only avoid reloading data inside one process.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hospitrust import metrics
from hospitrust.config import parse_node_config, parse_run_config
from hospitrust.datasets import DatasetInfo, load_hospital
from hospitrust.datasets.federation import LabelledImages
from hospitrust.models import build_model
from hospitrust.attacks.base import DataAttack, UpdateAttack, attack_state_dict
from hospitrust.threat_model import data_rng, hospital_attack
from hospitrust.training import balanced_class_weights, class_weights_from_counts, pick_device, predict_proba, seed_everything, train
from hospitrust.contribution.client import contribution_evaluate_mod, remember_round_mod, secure_train_mod

app = ClientApp()


def _setup(context: Context):
    cfg = parse_run_config(context.run_config)
    node = parse_node_config(context.node_config)
    info = DatasetInfo.of(cfg.dataset)
    return cfg, node, info, load_hospital(cfg, node)


def _model_from(msg: Message, cfg, info) -> torch.nn.Module:
    model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
    return model


def _local_report(model, images, labels, num_classes, device) -> dict:
    if labels.size == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "balanced_accuracy": float("nan")}
    probs = predict_proba(model, images, device=device)
    return metrics.classification_report(labels, probs, num_classes)


def _class_weights(cfg, server_cfg, train_labels, num_classes: int) -> torch.Tensor | None:
    """The loss's class weights: none, the hospital's own 'balanced' weights, or, when the
    server sends the federation's class totals (class-weights-from = federation), from those."""
    if not cfg.class_weighted_loss:
        return None
    totals = server_cfg.get("federation-class-counts")
    if totals is None:
        return balanced_class_weights(train_labels, num_classes)
    return class_weights_from_counts(list(totals), num_classes)


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Who this node is and what it holds: the server maps node ids to hospitals with it."""
    cfg, node, info, data = _setup(context)
    partition_id = -1 if node.partition_id is None else int(node.partition_id)
    record = ConfigRecord(
        {
            "hospital": data.name,
            "partition-id": partition_id,
            "num-partitions": -1 if node.num_partitions is None else int(node.num_partitions),
            "train-class-counts": data.train.class_counts(info.num_classes),
            "val-class-counts": data.val.class_counts(info.num_classes),
            "device": str(pick_device()),
        }
    )
    return Message(RecordDict({"info": record}), reply_to=msg)


# SecAgg+ train messages (secure-aggregation) go through Flower's secaggplus_mod; with
# contribution-scoring the hospital keeps M0 and its sent model to evaluate counterfactuals later
@app.train(mods=[secure_train_mod, remember_round_mod])
def train_handler(msg: Message, context: Context) -> Message:
    cfg, node, info, data = _setup(context)
    server_cfg = msg.content["config"]
    server_round = int(server_cfg.get("server-round", 0))
    device = pick_device()
    seed_everything(cfg.seed, node.partition_id if node.partition_id is not None else 0, server_round)
    global_state = msg.content["arrays"].to_torch_state_dict()
    model = _model_from(msg, cfg, info).to(device)
    attack = hospital_attack(cfg, node)  # None unless this hospital is one of the run's attackers
    train_images, train_labels = data.train.images, data.train.labels
    if isinstance(attack, DataAttack):
        train_images, train_labels = attack.poison_for_round(
            train_images, train_labels, server_round=server_round, rng=data_rng(cfg, node), num_classes=info.num_classes
        )

    # FedAgain's benchmark error: the incoming global model's error on local validation,
    # measured before local training (reported by the hospital itself).
    val = data.val if len(data.val) else data.train
    before = _local_report(model, val.images, val.labels, info.num_classes, device)

    result = train(
        model,
        train_images,
        train_labels,
        epochs=int(server_cfg.get("local-epochs", cfg.local_epochs)),
        batch_size=int(server_cfg.get("batch-size", cfg.batch_size)),
        learning_rate=float(server_cfg.get("learning-rate", cfg.learning_rate)),
        optimizer=cfg.optimizer,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        proximal_mu=float(server_cfg.get("proximal-mu", 0.0)),  # only fedprox sends it
        device=device,
        class_weights=_class_weights(cfg, server_cfg, train_labels, info.num_classes),
        missing_class_scale=cfg.fedrs_alpha,
    )
    rounds_trained = int(context.state["hospital"]["rounds-trained"]) + 1 if "hospital" in context.state else 1
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
        }
    )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if isinstance(attack, UpdateAttack):
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + server_round)
        state = attack_state_dict(attack, global_state, state, server_round=server_round, generator=generator)
    arrays = ArrayRecord(state)
    return Message(RecordDict({"arrays": arrays, "metrics": reply_metrics}), reply_to=msg)


@app.evaluate(mods=[contribution_evaluate_mod])
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Federated evaluation: the global model on this hospital's local validation set."""
    cfg, node, info, data = _setup(context)
    device = pick_device()
    model = _model_from(msg, cfg, info)
    val = data.val if len(data.val) else data.train
    report = _local_report(model, val.images, val.labels, info.num_classes, device)
    return Message(
        RecordDict(
            {
                "metrics": MetricRecord(
                    {
                        "num-examples": int(len(val)),
                        "loss": float(report["loss"]),
                        "accuracy": float(report["accuracy"]),
                        "balanced-accuracy": float(report["balanced_accuracy"]),
                    }
                )
            }
        ),
        reply_to=msg,
    )


# FED-FBD (strategy fbd): "train.fbd" messages carry only this hospital's colors' blocks
from hospitrust.fbd.client import FBD_ACTION, fbd_train  # noqa: E402

app.train(FBD_ACTION)(fbd_train)

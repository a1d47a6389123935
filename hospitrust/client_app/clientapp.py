"""The ClientApp: a hospital trains the global model on its own images and reports back.

Per-hospital state lives in ``context.state`` (a SuperNode starts a fresh process per
message); the module-level caches only avoid reloading data inside one process.
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hospitrust.client_app.context import hospital_context, local_report, process_start_time
from hospitrust.client_app.attack import update_attack_mod
from hospitrust.client_app.failures import public_failures_mod
from hospitrust.client_app.secure import secure_train_mod
from hospitrust.client_app.training import local_training_step
from hospitrust.client_app.contribution import contribution_evaluate_mod, remember_round_mod
from hospitrust.client_app.fbd import FBD_ACTION, fbd_train
from hospitrust.metrics import POOLED_KEY, classification_report, evaluation_counts
from hospitrust.models.training import pick_device, predict_proba
from hospitrust.wire import packed_arrays_mod

# outermost on every handler: a failure leaves the hospital as its public text only; then the arrays unpacked
# before any handler sees them, and the reply packed (hospitrust.wire)
app = ClientApp(mods=[public_failures_mod, packed_arrays_mod])


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Who this node is and what it holds: the server maps node ids to hospitals with it. The data
    card is counts and pixel statistics only (with the number of files skipped under
    skip-unreadable): never an image, a path, a file name or a patient id.
    """
    hospital = hospital_context(context, msg)
    node, task, data, card = hospital.node, hospital.task, hospital.data, hospital.card
    record = ConfigRecord(
        {
            "hospital": data.name,
            "partition-id": -1 if node.partition_id is None else int(node.partition_id),
            "num-partitions": -1 if node.num_partitions is None else int(node.num_partitions),
            "train-class-counts": data.train.class_counts(task.num_classes),
            "val-class-counts": data.val.class_counts(task.num_classes),
            "device": str(pick_device()),
            "task-fingerprint": task.fingerprint(),
            "data-format": str(card.get("format", "")),
            "images": int(card.get("images", len(data.train) + len(data.val))),
            "patients": int(card.get("patients", 0)),
            "pixel-mean": [float(v) for v in card.get("pixel-mean", [])],
            "pixel-std": [float(v) for v in card.get("pixel-std", [])],
            "skipped-files": int(card.get("skipped-files", 0)),
        }
    )
    return Message(RecordDict({"info": record}), reply_to=msg)


# SecAgg+ train messages (secagg.enabled) go through Flower's secaggplus_mod; with
# contribution-scoring.enabled the hospital keeps M0 and its sent model to evaluate counterfactuals later;
# a simulated update attacker's reply is rewritten innermost (what it sends is what is masked and kept)
@app.train(mods=[secure_train_mod, remember_round_mod, update_attack_mod])
def train_handler(msg: Message, context: Context) -> Message:
    """Local training; the reply's metrics also say where this message's time went (``timing-*``:
    the process's age when the handler started, setup, the training step, and wall-clock stamps),
    which the server records per hospital and ``benchmarks/deploy_overhead.py`` reads.
    """
    started = time.time()
    hospital = hospital_context(context, msg)
    set_up = time.time()
    reply = local_training_step(msg, context, hospital)
    if "metrics" in reply.content.metric_records:
        reply.content.metric_records["metrics"].update({
            "timing-process-age": float(started - process_start_time()),  # process start and imports
            "timing-setup": float(set_up - started),  # configs, data (cache), model
            "timing-step": float(time.time() - set_up),  # benchmark error, training
            "timing-started-at": float(started),
            "timing-finished-at": float(time.time()),
        })
    return reply


@app.evaluate(mods=[contribution_evaluate_mod])
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Federated evaluation: the global model on this hospital's local validation set. Asked for
    pooled metrics (a run without a server test set), it adds its confusion matrix and per-class
    score histograms: counts only.
    """
    started = time.time()
    hospital = hospital_context(context, msg)
    model = hospital.model_from(msg)
    val = hospital.data.val if len(hospital.data.val) else hospital.data.train
    num_classes = hospital.task.num_classes
    config = msg.content.config_records.get("config")
    pooled = config is not None and bool(config.get(POOLED_KEY, False))
    device = pick_device()
    if pooled and len(val):
        probs = predict_proba(model, val.images, device=device)
        report = classification_report(val.labels, probs, num_classes)
    else:
        probs = None
        report = local_report(model, val.images, val.labels, num_classes, device)
    values: dict[str, Any] = {
        "num-examples": int(len(val)),
        "loss": float(report["loss"]),
        "accuracy": float(report["accuracy"]),
        "balanced-accuracy": float(report["balanced_accuracy"]),
    }
    if pooled:
        values.update(evaluation_counts(val.labels, probs, num_classes))
    values.update({"timing-process-age": float(started - process_start_time()), "timing-started-at": float(started),
                   "timing-finished-at": float(time.time())})
    return Message(RecordDict({"metrics": MetricRecord(values)}), reply_to=msg)


# FED-FBD (strategy fbd): "train.fbd" messages carry only this hospital's colors' blocks
app.train(FBD_ACTION)(fbd_train)

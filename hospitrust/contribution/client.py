"""A hospital's side of contribution scoring: it evaluates models it can build itself.

After round t's aggregation the hospital holds M0 (the model it was sent), its own sent
model M0 + U_i (it remembered both when it trained) and the new global M (in the evaluate
message), plus its aggregation weight w_i from the server. From those it builds

    M - U_i  := M0 + (M - M0 - w_i U_i) / (1 - w_i)   (the others' weighted mean; M0 if w_i = 1)
    M0 + U_i := its own sent model

and reports v on its validation set of M, M0, M - U_i and M0 + U_i, and cos(U_i, M - M0).
Nothing here is sent to the server except those five scalars.

Also here: the ClientApp mods that do this without touching the training code
(``remember_round_mod`` on train, ``contribution_evaluate_mod`` on evaluate), and
``secure_train_mod``, which runs Flower's ``secaggplus_mod`` for SecAgg+ train messages and
adapts the legacy FitIns/FitRes records to the Message-API train handler.
"""

from __future__ import annotations

from collections import OrderedDict
from logging import WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import log

from hospitrust.contribution.interface import REPORT_KEYS, WEIGHT_KEY
from hospitrust.contribution.scores import cosine_to_aggregate

STATE_GLOBAL = "contribution-global"  # context.state keys
STATE_SENT = "contribution-sent"
STATE_ROUND = "contribution-round"


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().reshape(-1).to(torch.float64) for v in state.values() if v.is_floating_point()])


def counterfactual_states(
    global_state: dict[str, torch.Tensor], sent_state: dict[str, torch.Tensor], new_state: dict[str, torch.Tensor],
    weight: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(M - U_i, M0 + U_i) from M0, the hospital's sent model and M, for a weighted-mean aggregate."""
    if not 0.0 < weight <= 1.0 + 1e-9:
        raise ValueError(f"aggregation weight must be in (0, 1], got {weight}")
    if set(global_state) != set(sent_state) or set(global_state) != set(new_state):
        raise ValueError("M0, the sent model and M must have the same keys")
    without: dict[str, torch.Tensor] = {}
    for k, g in global_state.items():
        if not g.is_floating_point():
            without[k] = new_state[k].clone()
            continue
        g64, u = g.to(torch.float64), sent_state[k].to(torch.float64) - g.to(torch.float64)
        agg = new_state[k].to(torch.float64) - g64
        if weight >= 1.0 - 1e-9:
            rest = torch.zeros_like(g64)  # alone in the round: leaving it out leaves M0
        else:
            rest = (agg - weight * u) / (1.0 - weight)
        without[k] = (g64 + rest).to(g.dtype)
    return without, {k: v.clone() for k, v in sent_state.items()}


def utility(report: dict, name: str) -> float:
    """v of a classification report: balanced accuracy or negative cross-entropy."""
    if name == "balanced-accuracy":
        return float(report["balanced_accuracy"])
    if name == "neg-loss":
        return -float(report["loss"])
    raise ValueError(f"unknown contribution utility {name!r}; allowed: balanced-accuracy, neg-loss")


def hospital_report(evaluate_state, global_state, sent_state, new_state, weight: float) -> dict[str, float]:
    """The five scalars, with ``evaluate_state(state) -> v`` the hospital's own utility."""
    without, alone = counterfactual_states(global_state, sent_state, new_state, weight)
    cos = cosine_to_aggregate((flat(sent_state) - flat(global_state)).numpy(), (flat(new_state) - flat(global_state)).numpy())
    return {
        "v_new": evaluate_state(new_state),
        "v_previous": evaluate_state(global_state),
        "v_without_self": evaluate_state(without),
        "v_self_only": evaluate_state(alone),
        "cosine": cos,
        "weight": float(weight),
    }


def _selfish_inflation(cfg, node) -> float:
    ids = [s.strip() for s in cfg.contribution_selfish_hospitals.split(",") if s.strip()]
    return cfg.contribution_selfish_inflation if node.partition_id is not None and str(node.partition_id) in ids else 0.0


def inflate(report: dict[str, float], amount: float) -> dict[str, float]:
    """A selfish hospital's lie: its LOO and IOI each look ``amount`` better than they are."""
    if amount == 0.0:
        return report
    return {**report, "v_without_self": report["v_without_self"] - amount, "v_self_only": report["v_self_only"] + amount}


# ---- ClientApp mods -------------------------------------------------------------------------
def remember_round_mod(msg: Message, context: Context, call_next) -> Message:
    """On train: keep M0 and the model actually sent back (after any simulated attack)."""
    reply = call_next(msg, context)
    from hospitrust.config import parse_run_config

    if not parse_run_config(context.run_config).contribution_scoring or reply.has_error():
        return reply
    if "arrays" not in msg.content.array_records or "arrays" not in reply.content.array_records:
        return reply
    context.state[STATE_GLOBAL] = ArrayRecord(msg.content["arrays"].to_torch_state_dict())
    context.state[STATE_SENT] = ArrayRecord(reply.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"].get("server-round", 0)) if "config" in msg.content.config_records else 0
    context.state[STATE_ROUND] = MetricRecord({"round": rnd})
    return reply


def contribution_evaluate_mod(msg: Message, context: Context, call_next) -> Message:
    """On evaluate: when the server sent this hospital's weight, add the contribution scalars."""
    reply = call_next(msg, context)
    config = msg.content.config_records.get("config")
    if reply.has_error() or config is None or WEIGHT_KEY not in config:
        return reply
    from hospitrust.client_app import _setup
    from hospitrust.models import build_model
    from hospitrust.training import pick_device, predict_proba
    from hospitrust import metrics

    cfg, node, info, data = _setup(context)
    if STATE_GLOBAL not in context.state or STATE_SENT not in context.state:
        log(WARNING, "contribution: asked for round %s scores but no trained model is remembered", config.get("server-round"))
        return reply
    remembered = int(context.state[STATE_ROUND]["round"])
    if remembered != int(config.get("server-round", -1)):
        log(WARNING, "contribution: asked about round %s but the last trained round is %d", config.get("server-round"), remembered)
        return reply
    device = pick_device()
    model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
    val = data.val if len(data.val) else data.train

    def evaluate_state(state):
        model.load_state_dict(state, strict=True)
        probs = predict_proba(model, val.images, device=device)
        return utility(metrics.classification_report(val.labels, probs, info.num_classes), cfg.contribution_utility)

    report = hospital_report(
        evaluate_state,
        context.state[STATE_GLOBAL].to_torch_state_dict(),
        context.state[STATE_SENT].to_torch_state_dict(),
        msg.content["arrays"].to_torch_state_dict(),
        float(config[WEIGHT_KEY]),
    )
    report = inflate(report, _selfish_inflation(cfg, node))
    out = reply.content.metric_records["metrics"]
    for field, key in REPORT_KEYS.items():
        out[key] = float(report[field])
    return reply


def secure_train_mod(msg: Message, context: Context, call_next) -> Message:
    """SecAgg+ train messages through Flower's ``secaggplus_mod``; all others untouched.

    The legacy SecAgg+ workflow speaks FitIns/FitRes records; this turns them into the
    Message-API ``arrays``/``config`` the train handler reads, and its reply back into a
    FitRes (scalar metrics only), whose parameters ``secaggplus_mod`` then quantizes and masks.
    """
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    from flwr.client.mod import secaggplus_mod

    return secaggplus_mod(msg, context, lambda m, c: _legacy_train(m, c, call_next))


def _legacy_train(msg: Message, context: Context, call_next) -> Message:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict, recorddict_to_fitins

    from hospitrust.client_app import _setup
    from hospitrust.models import build_model

    cfg, _, info, _ = _setup(context)
    fitins = recorddict_to_fitins(msg.content, keep_input=True)
    template = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size).state_dict()
    arrays = parameters_to_ndarrays(fitins.parameters)
    if len(arrays) != len(template):
        raise ValueError(f"SecAgg+ train message has {len(arrays)} arrays, the model has {len(template)}")
    state = OrderedDict(
        (k, torch.from_numpy(np.ascontiguousarray(a)).to(t.dtype).reshape(t.shape)) for (k, t), a in zip(template.items(), arrays)
    )
    inner = Message(RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord(dict(fitins.config))}),
                    metadata=msg.metadata)
    out = call_next(inner, context)
    if out.has_error():
        raise RuntimeError(f"local training failed: {out.error.reason}")
    sent = out.content["arrays"].to_torch_state_dict()
    clip = float(fitins.config.get("secagg-clipping-range", 0.0))
    largest = max(float(v.abs().max()) for v in sent.values() if v.is_floating_point() and v.numel())
    if clip and largest > clip:
        log(WARNING, "SecAgg+: a model value of magnitude %.3g exceeds the clipping range %.3g and is clipped", largest, clip)
    metrics = {k: v for k, v in dict(out.content["metrics"]).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    fitres = FitRes(
        status=Status(Code.OK, "ok"),
        parameters=ndarrays_to_parameters([sent[k].detach().cpu().numpy() for k in template]),
        num_examples=int(metrics.get("num-examples", 0)),
        metrics=metrics,
    )
    return Message(fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

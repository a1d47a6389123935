"""A hospital's side of contribution scoring: it evaluates models it can build itself.

After round t's aggregation the hospital holds M0 (the model it was sent), its own sent
model M0 + U_i (it remembered both when it trained) and the new global M (in the evaluate
message), plus its aggregation weight w_i from the server. From those it builds

    M - U_i  := M0 + (M - M0 - w_i U_i) / (1 - w_i)   (the others' weighted mean; M0 if w_i = 1)
    M0 + U_i := its own sent model

and reports v on its validation set of M, M0, M - U_i and M0 + U_i, and cos(U_i, M - M0).
Nothing here is sent to the server except those five scalars.

Also here: the ClientApp mods that do this without touching the training code
(``remember_round_mod`` on train, ``contribution_evaluate_mod`` on evaluate).
"""

from __future__ import annotations

from logging import WARNING
from typing import cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.common import log

from hospitrust import metrics
from hospitrust.client_app.context import hospital_context
from hospitrust.config import memoised_run_config
from hospitrust.contribution.interface import REPORT_KEYS, WEIGHT_KEY
from hospitrust.contribution.options import ContributionScoringOptions
from hospitrust.contribution.scores import cosine_to_aggregate
from hospitrust.models.training import pick_device, predict_proba

STATE_GLOBAL = "contribution-global"  # context.state keys
STATE_SENT = "contribution-sent"
STATE_ROUND = "contribution-round"


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The floating-point tensors of a state dict as one float64 vector, in key order.

    Parameters
    ----------
    state : dict[str, torch.Tensor]
        A model state dict.

    Returns
    -------
    torch.Tensor
        ``(d,)`` float64.
    """
    return torch.cat([v.detach().reshape(-1).to(torch.float64) for v in state.values() if v.is_floating_point()])


def counterfactual_states(
    global_state: dict[str, torch.Tensor], sent_state: dict[str, torch.Tensor], new_state: dict[str, torch.Tensor],
    weight: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(M - U_i, M0 + U_i) from M0, the hospital's sent model and M, for a weighted-mean aggregate.

    Parameters
    ----------
    global_state : dict[str, torch.Tensor]
        M0, the model the hospital was sent in round t.
    sent_state : dict[str, torch.Tensor]
        M0 + U_i, the model it sent back.
    new_state : dict[str, torch.Tensor]
        M, the new global model.
    weight : float
        w_i, the hospital's weight in the aggregate, in (0, 1].

    Returns
    -------
    tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]
        M - U_i (non-float entries from M) and a copy of M0 + U_i.
    """
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
    """V of a classification report: balanced accuracy or negative cross-entropy.

    Parameters
    ----------
    report : dict
        A ``hospitrust.metrics.classification_report``.
    name : {"balanced-accuracy", "neg-loss"}
        Which utility (``contribution-scoring.utility``).

    Returns
    -------
    float
        V, larger is better.
    """
    if name == "balanced-accuracy":
        return float(report["balanced_accuracy"])
    if name == "neg-loss":
        return -float(report["loss"])
    raise ValueError(f"unknown contribution utility {name!r}; allowed: balanced-accuracy, neg-loss")


def hospital_report(evaluate_state, global_state, sent_state, new_state, weight: float) -> dict[str, float]:
    """The five scalars, with ``evaluate_state(state) -> v`` the hospital's own utility.

    Parameters
    ----------
    evaluate_state : Callable[[dict[str, torch.Tensor]], float]
        The hospital's utility V of a state dict on its validation set.
    global_state : dict[str, torch.Tensor]
        M0, the model it was sent.
    sent_state : dict[str, torch.Tensor]
        M0 + U_i, the model it sent back.
    new_state : dict[str, torch.Tensor]
        M, the new global model.
    weight : float
        w_i, its weight in the aggregate, in (0, 1].

    Returns
    -------
    dict[str, float]
        ``v_new``, ``v_previous``, ``v_without_self``, ``v_self_only``, ``cosine`` and ``weight``.
    """
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
    scoring = cfg.section(ContributionScoringOptions)
    ids = [s.strip() for s in scoring.selfish_hospitals.split(",") if s.strip()]
    return scoring.selfish_inflation if node.partition_id is not None and str(node.partition_id) in ids else 0.0


def inflate(report: dict[str, float], amount: float) -> dict[str, float]:
    """A selfish hospital's lie: its LOO and IOI each look ``amount`` better than they are.

    Parameters
    ----------
    report : dict[str, float]
        The honest report (:func:`hospital_report`).
    amount : float
        How much better LOO and IOI look (0: the report unchanged).

    Returns
    -------
    dict[str, float]
        The reported scalars.
    """
    if amount == 0.0:
        return report
    return {**report, "v_without_self": report["v_without_self"] - amount, "v_self_only": report["v_self_only"] + amount}


# ---- ClientApp mods -------------------------------------------------------------------------
def remember_round_mod(msg: Message, context: Context, call_next) -> Message:
    """On train: keep M0 and the model actually sent back (after any simulated attack).

    Parameters
    ----------
    msg : Message
        The incoming message.
    context : Context
        The hospital's context; its state keeps the models and the round.
    call_next : Callable[[Message, Context], Message]
        The rest of the ClientApp.

    Returns
    -------
    Message
        The reply of ``call_next``, unchanged.
    """
    reply = call_next(msg, context)
    if not memoised_run_config(context.run_config).section(ContributionScoringOptions).enabled or reply.has_error():
        return reply
    if "arrays" not in msg.content.array_records or "arrays" not in reply.content.array_records:
        return reply
    context.state[STATE_GLOBAL] = ArrayRecord(cast(ArrayRecord, msg.content["arrays"]).to_torch_state_dict())
    context.state[STATE_SENT] = ArrayRecord(reply.content["arrays"].to_torch_state_dict())
    rnd = (int(cast(int, cast(ConfigRecord, msg.content["config"]).get("server-round", 0)))
           if "config" in msg.content.config_records else 0)
    context.state[STATE_ROUND] = MetricRecord({"round": rnd})
    return reply


def contribution_evaluate_mod(msg: Message, context: Context, call_next) -> Message:
    """On evaluate: when the server sent this hospital's weight, add the contribution scalars.

    Parameters
    ----------
    msg : Message
        The incoming message.
    context : Context
        The hospital's context (the models remembered on train).
    call_next : Callable[[Message, Context], Message]
        The rest of the ClientApp.

    Returns
    -------
    Message
        The reply of ``call_next``, with the contribution scalars added to its metrics when asked.
    """
    reply = call_next(msg, context)
    config = msg.content.config_records.get("config")
    if reply.has_error() or config is None or WEIGHT_KEY not in config:
        return reply
    hospital = hospital_context(context, msg)
    cfg, node, info, data = hospital.cfg, hospital.node, hospital.info, hospital.data
    if STATE_GLOBAL not in context.state or STATE_SENT not in context.state:
        log(WARNING, "contribution: asked for round %s scores but no trained model is remembered", config.get("server-round"))
        return reply
    # what remember_round_mod kept: ArrayRecords and the round's MetricRecord
    remembered = int(cast(int, cast(MetricRecord, context.state[STATE_ROUND])["round"]))
    if remembered != int(cast(int, config.get("server-round", -1))):
        log(WARNING, "contribution: asked about round %s but the last trained round is %d", config.get("server-round"), remembered)
        return reply
    device = pick_device()
    model = hospital.new_model()
    val = data.val if len(data.val) else data.train

    def evaluate_state(state):
        model.load_state_dict(state, strict=True)
        probs = predict_proba(model, val.images, device=device)
        return utility(metrics.classification_report(val.labels, probs, info.num_classes), cfg.section(ContributionScoringOptions).utility)

    report = hospital_report(
        evaluate_state,
        cast(ArrayRecord, context.state[STATE_GLOBAL]).to_torch_state_dict(),
        cast(ArrayRecord, context.state[STATE_SENT]).to_torch_state_dict(),
        cast(ArrayRecord, msg.content["arrays"]).to_torch_state_dict(),
        float(cast(float, config[WEIGHT_KEY])),
    )
    report = inflate(report, _selfish_inflation(cfg, node))
    out = reply.content.metric_records["metrics"]
    for field, key in REPORT_KEYS.items():
        out[key] = float(report[field])
    return reply

"""The hospital side of FED-FBD: a ``train.fbd`` message handler for the ClientApp.

The message carries only this hospital's colors' blocks: the color it writes this round
(``fbd-color``) and, when it owns another, the sibling color it distills from
(``fbd-sibling``). It returns every block of the color it writes, and nothing else; the
server checks that against the plan anyway. A malicious simulated hospital's data or
update attack is applied here, as in the plain ClientApp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hospitrust.attacks.apply import attack_state_dict
from hospitrust.attacks.interfaces import UpdateAttack
from hospitrust.client_app.context import hospital_context
from hospitrust.fbd.training import train_with_sibling
from hospitrust.fbd.warehouse import color_key, parse_color_key
from hospitrust.attacks.threat_model import data_rng, hospital_attack
from hospitrust.models.loop import apply_data_steps
from hospitrust.models.training import pick_device, seed_everything

if TYPE_CHECKING:  # the server's strategy module: not imported on the hospital side
    from hospitrust.strategies.fbd import FBDOptions

FBD_ACTION = "fbd"


def _color_state(arrays: ArrayRecord, color: int) -> dict[str, torch.Tensor]:
    out = {}
    for name in arrays.keys():
        parsed = parse_color_key(name)
        if parsed is not None and parsed[0] == color:
            out[parsed[1]] = torch.from_numpy(arrays[name].numpy().copy())
    if not out:
        raise ValueError(f"the server sent no tensors of color {color}; got keys like {list(arrays.keys())[:3]}")
    return out


def fbd_train(msg: Message, context: Context) -> Message:
    """The ``train.fbd`` handler: train the color this hospital writes (distilling from its sibling) and reply
    with that color's blocks.

    Parameters
    ----------
    msg : Message
        The server's ``train.fbd`` message (the colors' arrays and the round's config).
    context : Context
        The hospital's context (run and node config).

    Returns
    -------
    Message
        The reply: ``arrays`` with every block of the written color, and ``metrics``.
    """
    hospital = hospital_context(context, msg)
    cfg, node, info, data = hospital.cfg, hospital.node, hospital.info, hospital.data
    # the server's train.fbd config (strategies.fbd.FBD.configure_train): numbers where read as numbers
    server_cfg = cast(ConfigRecord, msg.content["config"])
    server_round = int(cast(int, server_cfg.get("server-round", 0)))
    color = int(cast(int, server_cfg["fbd-color"]))
    sibling = int(cast(int, server_cfg.get("fbd-sibling", -1)))
    lam = float(cast(float, server_cfg.get("fbd-lambda", cast("FBDOptions", cfg.options("fbd")).distill_weight)))
    device = pick_device()
    seed_everything(cfg.seed, node.partition_id if node.partition_id is not None else 0, server_round)

    arrays = cast(ArrayRecord, msg.content["arrays"])
    received = _color_state(arrays, color)
    student = hospital.new_model()
    student.load_state_dict(received, strict=True)
    teacher = None
    if sibling >= 0:
        teacher = hospital.new_model()
        teacher.load_state_dict(_color_state(arrays, sibling), strict=True)

    attack = hospital_attack(cfg.threat_model, node)
    hospital.check_train_images(len(data.train))
    data_steps = [] if attack is None else attack.data_steps(server_round=server_round, rng=data_rng(cfg.seed, node),
                                                             num_classes=info.num_classes)
    images, labels = apply_data_steps(data_steps, data.train.images, data.train.labels)
    result = train_with_sibling(
        student, teacher, images, labels, lam=lam,
        epochs=hospital.local_epochs(server_cfg), batch_size=hospital.batch_size(server_cfg),  # the gate's, where it runs
        learning_rate=float(cast(float, server_cfg.get("learning-rate", cfg.learning_rate))),
        optimizer=cfg.train.optimizer, momentum=cfg.train.momentum, weight_decay=cfg.train.weight_decay, device=device,
    )
    state = {k: v.detach().cpu() for k, v in student.state_dict().items()}
    if isinstance(attack, UpdateAttack):
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + server_round)
        state = attack_state_dict(attack, received, state, server_round=server_round, generator=generator)
    reply = RecordDict(
        {
            "arrays": ArrayRecord({color_key(color, k): v for k, v in state.items()}),
            "metrics": MetricRecord(
                {
                    "num-examples": int(result.num_examples),
                    "train-loss": float(result.loss),
                    "cross-entropy": float(result.cross_entropy),
                    "kl": float(result.kl),
                    "fbd-color": color,
                }
            ),
        }
    )
    return Message(reply, reply_to=msg)

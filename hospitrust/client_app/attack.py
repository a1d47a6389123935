"""A simulated attacker's update attack as a ClientApp mod: the train handler trains honestly, the
mod rewrites the model in its reply (before SecAgg+ masks it and before contribution scoring keeps it).
"""

from __future__ import annotations

from typing import cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from hospitrust.attacks.apply import attack_state_dict
from hospitrust.attacks.interfaces import UpdateAttack
from hospitrust.attacks.threat_model import hospital_attack
from hospitrust.client_app.context import hospital_context


def update_attack_mod(msg: Message, context: Context, call_next) -> Message:
    """On train, at a hospital the threat model makes an update attacker: its reply's model rewritten
    by the attack (seeded by the run's seed and the round); every other message untouched.

    Parameters
    ----------
    msg : Message
        The incoming train message (``arrays``: the global model, ``config``: its round).
    context : Context
        The hospital's context.
    call_next : Callable[[Message, Context], Message]
        The rest of the ClientApp (the train handler).

    Returns
    -------
    Message
        The reply, its ``arrays`` attacked where this hospital is an update attacker.
    """
    reply = call_next(msg, context)
    if reply.has_error() or "arrays" not in reply.content.array_records or "arrays" not in msg.content.array_records:
        return reply  # an error, or a refusal (a spent privacy budget): nothing to rewrite
    hospital = hospital_context(context, msg)
    attack = hospital_attack(hospital.cfg.threat_model, hospital.node)  # None unless this hospital is one of the run's attackers
    if not isinstance(attack, UpdateAttack):
        return reply
    server_round = int(cast(int, cast(ConfigRecord, msg.content["config"]).get("server-round", 0)))
    global_state = cast(ArrayRecord, msg.content["arrays"]).to_torch_state_dict()
    state = cast(ArrayRecord, reply.content["arrays"]).to_torch_state_dict()
    generator = torch.Generator().manual_seed(hospital.cfg.seed * 7919 + server_round)
    reply.content["arrays"] = ArrayRecord(attack_state_dict(attack, global_state, state, server_round=server_round,
                                                            generator=generator))
    return reply


__all__ = ["update_attack_mod"]

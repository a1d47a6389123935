"""SecAgg+ train messages on the hospital's side: Flower's ``secaggplus_mod`` around the train handler.

The legacy SecAgg+ workflow speaks FitIns/FitRes records; ``secure_train_mod`` turns them into
the Message-API ``arrays``/``config`` the train handler reads, and its reply back into a FitRes
(scalar metrics only), whose parameters ``secaggplus_mod`` then quantizes and masks.
"""

from __future__ import annotations

from collections import OrderedDict
from logging import WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import Scalar, log

from hospitrust.client_app.context import hospital_context


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

    return secaggplus_mod(msg, context, lambda m, c: legacy_train_step(m, c, call_next))


def legacy_train_step(msg: Message, context: Context, call_next) -> Message:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict, recorddict_to_fitins

    fitins = recorddict_to_fitins(msg.content, keep_input=True)
    template = hospital_context(context).new_model().state_dict()
    arrays = parameters_to_ndarrays(fitins.parameters)
    if len(arrays) != len(template):
        raise ValueError(f"SecAgg+ train message has {len(arrays)} arrays, the model has {len(template)}")
    state = OrderedDict(
        (k, torch.from_numpy(np.ascontiguousarray(a)).to(t.dtype).reshape(t.shape)) for (k, t), a in zip(template.items(), arrays)
    )
    # metadata= is Flower's own internal form (flwr.app.message.make_message), left out of its overloads
    inner = Message(RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord(dict(fitins.config))}),  # type: ignore[call-overload]
                    metadata=msg.metadata)
    out = call_next(inner, context)
    if out.has_error():
        raise RuntimeError(f"local training failed: {out.error.reason}")
    sent = out.content["arrays"].to_torch_state_dict()
    clip = float(fitins.config.get("secagg-clipping-range", 0.0))
    largest = max(float(v.abs().max()) for v in sent.values() if v.is_floating_point() and v.numel())
    if clip and largest > clip:
        log(WARNING, "SecAgg+: a model value of magnitude %.3g exceeds the clipping range %.3g and is clipped", largest, clip)
    metrics: dict[str, Scalar] = {k: v for k, v in dict(out.content["metrics"]).items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
    fitres = FitRes(
        status=Status(Code.OK, "ok"),
        parameters=ndarrays_to_parameters([sent[k].detach().cpu().numpy() for k in template]),
        num_examples=int(metrics.get("num-examples", 0)),
        metrics=metrics,
    )
    return Message(fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

"""Secure aggregation with Flower's SecAgg+ as a round feature: the server only ever holds the sum.

Flower 1.42 has no Message-API SecAgg strategy; the supported path is the legacy
``SecAggPlusWorkflow`` driving a legacy strategy through a ``LegacyContext``, with
``secaggplus_mod`` on the ClientApp (here behind ``contribution.client.secure_train_mod``,
which also adapts FitIns/FitRes to the Message-API train handler). One
``SecureTrainRound`` call runs one SecAgg+ round: setup, key sharing, masked vectors,
unmasking. Each hospital sends ``[n_i, n_i * model_i]`` quantized and masked; the
server unmasks only the sum, i.e. the example-weighted mean model (FedAvg). What the
server learns per hospital is its ``num-examples`` and its scalar train metrics.

Precision: model values are clipped to ``[-secagg-clipping-range, +range]`` and quantized
to ``secagg.quantization-range`` levels, so the aggregate differs from plain FedAvg by up
to about ``2 * range / levels`` per value (about 4e-6 with the defaults).

As a round feature (:class:`SecureAggregation`) it replaces the round's train exchange
(``wrap_trainer``): configure, send, receive and aggregate run in the workflow's own stages.
"""

from __future__ import annotations

from collections import OrderedDict
from logging import INFO
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, Parameters, log, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.serverapp import Grid

from hospitrust.features.base import Round, RoundFeature, RunFacts, Trainer
from hospitrust.features.secagg_options import SECTION, SecAggOptions
from hospitrust.records import HospitalRecord
from hospitrust.strategies.base import RoundResult

#: The feature's name: its run-config section, and where a hospital record carries its signals
SECAGG = SECTION


def _legacy_strategy_class():
    from flwr.server.strategy import Strategy

    class SecureFedAvg(Strategy):
        """The legacy strategy SecAggPlusWorkflow drives: asks every hospital, keeps the
        unmasked mean. ``results`` reach it with every FitRes' parameters already replaced
        by the aggregate; only num-examples and scalar metrics are per hospital.
        """

        def __init__(self, node_ids: list[int], fit_config: dict[str, Any]) -> None:
            self.node_ids, self.fit_config = node_ids, fit_config
            self.results: list[tuple[int, int, dict]] = []
            self.failures = 0
            self.aggregate: Parameters | None = None

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            proxies = [p for p in client_manager.all().values() if p.node_id in self.node_ids]
            return [(p, FitIns(parameters, dict(self.fit_config))) for p in sorted(proxies, key=lambda p: p.node_id)]

        def aggregate_fit(self, server_round, results, failures):
            self.failures = len(failures)
            self.results = [(int(proxy.node_id), int(res.num_examples), dict(res.metrics)) for proxy, res in results]
            if not results:
                return None, {}
            self.aggregate = results[0][1].parameters  # all equal: the unmasked weighted mean
            return self.aggregate, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return SecureFedAvg


class SecureTrainRound:
    """Runs one SecAgg+ training round per call: configure, send, receive and aggregate in Flower's workflow."""

    def __init__(self, options: SecAggOptions, hospitals: dict[int, str], train_config: dict[str, Any], *,
                 reply_timeout: float, min_hospitals: int, train_sizes: list[int] | None = None) -> None:
        self.options, self.hospitals = options, dict(hospitals)
        self.reply_timeout, self.min_hospitals = reply_timeout, min_hospitals
        # each model is scaled by n_i / max_weight before quantization: the tightest bound
        # keeps the most precision (a hospital above it still aggregates, with a warning)
        self.max_weight = options.max_weight or float(max(train_sizes or [0]) or 1)
        self.train_config = {**train_config, "secagg-clipping-range": options.clipping_range}

    def workflow(self):
        from flwr.server.workflow import SecAggPlusWorkflow

        n = len(self.hospitals)
        return SecAggPlusWorkflow(
            num_shares=n,
            reconstruction_threshold=max(2, round(self.options.reconstruction_threshold * n)),
            max_weight=self.max_weight,
            clipping_range=self.options.clipping_range,
            quantization_range=self.options.quantization_range,
            timeout=self.reply_timeout,
        )

    def __call__(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> tuple[RoundResult, list[int]]:
        """(the round's result, node ids asked)."""
        from flwr.server import LegacyContext, ServerConfig
        from flwr.server.client_manager import SimpleClientManager
        from flwr.server.compat.grid_client_proxy import GridClientProxy
        from flwr.compat.common.recorddict_compat import parameters_to_arrayrecord
        from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

        state = arrays.to_torch_state_dict()
        bad = [k for k, v in state.items() if not v.is_floating_point()]
        if bad:
            raise ValueError(f"secagg.enabled averages every array; the model has integer buffers {bad}: use a model without them")
        names, dtypes = list(state), {k: v.dtype for k, v in state.items()}
        online = set(grid.get_node_ids())
        node_ids = sorted(nid for nid in self.hospitals if nid in online)
        strategy = _legacy_strategy_class()(node_ids, {**self.train_config, "server-round": server_round})
        manager = SimpleClientManager()
        run_id = grid.run.run_id
        for nid in node_ids:
            manager.register(GridClientProxy(nid, grid, run_id))
        context = LegacyContext(Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                                config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=manager)
        params = ndarrays_to_parameters([state[k].detach().cpu().numpy() for k in names])
        context.state.array_records[MAIN_PARAMS_RECORD] = parameters_to_arrayrecord(params, keep_input=True)
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: server_round})
        log(INFO, "Round %d: SecAgg+ over %d hospitals", server_round, len(node_ids))
        self.workflow()(grid, context)

        record = RoundResult()
        answered = {nid for nid, _, _ in strategy.results}
        total = float(sum(n for _, n, _ in strategy.results))
        for nid, n, metrics in strategy.results:
            entry = HospitalRecord.from_reply(self.hospitals.get(nid, f"unknown-node-{nid}"), nid, n, metrics,
                                              weight=n / total if total > 0 else 0.0, selected=True)
            entry.add_signals(SECAGG, {"secure_aggregation": True})  # the server saw only the masked sum
            record.clients.append(entry)
        for nid in node_ids:
            if nid not in answered:
                record.clients.append(HospitalRecord(self.hospitals[nid], nid, rejected=True,
                                                     reason="error reply: dropped out of the SecAgg+ round"))
        if strategy.aggregate is None or len(answered) < self.min_hospitals:
            record.keep_previous(f"SecAgg+ produced no aggregate from {len(answered)} hospital(s): kept the previous model")
            return record, node_ids
        mean = parameters_to_ndarrays(strategy.aggregate)
        new_state = OrderedDict((k, torch.from_numpy(np.asarray(a)).to(dtypes[k]).reshape(state[k].shape)) for k, a in zip(names, mean))
        record.arrays = ArrayRecord(new_state)
        return record, node_ids


class SecureTrainer:
    """The train exchange of a SecAgg+ round: nothing goes out before ``receive``, which runs the workflow."""

    def __init__(self, strategy: Any, grid: Grid, secure: SecureTrainRound) -> None:
        self.strategy, self.grid, self.secure = strategy, grid, secure

    def send(self, rnd: Round) -> None:
        return None

    def receive(self, rnd: Round, sent: Any) -> RoundResult:
        result, rnd.asked = self.secure(self.grid, rnd.number, rnd.arrays)
        return result


class SecureAggregation(RoundFeature):
    """The ``secagg`` section (enabled).

    Parameters
    ----------
    options : SecAggOptions
        The ``secagg`` section.
    hospitals : Mapping[int, str]
        Node id -> hospital name.
    grid : Grid
        The ServerApp's grid.
    reply_timeout : float
        Seconds each stage waits for replies.
    min_hospitals : int
        Fewest hospitals for an aggregate.
    train_sizes : Sequence[int]
        The hospitals' training-set sizes from the query round (the tightest weight bound).
    """

    name = SECAGG
    overlaps_rounds = False  # its own stages
    order = 50
    section, Options, doc = SECTION, SecAggOptions, "deployment.md"

    @classmethod
    def for_run(cls, run: RunFacts) -> SecureAggregation | None:
        options = run.cfg.section(SecAggOptions)
        if not options.enabled:
            return None
        return cls(options, run.hospitals, run.grid, reply_timeout=run.cfg.reply_timeout,
                   min_hospitals=run.cfg.min_hospitals, train_sizes=[sum(r["train"]) for r in run.rows])

    def __init__(self, options: SecAggOptions, hospitals: Mapping[int, str], grid: Grid, *, reply_timeout: float,
                 min_hospitals: int, train_sizes: Sequence[int]) -> None:
        self.options, self.hospitals, self.grid = options, dict(hospitals), grid
        self.reply_timeout, self.min_hospitals, self.train_sizes = reply_timeout, min_hospitals, list(train_sizes)

    def wrap_trainer(self, trainer: Trainer) -> Trainer:
        secure = SecureTrainRound(self.options, self.hospitals, trainer.strategy.train_config,
                                  reply_timeout=self.reply_timeout, min_hospitals=self.min_hospitals,
                                  train_sizes=self.train_sizes)
        return SecureTrainer(trainer.strategy, self.grid, secure)


__all__ = ["SecAggOptions", "SecureAggregation", "SecureTrainRound", "SecureTrainer"]

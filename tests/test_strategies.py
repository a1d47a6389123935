"""The robust strategies on synthetic replies (fast: no training), and each in a real in-process run."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from conftest import small_run_config
from test_field_rules import FIELD_RULES  # issue 34's rules: their in-process runs are one test there, at 4 hospitals
from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.client_app import app as client_app
from hospitrust.server_app.results import read_round_records
from hospitrust.server_app import app as server_app
from hospitrust.strategies import build_strategy, strategy_class, strategy_names

D = 6


def _replies(strategy, vectors, num_examples=None, order=None):
    """Send the global model (zeros) and answer with global + vectors[i] from node i; the
    replies reach the strategy in ``order`` (indices; default node order)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1

    class _Grid:
        def get_node_ids(self):
            return list(strategy.hospitals)

    global_arrays = ArrayRecord({"w": torch.zeros(D), "steps": torch.tensor(5)})
    messages = list(strategy.configure_train(1, global_arrays, ConfigRecord(), _Grid()))
    replies = []
    for i, msg in enumerate(sorted(messages, key=lambda m: m.metadata.dst_node_id)):
        n = 10 if num_examples is None else num_examples[i]
        content = RecordDict({"arrays": ArrayRecord({"w": torch.tensor(vectors[i], dtype=torch.float32),
                                                     "steps": torch.tensor(7 + i)}),
                              "metrics": MetricRecord({"num-examples": n, "train-loss": 0.5})})
        replies.append(Message(content, reply_to=msg))
    if order is not None:
        replies = [replies[i] for i in order]
    result = strategy.aggregate_round(1, replies)
    return result.arrays, result


class _RootUpdate:
    """A fixed root update (anchor) over one local step, as the ServerApp's reference-cohort trainer gives."""

    local_steps = 1

    def __init__(self, vector):
        self.vector = torch.as_tensor(vector, dtype=torch.float32)

    def __call__(self, state, rnd):
        return self.vector.clone()


def _cohort_split(target):
    """A stand-in for the server's cohort split: (its update: ones; the held-out loss: ||s - target||^2)."""
    goal = torch.as_tensor(target, dtype=torch.float64)

    def split(check_fraction, epochs):
        return _RootUpdate(torch.ones(D)), lambda state, steps: ((steps.double() - goal) ** 2).sum(1)
    return split


def _strategy(name, n, **kwargs):
    hospitals = {100 + i: f"h{i}" for i in range(n)}
    if name in ("fltrust", "monna", "anchored-trust"):
        kwargs.setdefault("server_update", _RootUpdate(torch.ones(D)))
    if name == "sentinel":  # the held-out loss is lowest at the hospitals' mean: their step is kept
        kwargs.setdefault("cohort_split", _cohort_split(torch.tensor(HONEST).mean(0)))
    return build_strategy(name, hospitals, **kwargs)


HONEST = [[1.0, 1, 1, 1, 1, 1], [1.2, 0.9, 1, 1.1, 1, 1], [0.9, 1.1, 1, 1, 0.9, 1], [1.1, 1, 0.9, 1, 1.1, 1],
          [1.0, 1, 1.1, 0.9, 1, 1], [1.0, 1.05, 1, 1, 1, 0.95]]
OUTLIER = [[-50.0, 40, -60, 50, -40, 60]]


# every rule and preset that aggregates a stack of updates into one model (its capability; FED-FBD replaces blocks
# of a warehouse of colors instead: tests/test_fbd.py)
STACK_RULES = [n for n in strategy_names() if strategy_class(n).stacks_updates]


@pytest.mark.parametrize("name", STACK_RULES)
def test_identical_updates_give_that_update(name):
    kwargs = {"options": {"proximal_mu": 0.1}} if name == "fedprox" else {}
    if name == "flame":  # no noise: the aggregate is exact
        kwargs = {"options": {"noise_lambda": 0.0}}
    if name in ("fltrust", "monna", "anchored-trust"):  # FLTrust rescales to the root update's norm: the same update
        kwargs["server_update"] = _RootUpdate([2.0, -1, 0, 3, 1, 1])
    if name == "sentinel":  # the identical update is the held-out optimum; the step bound lets it through
        kwargs.update(cohort_split=_cohort_split([2.0, -1, 0, 3, 1, 1]), options={"step_bound": 10.0})
    s = _strategy(name, 7, **kwargs)
    arrays, record = _replies(s, [[2.0, -1, 0, 3, 1, 1]] * 7)
    # FoolsGold takes identical histories for Sybils: every learning rate 0, the model does not move
    expected = torch.zeros(D) if name == "foolsgold" else torch.tensor([2.0, -1, 0, 3, 1, 1])
    assert torch.allclose(torch.from_numpy(arrays["w"].numpy()), expected, atol=1e-5)
    # integer buffers are copied (the largest counter among selected replies), never averaged
    assert int(arrays["steps"].numpy()) in range(7, 14)
    assert record.aggregation_seconds > 0


@pytest.mark.parametrize("name", ["fedavg", "multi-krum", "geometric-median", "fedagain", "hta", "earn"])
def test_the_order_replies_arrive_in_does_not_change_a_bit(name):
    """Hospitals finish in any order; the same updates must give the bit-identical model (a
    float sum depends on the order of its terms, so the rules sum in hospital order)."""
    gen = torch.Generator().manual_seed(3)
    vectors = (torch.randn(7, D, generator=gen) * torch.logspace(-3, 3, D)).tolist()
    sizes = [3, 17, 5, 101, 9, 44, 60]
    models = []
    for order in (None, [6, 2, 4, 0, 5, 1, 3]):
        arrays, _ = _replies(_strategy(name, 7), vectors, num_examples=sizes, order=order)
        models.append(torch.from_numpy(arrays["w"].numpy()))
    assert torch.equal(models[0], models[1])


@pytest.mark.parametrize("name", ["median", "trimmed-mean", "krum", "multi-krum", "bulyan", "geometric-median",
                                  "centered-clipping", "fltrust"])
def test_robust_rules_resist_one_far_outlier(name):
    s = _strategy(name, 7)
    arrays, record = _replies(s, HONEST + OUTLIER)
    w = torch.from_numpy(arrays["w"].numpy())
    assert float(torch.linalg.vector_norm(w - torch.ones(D))) < 1.0, (name, w)
    fedavg, _ = _replies(_strategy("fedavg", 7), HONEST + OUTLIER)
    assert float(torch.linalg.vector_norm(torch.from_numpy(fedavg["w"].numpy()) - torch.ones(D))) > 10


@pytest.mark.parametrize("name", ["krum", "multi-krum", "bulyan", "fltrust"])
def test_selection_rules_record_the_outlier_as_not_selected(name):
    s = _strategy(name, 7)
    _, record = _replies(s, HONEST + OUTLIER)
    by_name = {c.hospital: c for c in record.clients}
    assert not by_name["h6"].selected and by_name["h6"].weight == 0.0
    assert sum(c.weight for c in record.clients) == pytest.approx(1.0)


def test_krum_picks_one_honest_update():
    _, record = _replies(_strategy("krum", 7), HONEST + OUTLIER)
    assert [c.hospital for c in record.clients if c.selected] in (["h0"], ["h1"], ["h2"], ["h3"], ["h4"], ["h5"])


def test_fltrust_gives_zero_trust_to_an_opposite_update():
    s = _strategy("fltrust", 3)
    arrays, record = _replies(s, [[1.0] * D, [2.0] * D, [-1.0] * D])
    trust = {c.hospital: c.trust for c in record.clients}
    assert trust["h2"] == 0.0 and trust["h0"] == pytest.approx(1.0) and trust["h1"] == pytest.approx(1.0)
    # both honest updates rescaled to ||g|| = sqrt(6): the aggregate is g itself
    assert torch.allclose(torch.from_numpy(arrays["w"].numpy()), torch.ones(D), atol=1e-5)


def test_rule_minimum_keeps_previous_model_instead_of_crashing():
    s = _strategy("bulyan", 5, assumed_malicious=1)  # needs 7
    arrays, record = _replies(s, HONEST[:5])
    assert arrays is None and record.kept_previous_model and "minimum of 7" in record.note


def test_fedavg_weights_by_examples():
    arrays, record = _replies(_strategy("fedavg", 2), [[0.0] * D, [3.0] * D], num_examples=[10, 20])
    assert torch.allclose(torch.from_numpy(arrays["w"].numpy()), torch.full((D,), 2.0))
    assert [c.weight for c in sorted(record.clients, key=lambda c: c.hospital)] == pytest.approx([1 / 3, 2 / 3])


@pytest.mark.parametrize("name", [n for n in STACK_RULES if n not in FIELD_RULES])
def test_each_strategy_in_a_real_inprocess_run(tmp_path, data_dir, name):
    own = {"contribution-scoring.enabled": True} if name == "contribution" else {}  # it weighs by the scores
    cfg = small_run_config(tmp_path, **{"strategy": name, "num-server-rounds": 1, "train-subsample": 0.03,
                                        "batch-size": 64, "local-epochs": 1, **own})
    grid = InProcessGrid(client_app, 7, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    (round1,) = read_round_records(tmp_path / "runs" / cfg["run-name"])
    assert not round1.kept_previous_model, round1.note
    assert len(round1.clients) == 7 and round1.central["num_examples"] == 624

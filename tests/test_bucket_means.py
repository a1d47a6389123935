"""Bucketing as ByzFL defines it (issue 44): with ``bucketing.rule-input = "bucket-means"`` the rule gets
the ceil(n / s) bucket means, each member's record names its bucket and carries its bucket's weight
split among the members; the old one-row-per-member form stays the default. Hand-computed cases with
one large outlier, through the run config's features and the strategy's aggregation."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from hospitrust.config import parse_run_config
from hospitrust.errors import ConfigError
from hospitrust.features import Round, RunFacts
from hospitrust.features.registry import run_features
from hospitrust.strategies import build_strategy
from hospitrust.strategies.base import GroupedRows

NAMES = [f"h{i}" for i in range(6)]


@pytest.fixture(autouse=True)
def _eager(monkeypatch):
    from hospitrust.aggregation import _codegen

    monkeypatch.setattr(_codegen, "_backend", "eager")  # one aggregation each: no torch.compile of the kernels
# five identical honest updates (1, 1) and one outlier (1001, 1001)
VECTORS = [[1.0, 1.0]] * 5 + [[1001.0, 1001.0]]


class _Grid:
    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return self.nodes


def _run_round(strategy_name, rule_input, **extra):
    """One aggregation of VECTORS with the run config's features (bucketing, s = 2) and strategy."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = parse_run_config({"pre-aggregation": "bucketing", "bucketing.bucket-size": 2, "bucketing.rule-input": rule_input,
                            "strategy": strategy_name, "assumed-malicious": 1, "seed": 3, **extra})
    hospitals = {101 + i: name for i, name in enumerate(NAMES)}
    features = run_features(RunFacts(cfg, None, None, hospitals, [], {h: False for h in NAMES}, None))
    strategy = build_strategy(strategy_name, hospitals, assumed_malicious=1)
    rnd = Round(1, ArrayRecord({"w": torch.zeros(2)}), started=0.0)
    messages = sorted(strategy.configure_train(1, rnd.arrays, ConfigRecord(), _Grid(hospitals)),
                      key=lambda m: m.metadata.dst_node_id)
    replies = [Message(RecordDict({"arrays": ArrayRecord({"w": torch.tensor(v)}),
                                   "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})}), reply_to=m)
               for v, m in zip(VECTORS, messages)]
    steps = features.update_steps(rnd)
    rnd.result = features.on_aggregate(rnd, strategy.aggregate_round(1, replies, steps))
    return steps, rnd.result, features.record(rnd)


def test_the_trimmed_mean_sees_three_bucket_means_and_trims_the_outliers_bucket():
    steps, result, record = _run_round("trimmed-mean", "bucket-means")
    assert len(steps) == 1 and isinstance(steps[0], GroupedRows)
    # buckets of 2 over 6 rows: two buckets of honest rows (1, 1) and the outlier's, (1 + 1001) / 2 = 501;
    # the trimmed mean (f = 1) of the 3 bucket means drops 501 and one 1: exactly (1, 1), whatever the order
    torch.testing.assert_close(result.arrays.to_torch_state_dict()["w"], torch.tensor([1.0, 1.0]))
    buckets = record["pre_aggregation"]["steps"][0]["buckets"]
    assert record["pre_aggregation"]["rows_out"] == 3 and sorted(len(b) for b in buckets) == [2, 2, 2]
    outlier_bucket = next(b for b in buckets if "h5" in b)
    for c in result.clients:
        mine = next(b for b in buckets if c.hospital in b)
        assert c.signals["pre-aggregation"]["steps"] == [{"step": "bucketing", "bucket": mine}]  # its record names its bucket
        # the row the rule saw for it: its bucket's mean, norm sqrt(2) x 501 or sqrt(2)
        expected = 501.0 * 2 ** 0.5 if mine == outlier_bucket else 2 ** 0.5
        assert c.update_norm == pytest.approx(expected, rel=1e-6)
    # members of one bucket share its weight equally
    weight = {c.hospital: c.weight for c in result.clients}
    for b in buckets:
        assert weight[b[0]] == pytest.approx(weight[b[1]])
    assert sum(weight.values()) == pytest.approx(1.0)


def test_one_row_per_member_lets_the_outliers_bucket_through_twice():
    """The default (and the v1 leaderboard's) bucketing: every member hands the rule its bucket's mean, so the
    trimmed mean gets 501 twice, trims one: (501 + 1 + 1 + 1) / 4 = 126 per coordinate."""
    steps, result, _ = _run_round("trimmed-mean", "member-rows")
    assert not isinstance(steps[0], GroupedRows)
    torch.testing.assert_close(result.arrays.to_torch_state_dict()["w"], torch.tensor([126.0, 126.0]))


def test_fedavg_on_bucket_means_is_the_mean_and_the_median_the_middle_bucket():
    # FedAvg over 3 equal-count buckets: the plain mean (1 x 5 + 1001) / 6
    _, fedavg, _ = _run_round("fedavg", "bucket-means")
    torch.testing.assert_close(fedavg.arrays.to_torch_state_dict()["w"], torch.tensor([1006.0 / 6] * 2))
    _, median, _ = _run_round("median", "bucket-means")
    torch.testing.assert_close(median.arrays.to_torch_state_dict()["w"], torch.tensor([1.0, 1.0]))


def test_too_few_bucket_means_for_the_rule_keep_the_previous_model():
    # Krum needs 2f + 3 = 5 rows; 6 replies in buckets of 2 give it 3
    _, result, _ = _run_round("krum", "bucket-means")
    assert result.kept_previous_model and result.arrays is None
    assert result.note == "3 rows after the pre-aggregation < the krum rule's minimum of 5 (assumed malicious f): " \
                          "kept the previous model"


def test_a_rule_that_reads_who_sent_each_row_is_refused():
    with pytest.raises(ConfigError, match="bucketing.rule-input = 'bucket-means' and strategy 'hta': the rule reads who"):
        parse_run_config({"pre-aggregation": "bucketing", "bucketing.rule-input": "bucket-means", "strategy": "hta"})
    with pytest.raises(ConfigError, match="rule-input"):
        parse_run_config({"pre-aggregation": "bucketing", "bucketing.rule-input": "buckets"})
    assert parse_run_config({"pre-aggregation": "bucketing"}).options("bucketing").rule_input == "member-rows"


def test_the_rule_in_a_tailored_attacks_loop_gets_the_bucket_means_too():
    from hospitrust.aggregation.pre_aggregation import PreAggregationChain
    from hospitrust.attacks.registry import build_attack
    from hospitrust.features.adversary import RoundAwareAdversary
    from hospitrust.strategies.validation import CheckedReply

    chain = PreAggregationChain(("bucketing",), bucket_size=2, seed=3, bucket_means=True)
    feature = RoundAwareAdversary(build_attack("tailored-ipm"), {"h5"}, seed=0, pre_aggregation=chain)
    feature.wrap_strategy(build_strategy("trimmed-mean", {101 + i: n for i, n in enumerate(NAMES)}, assumed_malicious=1))
    feature._checked = lambda hospitals: [CheckedReply(101 + i, {}, None, 10, {}) for i in range(len(hospitals))]
    agg = feature.evaluator(1, NAMES)(torch.tensor(VECTORS))
    torch.testing.assert_close(agg.update, torch.tensor([1.0, 1.0]))  # the same trimmed mean of 3 bucket means
    assert agg.weights.shape == (6,)  # given per hospital

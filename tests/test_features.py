"""Round features: the registry, the hook order, and the privacy feature's budget handling, by hand;
the loop's length (the round loop stays a loop over features, not a list of branches)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from hospitrust.features import Features, Round, RoundFeature, RunFacts
from hospitrust.features.registry import FEATURES, refresh, run_features

REPO = Path(__file__).resolve().parents[1]


def _facts(**flat):
    from hospitrust.config import parse_run_config

    return RunFacts(parse_run_config(flat), grid=None, task=None, hospitals={1: "a", 2: "b"}, rows=[], truth={},
                    attack=None, grid_takes_pushes=False)


def test_the_registry_finds_every_built_in_feature():
    assert set(refresh()) >= {"detection", "simulated-adversary", "privacy", "contribution", "secagg",
                              "overlapping-rounds"}
    assert all(cls.name == name for name, cls in FEATURES.items())


def test_a_run_has_only_the_features_its_config_turns_on():
    # audit-anchors records the audit heads hospitals' gates add to their replies: every run has it (a no-op without)
    always = ["audit-anchors", "detection"]
    assert [f.name for f in run_features(_facts())] == always
    assert [f.name for f in run_features(_facts(**{"contribution-scoring.enabled": True}))] == [*always, "contribution"]
    on_push_grid = _facts()
    on_push_grid.grid_takes_pushes = True
    assert [f.name for f in run_features(on_push_grid)] == [*always, "overlapping-rounds"]


class _Log(RoundFeature):
    def __init__(self, name, order, log):
        self.name, self.order, self.log = name, order, log  # type: ignore[misc]

    def before_round(self, rnd):
        self.log.append(self.name)

    def on_replies(self, rnd, replies):
        return [*replies, self.name]

    def record(self, rnd):
        return {"last": self.name, self.name: rnd.number}


def test_hooks_run_in_the_features_order_and_chain():
    log: list[str] = []
    features = Features([_Log("late", 200, log), _Log("early", 5, log), _Log("middle", 100, log)])
    rnd = Round(3, ArrayRecord(), started=0.0)
    features.before_round(rnd)
    assert log == ["early", "middle", "late"]
    assert features.on_replies(rnd, []) == ["early", "middle", "late"]  # each hook gets the previous one's output
    assert features.record(rnd) == {"last": "late", "early": 3, "middle": 3, "late": 3}
    with pytest.raises(ValueError, match="distinct"):
        Features([_Log("x", 1, log), _Log("x", 2, log)])


def _train_reply(node_id: int, metrics: dict, config: dict | None = None) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    sent = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=node_id,
                   message_type=MessageType.TRAIN)
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if config is not None:
        content["privacy"] = ConfigRecord(config)
    return Message(content, reply_to=sent)  # from node_id


def test_a_spent_budget_is_taken_from_the_replies_recorded_and_not_asked_again():
    import torch

    from hospitrust.features.privacy import DifferentialPrivacy
    from hospitrust.privacy.options import PrivacyOptions
    from hospitrust.strategies.base import RoundResult

    options = PrivacyOptions(mode="local")
    rows = [{"hospital": h, "train": [500, 500]} for h in ("a", "b")]
    feature = DifferentialPrivacy(options, {1: "a", 2: "b"}, torch.nn.Linear(2, 2), rows)
    rnd = Round(1, ArrayRecord(), started=0.0)
    feature.before_round(rnd)
    assert rnd.excluded == set()
    honest = _train_reply(1, {"num-examples": 10})
    spent = _train_reply(2, {"privacy-budget-spent": 1, "privacy-next-epsilon": 9.0, "privacy-max-epsilon": float("nan")},
                         {"reason": "next round would reach epsilon 9 > 8"})
    assert feature.on_replies(rnd, [honest, spent]) == [honest]
    assert rnd.answered == {2}  # asked and answered: not missing
    rnd.result = RoundResult(clients=[])
    entry = feature.record(rnd)
    assert entry["budget_spent"] == [{"hospital": "b", "node_id": 2, "reason": "next round would reach epsilon 9 > 8",
                                      "next_epsilon": 9.0}]  # the non-finite number is dropped
    assert entry["privacy"]["budget_spent"] == ["b"]
    nxt = Round(2, ArrayRecord(), started=0.0)
    feature.before_round(nxt)
    assert nxt.excluded == {"b"}
    assert feature.state()["budget_spent"]["b"]["round"] == 1
    # a resumed run: from the feature's saved state, or from an earlier hospitrust's strategy state
    for checkpoint in ({"history": [], "features": {"privacy": feature.state()}},
                       {"history": [], "strategy_state": {"budget_spent": feature.state()["budget_spent"]}}):
        restored = DifferentialPrivacy(options, {1: "a", 2: "b"}, torch.nn.Linear(2, 2), rows)
        restored.restore(checkpoint)
        later = Round(3, ArrayRecord(), started=0.0)
        restored.before_round(later)
        assert later.excluded == {"b"}


def test_the_longest_function_in_server_app_is_at_most_80_lines():
    lengths = {f"{p.name}:{n.name}": n.end_lineno - n.lineno + 1
               for p in (REPO / "hospitrust" / "server_app").rglob("*.py")
               for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    longest = max(lengths, key=lengths.__getitem__)
    assert lengths[longest] <= 80, f"{longest} has {lengths[longest]} lines"

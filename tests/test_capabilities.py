"""What a rule can do is a class attribute of its strategy (``HospitrustStrategy.stacks_updates``,
``weighted_mean``, ...), asked by the loop, the features and the run-config checks; no rule is known by
its name outside the strategy registry and FED-FBD's own modules, and no round feature reaches into a
strategy by setting its attributes (it calls a method the strategy declares).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hospitrust"

# the modules allowed to know a rule by its name: the registry that maps names to classes, and FED-FBD's own
NAME_KNOWERS = ("strategies/registry.py", "strategies/fbd.py")
NAME_KNOWER_PACKAGES = ("fbd/",)


# names that hold a rule's name or object: ``strategy``, ``rule``, ``rule_name(...)``, ``cfg.strategy``
RULE_NAMES = ("strategy", "rule", "rule_name")


def _is_strategy_expr(node: ast.AST) -> bool:
    """``strategy``, ``rule``, ``cfg.strategy``, ``self.run.cfg.strategy``, ``rule_name(x)``: an expression that
    holds a rule's name or object."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "rule_name"
    return (isinstance(node, ast.Name) and node.id in RULE_NAMES) or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "strategy")


def _is_string_literal(node: ast.AST, constants: frozenset[str] = frozenset()) -> bool:
    """A str constant, a tuple, list or set of them, a module-level name bound to one (``constants``), or a sum of
    those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_string_literal(node.left, constants) and _is_string_literal(node.right, constants)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)


def name_comparisons(source: str) -> list[int]:
    """Lines where a strategy expression is compared with (or tested for membership in) string literals, or in a
    module-level tuple of them (``AGR_RULES = ("krum", ...)`` ... ``rule in AGR_RULES``)."""
    tree = ast.parse(source)
    constants = frozenset(
        t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name) and node.value is not None and isinstance(node.value, (ast.Tuple, ast.List, ast.Set))
        and _is_string_literal(node.value))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_strategy_expr(s) for s in sides) and any(_is_string_literal(s, constants) for s in sides):
                lines.append(node.lineno)
    return lines


def strategy_attribute_writes(source: str) -> list[int]:
    """Lines that set an attribute of a strategy object: ``strategy.x = ...``, ``self.strategy.x += ...``,
    ``setattr(strategy, ...)``, ``del strategy.x``.
    """
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and node.args and _is_strategy_expr(node.args[0])):
            lines.append(node.lineno)
        flat: list[ast.AST] = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            else:
                flat.append(t)
        lines += [t.lineno for t in flat if isinstance(t, ast.Attribute) and _is_strategy_expr(t.value)]
    return sorted(lines)


def _modules(under: Path) -> list[Path]:
    return sorted(under.rglob("*.py"))


def test_the_checkers_see_what_they_look_for():
    assert name_comparisons('if cfg.strategy == "fbd": pass') == [1]
    assert name_comparisons('x = strategy not in ("fedavg", "fedprox")') == [1]
    assert name_comparisons('x = "krum" != self.run.cfg.strategy') == [1]
    assert name_comparisons('x = cfg.strategy == other_name\ny = c["strategy"] == "hta"') == []
    # a module-level tuple of names, and sums of them (the AGR-tailored attack knew its rules so before their tag)
    assert name_comparisons('A = ("krum", "bulyan")\nB = ["median"]\nif rule not in A + B: pass\nx = rule in A') == [3, 4]
    assert name_comparisons('if rule_name(cfg.strategy) == "median": pass\nx = rule == y') == [1]
    assert strategy_attribute_writes("strategy.equal_weights = True") == [1]
    assert strategy_attribute_writes("a, self.strategy.x = 1, 2\nsetattr(strategy, 'y', 3)\ndel strategy.z") == [1, 2, 3]
    assert strategy_attribute_writes("self.strategy = strategy\nstrategy.receive_scores(totals)") == []


def test_no_rule_name_is_compared_outside_the_registry_and_fbd():
    found = []
    for path in _modules(PACKAGE):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in NAME_KNOWERS or rel.startswith(NAME_KNOWER_PACKAGES):
            continue
        found += [f"hospitrust/{rel}:{line}" for line in name_comparisons(path.read_text())]
    assert found == [], "ask the rule's class attributes (HospitrustStrategy.stacks_updates, ...) instead:\n" + \
        "\n".join(found)


def test_no_feature_sets_an_attribute_of_a_strategy():
    found = []
    for path in _modules(PACKAGE / "features"):
        found += [f"hospitrust/features/{path.relative_to(PACKAGE / 'features').as_posix()}:{line}"
                  for line in strategy_attribute_writes(path.read_text())]
    assert found == [], "call a method the strategy declares (receive_scores, ...):\n" + \
        "\n".join(found)


EXPECTED = {  # rule -> the capabilities it has (every other one it lacks)
    "fedavg": {"stacks_updates", "weighted_mean", "central_dp_compatible", "local_dp_compatible", "secagg_compatible"},
    "fedprox": {"stacks_updates", "weighted_mean"},
    "contribution": {"stacks_updates", "weighted_mean", "local_dp_compatible", "weighs_hospitals"},
    "fbd": {"weighs_hospitals", "runs_own_evaluation"},
    "hta": {"stacks_updates", "local_dp_compatible", "weighs_hospitals"},
    "median": {"stacks_updates", "local_dp_compatible", "weighs_hospitals"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_rule_declares_what_it_can_do(name):
    from hospitrust.strategies.registry import CAPABILITIES, strategy_class

    cls = strategy_class(name)
    assert {c for c in CAPABILITIES if getattr(cls, c)} == EXPECTED[name]


def test_rules_with_a_capability_come_from_the_classes():
    from hospitrust.strategies.registry import STRATEGIES, StrategyError, rules_with

    assert rules_with("weighted_mean") == ["contribution", "fedavg", "fedprox"]
    assert rules_with("central_dp_compatible") == ["fedavg"]
    assert rules_with("agr_tailored") == ["bulyan", "krum", "median", "multi-krum", "trimmed-mean"]  # a tag that is set
    assert "fbd" not in rules_with("stacks_updates") and len(rules_with("stacks_updates")) == len(STRATEGIES) - 1
    with pytest.raises(StrategyError, match="unknown capability"):
        rules_with("flies")


def test_each_rule_names_its_own_trust_signal_and_no_reader_guesses_it():
    from hospitrust.strategies.registry import STRATEGIES, strategy_class

    named = {name: strategy_class(name).trust_signal for name in STRATEGIES if strategy_class(name).trust_signal}
    assert named == {"anchored-trust": "trust", "earn": "earn_trust", "fedagain": "trust", "fltrust": "trust",
                     "hta": "reputation"}
    # the trust plot and the console's trust series read the round record's name for it, not a list of names
    for module in ("server_app/plots.py", "console/views.py"):
        tree = ast.parse((PACKAGE / module).read_text())
        readers = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in ("trust_series", "plot_trust")]
        assert readers, module
        for reader in readers:
            strings = {n.value for n in ast.walk(reader) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            assert not strings & {"reputation", "earn_trust", "trust"}, (module, reader.name)


def test_central_dp_asks_the_round_for_equal_weights_and_other_rules_refuse():
    """Equal weights are an input of the round (central DP asks each round's intake), not a setting of the rule:
    FedAvg's aggregate of 3 and 1 examples is their plain mean when asked, their example-weighted mean otherwise;
    a rule that is not central_dp_compatible refuses, and so does central DP's wrapper around it."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from hospitrust.features.central_privacy import CentralPrivacy
    from hospitrust.privacy.options import PrivacyOptions
    from hospitrust.strategies.registry import build_strategy

    class TwoNodes:  # what configure_round asks of a grid
        def get_node_ids(self):
            return [1, 2]

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    fedavg = build_strategy("fedavg", {1: "a", 2: "b"})
    messages = sorted(fedavg.configure_round(1, ArrayRecord({"w": torch.zeros(2)}), ConfigRecord(), TwoNodes()),
                      key=lambda m: m.metadata.dst_node_id)
    replies = [Message(RecordDict({"arrays": ArrayRecord({"w": torch.full((2,), value)}),
                                   "metrics": MetricRecord({"num-examples": n, "train-loss": 0.5})}), reply_to=m)
               for (value, n), m in zip([(1.0, 3), (5.0, 1)], messages)]
    weighted = fedavg.aggregate_round(1, replies).arrays.to_torch_state_dict()["w"]
    equal = fedavg.aggregate_round(1, replies, equal_weights=True).arrays.to_torch_state_dict()["w"]
    assert weighted.tolist() == [2.0, 2.0] and equal.tolist() == [3.0, 3.0]  # (3*1 + 1*5) / 4; (1 + 5) / 2
    median = build_strategy("median", {1: "a", 2: "b"})
    with pytest.raises(ValueError, match="central_dp_compatible"):
        median.aggregate_round(1, replies, equal_weights=True)
    with pytest.raises(ValueError, match="central DP wraps a rule .* median cannot"):
        CentralPrivacy(median, PrivacyOptions(central_noise_multiplier=1.0, central_clipping_norm=1.0), 2)


def test_scores_reach_only_a_rule_that_keeps_them():
    from hospitrust.strategies.registry import build_strategy

    totals = {"a": {"fp": 1.0, "ee": 0.5}, "b": {"fp": 2.0, "ee": -0.5}}
    contribution = build_strategy("contribution", {1: "a", 2: "b"})
    contribution.receive_scores(totals)
    assert contribution.scores == {"a": 1.0, "b": 2.0}
    fedavg = build_strategy("fedavg", {1: "a", 2: "b"})
    before = dict(vars(fedavg))
    fedavg.receive_scores(totals)  # declared on the base: a no-op
    assert vars(fedavg).keys() == before.keys()


def test_the_run_config_checks_ask_the_capabilities(monkeypatch):
    from hospitrust.config import parse_run_config
    from hospitrust.errors import ConfigError
    from hospitrust.strategies.median import Median

    with pytest.raises(ConfigError, match="pre-aggregation = 'nnm' with strategy 'median': no stack here"):
        monkeypatch.setattr(Median, "stacks_updates", False)
        monkeypatch.setattr(Median, "capability_notes", {"stacks_updates": "no stack here"})
        parse_run_config({"strategy": "median", "pre-aggregation": "nnm", "min-hospitals": 4})
    monkeypatch.undo()
    monkeypatch.setattr(Median, "weighted_mean", True)
    parse_run_config({"strategy": "median", "contribution-scoring.enabled": True})

"""docs/extending.md's worked examples, taken from the page as they are: a rule with one option
(three files), an attack, a dataset source. Each is written into the package's search path, and
nothing else is edited: the registry, the run config, pyproject's run-config tables, the config
reference and the bench report must all pick it up."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO, small_run_config

DOC = REPO / "docs" / "extending.md"


def doc_files() -> dict[str, str]:
    """Path -> text of every code block of docs/extending.md whose first line names a file."""
    out = {}
    for lang, body in re.findall(r"```(python|markdown)\n(.*?)```", DOC.read_text(), re.S):
        first, _, rest = body.partition("\n")
        path = first.removeprefix("# ").removeprefix("<!-- ").removesuffix(" -->").strip()
        if path.startswith(("hospitrust/", "docs/")):
            out[path] = rest if lang == "markdown" else body
    return out


@pytest.fixture
def extension(tmp_path, monkeypatch):
    """The doc's package files in a folder on the packages' search paths; the registries searched
    again (and once more after the test, without them)."""
    import hospitrust.aggregation
    import hospitrust.attacks
    import hospitrust.datasets
    import hospitrust.features
    import hospitrust.strategies
    from hospitrust.attacks import registry as attack_registry
    from hospitrust.features import registry as feature_registry
    from hospitrust.strategies import registry as strategy_registry

    ext = tmp_path / "ext"
    for path, text in doc_files().items():
        if path.startswith("hospitrust/"):
            target = ext / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    for package in (hospitrust.aggregation, hospitrust.strategies, hospitrust.attacks, hospitrust.datasets,
                    hospitrust.features):
        folder = ext / Path(*package.__name__.split("."))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    strategy_registry.refresh()
    attack_registry.refresh()
    feature_registry.refresh()
    yield ext
    monkeypatch.undo()
    strategy_registry.refresh()
    attack_registry.refresh()
    feature_registry.refresh()


def test_the_rule_takes_three_files():
    rule_files = [p for p in doc_files() if "nearest" in p or "nearest-to-median" in p]
    assert sorted(rule_files) == ["docs/rules/nearest-to-median.md", "hospitrust/aggregation/nearest_to_median.py",
                                  "hospitrust/strategies/nearest_to_median.py"]


def test_a_rule_with_one_option_is_picked_up_everywhere(extension, tmp_path):
    from hospitrust.config import ConfigError, parse_run_config, reference
    from hospitrust.config.sections import is_hyperparameter
    from hospitrust.strategies import STRATEGIES

    # the registry
    assert "nearest-to-median" in STRATEGIES
    # the run config: its section, refused for another rule
    cfg = parse_run_config({"strategy": "nearest-to-median", "nearest-to-median.keep-fraction": 0.7})
    assert cfg.strategy_options.keep_fraction == 0.7
    with pytest.raises(ConfigError, match="nearest-to-median.keep-fraction = 0.7: an option of strategy nearest-to-median"):
        parse_run_config({"strategy": "fedavg", "nearest-to-median.keep-fraction": 0.7})
    with pytest.raises(ConfigError, match="nearest-to-median.keep-fraction"):
        parse_run_config({"strategy": "nearest-to-median", "nearest-to-median.keep-fraction": 1.5})
    # pyproject's tables, the config reference and the rule's page, generated (regenerating is not an edit)
    root = tmp_path / "project"
    (root / "docs" / "rules").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for page in (REPO / "docs" / "rules").glob("*.md"):
        shutil.copy(page, root / "docs" / "rules" / page.name)
    (root / "docs" / "rules" / "nearest-to-median.md").write_text(doc_files()["docs/rules/nearest-to-median.md"])
    reference.generate(root)
    assert "[tool.flwr.app.config.nearest-to-median]\nkeep-fraction = 0.5" in (root / "pyproject.toml").read_text()
    assert "`nearest-to-median.keep-fraction` | `0.5` |" in (root / "docs" / "config.md").read_text()
    assert "| `nearest-to-median.keep-fraction` | `0.5` |" in (root / "docs" / "rules" / "nearest-to-median.md").read_text()
    assert reference.stale(root) == []
    # the bench report: a rule's option is a variant of the rule, not a scenario
    assert is_hyperparameter("nearest-to-median.keep-fraction") and not is_hyperparameter("dirichlet.alpha")
    # its preset: selectable by name, the rule's section with the preset's value, no key of its own, a generated table
    from hospitrust.strategies import PRESETS

    assert PRESETS["nearest-to-median-strict"].rule is STRATEGIES["nearest-to-median"]
    assert parse_run_config({"strategy": "nearest-to-median-strict"}).strategy_options.keep_fraction == 0.25
    with pytest.warns(UserWarning, match="nearest-to-median.keep-fraction = 0.4 overrides the preset's 0.25"):
        assert parse_run_config({"strategy": "nearest-to-median-strict",
                                 "nearest-to-median.keep-fraction": 0.4}).strategy_options.keep_fraction == 0.4
    assert "nearest-to-median-strict" not in (root / "pyproject.toml").read_text()
    assert ("| `nearest-to-median.keep-fraction` | `0.25` | `0.5` | A quarter kept"
            in (root / "docs" / "rules" / "nearest-to-median.md").read_text())
    assert "| `nearest-to-median-strict` | `nearest-to-median` |" in (root / "docs" / "config.md").read_text()


def test_the_new_rule_runs_a_federation(extension, tmp_path, data_dir):
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records

    cfg = small_run_config(tmp_path, strategy="nearest-to-median", **{"nearest-to-median.keep-fraction": 0.5,
                                                                      "num-server-rounds": 1})
    run_inprocess(cfg, 4)
    clients = read_round_records(tmp_path / "runs" / cfg["run-name"])[0].clients
    assert sum(c.selected for c in clients) == 2 and sum(c.weight for c in clients) == pytest.approx(1.0)


def test_a_rule_written_for_the_earlier_interface_is_refused_with_what_changed():
    """Before issue 64 a rule implemented aggregate_updates(server_round, updates, num_examples, replies); a user's
    rule written so is refused when its class is defined, with the new method and where its old arguments went."""
    from hospitrust.strategies.base import Aggregate, HospitrustStrategy

    with pytest.raises(TypeError, match=r"implements aggregate_updates\(server_round.*now implements "
                                        r"aggregate\(updates, example_weights, context\).*context.server_round"):
        class OldStyle(HospitrustStrategy):  # noqa: F841 - defining it is the test
            name = "old-style"

            def aggregate_updates(self, server_round, updates, num_examples, replies) -> Aggregate:
                return Aggregate(updates.mean(dim=0), num_examples / num_examples.sum(), num_examples > 0)


def test_an_attack_is_picked_up_by_its_class(extension):
    from hospitrust.attacks import ATTACKS
    from hospitrust.attacks.threat_model import configured_attack
    from hospitrust.config import parse_run_config

    assert ATTACKS["halving"].kind == "update"
    attack = configured_attack(parse_run_config({"attack": "halving", "halving.factor": 0.25,
                                                 "attack-schedule.start-round": 1}).threat_model)
    assert attack.attack.factor == 0.25 and not attack.active(1) and attack.active(2)


def test_a_dataset_source_serves_a_federation(extension, tmp_path, monkeypatch):
    import importlib

    from hospitrust.datasets import registry
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_summary

    module = importlib.import_module("hospitrust.datasets.noise_source")
    monkeypatch.setitem(registry.SOURCES, "noise", module.NoiseSource())
    cfg = small_run_config(tmp_path, dataset="noise", **{"num-server-rounds": 1, "train-subsample": 1.0})
    run_inprocess(cfg, 3)
    summary = read_summary(tmp_path / "runs" / cfg["run-name"])
    assert summary["dataset"] == "noise" and summary["final"]["balanced_accuracy"] > 0.9  # bright vs dark is easy


def test_a_round_feature_takes_one_file_and_records_every_round(extension, tmp_path, data_dir):
    from hospitrust.features.registry import FEATURES
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_round_records, read_summary

    assert [p for p in doc_files() if p.startswith("hospitrust/features/")] == ["hospitrust/features/weight_concentration.py"]
    assert "weight-concentration" in FEATURES
    cfg = small_run_config(tmp_path, strategy="fedavg", **{"num-server-rounds": 2})
    run_inprocess(cfg, 3)
    run_dir = tmp_path / "runs" / cfg["run-name"]
    largest = []
    for rec in read_round_records(run_dir):
        weights = [c.weight for c in rec.clients if c.selected]
        shares = [w / sum(weights) for w in weights]
        assert len(shares) == 3  # FedAvg: every hospital, weighed by its example count
        concentration = rec.entries["weight_concentration"]  # the user's feature's entry, under its own name
        assert concentration["largest"] == pytest.approx(max(shares))
        assert concentration["effective_hospitals"] == pytest.approx(1 / sum(s * s for s in shares))
        assert 1.0 < concentration["effective_hospitals"] <= 3.0
        largest.append((max(shares), rec.number))
    assert read_summary(run_dir)["weight_concentration"] == pytest.approx({"largest": max(largest)[0], "round": max(largest)[1]})

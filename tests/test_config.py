"""Run config validation: every bad value fails before data is loaded, naming key, value and what is allowed."""

from __future__ import annotations

import pytest

from hospitrust.config import ConfigError, RunConfig, parse_node_config, parse_run_config


def _cfg(**kv):
    base = RunConfig().to_flat()
    base.update(kv)
    return base


def test_defaults_parse_and_round_trip():
    cfg = parse_run_config(RunConfig().to_flat())
    assert cfg.num_server_rounds == 10 and cfg.strategy == "fedavg" and cfg.dataset == "pneumoniamnist"
    assert parse_run_config(cfg.to_flat()) == cfg


def test_pyproject_run_config_matches_the_model():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    app_config = project["tool"]["flwr"]["app"]["config"]
    assert "federations" not in project["tool"]["flwr"]
    assert set(app_config) == set(RunConfig().to_flat())
    cfg = parse_run_config(app_config)
    for key, value in app_config.items():
        assert cfg.to_flat()[key] == value, key


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"strategy": "fedbest"}, ["strategy", "'fedbest'", "fedavg", "fedprox"]),
        ({"dataset": "cifar100"}, ["dataset", "'cifar100'", "pneumoniamnist", "retinamnist", "cifar10", "mnist"]),
        ({"partitioner": "random"}, ["partitioner", "'random'", "dirichlet", "specialist"]),
        ({"model": "vgg"}, ["model", "'vgg'", "small-cnn", "resnet18"]),
        ({"num-server-rounds": 0}, ["num-server-rounds", "0", "greater than or equal to 1"]),
        ({"dirichlet-alpha": 0.0}, ["dirichlet-alpha", "0.0", "greater than 0"]),
        ({"dirichlet-alpha": -1.0}, ["dirichlet-alpha", "-1.0", "greater than 0"]),
        ({"image-size": 32}, ["image-size", "32", "28, 64, 128, 224"]),
        ({"image-size": 48}, ["image-size", "48", "28, 64, 128, 224"]),
        ({"optimizer": "rmsprop"}, ["optimizer", "'rmsprop'", "sgd", "adam"]),
        ({"partitioner": "specialist"}, ["specialist-classes"]),
        ({"specialist-classes": "four:0"}, ["specialist-classes", "four:0"]),
        ({"fedrs-alpha": 1.5}, ["fedrs-alpha", "1.5", "less than or equal to 1"]),
        ({"fedrs-alpha": 0.0, "strategy": "fbd"}, ["fedrs-alpha 0.0", "strategy fbd", "leave it at 1.0"]),
    ],
)
def test_bad_values_name_key_value_and_allowed(overrides, fragments):
    with pytest.raises(ConfigError) as err:
        parse_run_config(_cfg(**overrides))
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_misspelt_key_is_named_with_a_suggestion():
    raw = _cfg()
    raw["num-server-round"] = 3
    with pytest.raises(ConfigError) as err:
        parse_run_config(raw)
    msg = str(err.value)
    assert "unknown key 'num-server-round'" in msg and "did you mean 'num-server-rounds'" in msg


def test_snake_case_keys_are_refused():
    with pytest.raises(ConfigError, match="kebab-case"):
        parse_run_config({"num_server_rounds": 3})


def test_relative_data_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_run_config(_cfg(**{"data-dir": "data"}))
    assert cfg.resolved_data_dir() == tmp_path / "data"
    monkeypatch.setenv("HOSPITRUST_DATA_DIR", str(tmp_path / "env"))
    assert parse_run_config(_cfg(**{"data-dir": ""})).resolved_data_dir() == tmp_path / "env"


def test_node_config_needs_a_data_source():
    assert parse_node_config({"partition-id": 1, "num-partitions": 3}).hospital_name == "hospital-1"
    assert parse_node_config({"data-path": "/data", "hospital": "st-marys"}).hospital_name == "st-marys"
    with pytest.raises(ConfigError, match="data-path"):
        parse_node_config({"hospital": "x"})
    with pytest.raises(ConfigError, match="partition-id 3 must be < num-partitions 3"):
        parse_node_config({"partition-id": 3, "num-partitions": 3})

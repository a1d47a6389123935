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


def test_pyproject_and_the_config_reference_are_generated_from_the_options():
    import tomllib
    from pathlib import Path

    from flwr.common.config import flatten_dict

    from hospitrust.config import reference, run_config_defaults

    root = Path(__file__).resolve().parent.parent
    assert reference.stale(root) == [], "run `hospitrust config generate` (pyproject.toml, docs/config.md, docs/rules)"
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert "federations" not in project["tool"]["flwr"]
    app_config = flatten_dict(project["tool"]["flwr"]["app"]["config"])  # as Flower flattens the sections
    assert app_config == run_config_defaults()
    # the rest lives in sections
    assert sum(1 for k in app_config if "." not in k) <= 30
    parse_run_config(app_config)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"strategy": "fedbest"}, ["strategy", "'fedbest'", "fedavg", "fedprox"]),
        ({"dataset": "cifar100"}, ["dataset", "'cifar100'", "pneumoniamnist", "retinamnist", "cifar10", "mnist"]),
        ({"partitioner": "random"}, ["partitioner", "'random'", "dirichlet", "specialist"]),
        ({"model": "vgg"}, ["model", "'vgg'", "small-cnn", "resnet18"]),
        ({"num-server-rounds": 0}, ["num-server-rounds", "0", "greater than or equal to 1"]),
        ({"dirichlet.alpha": 0.0}, ["dirichlet.alpha", "0.0", "greater than 0"]),
        ({"dirichlet.alpha": -1.0}, ["dirichlet.alpha", "-1.0", "greater than 0"]),
        ({"image-size": 32}, ["image-size", "32", "28, 64, 128, 224"]),
        ({"image-size": 48}, ["image-size", "48", "28, 64, 128, 224"]),
        ({"train.optimizer": "rmsprop"}, ["train.optimizer", "'rmsprop'", "sgd", "adam"]),
        ({"partitioner": "specialist"}, ["specialist.classes"]),
        ({"partitioner": "specialist", "specialist.classes": "four:0"}, ["specialist.classes", "four:0"]),
        ({"train.fedrs-alpha": 1.5}, ["train.fedrs-alpha", "1.5", "less than or equal to 1"]),
        ({"train.fedrs-alpha": 0.0, "strategy": "fbd"}, ["train.fedrs-alpha 0.0", "strategy fbd", "leave it at 1.0"]),
        ({"hta.exclusion-fraction": 0.4, "strategy": "krum"}, ["hta.exclusion-fraction", "selected strategy is 'krum'"]),
        ({"dirichlet.alpha": 0.1, "partitioner": "iid"}, ["dirichlet.alpha", "selected partitioner is 'iid'"]),
        ({"scaling.gamma": 3.0, "attack": "sign-flip"}, ["scaling.gamma", "selected attack is 'sign-flip'"]),
        ({"federated-evaluation-every": 0}, ["federated-evaluation-every", "greater than or equal to 1"]),
        ({"federated-evaluation-every": 2, "server-data.evaluation": "federated"},
         ["federated-evaluation-every = 2", "no server test set", "set it to 1"]),
        ({"federated-evaluation-every": 3, "contribution-scoring.enabled": True},
         ["federated-evaluation-every = 3", "contribution-scoring.enabled", "set it to 1"]),
        ({"federated-evaluation-every": 2, "strategy": "fbd"}, ["federated-evaluation-every = 2", "strategy 'fbd'"]),
    ],
)
def test_bad_values_name_key_value_and_allowed(overrides, fragments):
    with pytest.raises(ConfigError) as err:
        parse_run_config(_cfg(**overrides))
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_every_old_flat_key_still_works_with_a_deprecation_line():
    from hospitrust.config import legacy, run_config_defaults
    from hospitrust.config.sections import all_sections

    defaults, sections = run_config_defaults(), all_sections()
    needs = {"contribution": {"contribution-scoring.enabled": True}, "specialist": {"specialist.classes": "0:0"}}
    for old, new in legacy.RENAMED.items():
        section = sections[new.split(".")[0]]
        raw = {section.kind: section.name} if section.kind != "service" else {}
        raw.update(needs.get(section.name, {}))
        raw[old] = defaults[new] if old != "specialist-classes" else "0:0"
        with pytest.warns(FutureWarning, match=f"'{old}' is deprecated: it is now '{new}'"):
            cfg = parse_run_config(raw)
        assert cfg.to_flat()[new] == raw[old], old


def test_a_shared_old_key_goes_to_the_selected_component():
    with pytest.warns(FutureWarning, match="'dirichlet-alpha' is deprecated: it is now 'specialist.alpha'"):
        cfg = parse_run_config({"partitioner": "specialist", "specialist.classes": "4:0", "dirichlet-alpha": 0.2})
    assert cfg.options("specialist").alpha == 0.2
    with pytest.warns(FutureWarning, match="'attack-copy-noise' is deprecated: it is now 'ipm.copy-noise'"):
        cfg = parse_run_config({"attack": "sybil", "sybil.base": "ipm", "attack-copy-noise": 0.3})
    assert cfg.options("ipm").copy_noise == 0.3
    with pytest.raises(ConfigError, match="hta.exclusion-fraction = 0.4: an option of strategy hta"):
        with pytest.warns(FutureWarning):
            parse_run_config({"strategy": "krum", "hta-kappa": 0.4})


def test_explicit_keys_of_an_unselected_component_are_refused_even_at_their_default():
    parse_run_config({"strategy": "krum", "hta.exclusion-fraction": 0.5})  # pyproject's default for every section
    with pytest.raises(ConfigError, match="selected strategy is 'krum'"):
        parse_run_config({"strategy": "krum", "hta.exclusion-fraction": 0.5}, explicit={"hta.exclusion-fraction"})


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


def test_a_bad_node_config_says_which_key_and_leaves_its_value_on_the_hospital():
    """A node config's values are the hospital's paths: its error's public text (what a reply may
    carry) names the key and the problem; the detail (the hospital's own log) also the value.
    """
    with pytest.raises(ConfigError) as err:
        parse_node_config({"data-path": "/srv/ACC-99812", "hospital": "x", "skip-unreadable": 1.5})
    public, detail = str(err.value), err.value.detail
    assert "skip-unreadable: " in public and "skip-unreadable = 1.5" in detail and "1.5" not in public
    with pytest.raises(ConfigError) as err:
        parse_node_config({"data-path": "/srv/ACC-99812", "cache-dri": "/srv/c"})
    assert "did you mean 'cache-dir'" in str(err.value) and "/srv" not in str(err.value)
    assert parse_node_config({"data-path": "/d", "skip-unreadable": 0.05}).skip_unreadable == 0.05
    assert parse_node_config({"data-path": "/d"}).skip_unreadable == 0.0  # default: any unreadable file leaves it out


def test_a_section_is_read_by_its_options_class_and_a_class_of_no_section_is_named():
    from hospitrust.contribution.options import ContributionScoringOptions
    from hospitrust.features.secagg_options import SecAggOptions
    from hospitrust.options import Options
    from hospitrust.privacy.options import PrivacyOptions

    cfg = parse_run_config({"privacy.mode": "local", "secagg.enabled": True, "contribution-scoring.enabled": True})
    assert cfg.section(PrivacyOptions) is cfg.options("privacy") and cfg.section(PrivacyOptions).mode == "local"
    assert cfg.section(SecAggOptions).enabled and cfg.section(ContributionScoringOptions).enabled

    class Stray(Options):
        """No section has these options."""

    with pytest.raises(KeyError, match="Stray is the options of 0 run config sections"):
        cfg.section(Stray)


def test_memoised_options_equal_a_fresh_parse_keep_each_values_type_and_raise_every_time():
    """Options.from_flat memoises frozen models (a grid parses the same sections thousands of times): each
    result equals a fresh validation of the same keys, 1 and True stay different inputs, a bad value fails
    on every call."""
    from hospitrust.config.run import CoreOptions
    from hospitrust.options import OptionsError

    for value in (3, 3.0, "3", True, 1):
        first = CoreOptions.from_flat({"num-server-rounds": value, "strategy": "median"})
        assert first is CoreOptions.from_flat({"strategy": "median", "num-server-rounds": value})  # memoised
        fresh = CoreOptions._from_flat({"num-server-rounds": value, "strategy": "median"})
        assert first == fresh and first.model_fields_set == fresh.model_fields_set
    assert CoreOptions.from_flat({"num-server-rounds": True}) is not CoreOptions.from_flat({"num-server-rounds": 1})
    for _ in range(2):
        with pytest.raises(OptionsError, match="num-server-rounds"):
            CoreOptions.from_flat({"num-server-rounds": "many"})

"""Every published form and ablation is a preset (issue 31): named option values over one rule.

The behaviour record: before the variant subclasses were removed, each one's default options
(``OLD_DEFAULTS``, here) and its aggregate on fixed synthetic input over two rounds
(``_fingerprint`` below; the numbers in ``golden/preset_aggregates.json``) were written down from
the code of commit d43dd7e: the presets must give exactly those. The base rules whose attributes
were renamed to their option names (hta, earn, fedagain, centered-clipping, contribution) are
recorded the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_close_by_norm, flat_entry, jitter
from hospitrust.strategies import build_strategy
from hospitrust.strategies.intake import round_context

#: each variant subclass's ``Options().to_flat()`` at commit d43dd7e
HTA_PUBLISHED = {"direction-exponent": 1.0, "magnitude-exponent": 1.0, "validation-exponent": 1.0, "ema-rate": 0.3,
                 "variance-penalty": 1.0, "exclusion-mads": 2.0, "exclusion-fraction": 0.5, "clip-to-median-norm": False,
                 "magnitude-tolerance": 1.0, "duplicate-cosine": 0.999, "ablation.trim-norms": False,
                 "ablation.merge-duplicates": False}
FEDAGAIN_PUBLISHED = {"benchmark": "client", "divergence": "l2", "divergence-quantile": 0.0, "error-quantile": 0.0,
                      "error-floor": 0.0, "eps-placement": "product", "flag-low-trust": False}
OLD_DEFAULTS = {
    "hta-published": HTA_PUBLISHED,
    "hta-published-no-m": {**HTA_PUBLISHED, "magnitude-exponent": 0.0},
    "hta-published-no-memory": {**HTA_PUBLISHED, "ema-rate": 1.0, "variance-penalty": 0.0},
    "hta-published-no-direction": {**HTA_PUBLISHED, "direction-exponent": 0.0},
    "earn-published": {"evidence": "reported", "agreement": "blend", "nonholder-weight": 1.0, "row-cap": 0.5,
                       "clip-rows": "update", "history-rounds": 3, "agree-threshold": 0.1, "audit": True,
                       "audit-by": "row-shift-free", "rare-classes": "", "rare-fraction": 0.6, "rare-by": "holders",
                       "holder-min-count": 20, "base": "hta", "ablation.nonholder-by-peers": True,
                       "ablation.excuse-direction": True},
    "fedagain-published": FEDAGAIN_PUBLISHED,
    "fedagain-authors-code": {**FEDAGAIN_PUBLISHED, "divergence": "cosine", "eps-placement": "factors"},
}

#: each rule's (update, weights, selected) per round on the input of ``_fingerprint``, at commit d43dd7e (a data file)
OLD_AGGREGATES = json.loads((Path(__file__).parent / "golden" / "preset_aggregates.json").read_text())["aggregates"]

COUNTS = [[100, 25, 19], [100, 30, 0], [100, 5, 50], [100, 0, 0], [80, 22, 3]]


def _fingerprint(name, rel_jitter=0.0):
    """Two rounds of five hospitals on a linear head (weight (3, 2), bias (3,)): reported class counts
    (EARN) and benchmark errors (FedAgain) in the replies, one update four times larger. ``rel_jitter``
    moves the updates and benchmark errors by that much, relative (the any-CPU guard)."""
    n = 5
    s = build_strategy(name, {100 + i: f"h{i}" for i in range(n)})
    s.global_state = {"fc.weight": torch.zeros(3, 2), "fc.bias": torch.zeros(3)}
    gen = torch.Generator().manual_seed(7)
    out = []
    for rnd in (1, 2):
        u = torch.randn(n, 9, generator=gen) * torch.tensor([0.1, 0.2, 0.1, 0.3, 0.1, 0.2, 0.05, 0.1, 0.2])
        u[4] *= 4.0
        u = jitter(u, rel_jitter, seed=rnd)
        errors = jitter(torch.tensor([0.1 + 0.07 * i for i in range(n)], dtype=torch.float64), rel_jitter, seed=10 + rnd)
        replies = [SimpleNamespace(node_id=100 + i, metrics={"class-counts": COUNTS[i], "benchmark-error": float(errors[i])})
                   for i in range(n)]
        agg = s.aggregate(u, torch.tensor([10.0, 20, 30, 40, 50], dtype=torch.float64), round_context(s, rnd, replies))
        out.append(([round(float(x), 12) for x in agg.update], [round(float(x), 12) for x in agg.weights],
                    [bool(x) for x in agg.selected]))
    return out


@pytest.mark.parametrize("name", sorted(OLD_DEFAULTS))
def test_each_variant_resolves_to_the_old_subclass_defaults(name):
    assert build_strategy(name, {1: "a", 2: "b"}).options.to_flat() == OLD_DEFAULTS[name]


def assert_aggregates_as_recorded(name, got):
    """The same hospitals selected, update and weights within the float32 arithmetic's tolerance (by norm)."""
    for rnd, ((update, weights, selected), (old_update, old_weights, old_selected)) in enumerate(
            zip(got, OLD_AGGREGATES[name], strict=True), start=1):
        assert selected == old_selected, f"{name} round {rnd}: selected {selected}, recorded {old_selected}"
        assert_close_by_norm(update, old_update, f"{name} round {rnd}: the aggregate")
        assert_close_by_norm(weights, old_weights, f"{name} round {rnd}: the weights")


@pytest.mark.parametrize("name", sorted(OLD_AGGREGATES))
def test_each_variant_and_renamed_rule_aggregates_as_before(name, input_jitter):
    assert_aggregates_as_recorded(name, _fingerprint(name, input_jitter))


@pytest.mark.parametrize("name", ["hta", "earn", "fedagain"])
def test_a_change_of_1e_4_in_a_rules_output_fails_the_comparison(name, monkeypatch):
    """The tolerance is no blanket: the rule's aggregate moved by 1e-4 (on each coordinate) is told apart."""
    cls = type(build_strategy(name, {1: "a", 2: "b"}))
    aggregate = cls.aggregate

    def nudged(self, *args, **kwargs):
        out = aggregate(self, *args, **kwargs)
        out.update.add_(1e-4)
        return out

    monkeypatch.setattr(cls, "aggregate", nudged)
    with pytest.raises(AssertionError, match="the aggregate: differs from the record"):
        assert_aggregates_as_recorded(name, _fingerprint(name))


# ---- the registry: rules and presets ------------------------------------------------------------
RULES = ["anchored-trust", "bulyan", "caf", "centered-clipping", "clipped-clustering", "contribution", "dnc", "earn", "fbd", "fedagain",
         "fedavg", "fedprox", "flame", "fltrust", "foolsgold", "geometric-median", "hta", "krum", "mda", "median", "monna",
         "multi-krum", "sentinel", "signguard", "smea", "trimmed-mean"]


def test_the_registry_holds_twenty_six_rules_and_the_seven_variants_as_presets():
    from hospitrust.strategies import PRESETS, STRATEGIES, strategy_class, strategy_names

    assert list(STRATEGIES) == RULES
    assert sorted(PRESETS) == sorted(OLD_DEFAULTS)
    assert strategy_names() == sorted(RULES + list(OLD_DEFAULTS))  # every name selectable before still is
    assert {name: p.rule.name for name, p in PRESETS.items()} == {
        "earn-published": "earn", "fedagain-authors-code": "fedagain", "fedagain-published": "fedagain",
        "hta-published": "hta", "hta-published-no-direction": "hta", "hta-published-no-m": "hta",
        "hta-published-no-memory": "hta"}
    for name, preset in PRESETS.items():
        assert strategy_class(name) is preset.rule is STRATEGIES[preset.rule.name]


def test_no_rule_subclass_exists_only_to_change_defaults():
    """A registered class whose parent is registered too must do something of its own (Krum sizes
    Multi-Krum's selection to one; FedProx sends the proximal term), not only declare values."""
    from hospitrust.strategies import STRATEGIES

    declarations = {"name", "Options", "options", "__doc__", "__module__", "__annotations__", "__qualname__",
                    "__firstlineno__", "__static_attributes__", "__parameters__", "_abc_impl"}
    registered = set(STRATEGIES.values())
    for name, cls in STRATEGIES.items():
        for parent in cls.__mro__[1:]:
            if parent in registered:
                assert set(vars(cls)) - declarations, f"{name} only re-declares {parent.name}'s defaults: make it a preset"


def test_attributes_are_the_options_not_copies_under_other_names():
    hta = build_strategy("hta", {1: "a", 2: "b"})
    earn = build_strategy("earn", {1: "a", 2: "b"})
    fedagain = build_strategy("fedagain", {1: "a", 2: "b"})
    clipping = build_strategy("centered-clipping", {1: "a", 2: "b"})
    copies = {hta: ("a", "b", "c", "rate", "lam", "kappa", "clip", "variance_penalty", "magnitude_tolerance",
                    "merge_duplicates", "duplicate_cosine", "trim_norms"),
              earn: ("mode", "cap", "history_len", "evidence_source", "rare_by", "audit", "audit_by", "base",
                     "holder_min_count", "nonholder_weight", "rare_fraction", "agree_threshold", "excuse_direction"),
              fedagain: ("benchmark", "divergence", "divergence_quantile", "error_quantile", "error_floor",
                         "eps_placement", "flag_low_trust"),
              clipping: ("tau", "iters")}
    for strategy, names in copies.items():
        assert not [n for n in names if n in vars(strategy)], type(strategy).__name__
    # the rule reads its options; what it derives says so in its name
    assert hta.norm_trim_tolerance == hta.options.magnitude_tolerance == 2.0
    assert earn.audit_in_effect is False  # earn.audit, but no reference cohort callable here
    assert earn.options.history_rounds == 3 and earn.history_rounds == {}  # the option, and the per-hospital state


# ---- the run config: a preset is its rule's section with the preset's values --------------------
@pytest.mark.parametrize("name", sorted(OLD_DEFAULTS))
def test_each_preset_through_the_run_config_as_the_serverapp_sees_it(name):
    """Flower hands the ServerApp every key at pyproject's default (the rule's section at the rule's
    defaults): the preset's values still win, and the run records them under the rule's section."""
    from hospitrust.config import parse_run_config, run_config_defaults
    from hospitrust.strategies.registry import rule_name

    rule = rule_name(name)
    for raw in ({"strategy": name}, {**run_config_defaults(), "strategy": name}):
        cfg = parse_run_config(raw)
        assert cfg.strategy == name and cfg.strategy_options.to_flat() == OLD_DEFAULTS[name]
        assert cfg.options(rule).to_flat() == OLD_DEFAULTS[name] and rule in cfg.active_sections()
        assert {k[len(rule) + 1:]: v for k, v in cfg.to_flat().items() if k.startswith(f"{rule}.")} == OLD_DEFAULTS[name]
        assert cfg.preset_overrides == {}
    # config.json's record reads back as the same run
    assert parse_run_config(cfg.to_flat()) == cfg


def test_a_value_set_in_the_rules_section_overrides_the_preset_and_is_recorded():
    from hospitrust.config import parse_run_config

    with pytest.warns(UserWarning, match=r"strategy hta-published: hta.ema-rate = 0.5 overrides the preset's 0.3|"
                                         r"hta.direction-exponent = 2.0 overrides the preset's 1.0"):
        cfg = parse_run_config({"strategy": "hta-published", "hta.direction-exponent": 2.0, "hta.exclusion-fraction": 0.4})
    opts = cfg.strategy_options
    assert (opts.direction_exponent, opts.exclusion_fraction, opts.magnitude_tolerance) == (2.0, 0.4, 1.0)
    assert cfg.preset_overrides == {"direction-exponent": (1.0, 2.0)}  # exclusion-fraction is not the preset's
    # earn-threshold's cells: the published EARN with another holder threshold
    with pytest.warns(UserWarning, match="earn.holder-min-count = 10 overrides the preset's 20"):
        cfg = parse_run_config({"strategy": "earn-published", "earn.holder-min-count": 10})
    assert (cfg.strategy_options.evidence, cfg.strategy_options.holder_min_count) == ("reported", 10)
    # a bad override names the rule's key
    with pytest.raises(Exception, match="earn.holder-min-count = -1"):
        parse_run_config({"strategy": "earn-published", "earn.holder-min-count": -1})


def test_the_rules_default_cannot_override_a_preset_and_is_refused_where_the_set_keys_are_known():
    from hospitrust.config import ConfigError, parse_run_config
    from hospitrust.config.run import preset_key_problems

    raw = {"strategy": "earn-published", "earn.holder-min-count": 0}  # 0 is earn's default
    # the ServerApp cannot tell it from unset: the preset's value stands (docs/rules/README.md says so)
    assert parse_run_config(raw).strategy_options.holder_min_count == 20
    with pytest.raises(ConfigError, match="earn.holder-min-count = 0: earn's default, which the ServerApp cannot tell "
                                          "from unset, so it cannot override preset earn-published's 20; select "
                                          "strategy = 'earn'"):
        parse_run_config(raw, explicit=set(raw))  # hospitrust simulate -c
    assert preset_key_problems(raw, {"earn.holder-min-count"})[0].startswith("earn.holder-min-count = 0: earn's default")
    assert preset_key_problems(raw, {"strategy"}) == [] and preset_key_problems({"strategy": "earn"}, {"strategy"}) == []


def test_a_bench_grid_refuses_a_cell_that_sets_the_rules_default_over_a_preset(tmp_path):
    from hospitrust.bench.grid import GridError, parse_grid

    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\nname = "g"\n[axes]\nrule = [\n'
                    '  { label = "ten", strategy = "earn-published", "earn.holder-min-count" = 10 },\n'
                    '  { label = "zero", strategy = "earn-published", "earn-published.holder-min-count" = 0 },\n]\n')
    with pytest.raises(GridError, match=r"(?s)1 problem.*cell rule=zero: earn.holder-min-count = 0: earn's default"):
        parse_grid(grid, validate=False)
    grid.write_text(grid.read_text().replace('"earn-published.holder-min-count" = 0', '"earn.holder-min-count" = 40'))
    with pytest.warns(UserWarning, match="overrides the preset's 20") as said:
        cells = parse_grid(grid, validate=True).cells
    assert sorted(str(w.message).split(": ", 1)[1] for w in said) == [
        "earn.holder-min-count = 10 overrides the preset's 20", "earn.holder-min-count = 40 overrides the preset's 20"]
    assert [c.run_config["earn.holder-min-count"] for c in cells] == [10, 40]


# ---- the sections the presets had: old keys ---------------------------------------------------
def test_a_key_of_a_presets_former_section_is_translated_where_the_preset_is_selected():
    from hospitrust.config import legacy, parse_run_config

    with pytest.warns(FutureWarning, match="'hta-published-no-m.ema-rate' is deprecated: hta-published-no-m is a "
                                           "preset of hta now, so it is 'hta.ema-rate'"):
        cfg = parse_run_config({"strategy": "hta-published-no-m", "hta-published-no-m.ema-rate": 0.5})
    assert (cfg.strategy_options.ema_rate, cfg.strategy_options.magnitude_exponent) == (0.5, 0.0)
    # an old config.json of such a run (every key of the preset's section, at its values) is the same run
    old = {"strategy": "fedagain-authors-code", **{f"fedagain-authors-code.{k}": v for k, v in
                                                   OLD_DEFAULTS["fedagain-authors-code"].items()}}
    with pytest.warns(FutureWarning):
        assert parse_run_config(old) == parse_run_config({"strategy": "fedagain-authors-code"})
    assert legacy.new_names("earn-published.holder-min-count") == ["earn.holder-min-count"]
    assert legacy.translate_keys({"earn-published.rare-by"}, {"strategy": "earn-published"}) == {"earn.rare-by"}
    assert ("hta-published.*", 'hta.* (with strategy = "hta-published", a preset of hta)') in legacy.old_key_table()


def test_a_key_of_a_presets_former_section_is_refused_with_another_strategy():
    from hospitrust.config import ConfigError, parse_run_config
    from hospitrust.config.run import restrict_to_active

    with pytest.raises(ConfigError, match="hta-published.ema-rate = 0.5: hta-published is a preset of hta now, with no "
                                          "section of its own, and the selected strategy is 'hta': with strategy = "
                                          "'hta-published' write hta.ema-rate, or remove the key"):
        parse_run_config({"strategy": "hta", "hta-published.ema-rate": 0.5})
    # a grid's shared key applies where it is relevant: inactive for another strategy, as before
    assert "hta-published.ema-rate" not in restrict_to_active({"strategy": "hta", "hta-published.ema-rate": 0.5})


# ---- each preset's page: its table, generated from the preset -----------------------------------
@pytest.mark.parametrize("name", sorted(OLD_DEFAULTS))
def test_each_presets_page_has_its_table_generated_from_the_preset(name):
    from conftest import REPO
    from hospitrust.config.reference import PRESET_MARKER, preset_table, render_rule_page
    from hospitrust.strategies import PRESETS

    page = (REPO / "docs" / "rules" / f"{name}.md").read_text()
    assert [m.group("name") for m in PRESET_MARKER.finditer(page)] == [name]
    assert render_rule_page(page) == page  # `hospitrust config check` fails on a stale one (tests/test_config.py)
    table = preset_table(PRESETS[name])
    assert "\n".join(table) in page
    rule = PRESETS[name].rule.name
    rows = [row for row in table if row.startswith(f"| `{rule}.")]
    assert len(rows) == len(PRESETS[name].settings)
    for key, (value, _) in PRESETS[name].settings.items():  # each value as the old subclass's default
        assert value == OLD_DEFAULTS[name][key]


def test_a_preset_is_checked_when_declared():
    from hospitrust.strategies import STRATEGIES, Preset

    hta = STRATEGIES["hta"]
    with pytest.raises(ValueError, match="preset x: ema-rat are not options of hta"):
        Preset("x", hta, "A typo.", {"ema-rat": (0.5, "")})
    with pytest.raises(ValueError, match="preset x: ema-rate = 2.0"):
        Preset("x", hta, "Out of bounds.", {"ema-rate": (2.0, "")})


# ---- a preset with an override in a real in-process run ----------------------------------------
def test_a_preset_with_an_override_in_a_real_inprocess_run(tmp_path, data_dir):
    from conftest import small_run_config
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_config, read_round_records

    cfg = small_run_config(tmp_path, **{"strategy": "hta-published-no-direction", "num-server-rounds": 1,
                                        "train-subsample": 0.03, "hta.validation-exponent": 0.0, "hta.ema-rate": 0.5,
                                        "hta.magnitude-tolerance": 1.5})
    with pytest.warns(UserWarning, match="hta.magnitude-tolerance = 1.5 overrides the preset's 1.0"):
        run_inprocess(cfg, 3)
    run_dir = tmp_path / "runs" / cfg["run-name"]
    recorded = read_config(run_dir)
    assert recorded["strategy"] == "hta-published-no-direction"
    assert (recorded["hta.direction-exponent"], recorded["hta.magnitude-tolerance"], recorded["hta.ema-rate"],
            recorded["hta.clip-to-median-norm"]) == (0.0, 1.5, 0.5, False)
    (rec,) = read_round_records(run_dir)
    assert not rec.kept_previous_model, rec.note
    # a = 0 and c = 0: tau = m, and the first round's reputation is tau
    for c in map(flat_entry, rec.clients):  # the rule's signals beside the common fields
        assert c["tau"] == pytest.approx(c["m"]) and c["reputation"] == pytest.approx(c["tau"])

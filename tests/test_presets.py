"""Every published form and ablation is a preset (issue 31): named option values over one rule.

The behaviour record: before the variant subclasses were removed, each one's default options and
its aggregate on fixed synthetic input over two rounds (``_fingerprint`` below) were written down
here from the code of commit d43dd7e: the presets must give exactly those. The base rules whose
attributes were renamed to their option names (hta, earn, fedagain, centered-clipping,
contribution) are recorded the same way.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hospitrust.strategies import build_strategy

#: each variant subclass's ``Options().to_flat()`` at commit d43dd7e
OLD_DEFAULTS = {'hta-published': {'direction-exponent': 1.0,
                   'magnitude-exponent': 1.0,
                   'validation-exponent': 1.0,
                   'ema-rate': 0.3,
                   'variance-penalty': 1.0,
                   'exclusion-mads': 2.0,
                   'exclusion-fraction': 0.5,
                   'clip-to-median-norm': False,
                   'magnitude-tolerance': 1.0,
                   'duplicate-cosine': 0.999,
                   'ablation.trim-norms': False,
                   'ablation.merge-duplicates': False},
 'hta-published-no-m': {'direction-exponent': 1.0,
                        'magnitude-exponent': 0.0,
                        'validation-exponent': 1.0,
                        'ema-rate': 0.3,
                        'variance-penalty': 1.0,
                        'exclusion-mads': 2.0,
                        'exclusion-fraction': 0.5,
                        'clip-to-median-norm': False,
                        'magnitude-tolerance': 1.0,
                        'duplicate-cosine': 0.999,
                        'ablation.trim-norms': False,
                        'ablation.merge-duplicates': False},
 'hta-published-no-memory': {'direction-exponent': 1.0,
                             'magnitude-exponent': 1.0,
                             'validation-exponent': 1.0,
                             'ema-rate': 1.0,
                             'variance-penalty': 0.0,
                             'exclusion-mads': 2.0,
                             'exclusion-fraction': 0.5,
                             'clip-to-median-norm': False,
                             'magnitude-tolerance': 1.0,
                             'duplicate-cosine': 0.999,
                             'ablation.trim-norms': False,
                             'ablation.merge-duplicates': False},
 'hta-published-no-direction': {'direction-exponent': 0.0,
                                'magnitude-exponent': 1.0,
                                'validation-exponent': 1.0,
                                'ema-rate': 0.3,
                                'variance-penalty': 1.0,
                                'exclusion-mads': 2.0,
                                'exclusion-fraction': 0.5,
                                'clip-to-median-norm': False,
                                'magnitude-tolerance': 1.0,
                                'duplicate-cosine': 0.999,
                                'ablation.trim-norms': False,
                                'ablation.merge-duplicates': False},
 'earn-published': {'evidence': 'reported',
                    'agreement': 'blend',
                    'nonholder-weight': 1.0,
                    'row-cap': 0.5,
                    'clip-rows': 'update',
                    'history-rounds': 3,
                    'agree-threshold': 0.1,
                    'audit': True,
                    'audit-by': 'row-shift-free',
                    'rare-classes': '',
                    'rare-fraction': 0.6,
                    'rare-by': 'holders',
                    'holder-min-count': 20,
                    'base': 'hta',
                    'ablation.nonholder-by-peers': True,
                    'ablation.excuse-direction': True},
 'fedagain-published': {'benchmark': 'client',
                        'divergence': 'l2',
                        'divergence-quantile': 0.0,
                        'error-quantile': 0.0,
                        'error-floor': 0.0,
                        'eps-placement': 'product',
                        'flag-low-trust': False},
 'fedagain-authors-code': {'benchmark': 'client',
                           'divergence': 'cosine',
                           'divergence-quantile': 0.0,
                           'error-quantile': 0.0,
                           'error-floor': 0.0,
                           'eps-placement': 'factors',
                           'flag-low-trust': False}}

#: each rule's (update, weights, selected) per round on the input of ``_fingerprint``, at commit d43dd7e
OLD_AGGREGATES = {'hta': [([0.034285791218,
           -0.250807315111,
           -0.056875430048,
           0.232182338834,
           0.017064975575,
           -0.049371276051,
           0.005723866634,
           -0.049418665469,
           -0.16631038487],
          [0.0, 0.264361791254, 0.324529471244, 0.411108737502, 0.0],
          [False, True, True, True, False]),
         ([-0.015371501446,
           -0.119754053652,
           -0.077973023057,
           0.202699184418,
           0.020595805719,
           -0.026134731248,
           0.008380177431,
           -0.125355437398,
           -0.133408039808],
          [0.0, 0.190285516761, 0.353884889143, 0.455829594096, 0.0],
          [False, True, True, True, False])],
 'earn': [([0.034285791218,
            -0.250807315111,
            -0.056875430048,
            0.232182338834,
            0.028677569702,
            -0.043984726071,
            0.005723866634,
            -0.049418665469,
            -0.129437565804],
           [0.0, 0.264361791254, 0.324529471244, 0.411108737502, 0.0],
           [False, True, True, True, False]),
          ([-0.015371501446,
            -0.119754053652,
            -0.077973023057,
            0.202699184418,
            0.039834361523,
            0.001693877159,
            0.008380177431,
            -0.125355452299,
            -0.069214515388],
           [0.0, 0.190285516761, 0.353884889143, 0.455829594096, 0.0],
           [False, True, True, True, False])],
 'fedagain': [([-0.044190824032,
                -0.127561420202,
                0.002805247903,
                0.050686478615,
                0.055527631193,
                -0.01749539189,
                -0.003317284863,
                -0.105523735285,
                -0.036460615695],
               [0.253794678749, 0.253794678749, 0.253794678749, 0.194831359796, 0.043784603956],
               [True, True, True, True, True]),
              ([-0.003540628823,
                -0.190508902073,
                -0.043854188174,
                0.215619891882,
                0.049670763314,
                -0.019744886085,
                0.0036790187,
                -0.131760179996,
                -0.090673401952],
               [0.272035095109, 0.272035095109, 0.208147087597, 0.210608292447, 0.037174429738],
               [True, True, True, True, True])],
 'centered-clipping': [([-0.06025005132,
                         -0.115169860423,
                         0.001685226802,
                         0.04869709909,
                         0.052064005286,
                         -0.015357720666,
                         -0.00495644426,
                         -0.10019697994,
                         -0.01373414509],
                        [0.234481408385, 0.234481408385, 0.234481408385, 0.232506128496, 0.064049646349],
                        [True, True, True, True, True]),
                       ([-0.015497730114,
                         -0.196715980768,
                         -0.032863140106,
                         0.196831211448,
                         0.057726290077,
                         -0.006388876587,
                         0.000845992006,
                         -0.131574645638,
                         -0.071258813143],
                        [0.237660520466, 0.237660520466, 0.233785674732, 0.237660520466, 0.053232763871],
                        [True, True, True, True, True])],
 'contribution': [([-0.378776162863,
                    -0.085592858493,
                    0.054722867906,
                    0.076143503189,
                    0.221337139606,
                    -0.028120182455,
                    -0.029591973871,
                    -0.312890857458,
                    0.215930819511],
                   [0.066666666667, 0.133333333333, 0.2, 0.266666666667, 0.333333333333],
                   [True, True, True, True, True]),
                  ([-0.048420585692,
                    -0.432879030704,
                    0.038458958268,
                    0.410135418177,
                    0.230720713735,
                    0.224972993135,
                    -0.056593526155,
                    -0.198323920369,
                    0.207941636443],
                   [0.066666666667, 0.133333333333, 0.2, 0.266666666667, 0.333333333333],
                   [True, True, True, True, True])],
 'hta-published': [([0.037779215723,
                     -0.248686432838,
                     -0.055856101215,
                     0.23317758739,
                     0.017933644354,
                     -0.051911570132,
                     0.005085381679,
                     -0.048259984702,
                     -0.17101752758],
                    [0.0, 0.255004321093, 0.339650662291, 0.405345016615, 0.0],
                    [False, True, True, True, False]),
                   ([-0.020805798471,
                     -0.228802934289,
                     -0.049445323646,
                     0.249898672104,
                     0.062772877514,
                     0.021882060915,
                     0.001508649555,
                     -0.151276320219,
                     -0.091227665544],
                    [0.0, 0.142752412543, 0.361961449064, 0.430662807673, 0.064623330721],
                    [True, True, True, True, True])],
 'hta-published-no-m': [([-0.176284074783,
                          -0.173559769988,
                          -0.002908187918,
                          0.173570469022,
                          0.130276799202,
                          -0.03661396727,
                          -0.007563196123,
                          -0.190264895558,
                          0.020718036219],
                         [0.0, 0.258270441491, 0.259474305646, 0.3122919229, 0.169963329964],
                         [True, True, True, True, True]),
                        ([-0.035597719252,
                          -0.321945786476,
                          -0.00954435952,
                          0.332477480173,
                          0.143493190408,
                          0.121754780412,
                          -0.027325645089,
                          -0.174341604114,
                          0.055304720998],
                         [0.0, 0.143902573922, 0.293478082512, 0.368999042957, 0.193620300609],
                         [False, True, True, True, True])],
 'hta-published-no-memory': [([0.037779215723,
                               -0.248686432838,
                               -0.055856101215,
                               0.23317758739,
                               0.017933644354,
                               -0.051911570132,
                               0.005085381679,
                               -0.048259984702,
                               -0.17101752758],
                              [0.0, 0.255004321093, 0.339650662291, 0.405345016615, 0.0],
                              [False, True, True, True, False]),
                             ([-0.00794650428,
                               -0.209809228778,
                               -0.062095232308,
                               0.175400272012,
                               0.020133005455,
                               -0.038992859423,
                               0.022519525141,
                               -0.140658795834,
                               -0.192987576127],
                              [0.144961072938, 0.07108874198, 0.35466371609, 0.429286468992, 0.0],
                              [True, True, True, True, False])],
 'hta-published-no-direction': [([0.029813602567,
                                  -0.223296776414,
                                  -0.044629052281,
                                  0.16908210516,
                                  0.002743266523,
                                  -0.047868873924,
                                  -0.003333436791,
                                  -0.0418625772,
                                  -0.139217227697],
                                 [0.101895716339, 0.159866838396, 0.31791785372, 0.420319591546, 0.0],
                                 [True, True, True, True, False]),
                                ([-0.010677993298,
                                  -0.161709368229,
                                  -0.07334394753,
                                  0.197943165898,
                                  0.022007662803,
                                  -0.036767009646,
                                  0.014412347227,
                                  -0.136367514729,
                                  -0.162173211575],
                                 [0.111613504766, 0.167505380796, 0.288047498998, 0.43283361544, 0.0],
                                 [True, True, True, True, False])],
 'earn-published': [([0.034285791218,
                      -0.250807315111,
                      -0.056875430048,
                      0.232182338834,
                      0.017064975575,
                      -0.049371276051,
                      0.005723866634,
                      -0.049418665469,
                      -0.16631038487],
                     [0.0, 0.264361791254, 0.324529471244, 0.411108737502, 0.0],
                     [False, True, True, True, False]),
                    ([-0.015371501446,
                      -0.119754053652,
                      -0.077973023057,
                      0.202699184418,
                      0.020772825927,
                      -0.02567647025,
                      0.008380177431,
                      -0.125355437398,
                      -0.134223178029],
                     [0.0, 0.190285516761, 0.353884889143, 0.455829594096, 0.0],
                     [False, True, True, True, False])],
 'fedagain-published': [([-0.054454475641,
                          -0.092966593802,
                          0.016712527722,
                          -0.037749830633,
                          0.044719576836,
                          0.008964467794,
                          -0.00214211829,
                          -0.108979843557,
                          0.012203419581],
                         [0.395697407879, 0.29671809429, 0.158532944005, 0.12170148407, 0.027350069755],
                         [True, True, True, True, True]),
                        ([0.004116419703,
                          -0.190337136388,
                          -0.042016651481,
                          0.182196930051,
                          0.040959641337,
                          -0.041450433433,
                          0.009505973198,
                          -0.126937314868,
                          -0.116677507758],
                         [0.429910610086, 0.255388120485, 0.137062428194, 0.153159913062, 0.024478928173],
                         [True, True, True, True, True])],
 'fedagain-authors-code': [([-0.137655109167,
                             -0.064815580845,
                             0.037524431944,
                             -0.055454488844,
                             0.085995770991,
                             0.004860920366,
                             -0.012184655294,
                             -0.159750029445,
                             0.081871822476],
                            [0.386003590465, 0.227061870519, 0.16083576756, 0.124518130748, 0.101580640709],
                            [True, True, True, True, True]),
                           ([-0.005223012529,
                             -0.265646576881,
                             -0.013560811058,
                             0.232079833746,
                             0.089102394879,
                             0.021718256176,
                             -0.005417699926,
                             -0.142937809229,
                             -0.035714033991],
                            [0.386003590465, 0.227061870519, 0.16083576756, 0.124518130748, 0.101580640709],
                            [True, True, True, True, True])]}

COUNTS = [[100, 25, 19], [100, 30, 0], [100, 5, 50], [100, 0, 0], [80, 22, 3]]


def _fingerprint(name):
    """Two rounds of five hospitals on a linear head (weight (3, 2), bias (3,)): reported class counts
    (EARN) and benchmark errors (FedAgain) in the replies, one update four times larger."""
    n = 5
    s = build_strategy(name, {100 + i: f"h{i}" for i in range(n)})
    s.global_state = {"fc.weight": torch.zeros(3, 2), "fc.bias": torch.zeros(3)}
    gen = torch.Generator().manual_seed(7)
    out = []
    for rnd in (1, 2):
        u = torch.randn(n, 9, generator=gen) * torch.tensor([0.1, 0.2, 0.1, 0.3, 0.1, 0.2, 0.05, 0.1, 0.2])
        u[4] *= 4.0
        replies = [SimpleNamespace(node_id=100 + i, metrics={"class-counts": COUNTS[i], "benchmark-error": 0.1 + 0.07 * i})
                   for i in range(n)]
        agg = s.aggregate_updates(rnd, u, torch.tensor([10.0, 20, 30, 40, 50], dtype=torch.float64), replies)
        out.append(([round(float(x), 12) for x in agg.update], [round(float(x), 12) for x in agg.weights],
                    [bool(x) for x in agg.selected]))
    return out


@pytest.mark.parametrize("name", sorted(OLD_DEFAULTS))
def test_each_variant_resolves_to_the_old_subclass_defaults(name):
    assert build_strategy(name, {1: "a", 2: "b"}).options.to_flat() == OLD_DEFAULTS[name]


@pytest.mark.parametrize("name", sorted(OLD_AGGREGATES))
def test_each_variant_and_renamed_rule_aggregates_as_before(name):
    got = _fingerprint(name)
    for (update, weights, selected), (old_update, old_weights, old_selected) in zip(got, OLD_AGGREGATES[name]):
        assert selected == old_selected
        assert update == pytest.approx(old_update, abs=1e-11)
        assert weights == pytest.approx(old_weights, abs=1e-11)


# ---- the registry: rules and presets ------------------------------------------------------------
RULES = ["bulyan", "centered-clipping", "contribution", "earn", "fbd", "fedagain", "fedavg", "fedprox", "fltrust",
         "geometric-median", "hta", "krum", "median", "multi-krum", "trimmed-mean"]


def test_the_registry_holds_fifteen_rules_and_the_seven_variants_as_presets():
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
    cells = parse_grid(grid, validate=True).cells
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
    from hospitrust.server_app.results import read_config, read_rounds

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
    (rec,) = read_rounds(run_dir)
    assert not rec["kept_previous_model"], rec["note"]
    # a = 0 and c = 0: tau = m, and the first round's reputation is tau
    for c in rec["clients"]:
        assert c["tau"] == pytest.approx(c["m"]) and c["reputation"] == pytest.approx(c["tau"])

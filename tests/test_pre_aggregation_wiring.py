"""Pre-aggregation in a run (issue 34, item 1): the run-config key and the steps' sections, the
refusals, the round feature on a small stack by hand (its rows and its records by hospital name),
and real in-process runs with "arc,nnm" before HTA and "bucketing" before the median.
The math itself is tested in tests/test_field_defences.py."""

from __future__ import annotations

import functools

import pytest
import torch
from flwr.app import ArrayRecord

from hospitrust.aggregation import coordinate_median
from hospitrust.aggregation.pre_aggregation import PreAggregationChain, parse_chain, rows_before_each_step
from hospitrust.config import parse_run_config
from hospitrust.errors import ConfigError
from hospitrust.features import Round, RunFacts
from hospitrust.features.pre_aggregation import PreAggregation
from hospitrust.features.registry import run_features
from hospitrust.records import HospitalRecord
from hospitrust.strategies.base import RoundResult

T = functools.partial(torch.tensor, dtype=torch.float64)
NAMES = ["h0", "h1", "h2", "h3"]
X = T([[3.0, 4.0], [0.0, 1.0], [0.0, 2.0], [6.0, 8.0]])  # norms 5, 1, 2, 10


def close(a, b, atol=1e-12):  # float64
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=atol, rtol=0)


# ---- the run config --------------------------------------------------------------------------
def test_the_key_takes_one_step_a_chain_or_none():
    assert parse_run_config({}).pre_aggregation_steps == ()
    assert parse_run_config({"pre-aggregation": "none"}).pre_aggregation_steps == ()
    assert parse_run_config({"pre-aggregation": " arc , nnm "}).pre_aggregation_steps == ("arc", "nnm")
    cfg = parse_run_config({"pre-aggregation": "clipping,bucketing", "bucketing.bucket-size": 3, "clipping.max-norm": 0.5,
                            "min-hospitals": 4})
    assert (cfg.options("bucketing").bucket_size, cfg.options("clipping").max_norm) == (3, 0.5)
    assert {"bucketing", "clipping"} <= set(cfg.active_sections())
    assert cfg.to_flat()["bucketing.bucket-size"] == 3  # what config.json records
    assert rows_before_each_step(("bucketing", "nnm", "bucketing"), 7, 2) == [7, 4, 4, 2]


@pytest.mark.parametrize("raw, match", [
    ({"pre-aggregation": "nnm,krum"}, r"unknown pre-aggregation step 'krum' in 'nnm,krum'; allowed steps: nnm, arc, "
                                      r"bucketing, clipping"),
    ({"pre-aggregation": "arc,,nnm"}, r"unknown pre-aggregation step ''"),
    ({"strategy": "fbd", "pre-aggregation": "nnm"}, r"pre-aggregation = 'nnm' with strategy 'fbd': FED-FBD"),
    ({"pre-aggregation": "arc", "secagg.enabled": True}, r"pre-aggregation = 'arc' with secagg.enabled: SecAgg\+ hands "
                                                         r"the server only the sum"),
    ({"pre-aggregation": "nnm", "bucketing.bucket-size": 4}, r"bucketing.bucket-size = 4: an option of pre-aggregation "
                                                            r"step bucketing, but pre-aggregation is 'nnm'"),
    ({"clipping.max-norm": 0.5}, r"clipping.max-norm = 0.5: an option of pre-aggregation step clipping"),
    ({"pre-aggregation": "nnm", "assumed-malicious": 2}, r"nnm needs more rows than assumed-malicious = 2, and at the "
                                                         r"head of the chain a round with min-hospitals = 2"),
    ({"pre-aggregation": "bucketing,nnm"},
     r"nnm needs more rows than assumed-malicious = 1, and after bucketing .* gives it 1: raise min-hospitals"),
    ({"pre-aggregation": "nnm,arc", "assumed-malicious": 3, "min-hospitals": 2}, r"nnm needs more rows"),
    ({"pre-aggregation": "clipping", "clipping.max-norm": 0.0}, r"clipping.max-norm = 0.0"),
])
def test_what_cannot_apply_is_refused_before_anything_runs(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_run_config(raw)


@pytest.mark.parametrize("mode", ["central", "both"])
def test_central_dp_is_refused(mode):
    # privacy's own checks import Opacus (seconds): the pre-aggregation check alone, on a parsed config with
    # central DP in its privacy section (the cases above show these checks run inside parse_run_config)
    from hospitrust.features.pre_aggregators import check_pre_aggregation
    from hospitrust.privacy.options import PrivacyOptions

    class WithCentralDP:
        def __init__(self, cfg):
            self.cfg = cfg

        def __getattr__(self, name):
            return getattr(self.cfg, name)

        def options(self, section):
            return PrivacyOptions(mode=mode) if section == "privacy" else self.cfg.options(section)

        def section(self, options_class):  # the typed read the checks use
            return PrivacyOptions(mode=mode) if options_class is PrivacyOptions else self.cfg.section(options_class)

    (problem,) = check_pre_aggregation(WithCentralDP(parse_run_config({"pre-aggregation": "bucketing"})))
    assert problem.startswith(f"pre-aggregation = 'bucketing' with privacy.mode = '{mode}': central DP's noise")
    assert check_pre_aggregation(WithCentralDP(parse_run_config({}))) == []


def test_a_steps_key_set_explicitly_is_refused_even_at_its_default_when_the_step_is_not_chained():
    with pytest.raises(ConfigError, match="bucketing.bucket-size = 2: an option of pre-aggregation step bucketing"):
        parse_run_config({"bucketing.bucket-size": 2}, explicit=["bucketing.bucket-size"])
    parse_run_config({"bucketing.bucket-size": 2})  # the ServerApp sees every default: not refused


# ---- the feature on a small stack, by hand ---------------------------------------------------
def _feature(steps, **kw) -> PreAggregation:
    return PreAggregation(PreAggregationChain(tuple(steps), **kw))


def test_arc_then_nnm_rows_and_records_by_hand():
    feature = _feature(("arc", "nnm"), f=1)
    (step,) = feature.update_steps(Round(1, ArrayRecord(), started=0.0))
    rows = step(1, X, NAMES)
    # ARC: k = floor(2 * 1 * 3 / 4) = 1: h3 (norm 10) clipped to 5, the largest left -> [3, 4]
    # NNM (n - f = 3): h0 and h3 are [3, 4] -> {itself, the other, h2 [0, 2]}; h1 [0, 1] -> {h1, h2, h0 (tie with h3:
    # lower row)}; h2 -> {h2, h1, h0}
    close(rows, [[2.0, 10 / 3], [1.0, 7 / 3], [1.0, 7 / 3], [2.0, 10 / 3]])
    result = RoundResult(clients=[HospitalRecord(h, selected=True) for h in NAMES]
                         + [HospitalRecord("h9", rejected=True, reason="bad reply")])
    feature.on_aggregate(Round(1, ArrayRecord(), started=0.0), result)
    h3 = result.clients[3].signals["pre-aggregation"]  # under the feature's own name
    assert h3["steps"] == [{"step": "arc", "factor": 0.5, "clipped": True},
                           {"step": "nnm", "neighbours": ["h3", "h0", "h2"]}]
    assert h3["mixed_from"] == pytest.approx({"h0": 1 / 3, "h2": 1 / 3, "h3": 0.5 / 3})  # h3's own update at half
    h1 = result.clients[1].signals["pre-aggregation"]
    assert h1["steps"][1]["neighbours"] == ["h1", "h2", "h0"] and h1["steps"][0] == {"step": "arc", "factor": 1.0,
                                                                                       "clipped": False}
    assert h1["mixed_from"] == pytest.approx({"h0": 1 / 3, "h1": 1 / 3, "h2": 1 / 3})
    assert result.clients[4].signals == {}  # a rejected reply was never in the stack
    assert feature.record(Round(1, ArrayRecord(), started=0.0)) == {"pre_aggregation": {
        "chain": ["arc", "nnm"], "applied": True, "rows_in": 4, "rows_out": 4, "steps": [
            {"step": "arc", "threshold": 5.0, "clipped": ["h3"], "num_clipped": 1},
            {"step": "nnm", "f": 1, "neighbourhood_size": 3}]}}
    # a round whose rule did not run (too few valid replies): the chain did not either
    assert feature.record(Round(2, ArrayRecord(), started=0.0)) == {"pre_aggregation": {"chain": ["arc", "nnm"],
                                                                                          "applied": False}}


def test_bucketing_hands_every_member_its_buckets_mean_and_names_the_buckets():
    chain = PreAggregationChain(("bucketing",), f=1, bucket_size=2, seed=7)
    perm = torch.randperm(4, generator=chain.generator(3, 0)).tolist()  # the order the chain draws in round 3
    feature = PreAggregation(chain)
    rows = feature.step(3, X, NAMES)
    buckets = [perm[:2], perm[2:]]
    for bucket in buckets:
        for i in bucket:
            close(rows[i], X[bucket].mean(0))
    result = RoundResult(clients=[HospitalRecord(h, selected=True) for h in NAMES])
    feature.on_aggregate(Round(3, ArrayRecord(), started=0.0), result)
    named = [[NAMES[i] for i in b] for b in buckets]
    for i, c in enumerate(result.clients):
        mine = next(b for b in named if NAMES[i] in b)
        assert c.signals["pre-aggregation"] == {"mixed_from": {h: 0.5 for h in sorted(mine)}, "steps": [{"step": "bucketing",
                                                                                                  "bucket": mine}]}
    assert feature.record(Round(3, ArrayRecord(), started=0.0))["pre_aggregation"]["steps"] == [
        {"step": "bucketing", "bucket_size": 2, "buckets": named}]


def test_bucketing_is_reproducible_from_the_seed_and_the_round():
    def buckets(seed, rnd):
        return PreAggregationChain(("bucketing",), bucket_size=2, seed=seed).apply(rnd, torch.randn(8, 3)).records[0].members

    assert buckets(42, 5) == buckets(42, 5)
    assert len({str(buckets(42, r)) for r in range(1, 9)}) > 1  # a new draw every round
    assert any(buckets(42, r) != buckets(43, r) for r in range(1, 9))
    two = PreAggregationChain(("bucketing", "bucketing"), bucket_size=2, seed=1)
    assert two.generator(1, 0).initial_seed() != two.generator(1, 1).initial_seed()  # each step its own order


def test_a_step_after_bucketing_names_the_buckets_by_their_hospitals():
    chain = PreAggregationChain(("clipping", "bucketing", "nnm"), f=1, bucket_size=2, max_norm=2.0, seed=0)
    perm = torch.randperm(4, generator=chain.generator(1, 1)).tolist()
    feature = PreAggregation(chain)
    feature.step(1, X, NAMES)
    done = feature.done[1]
    labels = [" + ".join(NAMES[i] for i in perm[:2]), " + ".join(NAMES[i] for i in perm[2:])]
    # two bucket rows, n - f = 1: every row is its own neighbourhood
    for i, h in enumerate(NAMES):
        mine = labels[0] if i in perm[:2] else labels[1]
        assert done.per_hospital[h]["steps"][2] == {"step": "nnm", "neighbours": [mine]}
    assert done.round_entry["rows_out"] == 2
    assert done.round_entry["steps"][0] == {"step": "clipping", "threshold": 2.0, "clipped": ["h0", "h3"]}


def test_with_a_divisor_bucket_size_the_median_of_the_members_rows_is_the_median_of_the_buckets():
    x = torch.randn(12, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for s in (2, 3, 4):  # 6, 4 and 3 buckets: even and odd counts
        done = PreAggregationChain(("bucketing",), bucket_size=s, seed=1).apply(1, x)
        means = torch.stack([x[m].mean(0) for m in done.records[0].members])
        close(coordinate_median(done.rows), coordinate_median(means))


def test_the_chain_runs_after_the_simulated_adversary():
    cfg = parse_run_config({"pre-aggregation": "arc", "attack": "alie", "malicious-hospitals": "0", "strategy": "median"})
    from hospitrust.attacks.threat_model import configured_attack

    facts = RunFacts(cfg, grid=None, task=None, hospitals={1: "hospital-0", 2: "hospital-1"}, rows=[],
                     truth={"hospital-0": True, "hospital-1": False}, attack=configured_attack(cfg.threat_model))
    features = run_features(facts)
    names = [f.name for f in features]
    assert names.index("simulated-adversary") < names.index("pre-aggregation")
    steps = features.update_steps(Round(1, ArrayRecord(), started=0.0))
    pre = next(f for f in features if f.name == "pre-aggregation")
    assert len(steps) == 2 and steps[-1] == pre.step  # type: ignore[attr-defined]
    assert "pre-aggregation" not in [f.name for f in run_features(RunFacts(parse_run_config({}), None, None, {}, [], {},
                                                                                None))]
    assert parse_chain("none") == ()


# ---- real runs ---------------------------------------------------------------------------------
def _one_round(tmp_path, name, hospitals, **overrides):
    from conftest import small_run_config
    from hospitrust.ops.inprocess import run_inprocess
    from hospitrust.server_app.results import read_config, read_round_records

    cfg = small_run_config(tmp_path, **{"num-server-rounds": 1, "train-subsample": 0.03, "run-name": name, **overrides})
    run_inprocess(cfg, hospitals)
    run_dir = tmp_path / "runs" / name
    (rec,) = read_round_records(run_dir)
    assert not rec.kept_previous_model, rec.note
    return cfg, read_config(run_dir), rec


def test_arc_nnm_before_hta_in_a_real_inprocess_run(tmp_path, data_dir):
    from hospitrust.console.views import hospital_rows

    _, config, rec = _one_round(tmp_path, "arc-nnm-hta", 4, strategy="hta",
                                **{"pre-aggregation": "arc,nnm", "hta.validation-exponent": 0.0})
    assert config["pre-aggregation"] == "arc,nnm" and config["pre_aggregation"] == {"chain": ["arc", "nnm"], "f": 1}
    entry = rec.entries["pre_aggregation"]
    assert entry["chain"] == ["arc", "nnm"] and entry["applied"] and entry["rows_in"] == entry["rows_out"] == 4
    arc, nnm = entry["steps"]
    assert arc["num_clipped"] == 1 and nnm == {"step": "nnm", "f": 1, "neighbourhood_size": 3}
    hospitals = [c.hospital for c in rec.clients]
    factor = {c.hospital: c.signals["pre-aggregation"]["steps"][0]["factor"] for c in rec.clients}
    assert arc["clipped"] == [h for h in hospitals if factor[h] < 1.0]
    for c in rec.clients:
        pre = c.signals["pre-aggregation"]
        neighbours = pre["steps"][1]["neighbours"]
        assert neighbours[0] == c.hospital and len(neighbours) == 3 and set(neighbours) <= set(hospitals)
        # the row HTA saw for this hospital: its neighbours' clipped updates, a third each
        assert pre["mixed_from"] == pytest.approx({h: factor[h] / 3 for h in neighbours})
        assert "reputation" in c.signals["hta"]  # the rule ran on the mixed rows and kept its per-hospital record
    rows = hospital_rows(rec, hospitals, ground_truth=False)
    shown = dict(rows[0]["signals"])["pre-aggregation"]
    assert shown.startswith("arc ") and f"nnm mean of {hospitals[0]}" in shown


def test_bucketing_before_the_median_in_a_real_inprocess_run(tmp_path, data_dir):
    cfg, _, rec = _one_round(tmp_path, "bucketing-median", 4, strategy="median", **{"pre-aggregation": "bucketing"})
    hospitals = [c.hospital for c in rec.clients]  # the stack's rows are in hospital order
    perm = torch.randperm(4, generator=PreAggregationChain(("bucketing",), seed=cfg["seed"]).generator(1, 0)).tolist()
    buckets = [[hospitals[i] for i in perm[:2]], [hospitals[i] for i in perm[2:]]]
    assert rec.entries["pre_aggregation"]["steps"] == [{"step": "bucketing", "bucket_size": 2, "buckets": buckets}]
    assert rec.entries["pre_aggregation"]["rows_out"] == 2
    norm = {c.hospital: c.update_norm for c in rec.clients}  # of the row the median saw
    for c in rec.clients:
        mine = next(b for b in buckets if c.hospital in b)
        assert c.signals["pre-aggregation"]["steps"] == [{"step": "bucketing", "bucket": mine}]
        assert c.signals["pre-aggregation"]["mixed_from"] == {h: 0.5 for h in sorted(mine)}
        assert norm[mine[0]] == pytest.approx(norm[mine[1]], rel=1e-12)  # float64: both members handed the bucket's mean

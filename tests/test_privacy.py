"""Differential privacy (docs/privacy.md): the accountant against what DP-SGD really did, the
hospital's budget in a real in-process run, bad input refused before training, and the ledger
across runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from scipy import stats

from browser import browser, wait_for  # noqa: F401  (browser is a fixture)
from conftest import small_run_config
from hospitrust.records import RoundRecord
from hospitrust.server_app.results import read_round_records

N_TRAIN, BATCH, EPOCHS, DELTA = 120, 12, 1, 1e-4  # q = 1 / ceil(120 / 12) = 0.1; B = n q exactly


def _hospital(run_config: dict, node_config: dict | None = None):
    """A HospitalContext over synthetic images (no files): the ClientApp's training step runs on it as in a run."""
    from hospitrust.client_app.context import HospitalContext
    from hospitrust.config import parse_node_config, parse_run_config
    from hospitrust.datasets.federation import HospitalData, LabelledImages
    from hospitrust.tasks.task import resolve_task

    rng = np.random.default_rng(0)
    cfg = parse_run_config(run_config)
    task = resolve_task(cfg)

    def share(n: int) -> LabelledImages:
        y = rng.integers(0, 2, n).astype(np.int64)
        x = (rng.integers(0, 100, (n, 28, 28, 1)) + 120 * y[:, None, None, None]).astype(np.uint8)
        return LabelledImages(x, y)

    node = parse_node_config(node_config or {"partition-id": 0, "num-partitions": 1})
    return HospitalContext(cfg, node, task, HospitalData("hospital-0", share(N_TRAIN), share(30)))


def _train_message(hospital, server_round: int) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    from hospitrust.tasks.model import task_model

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as the in-process Grid sets them
    torch.manual_seed(0)
    state = {k: v.detach() for k, v in task_model(hospital.task).state_dict().items()}
    config = ConfigRecord({"server-round": server_round, "local-epochs": EPOCHS, "batch-size": BATCH, "learning-rate": 0.05})
    msg = Message(RecordDict({"arrays": ArrayRecord(state), "config": config}), dst_node_id=1, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = f"m{server_round}"
    return msg


class _Counter:
    """Counts, outside the code under test, every optimizer step and every training batch (its size)."""

    def __init__(self) -> None:
        self.steps = 0
        self.batch_sizes: list[int] = []

    def __enter__(self) -> "_Counter":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from hospitrust.models.small_cnn import SmallCNN

        def on_forward(module, args):
            if isinstance(module, SmallCNN) and module.training:
                self.batch_sizes.append(int(args[0].shape[0]))

        def on_step(optimizer, args, kwargs):
            if type(optimizer).__module__.startswith("torch.optim"):  # the real SGD under Opacus's DPOptimizer
                self.steps += 1

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(on_forward),
                         register_optimizer_step_post_hook(on_step)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


def independent_check(counted: _Counter, reported: dict, num_examples: int, rounds: int) -> list[str]:
    """What does not hold between what the loop did and what the hospital reported: the steps,
    Poisson sampling at the reported rate (the batch sizes' dispersion), and epsilon recomputed
    with Google's dp-accounting RDP accountant (within 1 %).
    """
    from dp_accounting import dp_event, rdp
    from opacus.accountants import RDPAccountant

    problems = []
    q, sigma = reported["privacy-sample-rate"], reported["privacy-noise-multiplier"]
    if counted.steps != len(counted.batch_sizes) or counted.steps != reported["privacy-steps"] * rounds:
        problems.append(f"steps: {counted.steps} optimizer steps, {len(counted.batch_sizes)} batches, "
                        f"{reported['privacy-steps']} x {rounds} reported")
    # Poisson sampling: batch sizes ~ Binomial(n, q); their dispersion sum (b - nq)^2 / (nq(1-q)) ~ chi2(steps)
    sizes = np.array(counted.batch_sizes, dtype=float)
    mean, var = num_examples * q, num_examples * q * (1 - q)
    dispersion = float(((sizes - mean) ** 2).sum() / var)
    low, high = stats.chi2.ppf([0.001, 0.999], df=len(sizes))
    if not low <= dispersion <= high:
        problems.append(f"sampling: batch-size dispersion {dispersion:.2f} outside chi2({len(sizes)}) [{low:.1f}, {high:.1f}]:"
                        " not Poisson sampling at the reported rate")
    accountant = rdp.RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
    accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), counted.steps)
    independent = accountant.get_epsilon(reported["privacy-delta"])
    if abs(independent - reported["privacy-epsilon"]) > 0.01 * independent:
        problems.append(f"epsilon: reported {reported['privacy-epsilon']:.4f}, dp-accounting {independent:.4f}")
    return problems


def _two_private_rounds(tmp_path: Path) -> tuple[_Counter, dict]:
    from hospitrust.client_app.training import local_training_step

    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", "privacy.target-epsilon": 3.0, "privacy.delta": DELTA,
                                        "num-server-rounds": 2})
    hospital = _hospital(cfg)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    with _Counter() as counted:
        for rnd in (1, 2):
            reply = local_training_step(_train_message(hospital, rnd), context, hospital)
    return counted, dict(reply.content.metric_records["metrics"])


def test_reported_epsilon_matches_an_independent_accountant_of_the_steps_taken(tmp_path):
    counted, reported = _two_private_rounds(tmp_path)
    assert reported["privacy-sample-rate"] == pytest.approx(BATCH / N_TRAIN)
    assert independent_check(counted, reported, N_TRAIN, rounds=2) == []
    # calibrated for the run: two rounds spend the target epsilon (Opacus's search stops within 0.01)
    assert 2.9 < reported["privacy-epsilon"] <= 3.0


def test_a_loader_that_does_not_sample_as_the_accountant_assumes_fails_the_check(tmp_path, monkeypatch):
    from opacus import PrivacyEngine

    make_private = PrivacyEngine.make_private

    def shuffled_batches(self, **kwargs):  # fixed-size shuffled batches; the accountant still assumes Poisson
        return make_private(self, **{**kwargs, "poisson_sampling": False})

    monkeypatch.setattr(PrivacyEngine, "make_private", shuffled_batches)
    counted, reported = _two_private_rounds(tmp_path)
    problems = independent_check(counted, reported, N_TRAIN, rounds=2)
    assert len(problems) == 1 and problems[0].startswith("sampling:"), problems


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, _medmnist_problem) -> tuple[Path, Path]:
    """Three hospitals at target epsilon 3 over 3 rounds: one round spends 1.5 to 1.9, two 2.3 to 2.5
    (for any share size here), so hospital-0's own budget of 2 lets it train round 1 only. Its run
    directory and hospital-0's ledger.
    """
    from hospitrust.ops.inprocess import run_inprocess

    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    tmp_path = tmp_path_factory.mktemp("budget")
    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", "privacy.target-epsilon": 3.0, "privacy.delta": 1e-3,
                                        "num-server-rounds": 3, "min-hospitals": 2})
    ledger = tmp_path / "hospital-0" / "privacy-ledger.json"
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    nodes[0].update({"privacy-max-epsilon": 2.0, "privacy-ledger": str(ledger)})
    run_inprocess(cfg, 3, node_configs=nodes)
    return Path(cfg["output-dir"]) / cfg["run-name"], ledger


def test_a_hospital_whose_budget_runs_out_mid_run_stops_training_and_the_run_completes(budget_run):
    run_dir, ledger = budget_run
    rounds = read_round_records(run_dir)
    assert [r.number for r in rounds] == [1, 2, 3]  # the run completes
    first, second, third = rounds
    assert {c.hospital for c in first.clients if c.selected} == {"hospital-0", "hospital-1", "hospital-2"}
    eps0 = first.entries["privacy"]["hospitals"]["hospital-0"]["epsilon"]
    assert 1.4 < eps0 < 2.0
    # round 2: hospital-0 refuses (its budget), recorded as budget spent, not as failed or rejected
    assert [b["hospital"] for b in second.entries["budget_spent"]] == ["hospital-0"]
    assert "privacy budget spent" in second.entries["budget_spent"][0]["reason"]
    assert second.entries["budget_spent"][0]["next_epsilon"] > 2.0
    assert "hospital-0" not in {c.hospital for c in second.clients} and "hospital-0" not in second.missing
    assert second.entries["privacy"]["hospitals"]["hospital-0"]["budget_spent"] is True
    assert not second.kept_previous_model and not third.kept_previous_model  # the others go on
    assert {c.hospital for c in third.clients} == {"hospital-1", "hospital-2"}  # not asked again
    for name in ("hospital-1", "hospital-2"):  # each round's (epsilon, delta) on the record, adding up to the target
        eps = [r.entries["privacy"]["hospitals"][name]["epsilon"] for r in rounds]
        assert eps[0] < eps[1] < eps[2] <= 3.0 and eps[2] > 2.9
        assert rounds[2].entries["privacy"]["hospitals"][name]["delta"] == 1e-3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["privacy"]["budget_spent"] == ["hospital-0"]
    assert summary["privacy"]["hospitals"]["hospital-0"]["epsilon"] == pytest.approx(eps0)
    assert summary["participation"]["hospital-0"]["budget_spent"] == 1
    assert summary["failed_hospitals"] == []
    config = json.loads((run_dir / "config.json").read_text())
    assert config["privacy"]["local"]["accountant"].startswith("Opacus RDPAccountant")
    assert config["privacy.mode"] == "local"
    # the hospital's ledger holds its one round, keyed by its data's content hash
    doc = json.loads(ledger.read_text())
    (entry,) = doc["data"].values()
    assert entry["hospital"] == "hospital-0" and len(entry["rounds"]) == 1
    # the console (and the report, built from the same rows) shows it
    from hospitrust.console.app import round_rows, run_state
    from hospitrust.console.runs import RunReader

    reader = RunReader(run_dir, run_dir.name)
    reader.refresh()
    rows = {r["hospital"]: r for r in round_rows(reader, 2)["rows"]}
    assert rows["hospital-0"]["status"] == "budget spent" and rows["hospital-0"]["privacy"]["budget_spent"]
    assert rows["hospital-1"]["privacy"]["epsilon"] == pytest.approx(second.entries["privacy"]["hospitals"]["hospital-1"]["epsilon"])
    state = run_state(reader)
    assert state["run"]["privacy"] == "local" and state["summary"]["privacy"]["budget_spent"] == ["hospital-0"]
    assert [a["hospital"] for a in state["alerts"] if a["kind"] == "budget-spent"] == ["hospital-0"]


@pytest.mark.parametrize("overrides, key, reason", [
    ({"privacy.target-epsilon": 0.0}, "privacy.target-epsilon", "epsilon must be > 0"),
    ({"privacy.target-epsilon": -1.0}, "privacy.target-epsilon", "epsilon must be > 0"),
    ({"privacy.delta": 0.0}, "privacy.delta", "delta must lie in (0, 1)"),
    ({"privacy.delta": 1.0}, "privacy.delta", "delta must lie in (0, 1)"),
    ({"strategy": "fbd"}, "strategy 'fbd'", "FED-FBD"),
    ({"model": "resnet18"}, "model = 'resnet18'", "resnet18-gn"),
    ({"strategy": "fedprox"}, "strategy 'fedprox'", "proximal term"),
    ({"privacy.mode": "central", "strategy": "hta"}, "strategy 'hta'", "equal-weight mean"),
    ({"privacy.mode": "central", "secagg.enabled": True}, "secagg.enabled", "SecAgg+ hides"),
    ({"privacy.mode": "both", "model": "resnet18"}, "model = 'resnet18'", "BatchNorm"),
    ({"privacy.mode": "central", "model": "resnet18"}, "model = 'resnet18'", "resnet18-gn"),
])
def test_bad_privacy_input_is_refused_before_training_naming_key_and_reason(tmp_path, overrides, key, reason):
    from hospitrust.config import parse_run_config
    from hospitrust.errors import ConfigError

    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", **overrides})
    with pytest.raises(ConfigError) as err:
        parse_run_config(cfg)
    assert key in str(err.value) and reason in str(err.value), str(err.value)


def test_a_hospital_budget_of_zero_or_less_is_refused_in_its_node_config():
    from hospitrust.config import parse_node_config
    from hospitrust.errors import ConfigError

    with pytest.raises(ConfigError, match="privacy-max-epsilon: epsilon must be > 0"):
        parse_node_config({"partition-id": 0, "num-partitions": 2, "privacy-max-epsilon": 0.0})


def test_a_delta_not_below_one_over_a_hospitals_training_set_is_refused_before_any_round(tmp_path, data_dir):
    from hospitrust.errors import ConfigError
    from hospitrust.ops.inprocess import run_inprocess

    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", "privacy.delta": 0.02})  # shares of 25-150 images
    with pytest.raises(ConfigError, match=r"privacy.delta = 0.02: not below 1 / \(training-set size\)") as err:
        run_inprocess(cfg, 3)
    assert "hospital-" in str(err.value)
    run_dir = Path(cfg["output-dir"]) / cfg["run-name"]
    assert not (run_dir / "rounds.jsonl").exists() or not (run_dir / "rounds.jsonl").read_text()


def test_ledger_keeps_a_hospitals_spending_across_runs_and_refuses_past_its_budget(tmp_path):
    """Two runs (two fresh contexts) on one hospital's data with one ledger: the second run's lifetime
    epsilon is the composition of both, the file survives, and a third run that would pass the
    budget is refused before it trains.
    """
    from dp_accounting import dp_event, rdp

    from hospitrust.client_app.training import local_training_step
    from hospitrust.privacy.ledger import PrivacyLedger

    ledger = tmp_path / "ledger" / "privacy-ledger.json"
    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", "privacy.target-epsilon": 2.0, "privacy.delta": DELTA,
                                        "num-server-rounds": 1})
    node = {"partition-id": 0, "num-partitions": 1, "privacy-ledger": str(ledger), "privacy-max-epsilon": 2.8}  # 1 run: 2.0, 2: 2.52, 3: 2.94
    hospital = _hospital(cfg, node)
    replies = []
    for run in (1, 2, 3):
        context = Context(run_id=run, node_id=1, node_config=node, state=RecordDict(), run_config=cfg)
        replies.append(local_training_step(_train_message(hospital, 1), context, hospital))
    first, second, third = (dict(r.content.metric_records["metrics"]) for r in replies)
    assert first["privacy-epsilon"] == pytest.approx(first["privacy-lifetime-epsilon"]) and first["privacy-epsilon"] <= 2.0
    assert second["privacy-epsilon"] == pytest.approx(first["privacy-epsilon"])  # each run's own spending
    accountant = rdp.RdpAccountant()
    event = dp_event.PoissonSampledDpEvent(first["privacy-sample-rate"], dp_event.GaussianDpEvent(first["privacy-noise-multiplier"]))
    accountant.compose(event, 2 * first["privacy-steps"])
    assert second["privacy-lifetime-epsilon"] == pytest.approx(accountant.get_epsilon(DELTA), rel=0.01)
    assert third["privacy-budget-spent"] == 1 and "arrays" not in replies[2].content.array_records
    assert "over its privacy-max-epsilon 2.8" in str(replies[2].content.config_records["privacy"]["reason"])
    doc = json.loads(ledger.read_text())
    (key, entry), = doc["data"].items()
    assert key == hospital.card.get("content-hash") or len(key) == 64
    assert len(entry["rounds"]) == 2 and [r["run"] for r in entry["rounds"]] == ["1", "2"]
    assert not list(ledger.parent.glob("*.tmp"))  # written atomically: no temporary file left
    text = PrivacyLedger(ledger).format(max_epsilon=2.8)  # what `hospitrust data check` prints
    assert "2 rounds" in text and f"epsilon {second['privacy-lifetime-epsilon']:.3f}" in text and "left" in text


def test_central_dp_wraps_fedavg_with_flowers_server_side_clipping_and_accounts_every_release(tmp_path, data_dir):
    from dp_accounting import dp_event, rdp

    from hospitrust.ops.inprocess import run_inprocess

    cfg = small_run_config(tmp_path, **{"privacy.mode": "central", "privacy.central-noise-multiplier": 1.5,
                                        "privacy.central-clipping-norm": 0.5, "privacy.delta": 1e-3})
    run_inprocess(cfg, 3)
    run_dir = Path(cfg["output-dir"]) / cfg["run-name"]
    rounds = read_round_records(run_dir)
    accountant = rdp.RdpAccountant()
    for r in rounds:
        assert [c.weight for c in r.clients] == pytest.approx([1 / 3] * 3)  # equal weights, as the noise assumes
        accountant.compose(dp_event.GaussianDpEvent(1.5))  # no amplification: every hospital's update in every release
        central = r.entries["privacy"]["central"]
        assert central["released"] and central["sample_size"] == 3
        assert central["epsilon"] == pytest.approx(accountant.get_epsilon(1e-3), rel=0.01)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["privacy"]["central"]["wrapper"] == "DifferentialPrivacyServerSideFixedClipping"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["privacy"]["central"]["releases"] == len(rounds) == 2


def test_data_check_budget_line_reads_the_ledger_under_the_clientapps_content_hash(tmp_path):
    from hospitrust.client_app.context import load_hospital
    from hospitrust.config import parse_node_config, parse_run_config
    from hospitrust.privacy.ledger import PrivacyLedger, budget_report
    from hospitrust.privacy.local import PrivacyEvent
    from hospitrust.tasks.task import resolve_task

    rng = np.random.default_rng(1)
    archive = tmp_path / "hospital.npz"
    np.savez(archive, images=rng.integers(0, 255, (40, 28, 28), dtype=np.uint8), labels=rng.integers(0, 2, 40))
    cfg = parse_run_config(small_run_config(tmp_path))
    node = parse_node_config({"data-path": str(archive), "hospital": "st-elsewhere", "cache-dir": str(tmp_path / "cache")})
    _, card = load_hospital(cfg, node, resolve_task(cfg))  # what the ClientApp keys its ledger by
    ledger = tmp_path / "privacy-ledger.json"
    PrivacyLedger(ledger).record(card["content-hash"], PrivacyEvent(1.2, 0.25, 8), hospital="st-elsewhere", delta=1e-3,
                                 server_round=1)
    text = budget_report(archive, "auto", resolve_task(cfg), cache_dir=tmp_path / "cache", ledger=ledger, max_epsilon=4.0)
    assert "st-elsewhere" in text and "1 rounds, 8 DP-SGD steps" in text and "of the budget 4" in text
    other = budget_report(archive, "npz", resolve_task(cfg), cache_dir=tmp_path / "cache", ledger=tmp_path / "none.json")
    assert "nothing spent on this data yet" in other


def test_the_report_shows_each_hospitals_epsilon_and_who_ran_out_of_budget(budget_run, browser, tmp_path):
    from hospitrust.console.report import write_report

    run_dir, _ = budget_run
    write_report(run_dir, tmp_path / "report")
    browser.get((tmp_path / "report" / "report.html").as_uri())
    wait_for(browser, lambda d: len(d.find_elements("css selector", "#hospitals tr[data-hospital]")) == 3, what="3 rows")
    assert "privacy ε (δ)" in browser.find_element("id", "hospitals").text
    spent = browser.find_element("css selector", '#hospitals tr[data-hospital="hospital-0"]').text
    assert "budget spent" in spent and "since round 2" in spent  # round 3: not asked again
    trained = browser.find_element("css selector", '#hospitals tr[data-hospital="hospital-1"]').text
    assert "(0.001)" in trained
    head = browser.find_element("id", "run-head").text
    assert "privacy local" in head and "budget spent: hospital-0" in head


def test_privacy_table_counts_honest_hospital_rounds_as_the_issue_defines_fpr():
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("privacy_table", REPO / "benchmarks" / "privacy_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rounds = [RoundRecord.from_json({"clients": [
        {"hospital": "a", "weight": 0.30, "selected": True, "malicious": False},
        {"hospital": "b", "weight": 0.10, "selected": True, "malicious": False},  # below half the honest median 0.3
        {"hospital": "c", "weight": 0.35, "selected": False, "malicious": False},
        {"hospital": "d", "weight": 0.00, "selected": False, "malicious": True},  # an attacker: not counted
        {"hospital": "e", "weight": 0.00, "rejected": True, "malicious": False},  # rejected: no rule's decision
    ]})]
    assert table.false_positive_rate(rounds, "earn") == (1, 3)
    assert table.false_positive_rate(rounds, "hta") == (1, 3)  # c was left out
    assert table.privacy_level({"privacy.mode": "local", "privacy.target-epsilon": 3.0}) == "eps3"


def test_local_dp_under_secagg_records_each_hospitals_epsilon(tmp_path, data_dir):
    """SecAgg+ hides the noised updates from the server; the hospitals' reported epsilon still lands."""
    from hospitrust.ops.inprocess import run_inprocess

    cfg = small_run_config(tmp_path, **{"privacy.mode": "local", "privacy.target-epsilon": 4.0, "secagg.enabled": True,
                                        "num-server-rounds": 1, "privacy.delta": 1e-3})
    run_inprocess(cfg, 3)
    run_dir = Path(cfg["output-dir"]) / cfg["run-name"]
    (record,) = read_round_records(run_dir)
    assert not record.kept_previous_model and all(c.signals["secagg"]["secure_aggregation"] for c in record.clients)
    assert all(c.privacy is not None and 3.9 < c.privacy["epsilon"] <= 4.0 for c in record.clients)
    assert set(record.entries["privacy"]["hospitals"]) == {"hospital-0", "hospital-1", "hospital-2"}


def test_resnet18_with_groupnorm_is_what_opacus_can_train():
    from opacus.validators import ModuleValidator

    from hospitrust.models import build_model
    from hospitrust.privacy.local import model_problem

    assert model_problem("resnet18-gn", 28) == "" and model_problem("small-cnn", 28) == ""
    assert "BatchNorm" in model_problem("resnet18", 28)
    model = build_model("resnet18-gn", 1, 2, 28)
    assert ModuleValidator.validate(model.train(), strict=False) == []
    assert not [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert model.bn1.num_groups == 32 and model.layer1[0].bn1.num_channels == 64  # min(32, C) groups


def test_central_dp_releases_nothing_in_a_round_with_fewer_updates_than_asked(tmp_path, data_dir):
    """The noise z C / n is for all n asked: a round one hospital does not answer keeps the previous model."""
    from hospitrust.ops.inprocess import run_inprocess

    def drop_first_hospitals_second_train_reply(index, msg, reply):
        rnd = msg.content.config_records["config"].get("server-round") if msg.content.config_records else None
        return None if index == 0 and msg.metadata.message_type == "train" and rnd == 2 else reply

    cfg = small_run_config(tmp_path, **{"privacy.mode": "central", "privacy.delta": 1e-3, "reply-timeout": 0.5})
    run_inprocess(cfg, 3, reply_filter=drop_first_hospitals_second_train_reply)
    run_dir = Path(cfg["output-dir"]) / cfg["run-name"]
    first, second = read_round_records(run_dir)
    assert first.entries["privacy"]["central"]["released"] and not first.kept_previous_model
    assert second.kept_previous_model and "central DP: 2 valid updates of the 3 asked" in second.note
    assert not second.entries["privacy"]["central"]["released"]
    assert second.entries["privacy"]["central"]["releases"] == 1  # the accountant counts only what was released
    assert second.entries["privacy"]["central"]["epsilon"] == pytest.approx(first.entries["privacy"]["central"]["epsilon"])
    # the step as released (noise included) is recorded; nothing moved in the kept round
    assert first.update_norm is not None and first.update_norm > 0 and second.update_norm is None
    assert all(c.update_norm is not None and c.update_norm > 0 for c in first.clients)


def test_privacy_table_pairs_each_dp_cell_with_its_seeds_dp_off_twin():
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("privacy_table", REPO / "benchmarks" / "privacy_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    def row(privacy, seed, bal, auc, fp=0, honest=10):
        return {"strategy": "hta", "attack": "none", "seed": seed, "privacy": privacy, "balanced_accuracy": bal,
                "auc": auc, "fp": fp, "honest": honest, "epsilon": 0.0 if privacy == "off" else 3.0}

    text = table.table([row("off", 1, 0.8, 0.9), row("off", 2, 0.7, 0.8),
                        row("eps3", 1, 0.5, 0.85, fp=2), row("eps3", 2, 0.6, 0.6, fp=1)])
    lines = text.splitlines()
    assert lines[2].startswith("| hta | none | off |")  # off first, then the DP levels
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    # balanced accuracy 0.5 / 0.6: mean 0.55, sd 0.0707; paired costs -0.3 and -0.1: -0.2 ± 0.141
    assert cells[4] == "0.550 ± 0.071 (n=2)" and cells[5] == "-0.200 ± 0.141 (n=2)"
    # AUC 0.85 / 0.6; paired costs -0.05 and -0.2: -0.125 ± 0.106
    assert cells[6] == "0.725 ± 0.177 (n=2)" and cells[7] == "-0.125 ± 0.106 (n=2)"
    assert cells[8] == "0.150 (3/20)"


def test_privacy_specialist_table_reads_the_specialists_rare_row(monkeypatch):
    import importlib.util

    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("privacy_specialist_table", REPO / "benchmarks" / "privacy_specialist_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rounds = [RoundRecord.from_json(line) for line in (
        {"clients": [{"hospital": "hospital-0", "holds": [1, 4], "earn_trust": {"4": 1.0}, "rare_row_weight": {"4": 0.5}}]},
        {"clients": [{"hospital": "hospital-0", "holds": [1], "earn_trust": {"4": 0.0}, "rare_row_weight": {"4": 0.1}}]},
        {"clients": [{"hospital": "hospital-1", "holds": [4], "earn_trust": {"4": 1.0}}]},  # not the specialist
    )]
    assert script.specialist_row(rounds, "hospital-0", 4) == pytest.approx({"held": 0.5, "trust": 0.5, "row_weight": 0.3})
    rows = [{"strategy": "earn", "seed": 1, "privacy": "off", "rare_f1": 0.4, "held": 1.0, "trust": 1.0, "row_weight": 0.5},
            {"strategy": "earn", "seed": 1, "privacy": "eps3", "rare_f1": 0.1, "held": 0.5, "trust": 0.5, "row_weight": 0.3}]
    line = script.table(rows).splitlines()[3]
    assert line.startswith("| earn | eps3 | 0.100 (n=1) | -0.300 (n=1) | 0.500 (n=1) |")

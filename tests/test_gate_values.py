"""The hospital's gate resolves what the ClientApp will use and the site policy is checked against exactly that
(issue 46, findings 1, 2 and 6 at unit level; the real-process plays are in tests/test_hospital_control.py).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
import sys

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from hospitrust.client_app.context import GATE_KEY, GateValuesError, HospitalContext, gate_values, hospital_context
from hospitrust.config import parse_run_config, run_config_defaults
from hospitrust.ops.deploy import approval, gate
from hospitrust.ops.deploy.policy import SitePolicy, refusal, resolve
from hospitrust.tasks.task import resolve_task

CHEST = json.dumps({"name": "chest", "class_names": ["normal", "pneumonia"]})


def _app(root: Path, declare: bool) -> bytes:
    (root / "tinyapp").mkdir(parents=True)
    (root / "tinyapp" / "__init__.py").write_text("")
    (root / "tinyapp" / "client.py").write_text("app = None\n")
    (root / "tinyapp" / "server.py").write_text("app = None\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n[project]\nname = "tinyapp"\n'
        'version = "1.0.0"\ndependencies = []\n\n[tool.flwr.app]\npublisher = "consortium"\n\n[tool.flwr.app.components]\n'
        'serverapp = "tinyapp.server:app"\nclientapp = "tinyapp.client:app"\n\n[tool.flwr.app.config]\nrounds = 1\n'
        + ("\n[tool.hospitrust]\ngate-values = 1\n" if declare else ""))
    return approval.build_fab(root)


def test_resolve_gives_the_values_the_clientapp_uses():
    run = {"local-epochs": 3, "batch-size": 16, "train-subsample": 0.02, "dataset": "pneumoniamnist"}
    agreed = resolve("train", {"task": CHEST, "local-epochs": 2}, run, hospital_images=151)
    assert (agreed.task_name, agreed.classes, agreed.local_epochs, agreed.batch_size) == ("chest", ("normal", "pneumonia"), 2, 16)
    assert (agreed.images_per_epoch, agreed.images_per_round) == (151, 302)  # train-subsample does not scale own data
    assert resolve("train", {"local-epochs": 2.9}, run).local_epochs == 2  # the ClientApp's int(): 2 epochs
    # no task in the message: the one the gate accepted earlier in this run, else none (never the run's dataset)
    assert resolve("train", {}, run, remembered_task=CHEST).task == CHEST
    assert resolve("query", {}, run).task == "" and resolve("query", {}, run).task_name == ""
    values = json.loads(agreed.to_json())
    assert values["version"] == 1 and values["local_epochs"] == 2 and values["task"] == CHEST


def test_a_policy_naming_tasks_or_classes_refuses_a_message_without_a_task():
    tasks = SitePolicy.model_validate({"tasks": ["pneumoniamnist", "chest"]})
    run = {"dataset": "pneumoniamnist", "task.file": "tasks/chest-xray.toml"}  # the old fallback read "pneumoniamnist"
    assert refusal(tasks, "query", {}, run).startswith("tasks: the message names no task")
    assert refusal(tasks, "query", {"task": "not json"}, run) == "tasks: the message's task is not a task description"
    assert refusal(tasks, "query", {"task": CHEST}, run) is None
    assert refusal(tasks, "train", {}, run, remembered_task=CHEST) is None  # SecAgg+'s key stages: the run's task
    classes = SitePolicy.model_validate({"classes": ["normal", "pneumonia"]})
    assert refusal(classes, "query", {}, run).startswith("tasks: the message names no task")
    nameless = json.dumps({"name": "chest", "class_names": []})
    assert refusal(classes, "query", {"task": nameless}, run) == "classes: task 'chest' names no classes"
    assert refusal(SitePolicy(), "query", {}, run) is None  # a policy that names no task: any task


def test_the_image_limit_counts_the_resolved_images():
    policy = SitePolicy.model_validate({"max-images-per-round": 50})
    run = {"local-epochs": 2, "batch-size": 32, "train-subsample": 0.02}
    # the hospital's own data ignores train-subsample: 2 x 106 images, not 2 x 106 x 0.02
    assert refusal(policy, "train", {}, run, hospital_images=106) == "max-images-per-round: 2 epochs x 106 images = 212 > 50"
    assert refusal(policy, "train", {}, run, hospital_images=25) is None
    assert refusal(policy, "train", {"local-epochs": 3}, run, hospital_images=25) == \
        "max-images-per-round: 3 epochs x 25 images = 75 > 50"


def test_with_a_policy_a_bundle_that_does_not_declare_the_gate_values_is_refused(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("max-local-epochs = 2\n")
    undeclared, declared = _app(tmp_path / "a", False), _app(tmp_path / "b", True)
    store = approval.Approvals(tmp_path / "approved.toml")
    store.approve(undeclared)
    store.approve(declared)
    cfg = gate.GateConfig(approvals=store.path, policy=policy)
    assert gate.declared_gate_values(undeclared) == 0 and gate.declared_gate_values(declared) == 1
    assert decide_reason(cfg, undeclared).startswith("refused: the bundle does not declare that it uses this hospital's gate")
    assert decide_reason(cfg, declared) is None
    assert decide_reason(gate.GateConfig(approvals=store.path), undeclared) is None  # no policy: nothing to bind
    # the repository's own app declares it (Flower's builder keeps [tool.hospitrust]: the real-process tests' bundle)
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["tool"]["hospitrust"]["gate-values"] == 1


def decide_reason(cfg: gate.GateConfig, content: bytes) -> str | None:
    return gate.decide(cfg, content, "train", {"local-epochs": 1, "task": CHEST}, {"batch-size": 8})


def _message(config: dict | None, kind: str = "query", **records) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as the in-process Grid sets them
    content = RecordDict({**({"config": ConfigRecord(config)} if config is not None else {}),
                          **{k: ConfigRecord(v) for k, v in records.items()}})
    return Message(content, dst_node_id=1, message_type=kind)


def _through_gate(monkeypatch, cfg: gate.GateConfig, message: Message, context: Context, content: bytes):
    """One forked ClientApp's view: Flower's three functions wrapped by the gate; returns (context, install's reason)."""
    from flwr.cli.config_utils import get_fab_metadata
    from flwr.supercore.fab import Fab
    from flwr.supercore.run import Run
    from flwr.supernode.runtime import run_clientapp as rc

    from hospitrust.ops.deploy import approval

    monkeypatch.setenv("FLWR_HOME", str(cfg.policy.parent / "flwr-home"))  # the gate installs the accepted bundle
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    run = Run.create_empty(7)
    (run.fab_id, run.fab_version), run.fab_hash = get_fab_metadata(content), approval.fab_sha256(content)
    monkeypatch.setattr(rc, "pull_task_input", lambda client: (message, context, run, Fab(run.fab_hash, content, {})))
    monkeypatch.setattr(rc, "install_from_fab", rc.install_from_fab)  # Flower's own, restored after the test
    monkeypatch.setattr(rc, "push_message", lambda client, reply, ctx: None)
    gate.install(cfg)
    _, ctx, _, fab = rc.pull_task_input(None)
    try:
        rc.install_from_fab(fab.content)
    except gate.Refused as exc:
        return ctx, str(exc)
    return ctx, None


def test_the_gate_hands_the_clientapp_the_values_it_checked(tmp_path, monkeypatch):
    policy = tmp_path / "policy.toml"
    policy.write_text('tasks = ["chest"]\nmax-local-epochs = 2\n')
    cfg = gate.GateConfig(policy=policy, hospital_images=40)
    content = _app(tmp_path / "app", True)
    context = Context(run_id=7, node_id=1, node_config={"hospital": "st-mary"}, state=RecordDict(),
                      run_config={"local-epochs": 2, "batch-size": 8})
    ctx, reason = _through_gate(monkeypatch, cfg, _message({"task": CHEST}), context, content)
    assert reason is None
    values = gate_values(ctx.node_config)
    assert values is not None and values["task"] == CHEST and values["images_per_epoch"] == 40
    # SecAgg+'s setup stage carries no task: the task the gate accepted earlier in this run is the one
    secagg = _message(None, "train", secaggplus_configs={"stage": "setup"})
    ctx, reason = _through_gate(monkeypatch, cfg, secagg, ctx, content)
    assert reason is None and gate_values(ctx.node_config)["task"] == CHEST  # type: ignore[index]
    # its train stage carries the config in the legacy FitIns record: 5 epochs asked there are refused
    fit = _message(None, "train", **{"fitins.config": {"local-epochs": 5}})
    _, reason = _through_gate(monkeypatch, cfg, fit, ctx, content)
    assert reason == "refused by site policy: max-local-epochs: 5 > 2"
    # a new run (a fresh context) whose query names no task: refused
    fresh = Context(run_id=8, node_id=1, node_config={"hospital": "st-mary"}, state=RecordDict(), run_config={})
    _, reason = _through_gate(monkeypatch, cfg, _message({}), fresh, content)
    assert reason is not None and "tasks: the message names no task" in reason


def test_the_clientapp_uses_the_gate_values_and_nothing_else(data_dir):
    run = run_config_defaults()
    task = resolve_task(parse_run_config(run))  # pneumoniamnist's built-in task
    other = dataclasses.replace(task, name="other")
    agreed = resolve("train", {"task": task.to_json(), "local-epochs": 1, "batch-size": 4}, run, hospital_images=10)
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=run,
                      node_config={"partition-id": 0, "num-partitions": 40, GATE_KEY: agreed.to_json()})
    hospital = hospital_context(context, _message({"task": other.to_json()}, "train"))
    assert hospital.task == task  # the gate's, not the message's
    server = ConfigRecord({"local-epochs": 50, "batch-size": 512})
    assert (hospital.local_epochs(server), hospital.batch_size(server)) == (1, 4)
    with pytest.raises(GateValuesError, match="more than the 10 its gate checked"):
        hospital.check_train_images(len(hospital.data.train))  # this partition has more than the 10 counted
    plain = HospitalContext(hospital.cfg, hospital.node, task, hospital.data)  # no gate: the message's values
    assert (plain.local_epochs(server), plain.batch_size(server)) == (50, 512)
    with pytest.raises(GateValuesError, match="not version 1"):
        gate_values({GATE_KEY: json.dumps({"version": 2})})


def test_min_hospitals_counts_the_key_entries_the_server_lists_and_says_so():
    """Finding 6, what can be tested: the count is of the key entries at SecAgg+'s key-sharing stage (Flower's record:
    the stage, then one public-key pair per node id). The server makes that list, so entries it made itself count
    too; the policy's own description and docs/security.md say so rather than claim more."""
    policy = SitePolicy.model_validate({"min-hospitals": 3})
    run = {"min-hospitals": 3, "secagg.enabled": True}
    own = {"stage": "share_keys", "101": [b"pk1", b"pk2"]}
    assert refusal(policy, "train", {}, run, secagg=own) == "min-hospitals: SecAgg+ shares keys among 1 key entries < 3"
    made_up = {**own, "900": [b"s1", b"s2"], "901": [b"s3", b"s4"]}  # two entries of key pairs the server made
    assert refusal(policy, "train", {}, run, secagg=made_up) is None  # the documented limit: a count, not identities
    description = SitePolicy.model_fields["min_hospitals"].description or ""
    assert "The server makes that list" in description and "not against one that adds keys it made itself" in description
    security = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    assert "one real hospital and two made-up entries pass `min-hospitals = 3`" in security

"""The batched path for simulated hospitals (`train.batched-hospitals`): the same math as training
them one after the other, hospital by hospital, from each hospital's own random draws.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.attacks.data_attacks import LabelFlip
from hospitrust.models import batched, build_model
from hospitrust.models.augment import parse_augmentation
from hospitrust.models.batched import BatchSession, TrainJob, train_together
from hospitrust.models.small_cnn import SmallCNN
from hospitrust.models.training import _train_today, balanced_class_weights, seed_everything, train

CPU = torch.device("cpu")
REL = 1e-5  # float32 accumulations in a different order (stacked convolutions, the weighted mean)


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _update(model, start) -> torch.Tensor:
    return torch.cat([(p.detach() - q.detach()).flatten() for p, q in zip(model.parameters(), start.parameters())])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _hospitals(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, size=(n, 28, 28, 1), dtype=np.uint8), rng.integers(0, 2, size=n)) for n in sizes]


def _settings(h, images, labels, augment):
    """Hospital h's variant: 0 honest, 1 class-weighted, 2 label-flipped (its own poisoned labels), 3 FedRS."""
    if h == 2:
        images, labels = LabelFlip().poison(images, labels, rng=np.random.default_rng(5), num_classes=2)
    return dict(images=images, labels=labels, class_weights=balanced_class_weights(labels, 2) if h == 1 else None,
                missing_class_scale=0.5 if h == 3 else 1.0, augment=augment if h != 2 else None)


def _both_paths(sizes, batch_size, augment=None, model_seed=1, build=lambda: SmallCNN(1, 2, 28)):
    """Every hospital trained today (one after the other) and batched, from the same model and RNG state.

    The model is seeded so that the step is the same on every run: where two inputs of a max-pooling
    window (or a ReLU's input and 0) differ by float rounding alone, the two paths' different summation
    orders can route that window's gradient differently (measured: about 1 hospital-step in 8 moves by
    1e-5 to 5e-3 relative; with average pooling about 1 in 40). This seed's steps have no such tie.
    """
    torch.manual_seed(model_seed)
    base = build()
    today, jobs = [], []
    for h, (images, labels) in enumerate(_hospitals(sizes)):
        s = _settings(h, images, labels, augment)
        model = copy.deepcopy(base)
        seed_everything(1, h, 1)
        result = _train_today(model, s["images"], s["labels"], epochs=1, batch_size=batch_size, learning_rate=0.05,
                              optimizer="sgd", momentum=0.9, weight_decay=1e-4, proximal_mu=0.0, device=CPU,
                              generator=None, class_weights=s["class_weights"],
                              missing_class_scale=s["missing_class_scale"], augment=s["augment"])
        today.append((model, result, torch.get_rng_state()))
        seed_everything(1, h, 1)
        job = TrainJob(copy.deepcopy(base), s["images"], s["labels"], 1, batch_size, 0.05, "sgd", 0.9, 1e-4, 0.0, CPU,
                       None, s["class_weights"], s["missing_class_scale"], s["augment"], _not_today)
        job.rng = batched._save_rng(CPU)
        jobs.append(job)
    train_together(jobs)
    return base, today, jobs


def _not_today():
    raise AssertionError("a batchable job trained on today's path")


def test_one_step_matches_todays_path(one_thread):
    """One full-batch step from the same model: honest, class-weighted, label-flipped and FedRS
    hospitals' updates within 1e-5 of today's (by norm), the same reported loss.
    """
    base, today, jobs = _both_paths([48, 48, 48, 48], batch_size=48)
    for (model, result, _), job in zip(today, jobs):
        assert job.result.steps == result.steps == 1
        assert _rel(_update(job.model, base), _update(model, base)) < REL
        assert job.result.loss == pytest.approx(result.loss, rel=REL)


def test_one_step_of_the_tiny_cnn_matches_todays_path(one_thread):
    """The leaderboard's tiny CNN (the same chain at a quarter of the widths, GroupNorm of 4 groups) on the
    grouped engine: every update within 1e-5 of today's.
    """
    base, today, jobs = _both_paths([48, 48, 48, 48], batch_size=48, build=lambda: build_model("tiny-cnn", 1, 2, 28))
    for (model, result, _), job in zip(today, jobs):
        assert _rel(_update(job.model, base), _update(model, base)) < REL


@pytest.mark.parametrize(("engine", "chunk"), [("grouped", 2), ("grouped", 16), ("vmap", 2)])
def test_uneven_hospitals_with_augmentation_dropout_and_momentum_match_todays_path(one_thread, monkeypatch, engine, chunk):
    """3, 2, 4 and 2 batches, smaller last batches, per-image augmentation and dropout drawn from each
    hospital's own generator: every update within 1e-5 of today's, and each hospital's RNG ends where
    today's training leaves it (what its ClientApp draws next is the same); with grouped convolutions
    (the small CNN's chain of layers: two hospitals per computation, and all at once) and with vmap
    (any model without buffers).
    """
    monkeypatch.setattr(batched, "ENGINE", engine)
    monkeypatch.setattr(batched, "CHUNK", chunk)
    augment = parse_augmentation(["horizontal-flip", "rotation=10"], 28)
    base, today, jobs = _both_paths([70, 40, 100, 33], batch_size=32, augment=augment)
    for (model, result, rng_after), job in zip(today, jobs):
        assert job.result.steps == result.steps and job.result.num_examples == result.num_examples
        assert _rel(_update(job.model, base), _update(model, base)) < REL
        assert job.result.loss == pytest.approx(result.loss, rel=REL)
        assert torch.equal(job.rng["torch"], rng_after)


def test_the_grouped_engine_takes_chains_of_known_layers_only():
    """The small CNN is a chain of layers the grouped engine runs; a model with a residual add is not."""

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.flat, self.fc = torch.nn.Conv2d(1, 1, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(784, 2)

        def forward(self, x):
            return self.fc(self.flat(x + self.conv(x)))

    assert batched._GroupedNet.of(SmallCNN(1, 2), ["classifier.3.mask"]) is not None
    assert batched._GroupedNet.of(Residual(), []) is None
    assert batched._GroupedNet.of(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2), torch.nn.Conv2d(1, 1, 1)),
                                  []) is None


def test_a_job_the_batched_step_cannot_train_logs_why_and_trains_as_today(one_thread, caplog):
    """Adam and a model with BatchNorm buffers: not batched, logged once, bit-equal to today's path;
    the session runs hospitals one at a time in order and lets a failing one fail alone.
    """
    assert "optimizer adam" in TrainJob(SmallCNN(1, 2), *_hospitals([4])[0], 1, 4, 0.1, "adam", 0.9, 0.0, 0.0, CPU, None,
                                        None, 1.0, None, _not_today).why_not_batched()
    bn = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(), torch.nn.Linear(1352, 2))
    assert "has buffers" in TrainJob(bn, *_hospitals([4])[0], 1, 4, 0.1, "sgd", 0.9, 0.0, 0.0, CPU, None, None, 1.0,
                                     None, _not_today).why_not_batched()
    data, base = _hospitals([20, 30]), SmallCNN(1, 2, 28)

    def hospital(h, model):
        def call():
            seed_everything(3, h)
            return train(model, *data[h], epochs=1, batch_size=8, learning_rate=0.01, optimizer="adam", device=CPU)
        return call

    alone = [copy.deepcopy(base) for _ in data]
    expected = [hospital(h, m)() for h, m in enumerate(alone)]
    together = [copy.deepcopy(base) for _ in data]

    def fails():
        raise ValueError("no data")

    with caplog.at_level("INFO"):
        results = BatchSession().run([hospital(0, together[0]), lambda: _catch(fails), hospital(1, together[1])])
    assert results[0] == expected[0] and results[2] == expected[1] and isinstance(results[1], ValueError)
    for a, b in zip(alone, together):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert "optimizer adam" in caplog.text


def _catch(call):
    try:
        return call()
    except ValueError as ex:
        return ex


def _round_updates(tmp_path, name, attack, *, batched_on, threads, monkeypatch):
    """Each hospital's update (its reply minus the global model it got) after one in-process round."""
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app import app as server_app

    cfg = small_run_config(tmp_path / name, **{"num-server-rounds": 1, "batch-size": 16, "train-subsample": 0.04,
                                               "attack": attack, "malicious-hospitals": "1",
                                               "train.class-weighted-loss": True,
                                               "train.batched-hospitals": batched_on})
    updates: dict[int, torch.Tensor] = {}

    def capture(index, msg, reply):
        if msg.metadata.message_type == "train":
            sent, got = msg.content["arrays"].to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
            updates[index] = torch.cat([(got[k] - sent[k]).flatten() for k in sorted(sent)])
        return reply

    groups: list[int] = []
    original = batched._train_group
    monkeypatch.setattr(batched, "_train_group", lambda jobs: (groups.append(len(jobs)), original(jobs)))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        grid = InProcessGrid(client_app, 4, cfg, reply_filter=capture)
        server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    finally:
        torch.set_num_threads(previous)
    assert groups == ([4] if batched_on else [])  # the four hospitals trained as one computation, or none did
    return updates


@pytest.mark.parametrize("attack", ["label-flip", "sign-flip"])
def test_a_round_matches_todays_path(tmp_path, data_dir, monkeypatch, attack):
    """One in-process round of 4 hospitals (hospital 1 label-flipped or sign-flipped, class-weighted
    loss, several uneven batches): each hospital's update, batched, within max(1e-5, 2 x what today's
    path moves between 1 and 2 threads) of today's.
    """
    one = _round_updates(tmp_path, "one", attack, batched_on=False, threads=1, monkeypatch=monkeypatch)
    two = _round_updates(tmp_path, "two", attack, batched_on=False, threads=2, monkeypatch=monkeypatch)
    together = _round_updates(tmp_path, "batched", attack, batched_on=True, threads=1, monkeypatch=monkeypatch)
    assert sorted(one) == sorted(together) == [0, 1, 2, 3]
    for h in one:
        allowed = max(REL, 2 * _rel(two[h], one[h]))
        assert _rel(together[h], one[h]) < allowed, (h, _rel(together[h], one[h]), allowed)

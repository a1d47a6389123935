"""Local training: the class-weighted loss (`class-weighted-loss`) by hand and through a run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict

from conftest import small_run_config
from hospitrust.models.training import balanced_class_weights, class_weights_from_counts, to_batch, train


def test_balanced_class_weights_by_hand():
    # n = 4, two classes present: w0 = 4 / (2 x 3), w1 = 4 / (2 x 1); class 2 absent -> 1
    w = balanced_class_weights(np.array([0, 0, 0, 1]), 3)
    assert w.tolist() == pytest.approx([2 / 3, 2.0, 1.0])
    # balanced labels: every weight 1
    assert balanced_class_weights(np.array([0, 1, 2, 0, 1, 2]), 3).tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert balanced_class_weights(np.array([], dtype=np.int64), 2).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        balanced_class_weights(np.array([0, 2]), 2)


def test_federation_class_weights_by_hand():
    # totals 60 / 30 / 10 / 0: w_c = 100 / (3 n_c); the absent class 1
    assert class_weights_from_counts([60, 30, 10, 0], 4).tolist() == pytest.approx([100 / 180, 100 / 90, 100 / 30, 1.0])
    # a specialist holding 60 of class 2 and 40 of class 0: its own counts weigh class 2 down,
    # the federation's (class 2 is rare there) weigh it up
    own = balanced_class_weights(np.array([0] * 40 + [2] * 60), 3)
    fed = class_weights_from_counts([900, 300, 60], 3)
    assert own[2] < 1.0 < fed[2] and fed[2] > fed[0]
    with pytest.raises(ValueError, match="one entry per class"):
        class_weights_from_counts([1, 2], 3)
    with pytest.raises(ValueError, match="finite and >= 0"):
        class_weights_from_counts([1, -2, 3], 3)


def test_the_hospital_takes_federation_totals_when_the_server_sends_them():
    from types import SimpleNamespace

    from hospitrust.client_app.training import loss_class_weights

    labels = np.array([0, 0, 0, 1])
    on, off = SimpleNamespace(class_weighted_loss=True), SimpleNamespace(class_weighted_loss=False)
    assert loss_class_weights(off, {"federation-class-counts": [1.0, 1.0]}, labels, 2) is None
    assert loss_class_weights(on, {}, labels, 2).tolist() == pytest.approx([2 / 3, 2.0])
    assert loss_class_weights(on, {"federation-class-counts": [10.0, 30.0]}, labels, 2).tolist() == pytest.approx([2.0, 2 / 3])


def test_one_weighted_step_matches_the_hand_computed_gradient():
    """One full-batch SGD step with class weights = w - lr * grad(sum w_y l / sum w_y)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(6, 2, 2, 1), dtype=np.uint8)
    labels = np.array([0, 0, 0, 0, 1, 1])
    weights = balanced_class_weights(labels, 2)  # [0.75, 1.5]

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))

    expected = model()
    x, y = to_batch(images, torch.device("cpu")), torch.from_numpy(labels)
    logits = expected(x)
    per_sample = F.cross_entropy(logits, y, reduction="none")
    loss = (weights[y] * per_sample).sum() / weights[y].sum()
    loss.backward()
    with torch.no_grad():
        for p in expected.parameters():
            p -= 0.1 * p.grad

    for cw, should_match in ((weights, True), (None, False)):
        m = model()
        train(m, images, labels, epochs=1, batch_size=6, learning_rate=0.1, momentum=0.0, device=torch.device("cpu"),
              generator=torch.Generator().manual_seed(0), class_weights=cw)
        same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(m.parameters(), expected.parameters()))
        assert same is should_match


def test_restricted_softmax_step_matches_the_hand_computed_gradient():
    """FedRS (fedrs-alpha): one full-batch SGD step on CE(logits x s), s = 1 for the classes the
    hospital holds and alpha for the others. At alpha 0 the absent class's row and bias get no
    gradient at all; at alpha 1 it is the plain step."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(5, 2, 2, 1), dtype=np.uint8)
    labels = np.array([0, 1, 1, 0, 1])  # class 2 absent

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))

    x, y = to_batch(images, torch.device("cpu")), torch.from_numpy(labels)
    for alpha in (0.0, 0.5, 1.0):
        expected = model()
        scale = torch.tensor([1.0, 1.0, alpha])
        F.cross_entropy(expected(x) * scale, y).backward()
        with torch.no_grad():
            for p in expected.parameters():
                p -= 0.1 * p.grad
        m, start = model(), model()
        train(m, images, labels, epochs=1, batch_size=5, learning_rate=0.1, momentum=0.0, device=torch.device("cpu"),
              generator=torch.Generator().manual_seed(0), missing_class_scale=alpha)
        for a, b in zip(m.parameters(), expected.parameters()):
            assert torch.allclose(a, b, atol=1e-6)
        moved = [float((a - b)[2].abs().max().detach()) for a, b in zip(m.parameters(), start.parameters())]  # class 2's row, bias
        assert (max(moved) == 0.0) is (alpha == 0.0)
    with pytest.raises(ValueError, match=r"fedrs-alpha\) must be in \[0, 1\]"):
        train(model(), images, labels, epochs=1, batch_size=5, learning_rate=0.1, missing_class_scale=1.5)


def test_class_weighted_loss_reaches_the_hospitals_training(tmp_path, data_dir):
    """The same seeded run without `class-weighted-loss`, with the hospitals' own weights and with
    the federation's (`class-weights-from = federation`) ends with three different models."""
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app.results import read_round_records
    from hospitrust.server_app import app as server_app

    losses = []
    for name, weighted, source in (("off", False, "hospital"), ("own", True, "hospital"), ("fed", True, "federation")):
        cfg = small_run_config(tmp_path / name, **{"train.class-weighted-loss": weighted, "train.class-weights-from": source,
                                                   "num-server-rounds": 1})
        grid = InProcessGrid(client_app, 3, cfg)
        server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
        losses.append(read_round_records(tmp_path / name / "runs" / cfg["run-name"])[-1].central["loss"])
    assert losses[0] != pytest.approx(losses[1], rel=1e-6)
    assert losses[2] != pytest.approx(losses[0], rel=1e-6) and losses[2] != pytest.approx(losses[1], rel=1e-6)


def test_fedrs_alpha_reaches_the_hospitals_training(tmp_path, data_dir):
    """With normal (class 0) held by hospital 0 alone, the same seeded run with fedrs-alpha 1 and 0
    ends with different models; with every class held everywhere alpha changes nothing."""
    from hospitrust.client_app import app as client_app
    from hospitrust.ops.inprocess import InProcessGrid
    from hospitrust.server_app.results import read_round_records
    from hospitrust.server_app import app as server_app

    def final_loss(name, **extra):
        cfg = small_run_config(tmp_path / name, **{"num-server-rounds": 1, **extra})
        grid = InProcessGrid(client_app, 3, cfg)
        server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
        return read_round_records(tmp_path / name / "runs" / cfg["run-name"])[-1].central["loss"]

    specialist = {"partitioner": "specialist", "specialist.classes": "0:0"}
    assert final_loss("spec-on", **specialist, **{"train.fedrs-alpha": 0.0}) != pytest.approx(
        final_loss("spec-off", **specialist), rel=1e-6)
    iid = {"partitioner": "iid"}
    # float32 runs on one machine: the same arithmetic gives the same bits; 1e-6 allows a reordered sum and still
    # tells apart the specialist case above
    assert final_loss("iid-on", **iid, **{"train.fedrs-alpha": 0.0}) == pytest.approx(final_loss("iid-off", **iid), rel=1e-6)

"""The simulated hospitals of a round trained as one computation (``train.batched-hospitals``).

In process (``hospitrust.ops.inprocess``), a round's ten hospitals are ten independent trainings of
the same small model on batches of 32 tiny images: small convolutions and Python overhead use a
fraction of the CPU's arithmetic. With ``train.batched-hospitals = true`` the in-process grid calls
each hospital's ClientApp in its own thread (:class:`BatchSession`); the threads run one at a time,
in message order, and meet inside :func:`hospitrust.models.training.train`: each *parks* its
training job there and waits. When every hospital has parked or finished, the jobs of the same
architecture and optimizer settings are trained together (:func:`train_together`): the parameters
are stacked, one computation per :data:`CHUNK` hospitals gives each its gradient of its own batch (grouped
convolutions and batched matmuls, :class:`_GroupedNet`, for a chain of the small CNN's layers; else
``torch.func.vmap(grad(functional_call(...)))``), and SGD (momentum, weight decay) steps their rows of the
stacked tensors in place with ``torch.optim.SGD``'s arithmetic. Then the threads resume, one at a time, in message order: each
hospital's ClientApp and mods run as they do without the option (an update attacker rewrites its
own update after training).

Same math, replayed per hospital: each hospital's random draws (its permutation per epoch, its
augmentation per image, its dropout masks) come from its own global RNG state, the one its thread
left at the barrier (seeded by ``seed_everything`` per hospital and round), in the order today's
loop draws them; after training the thread continues from the state its own training left.
Hospitals with fewer batches drop out of the stacked step when they are done; a smaller last batch
is padded and masked out of the loss. What the batched step cannot do (Adam, models with buffers
or random layers other than ``nn.Dropout``, frozen parameters, a job alone in its group) runs
today's loop, and the run logs once why; DP-SGD and FED-FBD never park (they log why too).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

_LOGGED: set[str] = set()
_THREAD = threading.local()  # .session: the BatchSession this ClientApp thread belongs to


def note_not_batched(why: str) -> None:
    """Log once per process that a hospital trained on today's path, and why."""
    if why in _LOGGED:
        return
    _LOGGED.add(why)
    from flwr.common import log

    log(INFO, "train.batched-hospitals: a hospital trains alone (today's loop): %s", why)


def current_session() -> BatchSession | None:
    """The batch session of this thread (a ClientApp called by a batching in-process grid), or None."""
    return getattr(_THREAD, "session", None)


# ---- one hospital's training job -------------------------------------------------------------------
@dataclass
class TrainJob:
    """What ``training.train`` was asked to do at one hospital, parked at the barrier."""

    model: nn.Module
    images: np.ndarray
    labels: np.ndarray
    epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str
    momentum: float
    weight_decay: float
    proximal_mu: float
    device: torch.device
    generator: torch.Generator | None
    class_weights: torch.Tensor | None
    missing_class_scale: float
    augment: Callable[[torch.Tensor], torch.Tensor] | None
    today: Callable[[], Any]  # the job on today's loop (``training.train``'s own path), from the current RNG state
    rng: dict[str, Any] = field(default_factory=dict)  # the hospital's global RNG states
    result: Any = None  # its TrainResult, once trained

    def why_not_batched(self) -> str:
        """'' when the batched step can train this job, else why not."""
        if self.optimizer != "sgd":
            return f"optimizer {self.optimizer} (the batched step implements SGD)"
        if any(True for _ in self.model.buffers()):
            return f"model {type(self.model).__name__} has buffers (e.g. BatchNorm's running statistics)"
        if not all(p.requires_grad for p in self.model.parameters()):
            return "the model has frozen parameters"
        for m in self.model.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd) and type(m) is not nn.Dropout:
                return f"the model has a {type(m).__name__} layer (the batched step replays nn.Dropout only)"
            if isinstance(m, nn.Dropout) and m.inplace:
                return "the model has an in-place dropout"
        return ""

    def group_key(self) -> tuple:
        """Jobs with the same key train together: architecture, image shape, optimizer settings, device."""
        shapes = tuple((name, tuple(p.shape), p.dtype) for name, p in self.model.named_parameters())
        return (type(self.model), repr(self.model), shapes, tuple(self.images.shape[1:]), str(self.device),
                float(self.learning_rate), float(self.momentum), float(self.weight_decay), float(self.proximal_mu))


def _save_rng(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "random": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _load_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class _HospitalRng:
    """``with`` it, the global RNGs are this job's (and what was drawn is kept for its next draws)."""

    def __init__(self, job: TrainJob) -> None:
        self.job = job

    def __enter__(self) -> None:
        _load_rng(self.job.rng, self.job.device)

    def __exit__(self, *exc) -> None:
        self.job.rng = _save_rng(self.job.device)


# ---- the session: threads that meet at a barrier ---------------------------------------------------
class BatchSession:
    """Calls ``calls`` (one per hospital) in threads, one at a time in order; a call that reaches
    ``training.train`` parks its job; when all have parked or finished, the parked jobs are trained
    together and their threads resume, one at a time in order. Returns each call's result (a call
    catches its own exceptions: one that escapes is raised here, after every thread has ended).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parked: dict[int, TrainJob] = {}
        self._state: dict[int, str] = {}  # index -> running | parked | done
        self._turn = -1

    def run(self, calls: list[Callable[[], Any]]) -> list[Any]:
        out: list[Any] = [None] * len(calls)
        escaped: list[BaseException] = []

        def body(i: int) -> None:
            _THREAD.session, _THREAD.index = self, i
            with self._cond:
                self._cond.wait_for(lambda: self._turn == i)
                try:
                    out[i] = calls[i]()
                except BaseException as ex:  # noqa: BLE001 - handed to the caller's thread, raised there
                    escaped.append(ex)
                finally:
                    self._state[i] = "done"
                    self._cond.notify_all()

        threads = [threading.Thread(target=body, args=(i,), name=f"hospital-{i}", daemon=True) for i in range(len(calls))]
        with self._cond:
            for t in threads:
                t.start()
            order = list(range(len(calls)))
            for i in order:  # each runs until it parks or finishes
                self._give_turn(i)
            while self._parked:
                jobs = dict(sorted(self._parked.items()))
                try:
                    train_together(list(jobs.values()))
                except Exception as ex:  # noqa: BLE001 - each hospital's ClientApp raises it, as its training would
                    for job in jobs.values():
                        job.result = ex
                self._parked.clear()
                for i in jobs:  # resume in order, each until it finishes (or parks again)
                    self._give_turn(i)
        for t in threads:
            t.join()
        if escaped:
            raise escaped[0]
        return out

    def _give_turn(self, i: int) -> None:
        self._state[i] = "running"
        self._turn = i
        self._cond.notify_all()
        self._cond.wait_for(lambda: self._state[i] != "running")
        self._turn = -1

    def park(self, job: TrainJob):
        """Called by ``train`` in a hospital's thread: wait for the batched training, return its result."""
        i = _THREAD.index
        job.rng = _save_rng(job.device)
        self._parked[i] = job
        self._state[i] = "parked"
        self._turn = -1
        self._cond.notify_all()
        self._cond.wait_for(lambda: self._turn == i)
        _load_rng(job.rng, job.device)  # continue from the state this hospital's own training left
        if isinstance(job.result, BaseException):
            raise job.result
        return job.result


# ---- training the parked jobs ----------------------------------------------------------------------
def train_together(jobs: list[TrainJob]) -> None:
    """Train every job (``job.result`` set, ``job.model`` trained in place): jobs of the same group
    together, the others alone with today's loop, each from its own RNG state.
    """
    groups: dict[tuple, list[TrainJob]] = {}
    for job in jobs:
        why = job.why_not_batched()
        if why:
            note_not_batched(why)
            _train_alone(job)
        else:
            groups.setdefault(job.group_key(), []).append(job)
    if len(groups) > 1:
        note_not_batched("the round's hospitals differ in model, image size or optimizer settings: one batch per kind")
    for group in groups.values():
        if len(group) == 1:
            _train_alone(group[0])
        else:
            _train_group(group)


def _train_alone(job: TrainJob) -> None:
    with _HospitalRng(job):
        job.result = job.today()


class _MaskedDropout(nn.Module):
    """``nn.Dropout`` with its mask given (a buffer passed to ``functional_call``): the mask,
    drawn from the hospital's own RNG as ``F.dropout`` draws it, already holds the 1 / (1 - p) scale.
    """

    mask: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.zeros(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask


@dataclass
class _Plan:
    """A template of the architecture (dropouts made mask-driven) and its dropouts' shapes per example."""

    template: nn.Module
    classes: int  # the model's outputs
    dropouts: list[tuple[str, float, tuple[int, ...]]]  # (mask buffer name, p, per-example shape), forward order


def _plan(model: nn.Module, image_shape: tuple[int, ...], device: torch.device) -> _Plan:
    import copy

    template = copy.deepcopy(model).to(device)
    seen: list[tuple[str, float, tuple[int, ...]]] = []
    hooks = []
    for name, m in template.named_modules():
        if isinstance(m, nn.Dropout):
            hooks.append(m.register_forward_hook(
                lambda mod, inp, _out, name=name: seen.append((name, float(mod.p), tuple(inp[0].shape[1:])))))
    h, w, c = image_shape
    with torch.no_grad():
        classes = int(template.eval()(torch.zeros(1, c, h, w, device=device)).shape[-1])
    for hook in hooks:
        hook.remove()
    for name, _p, _shape in seen:
        parent_name, _, child = name.rpartition(".")
        parent = template.get_submodule(parent_name) if parent_name else template
        setattr(parent, child, _MaskedDropout())
    for p in template.parameters():
        p.requires_grad_(False)
    return _Plan(template.train(), classes, [(f"{name}.mask", p, shape) for name, p, shape in seen])


class _Hospital:
    """One job's draws and counters in the batched loop (its permutation, augmentation, dropout masks)."""

    def __init__(self, job: TrainJob, plan: _Plan) -> None:
        from hospitrust.models.loop import ShuffledBatches, restricted_softmax_scale

        self.job, self.plan = job, plan
        self.source = ShuffledBatches(job.images, job.labels, job.batch_size, job.device, job.generator)
        self.per_epoch = -(-self.source.n // job.batch_size)
        self.steps = job.epochs * self.per_epoch
        self.batches: list[torch.Tensor] = []
        self.total, self.seen = 0.0, 0
        ones = torch.ones(plan.classes, device=job.device)  # plain softmax, unweighted: PyTorch's mean
        scale = restricted_softmax_scale(job.model, job.labels, job.missing_class_scale, job.device)
        self.logit_scale = ones if scale is None else scale
        self.weight = ones if job.class_weights is None else torch.as_tensor(job.class_weights, dtype=torch.float32).to(job.device)

    def draw(self, step: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Batch ``step``: uint8 images (after augmentation), labels and dropout masks, drawn as today's loop draws them."""
        from hospitrust.models.augment import augment_batch
        from hospitrust.models.loop import uint8_batches

        with _HospitalRng(self.job):
            k = step % self.per_epoch
            if k == 0:
                self.batches = self.source.order()
            idx = self.batches[k]
            raw = next(iter(uint8_batches(self.job.images, [idx.numpy()], self.job.device)))
            if self.job.augment is not None and raw.shape[0]:
                raw = augment_batch(raw, self.job.augment)
            b = int(raw.shape[0])
            masks = [F.dropout(torch.ones((b, *shape), device=self.job.device), p, training=True)
                     for _name, p, shape in self.plan.dropouts]
        return raw, self.source.labels[idx.to(self.job.device)], masks


def _train_group(jobs: list[TrainJob]) -> None:
    from torch.func import functional_call, grad, vmap

    from hospitrust.models.loop import TrainResult, scale

    first = jobs[0]
    device = first.device
    plan = _plan(first.model, tuple(first.images.shape[1:]), device)
    hospitals = [_Hospital(job, plan) for job in jobs]
    names = [name for name, _ in first.model.named_parameters()]
    stacked = {name: torch.stack([dict(job.model.named_parameters())[name].detach().to(device) for job in jobs])
               for name in names}
    start = {name: t.clone() for name, t in stacked.items()} if first.proximal_mu > 0 else None
    weights = torch.stack([h.weight for h in hospitals])
    scales = torch.stack([h.logit_scale for h in hospitals])
    lr, momentum, wd, mu = first.learning_rate, first.momentum, first.weight_decay, first.proximal_mu
    mask_names = [name for name, _p, _s in plan.dropouts]

    def loss_of(params, x, y, valid, weight, logit_scale, masks, start_params):
        logits = functional_call(plan.template, (params, dict(zip(mask_names, masks))), (x,))
        logits = logits * logit_scale
        per_example = F.cross_entropy(logits, y, reduction="none")
        w = weight[y] * valid
        loss = (per_example * w).sum() / w.sum()
        if start_params is not None:
            prox = sum(((params[n] - start_params[n]) ** 2).sum() for n in names)
            loss = loss + 0.5 * mu * prox
        return loss, loss.detach()

    step_grads = vmap(grad(loss_of, has_aux=True), in_dims=(0, 0, 0, 0, 0, 0, 0, 0 if start is not None else None))
    grouped = _GroupedNet.of(first.model, mask_names) if ENGINE == "grouped" else None
    if grouped is not None:
        step_grads = grouped.step_grads(mu)
    most = max(h.steps for h in hospitals)
    buffers: dict[str, torch.Tensor] = {n: torch.zeros_like(t) for n, t in stacked.items()} if momentum != 0 else {}
    for step in range(most):
        rows = [i for i, h in enumerate(hospitals) if step < h.steps]
        drawn = [hospitals[i].draw(step) for i in rows]
        width = max(int(raw.shape[0]) for raw, _y, _m in drawn)
        x = torch.stack([_pad(scale(raw), width) for raw, _y, _m in drawn])
        y = torch.stack([_pad(lab, width) for _r, lab, _m in drawn])
        valid = torch.stack([_pad(torch.ones(int(lab.shape[0]), device=device), width) for _r, lab, _m in drawn])
        masks = [torch.stack([_pad(m[k], width) for _r, _l, m in drawn]) for k in range(len(mask_names))]
        losses: list[float] = []
        # hospitals a:b (consecutive rows of the stacked tensors: views, no copies), CHUNK at a time: one
        # computation of their gradients, then torch.optim.SGD's single-tensor step (dampening 0, no
        # nesterov) on their rows of the stacked parameters, in place
        for a, b, j in _runs(rows, CHUNK):
            here, drawn_here = slice(a, b), slice(j, j + b - a)
            params = {n: stacked[n][here] for n in names}
            grads, chunk_losses = step_grads(params, x[drawn_here], y[drawn_here], valid[drawn_here], weights[here],
                                             scales[here], [m[drawn_here] for m in masks],
                                             None if start is None else {n: start[n][here] for n in names})
            with torch.no_grad():
                for n in names:
                    p, g = params[n], grads[n]
                    if wd != 0:
                        g = g.add(p, alpha=wd)
                    if momentum != 0:
                        buf = buffers[n][here]
                        if step == 0:  # every hospital's first step: the buffer is the gradient
                            buf.copy_(g)
                        else:
                            buf.mul_(momentum).add_(g)
                        g = buf
                    p.add_(g, alpha=-lr)
            losses += chunk_losses.tolist()
        for row, loss, (_r, lab, _m) in zip(rows, losses, drawn):
            b = int(lab.shape[0])
            hospitals[row].total += float(loss) * b
            hospitals[row].seen += b
    with torch.no_grad():
        for k, (job, h) in enumerate(zip(jobs, hospitals)):
            for name, p in job.model.named_parameters():
                p.copy_(stacked[name][k])
            job.result = TrainResult(h.total / max(h.seen, 1), int(h.source.n), h.steps)


#: how a group's gradients are computed: "grouped" (grouped convolutions and batched matmuls over the
#: stacked hospitals, where the model is a chain of the layers :class:`_GroupedNet` knows), else "vmap"
ENGINE = "grouped"
#: hospitals per computation of gradients: all ten hospitals' activations at once (33 MB for the small CNN's
#: first block at batch 32) leave the CPU's caches and ran 1.5x slower than ten hospitals alone
CHUNK = 2
#: the grouped engine's images channels-last, as today's loop gets them (uint8 (B, H, W, C) batches permuted):
#: oneDNN's convolutions keep that layout, and ATen's max-pooling of channels-last tensors ran about 10x faster
#: than of NCHW ones at these sizes on one thread
CHANNELS_LAST = True


class _GroupedNet:
    """The model's layers run on every hospital at once: images of H hospitals as (B, H x C, h, w)
    (hospital h's channels a block), a convolution as one with H groups, GroupNorm(g) as GroupNorm(H x g),
    pooling and ReLU as they are; after Flatten (H, B, features), a Linear as one batched matmul.
    Only for a model that traces (torch.fx) to a chain of such layers; else None (vmap computes).
    """

    LAYERS = (nn.Conv2d, nn.GroupNorm, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten,
              nn.Linear, nn.Dropout)

    def __init__(self, layers: list[tuple[str, nn.Module]], mask_names: list[str]) -> None:
        self.layers, self.mask_names = layers, mask_names

    @classmethod
    def of(cls, model: nn.Module, mask_names: list[str]) -> _GroupedNet | None:
        class _Tracer(torch.fx.Tracer):  # the known layers (and their subclasses, e.g. small_cnn's pools) as leaves
            def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
                return isinstance(m, cls.LAYERS) or super().is_leaf_module(m, qualified_name)

        try:
            graph = _Tracer().trace(model)
        except Exception:  # noqa: BLE001 - a model fx cannot trace: vmap computes its gradients
            return None
        nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
        layers: list[tuple[str, nn.Module]] = []
        previous = next(n for n in graph.nodes if n.op == "placeholder")
        flat = False
        for node in nodes:
            if node.op != "call_module" or list(node.args) != [previous] or node.kwargs:
                return None
            module = model.get_submodule(str(node.target))
            if not isinstance(module, cls.LAYERS):
                return None
            if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"
                                                  or isinstance(module.padding, str)):
                return None
            if isinstance(module, nn.Flatten) and (flat or module.start_dim != 1 or module.end_dim != -1):
                return None
            if (flat and not isinstance(module, (nn.Linear, nn.Dropout, nn.ReLU))
                    or not flat and isinstance(module, (nn.Linear, nn.Dropout))):
                return None  # image layers before Flatten; Linear, Dropout and ReLU after it
            flat = flat or isinstance(module, nn.Flatten)
            layers.append((str(node.target), module))
            previous = node
        return cls(layers, mask_names) if flat else None

    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: list[torch.Tensor]) -> torch.Tensor:
        """(H, B, C, h, w) images -> (H, B, classes) logits, hospital h with its own parameters."""
        hospitals, batch = int(x.shape[0]), int(x.shape[1])
        z = x.transpose(0, 1).reshape(batch, -1, *x.shape[3:])
        if CHANNELS_LAST:
            z = z.contiguous(memory_format=torch.channels_last)
        dropout = 0
        for name, m in self.layers:
            if isinstance(m, nn.Conv2d):
                w = params[f"{name}.weight"]
                b = params.get(f"{name}.bias")
                z = F.conv2d(z, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1), m.stride, m.padding,
                             m.dilation, groups=hospitals)
            elif isinstance(m, nn.GroupNorm):
                gw, gb = params.get(f"{name}.weight"), params.get(f"{name}.bias")
                z = F.group_norm(z, hospitals * m.num_groups, None if gw is None else gw.reshape(-1),
                                 None if gb is None else gb.reshape(-1), m.eps)
            elif isinstance(m, nn.ReLU):
                z = F.relu(z)
            elif isinstance(m, nn.Flatten):
                z = z.reshape(batch, hospitals, -1).transpose(0, 1)
            elif isinstance(m, nn.Linear):
                w, b = params[f"{name}.weight"], params.get(f"{name}.bias")
                z = torch.bmm(z, w.transpose(1, 2)) if b is None else torch.baddbmm(b.unsqueeze(1), z, w.transpose(1, 2))
            elif isinstance(m, nn.Dropout):
                z = z * masks[dropout]
                dropout += 1
            else:  # pooling: per channel, as it is
                z = m(z)
        return z

    def step_grads(self, mu: float):
        """A function with vmap's signature: (params, x, y, valid, weight, logit_scale, masks, start) ->
        (each hospital's gradients, each hospital's loss).
        """

        def compute(params, x, y, valid, weight, logit_scale, masks, start_params):
            leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
            logits = self.forward(leaves, x, masks) * logit_scale.unsqueeze(1)
            hospitals, batch = int(y.shape[0]), int(y.shape[1])
            per_example = F.cross_entropy(logits.reshape(hospitals * batch, -1), y.reshape(-1),
                                          reduction="none").reshape(hospitals, batch)
            w = torch.gather(weight, 1, y) * valid
            loss = (per_example * w).sum(1) / w.sum(1)
            if start_params is not None:
                loss = loss + 0.5 * mu * sum(((leaves[n] - start_params[n]) ** 2).flatten(1).sum(1) for n in leaves)
            grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
            return dict(zip(leaves, grads)), loss.detach()

        return compute


def _runs(rows: list[int], chunk: int):
    """(a, b, j): hospitals a..b-1, consecutive in ``rows`` (sorted) from its position j, at most ``chunk`` of them."""
    j = 0
    while j < len(rows):
        k = j + 1
        while k < len(rows) and k - j < chunk and rows[k] == rows[k - 1] + 1:
            k += 1
        yield rows[j], rows[k - 1] + 1, j
        j = k


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``width`` rows."""
    if t.shape[0] == width:
        return t
    return torch.cat([t, t.new_zeros((width - t.shape[0], *t.shape[1:]))])


__all__ = ["BatchSession", "TrainJob", "current_session", "note_not_batched", "train_together"]

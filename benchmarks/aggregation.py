"""Benchmark hospitrust.aggregation against a one-pass read, over n and f (and Flower's built-ins).

For every (model size, number of clients n) it builds one set of synthetic client updates
(float32, ``randn * 0.01``; the first f rows are attackers moved by +5), then for every f times
on the same data:

* each ``hospitrust.aggregation`` rule on the stacked ``(n, d)`` tensor; the rules that take
  an f (trimmed mean, Krum, Multi-Krum, Bulyan) at every f given that the rule admits
  (trimmed mean 2f < n, Krum and Multi-Krum n >= 2f + 3, Bulyan n >= 4f + 3), the others
  once per n;
* the field's defences (issue 34): the pre-aggregation steps alone (their output is an
  ``(n', d)`` stack, written into a reused buffer as a round loop would) and the chain ``arc+nnm``, and the rules FLAME (clustering
  the local models, its strategy's default), FoolsGold (with a fixed history, writing the new one into a
  reused buffer), DnC, SignGuard, clipped clustering, MDA, SMEA, MoNNA (around a trusted update apart
  from the stack, as its strategy uses the server's) and CAF (``FIELD_F_RULES`` at every f they admit; MDA and SMEA only where
  C(n, f) <= ``MAX_SUBSETS``);
* a one-pass read of the stacked updates, ``x.sum(0)``, timed right before every call of a
  rule, so that each ratio compares two runs made under the same machine load (other
  processes may share the cores);
* with ``--flower``, Flower's counterpart (flwr ``serverapp.strategy``: FedAvg, FedMedian,
  FedTrimmedAvg, Krum, MultiKrum, Bulyan) on per-layer numpy arrays as Flower's strategies
  hold them after deserialisation (the record (de)serialisation itself is *not* timed).

It prints one table per size: per rule, n and f the first call (with any one-off
``torch.compile``), the median time of the timed calls, the median of the reads timed right
before them, ``/read`` (the median of the per-call ratios rule / read) and ``min/read`` (the
fastest call over the fastest read), and ``max |diff|``: the largest absolute difference
between the output and the same call on the plain torch passes (the ``eager`` backend, the
kernels as they were before the compiled one-pass ones; skip with ``--no-check``).
``--json PATH`` also writes every row.

``--backends`` measures instead where ``torch.compile`` pays (the ``auto`` backend's threshold,
``hospitrust.aggregation._codegen.AUTO_COMPILE_MIN_ELEMENTS``): per rule, n and size, the eager
call, the compiled call, the compile itself (its first call less a compiled call, with Inductor's
caches off so every process pays it as a new one does) and the break-even, the calls (rounds) after
which the compile has paid for itself.

Example::

    PYTHONPATH=. python benchmarks/aggregation.py --sizes resnet18 --clients 10,20,50 --f auto
    PYTHONPATH=. python benchmarks/aggregation.py --backends --sizes small,resnet18 --clients 3,10,20
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import functools
import math

import numpy as np
import torch

from hospitrust import aggregation as agg
from hospitrust.aggregation import _codegen
from hospitrust.aggregation import pre_aggregation as pre
from hospitrust.aggregation.subset_rules import MAX_SUBSETS

# Layer shapes: a small CNN (~0.2M) and CIFAR ResNet-18 (11.17M float params).
SMALL_CNN = [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 64, 3, 3), (128,),
             (256, 512), (256,), (10, 256), (10,)]


def resnet18_shapes() -> list[tuple[int, ...]]:
    """Float tensor shapes of torchvision's ResNet-18 with 10 classes (its total size without torchvision).

    Returns
    -------
    list of tuple of int
        One shape per float tensor of the state dict.
    """
    try:
        import torchvision

        m = torchvision.models.resnet18(num_classes=10)
        return [tuple(t.shape) for t in m.state_dict().values() if t.is_floating_point()
                and t.dim() > 0]
    except Exception:  # pragma: no cover - torchvision missing: same total size
        return [(11_191_242,)]


def default_model_shapes() -> list[tuple[int, ...]]:
    """The default run's model: hospitrust's small-cnn on 28 x 28 grey images, 2 classes (420,802 parameters)."""
    from hospitrust.models import build_model

    return [tuple(t.shape) for t in build_model("small-cnn", 1, 2).state_dict().values() if t.is_floating_point()]


SIZES = {"small": lambda: SMALL_CNN, "small-cnn": default_model_shapes, "resnet18": resnet18_shapes}

#: Rules that take f, with the condition on (n, f) under which they are defined.
F_RULES = {
    "trimmed_mean": lambda n, f: 2 * f < n,
    "krum": lambda n, f: n >= 2 * f + 3,
    "multi_krum": lambda n, f: n >= 2 * f + 3,
    "bulyan": lambda n, f: n >= 4 * f + 3,
}


#: The field's defences (issue 34) that take f, with the condition on (n, f) under which they run.
FIELD_F_RULES = {
    "nnm": lambda n, f: f < n,
    "arc": lambda n, f: f <= n,
    "arc+nnm": lambda n, f: f < n,
    "dnc": lambda n, f: f < n,
    "mda": lambda n, f: 2 * f < n and math.comb(n, f) <= MAX_SUBSETS,
    "smea": lambda n, f: 2 * f < n and math.comb(n, f) <= MAX_SUBSETS,
    "monna": lambda n, f: 2 * f < n,
    "caf": lambda n, f: 2 * f < n,
}
#: The field's defences without f (measured once per n).
FIELD_RULES = ["static_clipping", "bucketing", "flame", "foolsgold", "signguard", "clipped_clustering"]


def field_f_rule(name: str, x: torch.Tensor, f: int, trusted: torch.Tensor | None = None):
    """The call of a field rule that takes f, returning its ``(d,)`` aggregate or ``(n', d)`` stack.

    Parameters
    ----------
    name : str
        Key of ``FIELD_F_RULES``.
    x : torch.Tensor
        Stacked updates.
    f : int
        Byzantine count.
    trusted : torch.Tensor or None
        ``(d,)`` MoNNA's trusted update (the server's own, as the ``monna`` strategy uses it);
        None: the mean of the rows.

    Returns
    -------
    callable
        Without arguments; deterministic (the random rules get a fresh seeded generator).
    """
    server = x.mean(0) if trusted is None else trusted
    out = torch.empty_like(x)  # the pre-aggregation steps write their stack into a reused buffer
    return {"nnm": lambda: pre.nnm(x, f, out=out)[0],
            "arc": lambda: pre.arc(x, f, out=out)[0],
            "arc+nnm": lambda: pre.chain(x, [functools.partial(pre.arc_mixing, f=f),
                                             functools.partial(pre.nnm_mixing, f=f)], out=out)[0],
            "dnc": lambda: agg.dnc(x, f, generator=torch.Generator().manual_seed(0))[0],
            "mda": lambda: agg.mda(x, f)[0],
            "smea": lambda: agg.smea(x, f)[0],
            "monna": lambda: agg.monna_around(x, server, f)[0],
            "caf": lambda: agg.caf(x, f)[0]}[name]


def field_rule(name: str, x: torch.Tensor, buffers: dict):
    """The call of a field rule without f (see :func:`field_f_rule`).

    Parameters
    ----------
    name : str
        One of ``FIELD_RULES``.
    x : torch.Tensor
        Stacked updates.
    buffers : dict
        Reused buffers (made on first use): FoolsGold's fixed history, the ``(n, d)`` buffer
        FoolsGold's new history and the pre-aggregation steps' stacks are written to, and FLAME's
        global model.

    Returns
    -------
    callable
        Without arguments.
    """
    if name == "foolsgold":
        if "history" not in buffers:
            buffers["history"] = x * 0.5
        buffers.setdefault("out", torch.empty_like(x))
        return lambda: agg.foolsgold(x, buffers["history"], out=buffers["out"])[0]
    if "out" not in buffers:
        buffers["out"] = torch.empty_like(x)
    out = buffers["out"]
    global_model = buffers.setdefault("global_model", torch.full_like(x[0], 0.05))
    return {"static_clipping": lambda: pre.static_clipping(x, 1.0, out=out)[0],
            "bucketing": lambda: pre.bucketing(x, 2, generator=torch.Generator().manual_seed(0),
                                               out=out[: -(-x.shape[0] // 2)])[0],
            # clustering the local models (the strategy's default, flame.cluster = "models")
            "flame": lambda: agg.flame(x, global_model=global_model, generator=torch.Generator().manual_seed(0))[0],
            "signguard": lambda: agg.signguard(x, generator=torch.Generator().manual_seed(0))[0],
            "clipped_clustering": lambda: agg.clipped_clustering(x)[0]}[name]


def f_values(spec: str, n: int) -> list[int]:
    """The f values to measure at ``n``: ``auto`` is every f from 0 to n // 4, else a comma list.

    Parameters
    ----------
    spec : str
        ``auto`` or a comma list of non-negative ints.
    n : int
        Number of clients.

    Returns
    -------
    list of int
        Sorted, unique f values.
    """
    if spec.strip() == "auto":
        return list(range(0, n // 4 + 1))
    return sorted({int(v) for v in spec.split(",") if v.strip()})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, repeats: int, read, device: torch.device) -> dict:
    """Time ``fn``: one first call, then ``repeats`` calls each right after a timed ``read()``.

    Parameters
    ----------
    fn : callable
        The rule, called without arguments.
    repeats : int
        Timed calls (each with a read timed right before it).
    read : callable
        The one-pass read.
    device : torch.device
        Synchronised around every call on a GPU.

    Returns
    -------
    dict
        ``first`` (s), ``median`` (s), ``read`` (median read, s), ``ratio`` (median of the
        per-call ratios) and ``min_ratio`` (fastest call / fastest read).
    """
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    ts, rs = [], []
    for _ in range(repeats):
        gc.collect()
        _sync(device)
        t0 = time.perf_counter()
        read()
        _sync(device)
        t1 = time.perf_counter()
        fn()
        _sync(device)
        t2 = time.perf_counter()
        rs.append(t1 - t0)
        ts.append(t2 - t1)
    return {"first": first, "median": statistics.median(ts), "read": statistics.median(rs),
            "ratio": statistics.median(t / r for t, r in zip(ts, rs)), "min_ratio": min(ts) / min(rs)}


# ------------------------------------------------------------------ Flower side
class _FakeArrayRecord:
    """Just enough of ArrayRecord for Flower's select_multikrum (no (de)serialisation)."""

    def __init__(self, arrays):
        self._arrays = arrays

    def to_numpy_ndarrays(self, keep_input: bool = True):
        return self._arrays


class _FakeContent:
    def __init__(self, arrays):
        self.array_records = {"arrays": _FakeArrayRecord(arrays)}

    def __getitem__(self, key):
        return self.array_records[key]


def flower_baselines(layers, n: int, f: int) -> dict:
    """Flower's aggregation math on numpy per-layer arrays (list per client).

    Parameters
    ----------
    layers : list
        Per client, the list of its layer arrays.
    n : int
        Number of clients.
    f : int
        Byzantine count.

    Returns
    -------
    dict
        Rule name -> callable.
    """
    from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
    from flwr.serverapp.strategy.multikrum import select_multikrum

    contents = [_FakeContent(client) for client in layers]
    beta_frac = (f + 1e-6) / n  # int(beta * n) == f

    def weighted_avg(chosen):  # strategy_utils.aggregate_arrayrecords, equal weights
        w = 1.0 / len(chosen)
        out = [a * w for a in chosen[0].array_records["arrays"].to_numpy_ndarrays()]
        for c in chosen[1:]:
            for o, a in zip(out, c.array_records["arrays"].to_numpy_ndarrays()):
                o += a * w
        return out

    def bulyan():
        theta = n - 2 * f
        sel = select_multikrum(contents, f, theta)
        sel_nd = [c.array_records["arrays"].to_numpy_ndarrays() for c in sel]
        med = [np.median(arr, axis=0) for arr in zip(*sel_nd)]
        return aggregate_n_closest_weights(med, sel_nd, theta - 2 * f)

    return {"mean": lambda: weighted_avg(contents),
            "coordinate_median": lambda: [np.median(np.stack(ls), axis=0) for ls in zip(*layers)],
            "trimmed_mean": lambda: [trim_mean(np.stack(ls), beta_frac) for ls in zip(*layers)],
            "krum": lambda: weighted_avg(select_multikrum(contents, f, 1)),
            "multi_krum": lambda: weighted_avg(select_multikrum(contents, f, n - f)),
            "bulyan": bulyan}


# ------------------------------------------------------------------ main
def run(size: str, n: int, fs: list[int], repeats: int, flower: bool, seed: int,
        device: torch.device, rules_filter: set[str] | None = None, check: bool = True) -> list[dict]:
    """Measure every rule at one size and n, for the f values ``fs``; print the rows as they come.

    Parameters
    ----------
    size : str
        Key of ``SIZES``.
    n : int
        Number of clients.
    fs : list of int
        f values (each rule that takes f runs at those it admits).
    repeats : int
        Timed calls per rule.
    flower : bool
        Also time Flower's counterparts (CPU only, slow).
    seed : int
        Seed of the synthetic updates.
    device : torch.device
        Where the updates live and the rules run.
    rules_filter : set of str or None
        Only these rules; None: all.
    check : bool
        Also compare every output with the plain passes' (column ``max |diff|``).

    Returns
    -------
    list of dict
        One record per (rule, f) measured.
    """
    shapes = SIZES[size]()
    numels = [int(np.prod(s)) for s in shapes]
    d = sum(numels)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 0.01
    noise = 0.001 * torch.randn(d, generator=g)
    x = x.to(device)
    center = torch.zeros(d, device=device)
    read = lambda: x.sum(0)  # noqa: E731
    records: list[dict] = []

    def measure(name: str, f: int | None, fn, fl=None) -> None:
        if rules_filter is not None and name not in rules_filter:
            return
        r = timeit(fn, repeats, read, device)
        if check:
            r["max_abs_diff"] = _diff_to_plain(fn)
        if fl is not None:
            t0 = time.perf_counter()
            fl()
            r["flower"] = time.perf_counter() - t0
        rec = {"size": size, "d": d, "n": n, "f": f, "rule": name, "device": device.type,
               "threads": torch.get_num_threads(), **r}
        records.append(rec)
        print(_row(rec), flush=True)

    print(f"\n## size={size} d={d:,} n={n} device={device.type} threads={torch.get_num_threads()} "
          f"backend={agg.get_backend()}")
    print(_header())
    server = (x[min(1, n - 1):].mean(0) + noise.to(device))
    once = True
    for f in fs:
        if not any(ok(n, f) for ok in (*F_RULES.values(), *FIELD_F_RULES.values())):
            continue
        x[:f] += 5.0  # f "attackers" far away
        fl = flower_baselines(_layers(x, shapes, numels), n, f) if flower and device.type == "cpu" else {}
        if once:  # the rules without f, once per n (with the first f's attackers)
            once = False
            measure("mean", None, lambda: agg.mean(x), fl.get("mean"))
            measure("coordinate_median", None, lambda: agg.coordinate_median(x), fl.get("coordinate_median"))
            measure("geometric_median", None, lambda: agg.geometric_median(x))
            measure("centered_clipping", None, lambda: agg.centered_clipping(x, center, 1.0))
            measure("centered_clipping_3", None, lambda: agg.centered_clipping(x, center, 1.0, iters=3))
            measure("norm_clip", None, lambda: agg.norm_clip(x, 1.0))
            measure("fltrust", None, lambda: agg.fltrust(x, server))
            buffers: dict = {}
            for name in FIELD_RULES:
                if rules_filter is None or name in rules_filter:
                    measure(name, None, field_rule(name, x, buffers))
            buffers.clear()
        for name, ok in F_RULES.items():
            if not ok(n, f):
                continue
            fn = {"trimmed_mean": lambda: agg.trimmed_mean(x, f), "krum": lambda: agg.krum(x, f),
                  "multi_krum": lambda: agg.multi_krum(x, f), "bulyan": lambda: agg.bulyan(x, f)}[name]
            measure(name, f, fn, fl.get(name))
        for name, ok in FIELD_F_RULES.items():
            if ok(n, f) and (rules_filter is None or name in rules_filter):
                measure(name, f, field_f_rule(name, x, f, server))
        x[:f] -= 5.0
    return records


def _diff_to_plain(fn) -> float:
    """Largest absolute difference between ``fn()`` and the same call on the plain torch passes.

    The ``eager`` backend runs the kernels as they were before the compiled one-pass kernels
    (sorting networks on column blocks, the batched-product Gram, one distance pass per
    iteration), so this is the change of the output that the fast path brings.
    """
    fast = fn()
    old = agg.get_backend()
    agg.set_backend("eager")
    try:
        plain = fn()
    finally:
        agg.set_backend(old)
    return float((fast.double() - plain.double()).abs().max())


def _layers(x: torch.Tensor, shapes, numels) -> list:
    xn = x.numpy()
    layers = []  # per client: list of layer views (as Flower holds them)
    for i in range(x.shape[0]):
        off, client = 0, []
        for s, k in zip(shapes, numels):
            client.append(xn[i, off:off + k].reshape(s))
            off += k
        layers.append(client)
    return layers


def _header() -> str:
    return (f"| {'rule':<19} | {'n':>3} | {'f':>3} | {'first ms':>9} | {'median ms':>9} | {'read ms':>8} | "
            f"{'/read':>6} | {'min/read':>8} | {'Flower ms':>9} | {'max |diff|':>10} |\n"
            f"|{'-' * 21}|{'-' * 5}|{'-' * 5}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 8}|{'-' * 10}|{'-' * 11}|"
            f"{'-' * 12}|")


def _row(r: dict) -> str:
    fl = f"{r['flower'] * 1e3:9.1f}" if "flower" in r else f"{'-':>9}"
    f = "-" if r["f"] is None else str(r["f"])
    diff = f"{r['max_abs_diff']:10.1e}" if "max_abs_diff" in r else f"{'-':>10}"
    return (f"| {r['rule']:<19} | {r['n']:>3} | {f:>3} | {r['first'] * 1e3:9.1f} | {r['median'] * 1e3:9.1f} | "
            f"{r['read'] * 1e3:8.1f} | {r['ratio']:6.2f} | {r['min_ratio']:8.2f} | {fl} | {diff} |")


#: The kernels ``--backends`` times: every order statistic and a Gram and a row-dot pass (f = 1 where one is taken).
BACKEND_RULES = {
    "median": lambda x, server: agg.coordinate_median(x),
    "trimmed_mean": lambda x, server: agg.trimmed_mean(x, 1),
    "bulyan": lambda x, server: agg.bulyan(x, 1),
    "krum": lambda x, server: agg.krum(x, 1),
    "fltrust": lambda x, server: agg.fltrust(x, server),
}


def backends(size: str, n: int, repeats: int, seed: int, rules: set[str] | None) -> list[dict]:
    """Eager against compiled for each kernel of ``BACKEND_RULES`` that ``n`` admits, on one size.

    Returns
    -------
    list of dict
        Per rule: ``eager_ms``, ``compiled_ms`` (medians), ``compile_s`` and ``break_even_calls``.
    """
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True  # a new process pays the compile: so does every row here
    _inductor_start()
    d = sum(math.prod(s) for s in SIZES[size]())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 0.01
    server = x.mean(0)
    out = []
    old = agg.get_backend()
    try:
        for rule, fn in BACKEND_RULES.items():
            if (rules and rule not in rules) or (rule in F_RULES and not F_RULES[rule](n, 1)):
                continue
            agg.set_backend("eager")
            fn(x, server)
            eager = statistics.median(_seconds(lambda: fn(x, server)) for _ in range(repeats))
            agg.set_backend("compile")
            _codegen._compiled_cache.clear()  # every row compiles its kernels anew (one kernel serves every d)
            torch._dynamo.reset()
            before = sum(_codegen.compiled_calls.values())
            first = _seconds(lambda: fn(x, server))
            compiled = statistics.median(_seconds(lambda: fn(x, server)) for _ in range(repeats))
            ran = sum(_codegen.compiled_calls.values()) > before
            compile_s = max(first - compiled, 0.0)
            saved = eager - compiled
            row = {"size": size, "n": n, "d": d, "elements": n * d, "rule": rule, "eager_ms": eager * 1e3,
                   "compiled_ms": compiled * 1e3, "compile_s": compile_s, "compiled": ran,
                   "break_even_calls": compile_s / saved if saved > 0 and ran else math.inf}
            print(f"{size:>9} {n:>4} {d:>10,} {n * d:>13,} {rule:>13} {row['eager_ms']:>9.2f} {row['compiled_ms']:>9.2f} "
                  f"{compile_s:>8.1f} {row['break_even_calls']:>10.0f}" + ("" if ran else "  (compile failed: eager)"),
                  flush=True)
            out.append(row)
    finally:
        agg.set_backend(old)
    return out


_INDUCTOR_START: list[float] = []


def _inductor_start() -> float:
    """Seconds of the first compile in this process less a later one of the same kind: what a new process pays
    once, before any kernel of its own (Inductor's start), printed once and left out of every row."""
    if not _INDUCTOR_START:
        x = torch.randn(3, 1024)
        agg.set_backend("compile")
        try:
            first = _seconds(lambda: agg.coordinate_median(x))
            _codegen._compiled_cache.clear()
            torch._dynamo.reset()
            again = _seconds(lambda: agg.coordinate_median(x))
        finally:
            agg.set_backend("auto")
        _INDUCTOR_START.append(max(first - again, 0.0))
        print(f"Inductor's start in a new process: {_INDUCTOR_START[0]:.1f} s once, before its first kernel (not in the rows)")
    return _INDUCTOR_START[0]


def _seconds(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    """Command line entry point (see the module docstring).

    Parameters
    ----------
    argv : list of str or None
        Arguments; None: ``sys.argv[1:]``.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="resnet18", help="comma list of: " + ",".join(SIZES))
    p.add_argument("--clients", default="10,20,50", help="comma list of n")
    p.add_argument("--f", default="auto",
                   help="comma list of Byzantine counts, or 'auto': every f from 0 to n // 4 "
                        "(each rule runs at the f it admits)")
    p.add_argument("--rules", default=None, help="comma list: only these rules")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per rule (each after a timed read)")
    p.add_argument("--flower", action="store_true", help="also time Flower's counterparts (CPU, slow)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write every row to this JSON file")
    p.add_argument("--backends", action="store_true",
                   help="eager against compiled per rule, n and size, with the compile's break-even in calls")
    p.add_argument("--no-check", action="store_true",
                   help="skip comparing every output with the plain torch passes (eager backend)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    rules = None if a.rules is None else {r.strip() for r in a.rules.split(",") if r.strip()}
    print("command:", "python " + " ".join(sys.argv if argv is None else ["benchmarks/aggregation.py", *argv]))
    records: list[dict] = []
    if a.backends:
        print(f"{'size':>9} {'n':>4} {'d':>10} {'n x d':>13} {'rule':>13} {'eager ms':>9} {'comp. ms':>9} {'compile s':>8} "
              f"{'break-even':>10}")
        for size in a.sizes.split(","):
            for n_str in a.clients.split(","):
                records += backends(size.strip(), int(n_str), a.repeats, a.seed, rules)
        start = _INDUCTOR_START[0] if _INDUCTOR_START else 0.0
        for r in records:  # what a new process (a ServerApp) pays for its first kernel: Inductor's start too
            saved = (r["eager_ms"] - r["compiled_ms"]) / 1e3
            r["break_even_calls_new_process"] = (r["compile_s"] + start) / saved if saved > 0 and r["compiled"] else math.inf
        paying = [r for r in records if r["break_even_calls_new_process"] <= _codegen.AUTO_PAYBACK_CALLS]
        print(f"rows where a compile pays within {_codegen.AUTO_PAYBACK_CALLS} calls in a new process (Inductor's {start:.1f} s start "
              "counted): " + (", ".join(f"{r['size']} {r['rule']} n={r['n']} ({r['elements']:,}: "
                                        f"{r['break_even_calls_new_process']:.0f})" for r in paying) or "none"))
        print(f"auto compiles from {_codegen.AUTO_COMPILE_MIN_ELEMENTS:,} elements (hospitrust.aggregation._codegen.AUTO_COMPILE_MIN_ELEMENTS)")
    for size in ([] if a.backends else a.sizes.split(",")):
        for n_str in a.clients.split(","):
            n = int(n_str)
            records += run(size.strip(), n, f_values(a.f, n), a.repeats, a.flower, a.seed, device, rules,
                           check=not a.no_check)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"command": sys.argv, "torch": torch.__version__, "records": records}, fh, indent=1)


if __name__ == "__main__":
    main()

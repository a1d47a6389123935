"""Benchmark hospitrust.aggregation against a one-pass read and Flower's built-ins.

For every (model size, number of clients) it builds one set of synthetic
client updates, then times on the same data:

* each ``hospitrust.aggregation`` rule on the stacked ``(n, d)`` float32 tensor,
* Flower's counterpart (flwr ``serverapp.strategy``: FedAvg, FedMedian,
  FedTrimmedAvg, Krum, MultiKrum, Bulyan) called with per-layer numpy arrays
  as Flower's strategies hold them after deserialisation (the record
  (de)serialisation itself is *not* timed),
* a one-pass read of the stacked updates (``x.sum(0)``).

and prints median times and the ratios rule/read and rule/Flower.

Example::

    PYTHONPATH=. python benchmarks/aggregation.py --sizes resnet18 --clients 20
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np
import torch

from hospitrust import aggregation as agg

# Layer shapes: a small CNN (~0.2M) and CIFAR ResNet-18 (11.17M float params).
SMALL_CNN = [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 64, 3, 3), (128,),
             (256, 512), (256,), (10, 256), (10,)]


def resnet18_shapes() -> list[tuple[int, ...]]:
    try:
        import torchvision

        m = torchvision.models.resnet18(num_classes=10)
        return [tuple(t.shape) for t in m.state_dict().values() if t.is_floating_point()
                and t.dim() > 0]
    except Exception:  # pragma: no cover - torchvision missing: same total size
        return [(11_173_962,)]


SIZES = {"small": lambda: SMALL_CNN, "resnet18": resnet18_shapes}


def timeit(fn, repeats: int, read=None, warmup: bool = True) -> tuple[float, float, float | None]:
    """(first call, median of ``repeats`` further calls, median interleaved read).

    With ``read`` given, every timed call is preceded by a timed ``read()``
    so that the rule/read ratio compares runs made under the same machine
    load (other processes may share the cores).
    """
    first = float("nan")
    if warmup:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
    ts, rs = [], []
    for _ in range(repeats):
        gc.collect()
        if read is not None:
            t0 = time.perf_counter()
            read()
            rs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return first, statistics.median(ts), (statistics.median(rs) if rs else None)


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


def flower_baselines(layers, n: int, f: int):
    """Flower's aggregation math on numpy per-layer arrays (list per client)."""
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

    def fedavg():
        return weighted_avg(contents)

    def median():
        return [np.median(np.stack(ls), axis=0) for ls in zip(*layers)]

    def trimmed():
        return [trim_mean(np.stack(ls), beta_frac) for ls in zip(*layers)]

    def krum():
        return weighted_avg(select_multikrum(contents, f, 1))

    def multikrum():
        return weighted_avg(select_multikrum(contents, f, n - f))

    def bulyan():
        theta = n - 2 * f
        sel = select_multikrum(contents, f, theta)
        sel_nd = [c.array_records["arrays"].to_numpy_ndarrays() for c in sel]
        med = [np.median(arr, axis=0) for arr in zip(*sel_nd)]
        return aggregate_n_closest_weights(med, sel_nd, theta - 2 * f)

    return {"mean": fedavg, "coordinate_median": median, "trimmed_mean": trimmed,
            "krum": krum, "multi_krum": multikrum, "bulyan": bulyan}


# ------------------------------------------------------------------ main
def run(size: str, n: int, repeats: int, flower_repeats: int, f: int | None, seed: int):
    shapes = SIZES[size]()
    numels = [int(np.prod(s)) for s in shapes]
    d = sum(numels)
    if f is None:
        f = max(1, (n - 3) // 8)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 0.01
    x[:f] += 5.0  # f "attackers" far away
    center = torch.zeros(d)
    server = x[f:].mean(0) + 0.001 * torch.randn(d, generator=g)
    xn = x.numpy()
    layers = []  # per client: list of layer views (as Flower holds them)
    for i in range(n):
        off, client = 0, []
        for s, k in zip(shapes, numels):
            client.append(xn[i, off:off + k].reshape(s))
            off += k
        layers.append(client)

    rules = {
        "mean": lambda: agg.mean(x),
        "coordinate_median": lambda: agg.coordinate_median(x),
        "trimmed_mean": lambda: agg.trimmed_mean(x, f),
        "krum": lambda: agg.krum(x, f),
        "multi_krum": lambda: agg.multi_krum(x, f),
        "bulyan": lambda: agg.bulyan(x, f),
        "geometric_median": lambda: agg.geometric_median(x),
        "centered_clipping": lambda: agg.centered_clipping(x, center, 1.0),
        "norm_clip": lambda: agg.norm_clip(x, 1.0),
        "fltrust": lambda: agg.fltrust(x, server),
    }
    flower = flower_baselines(layers, n, f)
    read = lambda: x.sum(0)  # noqa: E731
    rows = []
    for name, fn in rules.items():
        first, t, t_read = timeit(fn, repeats, read)
        tf = None
        if name in flower:
            tf = timeit(flower[name], flower_repeats, warmup=False)[1]
        rows.append((name, first, t, t_read, tf))
    t_read_all = statistics.median(r[3] for r in rows)

    print(f"\n## size={size} d={d:,} n={n} f={f} threads={torch.get_num_threads()} "
          f"backend={agg.get_backend()}")
    print(f"one-pass read x.sum(0): {t_read_all * 1e3:.1f} ms (median over all rules; "
          f"/read uses the read timed right before each call of that rule)")
    print(f"| {'rule':<18} | {'first ms':>9} | {'median ms':>9} | {'read ms':>8} | "
          f"{'/read':>6} | {'Flower ms':>9} | {'/Flower':>7} |")
    print(f"|{'-' * 20}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 8}|{'-' * 11}|{'-' * 9}|")
    for name, first, t, t_read, tf in rows:
        fl = f"{tf * 1e3:9.1f}" if tf is not None else f"{'-':>9}"
        rf = f"{t / tf:7.3f}" if tf is not None else f"{'-':>7}"
        print(f"| {name:<18} | {first * 1e3:9.1f} | {t * 1e3:9.1f} | {t_read * 1e3:8.1f} | "
              f"{t / t_read:6.2f} | {fl} | {rf} |")
    sys.stdout.flush()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="small,resnet18",
                   help="comma list of: " + ",".join(SIZES))
    p.add_argument("--clients", default="10,20,50", help="comma list of n")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per rule")
    p.add_argument("--flower-repeats", type=int, default=1,
                   help="timed calls per Flower baseline (they are slow)")
    p.add_argument("--f", type=int, default=None,
                   help="Byzantine count (default max(1, (n-3)//8))")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print("command:", "python " + " ".join(sys.argv))
    for size in a.sizes.split(","):
        for n in a.clients.split(","):
            run(size.strip(), int(n), a.repeats, a.flower_repeats, a.f, a.seed)


if __name__ == "__main__":
    main()

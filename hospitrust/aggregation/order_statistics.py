"""Fast per-coordinate order statistics over the client axis.

The coordinate-wise rules (median, trimmed mean, Bulyan's coordinate phase)
need, for every coordinate ``j``, some order statistics of the ``n`` values
``x[0, j], ..., x[n-1, j]``. ``torch.sort`` / ``torch.median`` along ``dim=0``
are an order of magnitude slower than reading the data once, so instead we run
a *sorting network* (Batcher's odd-even merge sort, pruned to the ranks that
are needed) over the ``n`` rows: every comparator is an element-wise
``torch.minimum`` / ``torch.maximum`` of two rows.

Two executions of the same generated network:

* **compiled** (CPU, large ``d``): the network is generated as straight-line
  Python and given to ``torch.compile`` (Inductor), which fuses the whole
  network and its epilogue into a single vectorised C++ loop over ``d``; each
  value is read once and all comparisons happen in registers, so the cost is
  about one pass over the data.
* **eager** (fallback, small ``d``, non-CPU devices, or when compilation
  fails): the same function is run with eager torch ops on cache-sized column
  blocks.

Both produce exactly the values of the sort-based reference implementations
in :mod:`hospitrust.aggregation.reference` up to floating-point rounding of the
final sums (the selected order statistics themselves are exact). Inputs are
assumed finite: with NaNs the result is unspecified.

The backend can be forced with the environment variable
``HOSPITRUST_AGG_BACKEND`` (``auto`` | ``eager`` | ``compile``) or
:func:`set_backend`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = [
    "sorting_network",
    "prune_network",
    "set_backend",
    "get_backend",
    "median_kernel",
    "trimmed_mean_kernel",
    "bulyan_coordinate_kernel",
]

_LOG = logging.getLogger(__name__)

#: Minimum number of coordinates for which the compiled kernel is used in
#: ``auto`` mode (below it the one-off compile time would dominate).
COMPILE_MIN_COLUMNS = 1 << 18
#: Largest number of rows for which the compiled kernel is used in ``auto``
#: mode. Beyond it Inductor's code generation for the (then several hundred
#: comparator) networks becomes slow to compile (> 1 min) and its output slow
#: to run, so the eager column-block executor is used instead.
COMPILE_MAX_ROWS = 24
#: Column block size of the eager executor.
EAGER_BLOCK_COLUMNS = 1 << 15

_BACKENDS = ("auto", "eager", "compile")
_backend = os.environ.get("HOSPITRUST_AGG_BACKEND", "auto").strip().lower() or "auto"
if _backend not in _BACKENDS:  # pragma: no cover - configuration error
    _LOG.warning("HOSPITRUST_AGG_BACKEND=%r is not one of %s; using 'auto'", _backend, _BACKENDS)
    _backend = "auto"

_lock = threading.Lock()
_eager_cache: dict[tuple, Callable] = {}
_compiled_cache: dict[tuple, Callable] = {}
_compile_failed: set[tuple] = set()


def set_backend(backend: str) -> None:
    """Select how order-statistic kernels run.

    Parameters
    ----------
    backend : {"auto", "eager", "compile"}
        ``auto``: compiled (``torch.compile``) on CPU when ``d >= 2**18``,
        eager otherwise. ``eager``: always eager column blocks.
        ``compile``: always try ``torch.compile`` (falls back to eager, with a
        warning, if compilation fails).
    """
    global _backend
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}; got {backend!r}")
    _backend = backend


def get_backend() -> str:
    """Return the current backend name (see :func:`set_backend`)."""
    return _backend


# --------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------
def sorting_network(n: int) -> list[tuple[int, int]]:
    """Comparators ``(i, j)``, ``i < j``, of a sorting network on ``n`` wires.

    Batcher's odd-even merge sort on the next power of two, with every
    comparator that touches a padding wire (``j >= n``) removed (padding wires
    hold ``+inf``, so those comparators are no-ops). After applying
    ``(v[i], v[j]) <- (min, max)`` for each comparator in order, ``v`` is
    sorted ascending.

    Parameters
    ----------
    n : int
        Number of wires (values to sort), >= 0.

    Returns
    -------
    list[tuple[int, int]]
        The comparators in the order they apply.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}")
    p = 1
    while p < n:
        p *= 2
    comps: list[tuple[int, int]] = []
    size = 1
    while size < p:
        k = size
        while k >= 1:
            for j in range(k % size, p - k, 2 * k):
                for i in range(min(k, p - j - k)):
                    if (i + j) // (size * 2) == (i + j + k) // (size * 2):
                        comps.append((i + j, i + j + k))
            k //= 2
        size *= 2
    return [(a, b) for a, b in comps if b < n]


def prune_network(
    comps: Sequence[tuple[int, int]], needed: Iterable[int]
) -> list[tuple[int, int]]:
    """Drop the comparators that cannot influence the wires in ``needed``.

    Parameters
    ----------
    comps : Sequence[tuple[int, int]]
        Comparators of a network (:func:`sorting_network`), in order.
    needed : Iterable[int]
        Output wires whose final values are wanted.

    Returns
    -------
    list[tuple[int, int]]
        The comparators that remain, in their original order.
    """
    need = set(needed)
    out: list[tuple[int, int]] = []
    for a, b in reversed(comps):
        if a in need or b in need:
            out.append((a, b))
            need.add(a)
            need.add(b)
    out.reverse()
    return out


def _network_source(name: str, n: int, needed: Iterable[int], gather: bool) -> list[str]:
    """Straight-line source: unbind rows, run the pruned sorting network."""
    comps = prune_network(sorting_network(n), needed)
    args = "x, idx" if gather else "x"
    lines = [f"def {name}({args}):"]
    if gather:
        lines.append("    x = x.index_select(0, idx)")
    rows = ", ".join(f"r{i}" for i in range(n))
    lines.append(f"    {rows}, = x.unbind(0)")
    for a, b in comps:
        lines.append(
            f"    r{a}, r{b} = torch.minimum(r{a}, r{b}), torch.maximum(r{a}, r{b})"
        )
    return lines


def _median_expr(n: int) -> str:
    k = n // 2
    return f"r{k}" if n % 2 else f"((r{k - 1} + r{k}) * 0.5)"


def _median_needed(n: int) -> list[int]:
    k = n // 2
    return [k] if n % 2 else [k - 1, k]


def _build(kind: str, n: int, param: int) -> tuple[str, str]:
    """Return ``(function_name, source)`` for a kernel."""
    if kind == "median":
        name = f"_median_n{n}"
        lines = _network_source(name, n, _median_needed(n), gather=False)
        lines.append(f"    return {_median_expr(n)}")
    elif kind == "trimmed_mean":
        # Streaming partition instead of a full sort (a full sorting network
        # with n - 2f live outputs makes Inductor materialise intermediates):
        # sort the first 2f rows into a low list L (f smallest) and a high
        # list H (f largest); then push every further value v through L
        # (v becomes the largest of L + {v}) and then through H (v becomes the
        # smallest of H + {v}); what comes out is neither among the f smallest
        # nor the f largest seen so far, so it belongs to the trimmed sum.
        f = param
        name = f"_trimmed_mean_n{n}_f{f}"
        lines = [f"def {name}(x):"]
        lines.append(f"    {', '.join(f'r{i}' for i in range(n))}, = x.unbind(0)")
        for a, b in sorting_network(2 * f):
            lines.append(
                f"    r{a}, r{b} = torch.minimum(r{a}, r{b}), torch.maximum(r{a}, r{b})"
            )
        low = [f"r{i}" for i in range(f)]
        high = [f"r{i}" for i in range(f, 2 * f)]
        for j in range(2 * f, n):
            v = f"r{j}"
            for lk in low:
                lines.append(f"    {lk}, {v} = torch.minimum({lk}, {v}), torch.maximum({lk}, {v})")
            for hk in high:
                lines.append(f"    {v}, {hk} = torch.minimum({v}, {hk}), torch.maximum({v}, {hk})")
            lines.append(f"    s = {v}" if j == 2 * f else f"    s = s + {v}")
        lines.append(f"    return s / {n - 2 * f}")
    elif kind == "bulyan":
        # n here is theta (number of selected rows), param is f.
        theta, f = n, param
        beta = theta - 2 * f
        name = f"_bulyan_theta{theta}_f{f}"
        lines = _network_source(name, theta, range(theta), gather=True)
        lines.append(f"    m = {_median_expr(theta)}")
        # The beta values closest to the median are a window [k, k + beta)
        # of the sorted values, k in [0, 2f] = number dropped on the low side.
        # For each pair (t, t + beta), t < 2f, exactly one member lies in any
        # such window; the low one is dropped iff it is strictly farther from
        # the median (a tie in distance keeps the smaller value), so
        # k = 1 + max{t : |s_t - m| > |s_{t+beta} - m|} (0 if none). Taking the
        # max rather than the count makes pairs of *equal* values (which may
        # go either way) harmless: shifting the window across them changes
        # nothing.
        if f == 0:
            lines.append(f"    return ({' + '.join(f'r{i}' for i in range(theta))}) / {beta}")
        else:
            for t in range(2 * f):
                lines.append(
                    f"    c{t} = ((r{t} - m).abs() > (r{t + beta} - m).abs()).to(torch.int32)"
                    + (f" * {t + 1}" if t else "")
                )
            expr = "c0"
            for t in range(1, 2 * f):
                expr = f"torch.maximum({expr}, c{t})"
            lines.append(f"    k = {expr}")
            terms = []
            for i in range(theta):
                conds = []
                if i < 2 * f:  # included iff k <= i
                    conds.append(f"(k <= {i})")
                if i >= beta:  # included iff i < k + beta
                    conds.append(f"(k > {i - beta})")
                if conds:
                    terms.append(f"torch.where({' & '.join(conds)}, r{i}, 0.0)")
                else:
                    terms.append(f"r{i}")
            lines.append(f"    return ({' + '.join(terms)}) / {beta}")
    else:  # pragma: no cover - internal
        raise ValueError(kind)
    return name, "\n".join(lines) + "\n"


def _eager_fn(kind: str, n: int, param: int) -> Callable:
    key = (kind, n, param)
    fn = _eager_cache.get(key)
    if fn is None:
        name, src = _build(kind, n, param)
        namespace: dict = {"torch": torch}
        # A distinct code object per network: torch.compile caches per code
        # object, so different (n, f) never evict each other.
        exec(compile(src, f"<hospitrust.aggregation:{name}>", "exec"), namespace)
        fn = namespace[name]
        _eager_cache[key] = fn
    return fn


def _compiled_fn(kind: str, n: int, param: int) -> Callable:
    key = (kind, n, param)
    with _lock:
        fn = _compiled_cache.get(key)
        if fn is None:
            fn = torch.compile(_eager_fn(kind, n, param), dynamic=True, fullgraph=True)
            _compiled_cache[key] = fn
    return fn


def _want_compiled(x: torch.Tensor, rows: int) -> bool:
    if _backend == "eager":
        return False
    if _backend == "compile":
        return True
    return (
        x.device.type == "cpu"
        and x.shape[1] >= COMPILE_MIN_COLUMNS
        and rows <= COMPILE_MAX_ROWS
    )


def _run_eager(fn: Callable, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    d = x.shape[1]
    if x.device.type != "cpu" or d <= EAGER_BLOCK_COLUMNS:
        return fn(x, *extra).clone() if d else x.new_empty(0)
    out = x.new_empty(d)
    for c0 in range(0, d, EAGER_BLOCK_COLUMNS):
        c1 = min(c0 + EAGER_BLOCK_COLUMNS, d)
        out[c0:c1] = fn(x[:, c0:c1], *extra)
    return out


def _run(kind: str, n: int, param: int, x: torch.Tensor, extra: tuple = ()) -> torch.Tensor:
    key = (kind, n, param, x.dtype, x.device.type)
    if _want_compiled(x, n) and key not in _compile_failed and x.shape[1] > 0:
        try:
            return _compiled_fn(kind, n, param)(x.contiguous(), *extra)
        except Exception as exc:  # noqa: BLE001 - any compiler failure -> eager
            _compile_failed.add(key)
            _LOG.warning(
                "torch.compile of the %s kernel (n=%d, param=%d, %s) failed; "
                "falling back to eager column blocks: %s",
                kind, n, param, x.dtype, exc,
            )
    return _run_eager(_eager_fn(kind, n, param), x, extra)


# --------------------------------------------------------------------------
# Kernels (no argument checks: the public rules validate first)
# --------------------------------------------------------------------------
def median_kernel(x: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of ``x`` (n, d); even n: mean of the middle two.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    if n == 1:
        return x[0].clone()
    return _run("median", n, 0, x)


def trimmed_mean_kernel(x: torch.Tensor, f: int) -> torch.Tensor:
    """Mean of the ranks ``f .. n-f-1`` of every column of ``x`` (n, d).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Values dropped at each end of every column, ``2f < n``.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    n = x.shape[0]
    if f == 0:
        return x.sum(0) / n
    return _run("trimmed_mean", n, f, x)


def bulyan_coordinate_kernel(x: torch.Tensor, idx: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan coordinate phase over the rows ``x[idx]`` (``theta`` of them).

    For every column: the mean of the ``beta = theta - 2f`` values closest to
    the column median (ties in distance prefer the smaller value).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    idx : torch.Tensor
        int64 indices of the ``theta`` selected rows (:func:`~hospitrust.aggregation.bulyan_select`).
    f : int
        Assumed number of Byzantine clients.

    Returns
    -------
    torch.Tensor
        ``(d,)``.
    """
    theta = int(idx.numel())
    idx = idx.to(device=x.device, dtype=torch.long)
    if theta == 1:
        return x[idx[0]].clone()
    return _run("bulyan", theta, f, x, (idx,))

"""Fast per-coordinate order statistics over the client axis.

The coordinate-wise rules (median, trimmed mean, Bulyan's coordinate phase)
need, for every coordinate ``j``, some order statistics of the ``n`` values
``x[0, j], ..., x[n-1, j]``. ``torch.sort`` / ``torch.median`` along ``dim=0``
are an order of magnitude slower than reading the data once, so instead we run
a *comparator network* over the ``n`` rows: every comparator is an element-wise
``torch.minimum`` / ``torch.maximum`` of two rows.

* median: Batcher's odd-even merge sort pruned to the one or two middle ranks;
* trimmed mean: whichever is smaller of a streaming partition (keep the ``f``
  smallest and ``f`` largest seen so far, push every further value through
  both lists) and the sorting network pruned to the ``f`` lowest and ``f``
  highest ranks; the other wires then hold exactly the values to average, in
  some order;
* Bulyan: the sorting network of the selected rows pruned to the ranks the
  window selection compares (the ``2f`` lowest and highest) and the median.

Two executions of the same generated network:

* **compiled** (CPU, large ``rows x d``): the network is generated as straight-line
  Python and given to ``torch.compile`` (Inductor), which fuses the whole
  network and its epilogue into a single vectorised C++ loop over ``d``; each
  value is read once and all comparisons happen in registers, so the cost is
  about one pass over the data. The values are compared as integers: the bit
  pattern of a float, with the non-sign bits of negative values flipped, orders
  like the float itself (``-0.0`` just below ``+0.0``), and an integer
  ``min``/``max`` is one instruction where the float one carries NaN handling
  (n = 50 median: 1.8 reads instead of 4). The compiled kernels exist for up to
  ``COMPILE_MAX_ROWS`` rows (compiling a 50-row network takes 15-30 s once per
  process and shape of problem; Inductor also caches it on disk).
* **eager** (fallback, small ``d``, non-CPU devices, or when compilation
  fails): the same network with eager float ops on cache-sized column blocks;
  on a non-CPU device with more than ``EAGER_MAX_ROWS`` rows a column-chunked
  ``torch.sort`` instead (hundreds of full-width kernels otherwise).

Both produce exactly the values of the sort-based reference implementations
in :mod:`hospitrust.aggregation.reference` up to floating-point rounding of the
final sums (the selected order statistics themselves are exact). Inputs are
assumed finite: with NaNs the result is unspecified.

The backend is chosen with :func:`set_backend` (a run's ``aggregation.backend``
key, applied when the server sets the run up); it also chooses between the
compiled and the plain one-pass kernels of :mod:`hospitrust.aggregation.kernels`.
``auto`` compiles only where the compile pays for itself (``_codegen.auto_compiles``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import torch

from . import _codegen

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

#: Largest number of rows for which the compiled kernel is used in ``auto``
#: mode (compile time grows with the network: about 15-30 s at 50 rows, once).
COMPILE_MAX_ROWS = 64
#: Column block size of the eager executor.
EAGER_BLOCK_COLUMNS = 1 << 15
#: On a non-CPU device, networks up to this many rows run as eager ops; beyond, a
#: column-chunked ``torch.sort``.
EAGER_MAX_ROWS = 24
#: Columns per ``torch.sort`` chunk of the non-CPU fallback.
SORT_CHUNK_COLUMNS = 1 << 20


def set_backend(backend: str) -> None:
    """Select how order-statistic kernels (and the compiled one-pass kernels) run.

    Parameters
    ----------
    backend : {"auto", "eager", "compile"}
        ``auto``: compiled (``torch.compile``) on CPU where the compile repays
        itself within ``AUTO_PAYBACK_CALLS`` calls (rows x columns from
        ``AUTO_COMPILE_MIN_ELEMENTS``, measured), eager otherwise. ``eager``:
        always eager column blocks and the plain torch passes.
        ``compile``: always try ``torch.compile`` (falls back to eager, with a
        warning, if compilation fails).
    """
    _codegen.set_backend(backend)


def get_backend() -> str:
    """Return the current backend name (see :func:`set_backend`)."""
    return _codegen.get_backend()


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


# --------------------------------------------------------------------------
# Code generation
# --------------------------------------------------------------------------
#: Integer view used to compare each float dtype as integers (compiled kernels).
_INT_VIEWS = {torch.float32: ("torch.int32", 31), torch.float64: ("torch.int64", 63)}


def _style(dtype: torch.dtype, compiled: bool) -> str:
    """``"int32"``/``"int64"``: compare the order-preserving integer images; ``"float"``: floats."""
    if compiled and dtype in _INT_VIEWS:
        return _INT_VIEWS[dtype][0].removeprefix("torch.")
    return "float"


def _median_needed(n: int) -> list[int]:
    k = n // 2
    return [k] if n % 2 else [k - 1, k]


def _median_expr(n: int) -> str:
    k = n // 2
    return f"v{k}" if n % 2 else f"((v{k - 1} + v{k}) * 0.5)"


def _streaming_partition(n: int, f: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Sort the first ``2f`` rows into a low list (wires ``0..f-1``, the f smallest) and a high
    list (``f..2f-1``, the f largest); push every further value ``v`` through the low list
    (it leaves as the largest of L + {v}) and then the high list (the smallest of H + {v}).
    What comes out is neither among the f smallest nor the f largest seen so far. Few values
    are live at a time (2f + 1), so the compiled loop keeps them in registers.

    Returns the comparators ``(lo, hi)`` (``min`` to ``lo``, ``max`` to ``hi``) and the wires
    holding the ``n - 2f`` middle values.
    """
    comps = list(sorting_network(2 * f))
    for j in range(2 * f, n):
        comps += [(lk, j) for lk in range(f)]
        comps += [(j, hk) for hk in range(f, 2 * f)]
    return comps, list(range(2 * f, n))


def _pruned_partition(n: int, f: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The sorting network pruned to the ``f`` lowest and ``f`` highest ranks: every comparator
    exchanges values, so the other wires then hold the ``n - 2f`` middle values (unsorted).
    """
    comps = prune_network(sorting_network(n), [*range(f), *range(n - f, n)])
    return comps, list(range(f, n - f))


def _trimmed_partition(n: int, f: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The comparator network the trimmed-mean kernel runs, and the wires it then averages.

    The cheaper of :func:`_streaming_partition` and :func:`_pruned_partition`, where one
    comparator of the pruned network counts ``PRUNED_COST`` of the streaming one once more
    values are live than there are vector registers (it spills them).
    """
    stream = _streaming_partition(n, f)
    pruned = _pruned_partition(n, f)
    scale = PRUNED_COST if n > 28 else 1.0
    return pruned if len(pruned[0]) * scale < len(stream[0]) else stream


#: Relative cost of a comparator of a network with more live values than vector registers.
PRUNED_COST = 1.5


def _build(kind: str, n: int, param: int, style: str) -> tuple[str, str]:
    """Return ``(function_name, source)`` for a kernel.

    ``kind`` is ``median`` (n rows), ``trimmed_mean`` (n rows, param = f) or ``bulyan``
    (n = theta gathered rows, param = f).
    """
    # compiled Bulyan: the selected rows come as integer offsets (+2, so that none is 0 or 1,
    # values torch.compile would specialise on): one kernel serves every selection and the row
    # addresses are loop invariants (an index tensor is re-read and bounds-checked per vector)
    gather = kind == "bulyan" and style != "float"
    name = f"_{kind}_n{n}_p{param}_{style}"
    offsets = ", ".join(f"o{i}" for i in range(n))
    lines = [f"def {name}({f'x, {offsets}' if gather else 'x'}):"]
    if kind == "median":
        comps, used = prune_network(sorting_network(n), _median_needed(n)), _median_needed(n)
    elif kind == "trimmed_mean":
        comps, used = _trimmed_partition(n, param)
    elif kind == "bulyan":
        theta, f = n, param
        beta = theta - 2 * f
        if f == 0:
            comps = []
        else:
            needed = {*range(2 * f), *range(beta, theta), *_median_needed(theta)}
            comps = prune_network(sorting_network(theta), needed)
        used = list(range(theta))
    else:  # pragma: no cover - internal
        raise ValueError(kind)
    if style == "float" or not comps:
        src = "x"
    else:
        itype, bits = _INT_VIEWS[torch.float32 if style == "int32" else torch.float64]
        # order-preserving integer image of the floats (an involution: applied again it gives the bits back)
        lines.append(f"    k = x.view({itype})")
        lines.append(f"    k = k ^ ((k >> {bits}) & {(1 << bits) - 1})")
        src = "k"
    if gather:
        lines += [f"    r{i} = {src}[o{i} - 2]" for i in range(n)]
    else:
        lines.append(f"    {', '.join(f'r{i}' for i in range(n))}, = {src}.unbind(0)")
    for a, b in comps:
        lines.append(f"    r{a}, r{b} = torch.minimum(r{a}, r{b}), torch.maximum(r{a}, r{b})")
    for w in sorted(set(used) | (set(_median_needed(n)) if kind != "trimmed_mean" else set())):
        if src == "x":
            lines.append(f"    v{w} = r{w}")
        else:
            lines.append(f"    v{w} = (r{w} ^ ((r{w} >> {bits}) & {(1 << bits) - 1})).view(x.dtype)")
    if kind == "median":
        lines.append(f"    return {_median_expr(n)}")
    elif kind == "trimmed_mean":
        lines.append(f"    return ({' + '.join(f'v{w}' for w in used)}) / {n - 2 * param}")
    else:
        lines += _bulyan_epilogue(n, param)
    return name, "\n".join(lines) + "\n"


def _bulyan_epilogue(theta: int, f: int) -> list[str]:
    """Window selection over the sorted wires ``v0..v{theta-1}`` (see :func:`bulyan_coordinate_kernel`)."""
    beta = theta - 2 * f
    if f == 0:
        return [f"    return ({' + '.join(f'v{i}' for i in range(theta))}) / {beta}"]
    # The beta values closest to the median are a window [k, k + beta) of the sorted values,
    # k in [0, 2f] = number dropped on the low side. For each pair (t, t + beta), t < 2f,
    # exactly one member lies in any such window; the low one is dropped iff it is strictly
    # farther from the median (a tie in distance keeps the smaller value), so
    # k = 1 + max{t : |s_t - m| > |s_{t+beta} - m|} (0 if none). Taking the max rather than
    # the count makes pairs of *equal* values (which may go either way) harmless: shifting the
    # window across them changes nothing. Ranks [2f, beta) are in every window, so the
    # network need not sort them (they hold the right values in some order).
    lines = [f"    m = {_median_expr(theta)}"]
    for t in range(2 * f):
        lines.append(f"    c{t} = ((v{t} - m).abs() > (v{t + beta} - m).abs()).to(torch.int32)"
                     + (f" * {t + 1}" if t else ""))
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
        terms.append(f"torch.where({' & '.join(conds)}, v{i}, 0.0)" if conds else f"v{i}")
    lines.append(f"    return ({' + '.join(terms)}) / {beta}")
    return lines


def _want_compiled(x: torch.Tensor, rows: int) -> bool:
    backend = _codegen.get_backend()
    if backend == "eager":
        return False
    if backend == "compile":
        return True
    return rows <= COMPILE_MAX_ROWS and _codegen.auto_compiles(x, rows)


def _run_eager(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[1]
    if x.device.type != "cpu" or d <= EAGER_BLOCK_COLUMNS:
        return fn(x).clone() if d else x.new_empty(0)
    out = x.new_empty(d)
    for c0 in range(0, d, EAGER_BLOCK_COLUMNS):
        c1 = min(c0 + EAGER_BLOCK_COLUMNS, d)
        out[c0:c1] = fn(x[:, c0:c1])
    return out


def _run_sorted(kind: str, param: int, x: torch.Tensor) -> torch.Tensor:
    """The sort-based definitions on column chunks (non-CPU devices, many rows)."""
    from . import reference

    out = x.new_empty(x.shape[1])
    for c0 in range(0, x.shape[1], SORT_CHUNK_COLUMNS):
        block = x[:, c0:c0 + SORT_CHUNK_COLUMNS]
        if kind == "median":
            out[c0:c0 + block.shape[1]] = reference.reference_coordinate_median(block)
        elif kind == "trimmed_mean":
            out[c0:c0 + block.shape[1]] = reference.reference_trimmed_mean(block, param)
        else:
            out[c0:c0 + block.shape[1]] = reference.reference_bulyan_coordinate(block, param)
    return out


def _run(kind: str, n: int, param: int, x: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
    """Run the ``kind`` network over the ``n`` rows of ``x`` (Bulyan: the rows ``x[idx]``)."""
    if _want_compiled(x, n) and x.shape[1] > 0:
        style = _style(x.dtype, compiled=True)
        key = ("ostat", kind, n, param, style)
        args: tuple = (x.contiguous(),)
        if idx is not None and style != "float":
            args += tuple(int(i) + 2 for i in idx.tolist())
        elif idx is not None:
            args = (x.index_select(0, idx).contiguous(),)
        out = _codegen.call_compiled(key, lambda: _build(kind, n, param, style), args)
        if out is not None:
            return out
    if idx is not None:
        x = x.index_select(0, idx)
    if x.device.type != "cpu" and n > EAGER_MAX_ROWS and x.shape[1] > 0:
        return _run_sorted(kind, param, x)
    key = ("ostat", kind, n, param, "float")
    return _run_eager(_codegen.eager_fn(key, lambda: _build(kind, n, param, "float")), x)


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
    return _run("bulyan", theta, f, x, idx)

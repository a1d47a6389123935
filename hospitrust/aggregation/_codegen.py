"""Generated straight-line kernels, run with eager torch ops or compiled by ``torch.compile``.

The order-statistic networks (:mod:`.order_statistics`) and the one-pass Gram, row-statistic
and weighted-sum kernels (:mod:`.kernels`) are generated as Python source for a fixed number of
rows, executed once to get a function, and either called as they are (eager torch ops) or given
to ``torch.compile`` (Inductor), which turns each into one vectorised C++ loop over the columns.

Inductor's default ``max_fusion_size`` (64 nodes) cuts a network of a few hundred comparators
into dozens of kernels that pass ``(d,)`` intermediates through memory (trimmed mean at n = 20,
f = 4: 10x a read instead of 1x), so every kernel is compiled with a much larger limit.

A compile failure (no C++ compiler, an Inductor bug) is logged once per kernel, dtype and
device and the caller falls back to its eager path.

Compiling costs seconds once per process and kernel (7 s idle for a 3-row median, tens of seconds
loaded or at 50 rows), so ``auto`` compiles only where that pays: when the kernel's rows x columns
reach ``AUTO_COMPILE_MIN_ELEMENTS``, the size at which the time the compiled kernel saves per call
repays its compile within ``AUTO_PAYBACK_CALLS`` calls (measured with
``benchmarks/aggregation.py --backends``, docs/experiments/2026-12-06-compile-break-even.md). A
run chooses with its run config's ``aggregation.backend`` (applied when the server sets the run up,
:func:`set_backend`); a grid with ``[grid] aggregation-backend``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

_LOG = logging.getLogger(__name__)

BACKENDS = ("auto", "eager", "compile")

#: Inductor options for every generated kernel: fuse a whole network into one loop.
COMPILE_OPTIONS: dict[str, Any] = {"max_fusion_size": 1 << 16}
#: Extra options for the product kernels (Gram, dot products): let the C++ compiler contract
#: a * b + c into one fused multiply-add (twice the throughput of the Gram loop).
CONTRACT_OPTIONS: dict[str, Any] = {**COMPILE_OPTIONS, "cpp.enable_floating_point_contract_flag": "fast"}
#: The row kernels also keep the loop order of their outputs: otherwise Inductor orders the
#: reduction that reads only ``x`` row by row and the one that also reads ``v`` chunk by chunk,
#: two loop nests and two reads of ``x`` (1.0 read instead of 0.67 for FLTrust's dots and norms).
ROW_OPTIONS: dict[str, Any] = {**CONTRACT_OPTIONS, "pick_loop_orders": False}

#: Calls within which a compile must pay for itself for ``auto`` to compile: a run of 100 rounds.
AUTO_PAYBACK_CALLS = 100
#: Rows x columns from which ``auto`` compiles a kernel on the CPU: from this size on a compile, with the 9 s
#: Inductor takes to start in a new process, repays itself within ``AUTO_PAYBACK_CALLS`` calls (measured on
#: 2 cores: a ResNet-18 median at 10 rows in 88 calls, at 3 rows in 525; see the module's docstring). The default
#: small-cnn (420,802 parameters) stays eager up to 159 hospitals a round, ResNet-18 (11.2M) up to 5.
AUTO_COMPILE_MIN_ELEMENTS = 1 << 26

_backend = "auto"

_lock = threading.Lock()
_eager_cache: dict[tuple, Callable] = {}
_compiled_cache: dict[tuple, Callable] = {}
_failed: set[tuple] = set()
#: Calls answered by a compiled kernel, per kernel key (what the tests read to know a compiled kernel ran).
compiled_calls: dict[tuple, int] = {}


def get_backend() -> str:
    """The current backend name (``auto``, ``eager`` or ``compile``)."""
    return _backend


def set_backend(backend: str) -> None:
    """Set the backend (checked by :func:`hospitrust.aggregation.set_backend`)."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    _backend = backend


def auto_compiles(x: torch.Tensor, rows: int) -> bool:
    """Whether ``auto`` compiles a kernel over ``rows`` rows of ``x``'s columns: on the CPU, from
    ``AUTO_COMPILE_MIN_ELEMENTS`` elements (below it eager torch is milliseconds, and a compile costs seconds).
    """
    return x.device.type == "cpu" and rows * x.shape[-1] >= AUTO_COMPILE_MIN_ELEMENTS


def eager_fn(key: tuple, build: Callable[[], tuple[str, str]]) -> Callable:
    """The Python function of a generated kernel (cached by ``key``).

    ``build()`` returns ``(function_name, source)``. Every kernel gets its own code object
    (``torch.compile`` caches per code object, so kernels never evict each other).
    """
    fn = _eager_cache.get(key)
    if fn is None:
        name, src = build()
        namespace: dict = {"torch": torch}
        exec(compile(src, f"<hospitrust.aggregation:{name}>", "exec"), namespace)
        fn = namespace[name]
        _eager_cache[key] = fn
    return fn


def call_compiled(key: tuple, build: Callable[[], tuple[str, str]], args: tuple, *,
                  options: dict[str, Any] | None = None):
    """Call the ``torch.compile``'d kernel on ``args``; None when compiling it failed.

    The failure is cached per ``key``, the dtype and the device of the first argument, so a
    kernel that does not compile is tried once.
    """
    first = args[0]
    fkey = (*key, first.dtype, first.device.type)
    if fkey in _failed:
        return None
    with _lock:
        fn = _compiled_cache.get(key)
        if fn is None:
            fn = torch.compile(eager_fn(key, build), dynamic=True, fullgraph=True,
                               options=dict(COMPILE_OPTIONS if options is None else options))
            _compiled_cache[key] = fn
    try:
        out = fn(*args)
        compiled_calls[key] = compiled_calls.get(key, 0) + 1
        return out
    except Exception as exc:  # noqa: BLE001 - any compiler failure -> the caller's eager path
        _failed.add(fkey)
        _LOG.warning("torch.compile of the aggregation kernel %s (%s, %s) failed; using the eager path: %s",
                     key, first.dtype, first.device.type, exc)
        return None

"""The run config's ``aggregation`` section: how the aggregation kernels run (never what they compute)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hospitrust.options import Options


class AggregationOptions(Options):
    """How the order-statistic and one-pass aggregation kernels run on the CPU."""

    backend: Literal["auto", "eager", "compile"] = Field("auto", description=(
        "auto compiles a kernel (torch.compile) only where the compile repays itself within 100 rounds (rows x "
        "parameters from 2**26, measured: docs/experiments/2026-12-06-compile-break-even.md), eager never compiles, "
        "compile always does (long runs of large models; falls back to eager with a warning). The values are the same "
        "either way; the server applies it when it sets the run up."
    ))

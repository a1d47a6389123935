"""The ``secagg`` run-config section, apart from SecAgg+ itself: the config (and a ClientApp
reading it) imports these options without the server's SecAgg workflow.
"""

from __future__ import annotations


from pydantic import Field

from hospitrust.options import Options

#: The run-config section of secure aggregation (the round feature ``hospitrust.features.secagg``).
SECTION = "secagg"


class SecAggOptions(Options):
    """Secure aggregation with Flower's SecAgg+ (the ``secagg`` section): the server only ever holds the sum."""

    enabled: bool = Field(False, description=(
        "Aggregate with Flower's SecAgg+ (legacy SecAggPlusWorkflow + secaggplus_mod): the server only ever "
        "holds the sum; strategy must be fedavg."
    ))
    clipping_range: float = Field(8.0, gt=0.0, description=(
        "Model values are clipped to [-range, range] before quantization."
    ))
    quantization_range: int = Field(4194304, ge=2, description="Quantization levels over the clipping range.")
    max_weight: float = Field(0.0, ge=0.0, description=(
        "The largest num-examples a hospital may weigh in with; 0: the largest training set reported in the "
        "query round (models are scaled by n/max before quantization, so a loose bound costs precision)."
    ))
    reconstruction_threshold: float = Field(0.67, gt=0.0, le=1.0, description=(
        "Share of the hospitals' key shares needed to unmask the sum."
    ))



__all__ = ["SECTION", "SecAggOptions"]

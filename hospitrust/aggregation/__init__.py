"""Robust aggregation rules as pure torch functions (no Flower imports).

Every rule takes the stacked client updates ``x`` of shape ``(n, d)`` (one
row per client, floating dtype, any device) and returns a ``(d,)`` tensor
(:func:`clip_rows` is the helper that returns clipped ``(n, d)`` updates).
Selection rules also expose their scores / selected indices so a strategy
can record which clients were chosen.
"""

from .bulyan import bulyan, bulyan_select
from .centered_clipping import centered_clipping
from .fltrust import fltrust, fltrust_trust
from .geometric_median import geometric_median
from .kernels import gram, median_norm_clip, pairwise_sq_distances, plausible_median_norm
from .krum import krum, krum_scores, krum_select, multi_krum, multi_krum_select
from .mean import mean
from .median import coordinate_median
from .norm_clip import clip_factors, clip_rows, norm_clip
from .order_statistics import get_backend, set_backend
from .trimmed_mean import trimmed_mean
from .vectorize import FlatSpec, flatten_state, stack_updates, unflatten_state

__all__ = [
    "mean",
    "coordinate_median",
    "trimmed_mean",
    "pairwise_sq_distances",
    "gram",
    "krum_scores",
    "krum_select",
    "krum",
    "multi_krum_select",
    "multi_krum",
    "bulyan_select",
    "bulyan",
    "geometric_median",
    "centered_clipping",
    "norm_clip",
    "clip_factors",
    "clip_rows",
    "fltrust_trust",
    "fltrust",
    "flatten_state",
    "unflatten_state",
    "stack_updates",
    "FlatSpec",
    "set_backend",
    "get_backend",
]

# trust rules (fedagain, hta, earn)
from .fedagain import fedagain_divergence, fedagain_trust  # noqa: E402
from .hta import excused_direction, hta_fusion, hta_signals, hta_weights, mad_exclusion, reputation_update  # noqa: E402
from . import earn  # noqa: E402

__all__ += [
    "fedagain_divergence", "fedagain_trust", "hta_signals", "excused_direction", "hta_fusion", "reputation_update", "mad_exclusion",
    "hta_weights", "median_norm_clip", "plausible_median_norm", "earn",
]

# the field's defences (issue 34): the math only; not yet selectable in a run (the wiring comes with
# the round-features redesign)
from . import pre_aggregation  # noqa: E402
from .clipped_clustering import clipped_clustering  # noqa: E402
from .dnc import dnc  # noqa: E402
from .flame import flame  # noqa: E402
from .foolsgold import foolsgold  # noqa: E402
from .records import RuleRecord  # noqa: E402
from .signguard import signguard  # noqa: E402
from .subset_rules import caf, mda, monna, monna_around, smea  # noqa: E402

__all__ += ["pre_aggregation", "RuleRecord", "flame", "foolsgold", "dnc", "signguard", "clipped_clustering", "mda", "smea",
            "monna", "monna_around", "caf"]

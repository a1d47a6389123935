"""FedAgain (Reyes-Amezcua et al., arXiv:2603.19512): trust = 1 / (benchmark error x divergence)."""

from __future__ import annotations

import math
from collections.abc import Callable
from logging import INFO
from typing import Literal

import torch
from flwr.common import log
from pydantic import Field

from hospitrust.aggregation import fedagain_divergence, fedagain_trust, flatten_state
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy
from hospitrust.strategies.preset import Preset


class FedAgainOptions(Options):
    """FedAgain's options: how E and D are measured and floored."""

    benchmark: Literal["client", "server"] = Field("client", description=(
        "E: client = the hospital's reported error of the incoming global model on its validation set (the "
        "paper); server = 1 - reference-cohort balanced accuracy of the hospital's returned model (a variant;"
        " needs the reference cohort)."
    ))
    divergence: Literal["l2", "cosine", "median"] = Field("l2", description=(
        "D: l2 = ||returned - global|| (the paper); cosine = 1 - cos(returned, global) (the authors' code); "
        "median = ||update - coordinate-wise median update|| (a variant)."
    ))
    divergence_quantile: float = Field(0.5, ge=0.0, le=1.0, description=(
        "D is floored at this quantile of the round's divergences (a free-rider has D = 0)."
    ))
    error_quantile: float = Field(0.5, ge=0.0, le=1.0, description=(
        "E is floored at this quantile of the round's errors (a hospital reporting E = 0)."
    ))
    error_floor: float = Field(0.01, ge=0.0, le=1.0, description="Absolute floor of E.")
    eps_placement: Literal["product", "factors"] = Field("product", description=(
        "Where eps = 1e-6 enters: product = 1 / (E D + eps) (the paper); factors = 1 / ((E + eps)(D + eps)) "
        "(the authors' code)."
    ))
    flag_low_trust: bool = Field(True, description=(
        "Record a hospital as flagged when its trust is below half the round's median trust (a record only; "
        "the published rule has no outlier detection: false)."
    ))


def reported_errors(metrics) -> tuple[torch.Tensor, list[str]]:
    """Each reply's ``benchmark-error``; a missing or invalid one counts as 1.0 (the worst), with a note.

    Parameters
    ----------
    metrics : Sequence[Mapping]
        The round's replies' metrics, in row order (``RoundContext.metrics``).

    Returns
    -------
    tuple[torch.Tensor, list[str]]
        ``(n,)`` float64 errors in [0, 1] and one note per reply ('' when valid).
    """
    errors, notes = [], []
    for m in metrics:
        raw = m.get("benchmark-error")
        try:
            e = float(raw)
        except (TypeError, ValueError):
            e = math.nan
        if isinstance(raw, bool) or not math.isfinite(e) or not 0.0 <= e <= 1.0:
            errors.append(1.0)
            notes.append(f"benchmark-error {raw!r} missing or outside [0, 1]: counted as 1.0")
        else:
            errors.append(e)
            notes.append("")
    return torch.tensor(errors, dtype=torch.float64), notes


class FedAgain(HospitrustStrategy):
    """Trust ``T_k = 1 / (E'_k D'_k + eps)``, weights ``T / sum T``, aggregate ``sum_k w_k u_k``.

    ``E``: ``client`` (the paper): the incoming global model's error on the hospital's own
    validation set, as the hospital reports it (it can lie). ``server`` (a variant, not the
    paper): the error of the hospital's returned model (global + u_k) on the server's
    reference cohort, 1 - balanced accuracy, measured by the server (a hospital cannot
    report it; the incoming global's own error would be one number for everyone and cancel
    in T / sum T). ``D``: ``l2`` = ||u_k|| (the paper) or ``cosine`` = 1 - cos(w_k, w) (the
    authors' code). Both factors are floored at the round's quantiles (see
    :func:`hospitrust.aggregation.fedagain_trust`) so that a free-rider (D = 0) or a
    hospital reporting E = 0 cannot take the aggregate.

    ``candidate_scores``: callable (global state, (n, d) updates) -> (n,) balanced
    accuracies on the reference cohort (built by the ServerApp); needed for ``server``.
    A hospital is ``flagged`` when its trust is below half the round's median trust. The paper's
    form and the authors' code's are presets of this rule (``PRESETS`` below).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    candidate_scores : Callable[[dict, torch.Tensor], torch.Tensor] or None
        (global state, (n, d) updates) -> (n,) reference-cohort balanced accuracies; needed for
        ``fedagain.benchmark = "server"``.
    **kwargs
        The base's other keyword arguments.
    """

    name = "fedagain"
    trust_signal = "trust"
    reads_who_sent = True  # each reply's benchmark-error
    Options = FedAgainOptions
    options: FedAgainOptions

    @classmethod
    def needs(cls, options, composed) -> frozenset[str]:
        return frozenset({"candidate_scores"}) if options.benchmark == "server" else frozenset()

    @classmethod
    def cohort_free_setting(cls, options, composed) -> str | None:
        return "fedagain.benchmark = 'client' (each hospital's own benchmark error)"

    def __init__(self, hospitals, options=None, *,
                 candidate_scores: Callable[[dict, torch.Tensor], torch.Tensor] | None = None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        o = self.options
        if o.benchmark == "server" and candidate_scores is None:
            raise ValueError("fedagain.benchmark 'server' needs a candidate_scores callable (the reference cohort)")
        self.candidate_scores = candidate_scores

    def summary(self) -> None:
        super().summary()
        o = self.options
        log(INFO, "\t└── FedAgain: benchmark %s%s, divergence %s, floors: D at q%.2f, E at max(q%.2f, %g), trust %s",
            o.benchmark, " (variant: server-measured)" if o.benchmark == "server" else "", o.divergence,
            o.divergence_quantile, o.error_quantile, o.error_floor,
            "1 / (E D + eps)" if o.eps_placement == "product" else "1 / ((E + eps)(D + eps))")

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        assert self.global_state is not None
        o = self.options
        global_vec = flatten_state(self.global_state)[0].to(updates.device)
        if o.benchmark == "client":
            errors, notes = reported_errors(context.metrics)
        else:
            assert self.candidate_scores is not None  # __init__ refuses benchmark 'server' without it
            errors = 1.0 - torch.as_tensor(self.candidate_scores(self.global_state, updates), dtype=torch.float64).cpu()
            notes = [""] * len(example_weights)
        divergence = fedagain_divergence(updates, global_vec, o.divergence)
        res = fedagain_trust(errors, divergence, divergence_quantile=o.divergence_quantile,
                             error_quantile=o.error_quantile, error_floor=o.error_floor,
                             eps_placement=o.eps_placement)
        weights = res["weights"]
        update = weights.to(updates.dtype).to(updates.device) @ updates
        trust = res["trust"]
        flagged = (trust < 0.5 * float(torch.quantile(trust, 0.5)) if o.flag_low_trust
                   else torch.zeros(len(example_weights), dtype=torch.bool))
        return Aggregate(update, weights, torch.ones(len(example_weights), dtype=torch.bool), extra={
            "benchmark_error_used": [float(e) for e in errors],
            "error_floored": [float(e) for e in res["error"]],
            "divergence": [float(d) for d in divergence],
            "divergence_floored": [float(d) for d in res["divergence"]],
            "trust": [float(t) for t in trust],
            "flagged": [bool(f) for f in flagged],
            "note": notes,
        })


#: FedAgain as the paper describes it (arXiv:2603.19512)
FEDAGAIN_PUBLISHED = Preset(
    "fedagain-published", FedAgain,
    "FedAgain as published (arXiv:2603.19512): T_k = 1 / (E_k D_k + eps), D_k = ||w_k - w||, E_k the incoming global "
    "model's error on hospital k's validation set before local training (reported by the hospital), weights "
    "T / sum T, no floors and no outlier detection. A free-rider (D = 0) or a hospital that reports E = 0 takes "
    "nearly the whole aggregate here, as in the paper (docs/rules/fedagain.md).",
    {
        "divergence-quantile": (0.0, "D unfloored (fedagain floors it at the round's median: a free-rider has D = 0)."),
        "error-quantile": (0.0, "E unfloored (fedagain floors it at the round's median)."),
        "error-floor": (0.0, "No absolute floor of E (fedagain: 0.01)."),
        "flag-low-trust": (False, "No outlier detection: nobody is flagged."),
    },
)

PRESETS = (
    FEDAGAIN_PUBLISHED,
    FEDAGAIN_PUBLISHED.derive(
        "fedagain-authors-code",
        "FedAgain as the authors' public code computes it (github.com/Ivanrs297/federated-kidney-stone-corruption-"
        "detection, robust_divergence_experiments/train.py): D_k = 1 - cos(w_k, w) on the full parameter vectors and "
        "T_k = 1 / ((E_k + 1e-6)(D_k + 1e-6)), no floors, no flagging. One difference remains: the code's E is the "
        "incoming model's error on the client's training loader; hospitrust's hospitals report it on their "
        "validation split (the paper's choice).",
        {"divergence": ("cosine", "D = 1 - cos(returned, global) on the full parameter vectors (the paper: ||u_k||)."),
         "eps-placement": ("factors", "T = 1 / ((E + 1e-6)(D + 1e-6)) (the paper: 1 / (E D + 1e-6)).")},
    ),
)

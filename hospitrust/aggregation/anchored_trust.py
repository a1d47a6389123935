"""Anchored trust: each hospital's accumulated direction judged against the server's own update on
its reference cohort (the anchor) and the federation's own path, weights that saturate, and a step
set by the trusted updates.

Designed from the measured failures of HTA and EARN (docs/experiments/2026-12-04-trust-rule-failures.md):
trust is read from a hospital's history, not one round, against the operator's anchor and the path the
federation took (which colluders move only by the weight they were given), not a round's coordinate
median; looking average earns nothing beyond full trust; the bound on an update's norm is per local
step and set by the trusted rows only (zero rows cannot lower it, large hospitals are not outliers).
"""

from __future__ import annotations

import math

import torch

from ._validation import check_updates, check_vector

__all__ = ["anchored_trust", "full_trust_at", "local_steps", "saturating_trust"]


def local_steps(num_examples: torch.Tensor, batch_size: int, local_epochs: int) -> torch.Tensor:
    """Local optimizer steps of a hospital that trained ``local_epochs`` epochs of minibatches of
    ``batch_size`` on ``num_examples`` images: ``epochs x ceil(n / batch)`` (at least 1).

    Parameters
    ----------
    num_examples : torch.Tensor
        ``(n,)`` the examples each hospital reported.
    batch_size, local_epochs : int
        The round's training settings (positive).

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64.
    """
    if batch_size < 1 or local_epochs < 1:
        raise ValueError(f"batch_size and local_epochs must be >= 1, got {batch_size} and {local_epochs}")
    n = num_examples.double().cpu()
    return (local_epochs * torch.ceil(n / batch_size)).clamp_min(1.0)


def saturating_trust(history_cosine: torch.Tensor, full_trust_cosine: float, width: float) -> torch.Tensor:
    r"""Trust from the history cosine: :math:`t_i = \min(1, \max(0, 1 - (\tau^* - h_i) / w))`.

    A hospital whose history cosine reaches :math:`\tau^*` counts as one full voice; agreeing more
    earns nothing (looking average is no reason for more weight); below, trust falls linearly to 0
    at :math:`w` under :math:`\tau^*`.

    Parameters
    ----------
    history_cosine : torch.Tensor
        ``(n,)`` the history cosines :math:`h_i`.
    full_trust_cosine : float
        :math:`\tau^*` in [-1, 1].
    width : float
        :math:`w` > 0.

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 trusts in [0, 1].
    """
    if not -1.0 <= full_trust_cosine <= 1.0:
        raise ValueError(f"full_trust_cosine must be in [-1, 1], got {full_trust_cosine}")
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width}")
    return (1.0 - (full_trust_cosine - history_cosine.double()) / width).clamp(0.0, 1.0)


def full_trust_at(history_cosine: torch.Tensor, full_trust_cosine: float, assumed_malicious: int) -> float:
    r"""The history cosine of full trust this round: :math:`\tau^* = \min(\tau, h_{(n-f)})`, with
    :math:`h_{(n-f)}` the (n - f)-th largest history cosine of the round.

    At most f hospitals are assumed malicious, so at least n - 2f honest ones are at or above
    :math:`h_{(n-f)}`: the honest majority keeps full trust even when every history drifts from the
    reference (late in training non-IID hospitals point their own ways, measured), and full trust
    never needs more than :math:`\tau`.

    Parameters
    ----------
    history_cosine : torch.Tensor
        ``(n,)`` the round's history cosines.
    full_trust_cosine : float
        :math:`\tau` in (0, 1].
    assumed_malicious : int
        f, in [0, n).

    Returns
    -------
    float
        :math:`\tau^*`.
    """
    n = history_cosine.numel()
    if not 0.0 < full_trust_cosine <= 1.0:
        raise ValueError(f"full_trust_cosine must be in (0, 1], got {full_trust_cosine}")
    if not 0 <= assumed_malicious < max(n, 1):
        raise ValueError(f"assumed_malicious must be in [0, {max(n - 1, 0)}] for {n} updates, got {assumed_malicious}")
    kth = float(torch.sort(history_cosine.double(), descending=True).values[n - assumed_malicious - 1]) if n else 1.0
    return min(full_trust_cosine, kth)


def _unit_rows(x: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    scale = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), torch.zeros_like(norms))
    return x * scale.unsqueeze(1)


def _row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    na, nb = torch.linalg.vector_norm(a, dim=1), torch.linalg.vector_norm(b, dim=1)
    denom = na * nb
    dots = (a * b).sum(1)
    return torch.where(denom > 0, dots / denom.clamp_min(1e-300), torch.zeros_like(dots))


def reference_histories(anchor_history: torch.Tensor, path_history: torch.Tensor, anchor: torch.Tensor,
                        last_step: torch.Tensor | None, decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The reference side of the trust after this round: :math:`A_i \leftarrow \rho A_i + \hat g` and
    :math:`P_i \leftarrow \rho P_i + \hat s` (:func:`anchored_trust`; a hospital's history cosine is
    :math:`\cos(H_i, A_i + P_i)`). One function for the rule and for the attacker who forecasts it
    (``anchored-trust-aware``), so that both compute the same numbers.

    Parameters
    ----------
    anchor_history, path_history : torch.Tensor
        ``(n, d)`` or ``(d,)``: :math:`A_i` and :math:`P_i` before this round (float64).
    anchor : torch.Tensor
        ``(d,)`` this round's anchor :math:`g` (float64).
    last_step : torch.Tensor or None
        ``(d,)`` the rule's previous aggregate :math:`s` (float64; None in the first round: no path yet).
    decay : float
        :math:`\rho`.

    Returns
    -------
    tuple of torch.Tensor
        :math:`A_i` and :math:`P_i` after this round, shaped like the inputs.
    """
    gnorm = float(torch.linalg.vector_norm(anchor))
    g_unit = anchor / gnorm if gnorm > 0 else torch.zeros_like(anchor)
    new_anchor_history = decay * anchor_history + g_unit
    new_path = decay * path_history
    if last_step is not None:
        step_norm = float(torch.linalg.vector_norm(last_step))
        if step_norm > 0:
            new_path = new_path + last_step / step_norm
    return new_anchor_history, new_path


def anchored_trust(
    x: torch.Tensor,
    anchor: torch.Tensor,
    num_examples: torch.Tensor,
    steps: torch.Tensor,
    anchor_steps: float,
    history: torch.Tensor,
    anchor_history: torch.Tensor,
    path_history: torch.Tensor | None = None,
    last_step: torch.Tensor | None = None,
    *,
    decay: float = 0.9,
    full_trust_cosine: float = 0.5,
    trust_width: float = 0.5,
    assumed_malicious: int = 0,
    step_bound: float = 2.0,
    group_size: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    r"""One round of anchored trust.

    With :math:`g` the anchor (the global model trained on the server's reference cohort),
    :math:`\hat v = v / \lVert v\rVert` (0 for a zero vector), :math:`s` the rule's previous
    aggregate, and three decayed histories per hospital, carried from round to round (over the rounds
    hospital i took part in),

    .. math::

        H_i \leftarrow \rho H_i + \hat x_i,\quad A_i \leftarrow \rho A_i + \hat g,\quad
        P_i \leftarrow \rho P_i + \hat s,\qquad h_i = \cos(H_i, A_i + P_i),\qquad
        t_i = \min\bigl(1, \max(0, 1 - (\tau^* - h_i) / w)\bigr)

    where :math:`\tau^* = \min(\tau, h_{(n-f)})` (:func:`full_trust_at`): the reference is the operator's
    anchor plus the federation's own path, and full trust never needs more than the (n - f)-th
    largest history cosine, so the honest majority keeps it. Each update loses the part that points against this round's
    anchor and is clipped to :math:`\kappa` x its local steps :math:`k_i = e \lceil n_i / B\rceil` x
    the (lower) median norm per local step of the trusted rows (:math:`t_j > 0`; the anchor's
    :math:`\lVert g\rVert / k_0` when none is):

    .. math::

        x_i' = x_i - \min(0, \langle x_i, \hat g\rangle)\,\hat g,\qquad
        x_i'' = x_i' \min\Bigl(1, \frac{\kappa\, k_i\, \mathrm{med}_{t_j > 0}
            \lVert x_j'\rVert / k_j}{\lVert x_i'\rVert}\Bigr),\qquad
        \mathrm{AT}(x) = \sum_i w_i x_i'',\quad w_i = \frac{n_i t_i / s_i}{\sum_j n_j / s_j}

    with :math:`s_i` the size of hospital i's near-duplicate group (copies share one voice). The
    weights are shares of the whole round's examples: an untrusted hospital's share of the step is
    not taken. With every hospital at full trust and inside its bound this is FedAvg's mean of the
    projected updates. A zero anchor (nothing learnt on the cohort) gives the zero update.

    Parameters
    ----------
    x : torch.Tensor
        ``(n, d)`` the round's updates.
    anchor : torch.Tensor
        ``(d,)`` the anchor :math:`g`.
    num_examples, steps : torch.Tensor
        ``(n,)`` each hospital's examples and local steps.
    anchor_steps : float
        :math:`k_0`, the anchor's local steps (> 0).
    history, anchor_history : torch.Tensor
        ``(n, d)`` each hospital's :math:`H_i` and :math:`A_i` before this round (zeros for a
        hospital seen for the first time).
    path_history : torch.Tensor or None
        ``(n, d)`` each hospital's :math:`P_i` before this round (None: zeros).
    last_step : torch.Tensor or None
        ``(d,)`` the rule's previous aggregate :math:`s` (None in the first round).
    decay : float
        :math:`\rho` in [0, 1): 0 keeps only this round.
    full_trust_cosine : float
        :math:`\tau` in (0, 1].
    trust_width : float
        :math:`w` > 0.
    assumed_malicious : int
        f, in [0, n).
    step_bound : float
        :math:`\kappa` > 0.
    group_size : torch.Tensor or None
        ``(n,)`` near-duplicate group sizes (None: all 1).

    Returns
    -------
    dict
        ``update`` (d,), ``weights`` (n,) shares of the round's examples (summing to at most 1), and
        per hospital (float64, CPU): ``trust``, ``history_cosine``, ``round_cosine``,
        ``against_anchor`` (the norm removed by the projection), ``bound``, ``clip_factor``,
        ``full_trust_cosine`` (:math:`\tau^*`, the same for all); ``history``, ``anchor_history`` and
        ``path_history`` (n, d) after this round, in ``x``'s dtype and device.
    """
    n, d = check_updates(x)
    g = check_vector(anchor, d, "anchor", x)
    for name, v in (("decay", decay), ("step_bound", step_bound), ("anchor_steps", anchor_steps)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    if step_bound <= 0 or anchor_steps <= 0:
        raise ValueError(f"step_bound and anchor_steps must be > 0, got {step_bound} and {anchor_steps}")
    if history.shape != x.shape or anchor_history.shape != x.shape:
        raise ValueError(f"history and anchor_history must be {tuple(x.shape)} like the updates, got "
                         f"{tuple(history.shape)} and {tuple(anchor_history.shape)}")
    counts = num_examples.double().cpu()
    k = steps.double().cpu()
    if counts.shape != (n,) or k.shape != (n,):
        raise ValueError(f"num_examples and steps must have one value per update ({n}), got {tuple(counts.shape)} "
                         f"and {tuple(k.shape)}")
    sizes = torch.ones(n, dtype=torch.float64) if group_size is None else group_size.double().cpu()

    xd, gd = x.double(), g.double()
    norms = torch.linalg.vector_norm(xd, dim=1)
    gnorm = float(torch.linalg.vector_norm(gd))
    g_unit = gd / gnorm if gnorm > 0 else torch.zeros_like(gd)
    new_history = decay * history.double() + _unit_rows(xd, norms)
    past_path = torch.zeros_like(xd) if path_history is None else path_history.double()
    if past_path.shape != x.shape:
        raise ValueError(f"path_history must be {tuple(x.shape)} like the updates, got {tuple(past_path.shape)}")
    step = None if last_step is None else check_vector(last_step, d, "last_step", x).double()
    new_anchor_history, new_path = reference_histories(anchor_history.double(), past_path, gd, step, decay)
    h = _row_cosines(new_history, new_anchor_history + new_path).cpu()
    along = (xd @ g_unit)
    round_cos = torch.where(norms > 0, along / norms.clamp_min(1e-300), torch.zeros_like(along)).cpu()
    full = full_trust_at(h, full_trust_cosine, assumed_malicious)
    trust = saturating_trust(h, full, trust_width)

    against = along.clamp_max(0.0)
    projected = xd - against.unsqueeze(1) * g_unit.unsqueeze(0)
    pnorms = torch.linalg.vector_norm(projected, dim=1).cpu()
    per_step = pnorms / k
    trusted = trust > 0
    # the step: the trusted rows' (lower) median norm per local step (rows given no weight do not set it), the
    # anchor's when none is trusted
    norm_per_step = float(per_step[trusted].median()) if bool(trusted.any()) else gnorm / anchor_steps
    bound = step_bound * norm_per_step * k
    clip = torch.where(pnorms > bound, bound / pnorms.clamp_min(1e-300), torch.ones_like(pnorms))

    # shares of the whole round's examples: an untrusted hospital's share of the step is not taken (normalising
    # over the trusted alone would hand the whole step to one barely trusted hospital)
    mass = float((counts / sizes).sum())
    weights = counts * trust / sizes / mass if mass > 0 and gnorm > 0 else torch.zeros(n, dtype=torch.float64)
    coef = (weights * clip).to(x.device)
    update = (coef.unsqueeze(1) * projected).sum(0).to(x.dtype)
    return {
        "update": update,
        "weights": weights,
        "trust": trust,
        "history_cosine": h,
        "round_cosine": round_cos,
        "against_anchor": (-against).cpu(),
        "bound": bound,
        "clip_factor": clip,
        "full_trust_cosine": torch.full((n,), full, dtype=torch.float64),
        "history": new_history.to(x.dtype),
        "anchor_history": new_anchor_history.to(x.dtype),
        "path_history": new_path.to(x.dtype),
    }

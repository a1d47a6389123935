"""Defence-aware attacks on hospitrust's own rules, written as an attacker who has read the rule page.

* :func:`hta_band_attack`: against HTA, the least trust that keeps the attacker inside the dual
  MAD band this round (HTA's own reputation and exclusion functions in the loop), spent on an
  update that turns from the round's median direction towards the attacker's target;
* :func:`earn_row_push`: against EARN, a rare-class row pushed towards a target while it still
  looks like a holder (positive bias update), agrees with the other holders' median row and
  passes the row audit the attacker can estimate from its own few real images;
* :func:`fltrust_small_cosine`: against FLTrust, an update at a small positive cosine to the
  root update, the rest of it along the attacker's direction.

Each returns the malicious update and a record of the constraint it meets. Pure torch.
"""

from __future__ import annotations

import math

import torch

from hospitrust.aggregation.hta import mad_exclusion, reputation_update

from .update import check_finite_number

__all__ = ["turn_towards", "hta_trust_needed", "hta_band_attack", "earn_row_push", "fltrust_small_cosine",
           "anchored_trust_push"]


def _unit(v: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(v, torch.Tensor) or v.dim() != 1 or not v.is_floating_point():
        raise ValueError(f"{name} must be a 1-D floating tensor")
    norm = float(torch.linalg.vector_norm(v.double()))
    if not norm > 0:
        raise ValueError(f"{name} must be non-zero")
    return v.double() / norm


def _orthogonal_unit(target: torch.Tensor, ref_unit: torch.Tensor) -> torch.Tensor:
    t = target.double()
    perp = t - (t @ ref_unit) * ref_unit
    norm = float(torch.linalg.vector_norm(perp))
    if norm <= 1e-12 * float(torch.linalg.vector_norm(t)):
        raise ValueError("target must not be parallel to the reference direction (nothing to turn towards)")
    return perp / norm


def turn_towards(reference: torch.Tensor, target: torch.Tensor, cosine: float, norm: float) -> torch.Tensor:
    r""":math:`\lVert\cdot\rVert\,(c\,\hat r + \sqrt{1 - c^2}\,\hat t_\perp)`: the vector of the given
    norm at cosine ``c`` to ``reference``, turned towards ``target`` (:math:`\hat t_\perp`: the unit
    part of ``target`` orthogonal to ``reference``). Among the vectors at that cosine it has the
    largest component along ``target``.

    Parameters
    ----------
    reference : torch.Tensor
        ``(d,)`` the direction to keep cosine ``c`` with.
    target : torch.Tensor
        ``(d,)`` the direction to move towards (not parallel to ``reference``).
    cosine : float
        ``c`` in [-1, 1].
    norm : float
        The result's norm, >= 0.

    Returns
    -------
    torch.Tensor
        ``(d,)`` in ``reference``'s dtype.
    """
    c = check_finite_number(cosine, "cosine")
    if not -1.0 <= c <= 1.0:
        raise ValueError(f"cosine must be in [-1, 1], got {c}")
    norm = check_finite_number(norm, "norm", nonneg=True)
    r = _unit(reference, "reference")
    t = _orthogonal_unit(_unit(target, "target"), r)
    return (norm * (c * r + math.sqrt(max(0.0, 1.0 - c * c)) * t)).to(reference.dtype)


def hta_trust_needed(ema: float | None, var: float, others: torch.Tensor, *, num_malicious: int = 1, rate: float = 0.3,
                     variance_penalty: float = 1.0, lam: float = 2.0, kappa: float = 0.5, grid: int = 2001) -> dict:
    r"""The least round trust :math:`\tau` that leaves the attacker's reputation outside HTA's dual
    exclusion this round.

    For :math:`\tau` on a grid over [0, 1] (then refined by bisection next to the first grid point
    that works), the attacker's new reputation comes from
    :func:`~hospitrust.aggregation.hta.reputation_update` and the exclusion from
    :func:`~hospitrust.aggregation.hta.mad_exclusion` over ``others`` plus ``num_malicious``
    copies of it (colluders in the same state). The exclusion is not monotone in :math:`\tau` in
    general (the attacker's own reputation moves the median), so the rule itself decides each point.

    Parameters
    ----------
    ema : float or None
        The attacker's running mean reputation :math:`r_{t-1}` (None: its first round).
    var : float
        Its running variance.
    others : torch.Tensor
        ``(k,)`` the other hospitals' reputations after this round (the attacker's forecast).
    num_malicious : int
        Colluders in the same state.
    rate : float
        HTA's :math:`\rho`.
    variance_penalty : float
        HTA's :math:`\gamma`.
    lam : float
        HTA's :math:`\lambda`.
    kappa : float
        HTA's :math:`\kappa`.
    grid : int
        Grid points over [0, 1].

    Returns
    -------
    dict
        ``tau`` (the least trust that works, or 1.0), ``feasible`` (bool), ``reputation`` (the
        attacker's after the round at ``tau``).
    """
    others = torch.as_tensor(others, dtype=torch.float64).flatten()

    def kept(tau: float) -> tuple[bool, float]:
        rep = reputation_update(tau, ema, var, rate=rate, variance_penalty=variance_penalty)[2]
        r = torch.cat([others, torch.full((num_malicious,), rep, dtype=torch.float64)])
        return not bool(mad_exclusion(r, lam=lam, kappa=kappa)["excluded"][-1]), rep

    taus = torch.linspace(0.0, 1.0, grid).tolist()
    for i, tau in enumerate(taus):
        ok, rep = kept(tau)
        if ok:
            if i == 0:
                return {"tau": 0.0, "feasible": True, "reputation": rep}
            lo, hi = taus[i - 1], tau
            for _ in range(40):
                mid = 0.5 * (lo + hi)
                if kept(mid)[0]:
                    hi = mid
                else:
                    lo = mid
            return {"tau": hi, "feasible": True, "reputation": kept(hi)[1]}
    return {"tau": 1.0, "feasible": False, "reputation": kept(1.0)[1]}


def hta_band_attack(reference: torch.Tensor, target: torch.Tensor, *, median_norm: float, ema: float | None, var: float,
                    others: torch.Tensor, num_malicious: int = 1, expected_validation: float = 1.0, a: float = 0.5,
                    b: float = 1.0, c: float = 1.0, rate: float = 0.3, variance_penalty: float = 1.0, lam: float = 2.0,
                    kappa: float = 0.5, margin: float = 0.02) -> tuple[torch.Tensor, dict]:
    r"""Against HTA: attack while staying inside the dual MAD band.

    HTA's round trust is :math:`\tau = s^a m^b v^c` (its page): :math:`s` the cosine to the
    coordinate median of the round's updates, :math:`m = 1` for a norm within the tolerance of the
    median norm, :math:`v` the validation signal. The attacker sends ``median_norm`` (m = 1),
    expects validation ``expected_validation``, needs the trust :func:`hta_trust_needed` gives
    (plus ``margin``, for the median its own row moves), so it needs cosine
    :math:`s = (\tau / v^c)^{1/a}` to ``reference`` (its estimate of the round's median update)
    and spends the rest of the update on ``target`` (:func:`turn_towards`). A hospital that
    built its reputation honestly for k rounds (``attack-schedule.start-round``) can then pull
    every round without being excluded. With ``a = 0`` the direction is free (cosine 0).

    Parameters
    ----------
    reference : torch.Tensor
        ``(d,)`` the attacker's estimate of the coordinate median update.
    target : torch.Tensor
        ``(d,)`` where it wants the model to go (e.g. minus the honest mean).
    median_norm : float
        Its estimate of the median update norm.
    ema : float or None
        Its running mean reputation.
    var : float
        Its running variance.
    others : torch.Tensor
        ``(k,)`` the others' reputations it forecasts.
    num_malicious : int
        Colluders in the same state.
    expected_validation : float
        The validation signal :math:`v` it expects, in (0, 1].
    a : float
        HTA's exponent of s.
    b : float
        HTA's exponent of m.
    c : float
        HTA's exponent of v.
    rate : float
        HTA's :math:`\rho`.
    variance_penalty : float
        HTA's :math:`\gamma`.
    lam : float
        HTA's :math:`\lambda`.
    kappa : float
        HTA's :math:`\kappa`.
    margin : float
        Added to the trust needed.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` update and ``{"tau", "cosine", "feasible", "reputation"}``.
    """
    _ = b  # m = 1 by construction, so its exponent does not matter
    need = hta_trust_needed(ema, var, others, num_malicious=num_malicious, rate=rate, variance_penalty=variance_penalty,
                            lam=lam, kappa=kappa)
    tau = min(1.0, need["tau"] + margin)
    v = check_finite_number(expected_validation, "expected_validation", positive=True)
    if a <= 0:
        cos = 0.0
    else:
        cos = (tau / v ** c) ** (1.0 / a)
    feasible = need["feasible"] and cos <= 1.0
    cos = min(1.0, cos)
    return turn_towards(reference, target, cos, median_norm), {"tau": tau, "cosine": cos, "feasible": feasible,
                                                               "reputation": need["reputation"]}


def earn_row_push(row: torch.Tensor, peer_reference: torch.Tensor, push: torch.Tensor, *, agree_threshold: float,
                  audit_direction: torch.Tensor | None = None, bias_index: int = -1, margin: float = 1e-3
                  ) -> tuple[torch.Tensor, dict]:
    r"""Against EARN: a rare-class row pushed towards ``push`` while it still passes EARN's checks.

    The attacker claims the rare class c with a few real images, so its honest row update ``row``
    (class c's weight row and bias) has a positive bias update (EARN's evidence: it holds c).
    It rotates the row, norm kept (so the row clip treats it as before), from
    ``peer_reference`` (its estimate of the other holders' median row) towards ``push`` by the
    largest angle that keeps

    * the cosine to ``peer_reference`` at least ``agree_threshold + margin`` (EARN's peer
      agreement, ``earn.agree-threshold``),
    * the bias entry positive (still a holder),
    * ``audit_direction . row > 0`` when given: EARN's row audit is
      :math:`\Delta w \cdot (\bar h_{y=c} - \bar h_{y \ne c})`, so an attacker who estimates the
      mean feature difference from its own images passes it as long as its estimate points the
      way the server's cohort does.

    On the arc from the reference the linear constraints stay positive up to their first root,
    so the angle is exact. Returns the reference direction itself (feasible False) when that
    already fails a constraint.

    Parameters
    ----------
    row : torch.Tensor
        ``(R,)`` the attacker's honest row update (weight row and bias); its norm is kept.
    peer_reference : torch.Tensor
        ``(R,)`` its estimate of the median row of the other holders.
    push : torch.Tensor
        ``(R,)`` the direction it pushes the row (not parallel to ``peer_reference``).
    agree_threshold : float
        EARN's agreement threshold in [0, 1).
    audit_direction : torch.Tensor or None
        ``(R,)`` the estimated audit direction (0 at the bias); None: no audit constraint.
    bias_index : int
        Where the bias entry is in the row.
    margin : float
        Added to the threshold, and the share of the last feasible angle kept back.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(R,)`` row and ``{"cosine", "angle", "feasible", "bias"}``.
    """
    t = check_finite_number(agree_threshold, "agree_threshold")
    if not 0.0 <= t < 1.0:
        raise ValueError(f"agree_threshold must be in [0, 1), got {t}")
    norm = float(torch.linalg.vector_norm(row.double()))
    r = _unit(peer_reference, "peer_reference")
    p = _orthogonal_unit(_unit(push, "push"), r)
    angle = math.acos(min(1.0, t + margin))
    limits = [torch.zeros_like(r)]
    limits[0][bias_index] = 1.0
    if audit_direction is not None:
        limits.append(audit_direction.double())
    for lin in limits:
        at_ref, along = float(lin @ r), float(lin @ p)
        if at_ref <= 0:
            return (norm * r).to(row.dtype), {"cosine": 1.0, "angle": 0.0, "feasible": False, "bias": norm * float(r[bias_index])}
        if along < 0:  # at_ref cos(theta) + along sin(theta) > 0 up to atan2(at_ref, -along)
            angle = min(angle, math.atan2(at_ref, -along) * (1.0 - margin))
    out = norm * (math.cos(angle) * r + math.sin(angle) * p)
    return out.to(row.dtype), {"cosine": math.cos(angle), "angle": angle, "feasible": True, "bias": float(out[bias_index])}


def fltrust_small_cosine(root_estimate: torch.Tensor, direction: torch.Tensor, cosine: float = 0.1,
                         norm: float | None = None) -> tuple[torch.Tensor, dict]:
    r"""Against FLTrust: an update at a small positive cosine ``c`` to the server's root update, the
    rest along ``direction``.

    FLTrust weighs an update by :math:`\mathrm{ReLU}(\cos(u, g_0))` and rescales it to
    :math:`\lVert g_0\rVert` (its page), so an update at cosine :math:`c > 0` keeps weight c and
    adds :math:`c\sqrt{1 - c^2}\,\lVert g_0\rVert` along the attacker's direction orthogonal to
    :math:`g_0` per attacker (the most at :math:`c = 1/\sqrt 2`; a small c hides better among
    hospitals whose data differ from the root cohort). ``root_estimate`` is the attacker's guess
    of :math:`g_0` (its own honest update: the root cohort is drawn from the same val split).

    Parameters
    ----------
    root_estimate : torch.Tensor
        ``(d,)`` the estimated root update :math:`g_0`.
    direction : torch.Tensor
        ``(d,)`` where the attacker pulls (not parallel to ``root_estimate``).
    cosine : float
        ``c`` in (0, 1].
    norm : float or None
        The update's norm; None: the root estimate's (FLTrust rescales it anyway).

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` update and ``{"cosine": c}``.
    """
    c = check_finite_number(cosine, "cosine")
    if not 0.0 < c <= 1.0:
        raise ValueError(f"cosine must be in (0, 1] (a cosine of 0 or below gets FLTrust weight 0), got {c}")
    size = float(torch.linalg.vector_norm(root_estimate.double())) if norm is None else check_finite_number(norm, "norm", nonneg=True)
    return turn_towards(root_estimate, direction, c, size), {"cosine": c}


def anchored_trust_push(anchor: torch.Tensor, away: torch.Tensor, history: torch.Tensor, reference: torch.Tensor, *,
                        decay: float, full_trust_cosine: float, trust_width: float, norm: float, angles: int = 91
                        ) -> tuple[torch.Tensor, dict]:
    r"""Against anchored trust: the update of norm ``norm`` in the plane of the anchor :math:`\hat g`
    and the attacker's direction that adds the most along the direction, times the trust it keeps.

    Anchored trust keeps the part of an update along :math:`\hat g` and orthogonal to it (the part
    against :math:`\hat g` is removed) and weighs it by
    :math:`t = \min(1, \max(0, 1 - (\tau^* - \cos(\rho H + \hat x, R)) / w))`, with the attacker's history
    :math:`H` and the reference :math:`R` (the anchor's and the federation's decayed path, this round's
    anchor included). For :math:`x(\theta) = \lVert x\rVert(\cos\theta\,\hat g + \sin\theta\,\hat u)`,
    :math:`\hat u` the direction's unit part orthogonal to :math:`\hat g`, the search takes the
    :math:`\theta \in [0, \pi/2]` (a grid of ``angles``) that maximises :math:`t(\theta)\sin\theta`: the
    orthogonal push the rule lets through, per unit of norm. Ties go to the larger angle.

    Parameters
    ----------
    anchor, away : torch.Tensor
        ``(d,)`` the anchor and where the attacker pulls.
    history, reference : torch.Tensor
        ``(d,)`` :math:`\rho`-decayed history before this round, and :math:`R`.
    decay, full_trust_cosine, trust_width, norm : float
        :math:`\rho`, the round's cosine of full trust :math:`\tau^*`, the width :math:`w`, and the
        update's norm.
    angles : int
        Grid size (>= 2).

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` update and ``{"angle": degrees, "trust": t, "push": t sin(angle)}``.
    """
    g = anchor.double()
    gnorm = float(torch.linalg.vector_norm(g))
    if gnorm == 0:
        raise ValueError("the anchor is zero: there is no plane to search")
    g_unit = g / gnorm
    u = away.double() - float(away.double() @ g_unit) * g_unit
    unorm = float(torch.linalg.vector_norm(u))
    if unorm == 0:
        raise ValueError("the attacker's direction is parallel to the anchor: nothing to push orthogonally")
    u_unit = u / unorm
    thetas = torch.linspace(0.0, math.pi / 2, max(int(angles), 2), dtype=torch.float64)
    base = decay * history.double()
    ref = reference.double()
    ref_norm = float(torch.linalg.vector_norm(ref))
    best = (-1.0, 0.0, 0.0)
    for theta in thetas.tolist():
        unit = math.cos(theta) * g_unit + math.sin(theta) * u_unit
        h_vec = base + unit
        denom = float(torch.linalg.vector_norm(h_vec)) * ref_norm
        h = float(h_vec @ ref) / denom if denom > 0 else 0.0
        trust = min(1.0, max(0.0, 1.0 - (full_trust_cosine - h) / trust_width))
        push = trust * math.sin(theta)
        if push >= best[0]:
            best = (push, theta, trust)
    push, theta, trust = best
    row = norm * (math.cos(theta) * g_unit + math.sin(theta) * u_unit)
    return row.to(anchor.dtype), {"angle": math.degrees(theta), "trust": trust, "push": push}

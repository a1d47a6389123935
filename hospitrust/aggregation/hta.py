"""HTA, Hospital Trust Aggregation: three bounded signals, a reputation over rounds, a dual MAD exclusion."""

from __future__ import annotations

import math

import torch

from ._validation import check_updates
from .duplicates import group_representatives
from .kernels import median_norm_clip, plausible_median_norm
from .median import coordinate_median

__all__ = ["hta_signals", "excused_direction", "hta_fusion", "reputation_update", "mad_exclusion", "hta_weights"]


def hta_signals(
    x: torch.Tensor,
    validation: torch.Tensor | None = None,
    *,
    magnitude_tolerance: float = 2.0,
    group: torch.Tensor | None = None,
    trim_norms: bool = False,
) -> dict[str, torch.Tensor]:
    r"""The per-round signals, each in [0, 1].

    .. math::

        s_h = \max(0, \cos(u_h, \mathrm{med}(u))),\qquad
        m_h = \exp\bigl(-\max(0,\ |\ln(\lVert u_h\rVert / \tilde\nu)| - \ln t)\bigr),\qquad
        v_h = \mathrm{clip}(\beta_h / \tilde\beta,\ 0,\ 1)

    :math:`\mathrm{med}(u)` is the coordinate-wise median of the updates, :math:`\tilde\nu`
    the median update norm (with ``trim_norms``, the median of the norms at most t times
    it, :func:`plausible_median_norm`), :math:`t` the magnitude tolerance (norms within a factor t of
    the median are fully plausible; beyond, the penalty is symmetric in the log ratio, so
    a 10x scaler and a 10x shrinker score the same), :math:`\beta_h` the balanced accuracy
    of (global + u_h) on the reference cohort and :math:`\tilde\beta` its median over the
    round. Edge cases: a zero update has s = 0 and m = 0; a zero median has s = 1 (no
    direction to agree with); a zero median norm gives m = 1; a zero median accuracy gives
    v = 1; no validation (``None``) gives v = 1 (the ablation c = 0).

    ``group`` (n,), optional, from :func:`~hospitrust.aggregation.duplicates.duplicate_groups`:
    the three medians are taken over one entry per group (the members' mean), so k copies of
    one update move them as one hospital would.

    Returns ``{"s", "m", "v", "norm"}``, each ``(n,)`` float64 on CPU.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``, :math:`u_h`.
    validation : torch.Tensor or None
        ``(n,)`` balanced accuracy :math:`\beta_h` of each candidate model on the reference cohort;
        None: no validation signal.
    magnitude_tolerance : float
        ``t`` (>= 1): norms within this factor of the median are fully plausible.
    group : torch.Tensor or None
        ``(n,)`` near-duplicate group of each update; None: every update alone.
    trim_norms : bool
        Take the median norm over the norms at most ``t`` times the median.

    Returns
    -------
    dict[str, torch.Tensor]
        ``s``, ``m``, ``v`` and ``norm`` (the update norms), each ``(n,)``.
    """
    n, d = check_updates(x)
    if magnitude_tolerance < 1.0:
        raise ValueError(f"magnitude_tolerance must be >= 1, got {magnitude_tolerance}")
    xd = x.double()
    voices = x if group is None else group_representatives(x, group)
    med = coordinate_median(voices).double()
    norms = torch.linalg.vector_norm(xd, dim=1)
    med_norm_vec = float(torch.linalg.vector_norm(med))
    if med_norm_vec > 0:
        cos = (xd @ med) / (norms * med_norm_vec).clamp_min(1e-300)
        s = torch.where(norms > 0, cos.clamp(0.0, 1.0), torch.zeros_like(cos))
    else:
        s = torch.ones(n, dtype=torch.float64, device=x.device)
    voice_norms = norms if voices is x else torch.linalg.vector_norm(voices.double(), dim=1)
    med_norm = plausible_median_norm(voice_norms, magnitude_tolerance if trim_norms else None)
    if med_norm > 0:
        log_ratio = torch.log(norms.clamp_min(1e-300) / med_norm).abs()
        m = torch.exp(-(log_ratio - math.log(magnitude_tolerance)).clamp_min(0.0))
        m = torch.where(norms > 0, m, torch.zeros_like(m))
    else:
        m = torch.ones(n, dtype=torch.float64, device=x.device)
    if validation is None:
        v = torch.ones(n, dtype=torch.float64)
    else:
        acc = torch.as_tensor(validation, dtype=torch.float64).flatten().cpu()
        if acc.numel() != n:
            raise ValueError(f"validation must have one value per update (n={n}), got {acc.numel()}")
        med_acc = float(torch.quantile(acc if group is None else group_representatives(acc[:, None], group)[:, 0], 0.5))
        v = (acc / med_acc).clamp(0.0, 1.0) if med_acc > 0 else torch.ones(n, dtype=torch.float64)
    return {"s": s.cpu(), "m": m.cpu(), "v": v, "norm": norms.cpu()}


def excused_direction(s: torch.Tensor, excuse: torch.Tensor) -> torch.Tensor:
    r""":math:`s'_h = \max(s_h,\ e_h\,\tilde s)`: the direction signal floored by an excuse
    :math:`e_h \in [0, 1]` times the round's median :math:`\tilde s`.

    An honest specialist points away from the median because of the data it alone holds;
    when that data has been verified elsewhere (EARN's audited rare-class trust), the
    disagreement is not evidence against it, so at full excuse it counts as a typical
    hospital of the round, no more. The magnitude and validation signals still apply, so
    an excused update that hurts the reference cohort still loses reputation.

    Parameters
    ----------
    s : torch.Tensor
        ``(n,)`` the direction signals :math:`s_h`.
    excuse : torch.Tensor
        ``(n,)`` the excuses :math:`e_h` in [0, 1].

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 CPU :math:`s'_h`.
    """
    s = s.double().cpu()
    e = torch.as_tensor(excuse, dtype=torch.float64).flatten().cpu()
    if e.numel() != s.numel():
        raise ValueError(f"excuse must have one value per update (n={s.numel()}), got {e.numel()}")
    if bool(torch.isnan(e).any()) or float(e.min()) < 0.0 or float(e.max()) > 1.0:
        raise ValueError(f"excuse values must be in [0, 1], got {e.tolist()}")
    return torch.maximum(s, e * float(torch.quantile(s, 0.5)))


def hta_fusion(s: torch.Tensor, m: torch.Tensor, v: torch.Tensor, a: float = 0.5, b: float = 1.0, c: float = 1.0) -> torch.Tensor:
    r""":math:`\tau_h = s_h^a\, m_h^b\, v_h^c` (with :math:`0^0 = 1`: an exponent 0 drops that signal).

    Parameters
    ----------
    s : torch.Tensor
        ``(n,)`` direction signals.
    m : torch.Tensor
        ``(n,)`` magnitude signals.
    v : torch.Tensor
        ``(n,)`` validation signals.
    a : float
        Exponent of ``s`` (>= 0).
    b : float
        Exponent of ``m`` (>= 0).
    c : float
        Exponent of ``v`` (>= 0).

    Returns
    -------
    torch.Tensor
        ``(n,)`` float64 round trust :math:`\tau_h`.
    """
    for name, e in (("a", a), ("b", b), ("c", c)):
        if e < 0:
            raise ValueError(f"exponent {name} must be >= 0, got {e}")
    return s.double().pow(a) * m.double().pow(b) * v.double().pow(c)


def reputation_update(
    tau: float, ema: float | None, var: float, *, rate: float = 0.3, variance_penalty: float = 1.0
) -> tuple[float, float, float]:
    r"""One round of a hospital's reputation.

    .. math::

        \delta = \tau_t - r_{t-1},\quad
        r_t = r_{t-1} + \rho\,\delta,\quad
        \sigma^2_t = (1-\rho)(\sigma^2_{t-1} + \rho\,\delta^2),\quad
        R_t = \mathrm{clip}(r_t - \gamma\,\sigma_t,\ 0,\ 1)

    (the exponentially weighted mean and variance, Finch 2009); a first observation sets
    :math:`r = \tau, \sigma^2 = 0`. The penalty is on the standard deviation, the same
    units as the reputation, so a hospital that alternates honest and hostile rounds
    (on-off) ends below one that is steadily mediocre.

    Returns ``(ema, var, reputation)``.

    Parameters
    ----------
    tau : float
        This round's trust :math:`\tau_t`.
    ema : float or None
        The hospital's running mean :math:`r_{t-1}`; None for its first observation.
    var : float
        Its running variance :math:`\sigma^2_{t-1}`.
    rate : float
        :math:`\rho`, in (0, 1].
    variance_penalty : float
        :math:`\gamma`, the factor on the standard deviation.

    Returns
    -------
    tuple[float, float, float]
        The new :math:`r_t`, :math:`\sigma^2_t` and :math:`R_t`.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if ema is None:
        ema, var = float(tau), 0.0
    else:
        delta = float(tau) - ema
        ema = ema + rate * delta
        var = (1.0 - rate) * (var + rate * delta * delta)
    rep = min(1.0, max(0.0, ema - variance_penalty * math.sqrt(max(var, 0.0))))
    return ema, var, rep


def mad_exclusion(reputation: torch.Tensor, *, lam: float = 2.0, kappa: float = 0.5) -> dict[str, torch.Tensor]:
    r"""Dual exclusion: h is excluded only when both
    :math:`R_h < \mu - \lambda\,\mathrm{MAD}` and :math:`R_h < \kappa\,\mu`, with
    :math:`\mu = \mathrm{median}(R)` and :math:`\mathrm{MAD} = \mathrm{median}|R - \mu|`
    (raw, not scaled by 1.4826). The first test alone excludes honest hospitals when all
    reputations are close (MAD near 0); the second alone excludes nobody when everyone is
    low. The median itself is never excluded, so at least half the hospitals are kept.

    Returns ``{"excluded", "below_mad", "below_kappa"}`` (bool) and ``mu``, ``mad`` (0-d).

    Parameters
    ----------
    reputation : torch.Tensor
        ``(n,)`` reputations :math:`R_h`.
    lam : float
        :math:`\lambda`, the MADs below the median that the first test allows.
    kappa : float
        :math:`\kappa`, the share of the median that the second test allows.

    Returns
    -------
    dict[str, torch.Tensor]
        ``excluded``, ``below_mad``, ``below_kappa`` (``(n,)`` bool), ``mu`` and ``mad``.
    """
    r = torch.as_tensor(reputation, dtype=torch.float64).flatten()
    mu = torch.quantile(r, 0.5)
    mad = torch.quantile((r - mu).abs(), 0.5)
    below_mad = r < mu - lam * mad
    below_kappa = r < kappa * mu
    return {"excluded": below_mad & below_kappa, "below_mad": below_mad, "below_kappa": below_kappa, "mu": mu, "mad": mad}


def hta_weights(
    x: torch.Tensor,
    reputation: torch.Tensor,
    num_examples: torch.Tensor,
    keep: torch.Tensor,
    *,
    clip_to_median_norm: bool = True,
    group_size: torch.Tensor | None = None,
    trim_tolerance: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Weights :math:`w_h \propto R_h n_h / k_h` over the kept hospitals (num-examples alone if
    every kept reputation is 0; :math:`k_h` the size of h's group of near-duplicate updates,
    ``group_size``, 1 if None, so a group weighs as much as its average member), and the
    aggregate :math:`\sum_h w_h \tilde u_h` with
    :math:`\tilde u_h = u_h \min(1, \tilde\nu_K / \lVert u_h\rVert)` when clipping
    (:math:`\tilde\nu_K` the median norm of the kept updates; with ``trim_tolerance`` t, the
    median of those at most t times it, :func:`plausible_median_norm`), else :math:`u_h`.

    Returns ``(update (d,), weights (n,) float64 CPU)``.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    reputation : torch.Tensor
        ``(n,)`` reputations :math:`R_h`.
    num_examples : torch.Tensor
        ``(n,)`` the reported example counts :math:`n_h`.
    keep : torch.Tensor
        ``(n,)`` bool: the hospitals not excluded (at least one).
    clip_to_median_norm : bool
        Clip each update to the kept updates' median norm.
    group_size : torch.Tensor or None
        ``(n,)`` size :math:`k_h` of each hospital's near-duplicate group; None: all 1.
    trim_tolerance : float or None
        ``t`` for the median norm (:func:`plausible_median_norm`); None: the plain median.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        The ``(d,)`` aggregate (``x``'s dtype and device) and the ``(n,)`` float64 CPU weights.
    """
    n, d = check_updates(x)
    keep = torch.as_tensor(keep, dtype=torch.bool).flatten().cpu()
    if not bool(keep.any()):
        raise ValueError("at least one hospital must be kept")
    r = torch.as_tensor(reputation, dtype=torch.float64).cpu()
    ne = torch.as_tensor(num_examples, dtype=torch.float64).cpu()
    k = torch.ones_like(ne) if group_size is None else torch.as_tensor(group_size, dtype=torch.float64).flatten().cpu()
    if k.numel() != n or float(k.min()) < 1:
        raise ValueError(f"group_size must have one entry >= 1 per update (n={n}), got {k.tolist()}")
    raw = torch.where(keep, r * ne / k, torch.zeros_like(r))
    if float(raw.sum()) <= 0:
        raw = torch.where(keep, ne / k, torch.zeros_like(ne))
    w = raw / raw.sum()
    coef = w * median_norm_clip(x, keep, trim_tolerance) if clip_to_median_norm else w.clone()
    return coef.to(dtype=x.dtype, device=x.device) @ x, w

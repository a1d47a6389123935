"""Model-poisoning attacks as pure torch functions.

Conventions
-----------
* An *update* is ``returned weights - global weights``, flattened: a ``(d,)`` tensor.
* ``honest`` is an ``(n, d)`` stack of n hospitals' honest updates (one per row).
* Single-hospital attacks (:func:`sign_flip`, :func:`scale`, :func:`gaussian_noise`,
  :func:`free_ride`) keep the shape of their input.
* Colluding attacks take the honest stack and return one ``(d,)`` malicious update that
  every attacker sends, except Fang's attacks, which return ``(m, d)`` (one row per
  attacker, since each attacker draws its own values).
* Statistics are computed in float64 and the result is cast back to the input dtype.
* Inputs are never modified.

No Flower imports: this module is usable in any simulation loop.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

import torch

Perturbation = Literal["std", "unit", "sign"]
PERTURBATIONS: tuple[str, ...] = ("std", "unit", "sign")


# --------------------------------------------------------------------------- checks
def _as_tensor(u, name: str) -> torch.Tensor:
    if not isinstance(u, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(u).__name__}")
    if not u.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {u.dtype}")
    return u


def check_stack(honest, *, min_rows: int = 1, why: str = "") -> torch.Tensor:
    honest = _as_tensor(honest, "honest")
    if honest.dim() != 2:
        raise ValueError(f"honest must be an (n, d) stack of updates, got shape {tuple(honest.shape)}")
    n = honest.shape[0]
    if n < min_rows:
        reason = f" ({why})" if why else ""
        raise ValueError(f"need at least {min_rows} honest updates{reason}, got n={n}")
    if honest.shape[1] == 0:
        raise ValueError("honest updates are empty (d=0)")
    return honest


def check_finite_number(x, name: str, *, nonneg: bool = False, positive: bool = False) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    if nonneg and v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    return v


def check_count(m, name: str, *, minimum: int = 1) -> int:
    if isinstance(m, bool) or int(m) != m:
        raise TypeError(f"{name} must be an integer, got {m!r}")
    m = int(m)
    if m < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {m}")
    return m


def _randn_like(u: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    device = generator.device if generator is not None else u.device
    return torch.randn(u.shape, generator=generator, dtype=u.dtype, device=device).to(u.device)


def _rand_like(shape, like: torch.Tensor, generator: torch.Generator | None, dtype) -> torch.Tensor:
    device = generator.device if generator is not None else like.device
    return torch.rand(shape, generator=generator, dtype=dtype, device=device).to(like.device)


# ------------------------------------------------------------- single-hospital attacks
def sign_flip(u: torch.Tensor) -> torch.Tensor:
    r"""Sign flipping: :math:`\tilde u = -u`.

    The classic Byzantine baseline (e.g. Allen-Zhu et al., ICLR'21; Karimireddy et al.,
    ICML'21; ByzFL ``SignFlipping``). Works on any shape.
    """
    return -_as_tensor(u, "u")


def scale(u: torch.Tensor, gamma: float) -> torch.Tensor:
    r"""Scaling / model replacement: :math:`\tilde u = \gamma\,u`.

    Bagdasaryan et al., "How to backdoor federated learning", AISTATS'20: with
    :math:`\gamma \approx n/\eta` (n hospitals, server learning rate :math:`\eta`) the
    attacker's (e.g. backdoored) model replaces the global model after plain averaging.
    """
    u = _as_tensor(u, "u")
    gamma = check_finite_number(gamma, "gamma")
    return u * gamma


def gaussian_noise(
    u: torch.Tensor, sigma: float, generator: torch.Generator | None = None, *, additive: bool = False
) -> torch.Tensor:
    r"""Gaussian attack: :math:`\tilde u \sim \mathcal N(0, \sigma^2 I)`.

    The random Byzantine vector of Blanchard et al., "Machine learning with adversaries:
    Byzantine tolerant gradient descent" (Krum), NeurIPS'17 (ByzFL ``Gaussian``). ``u``
    only gives shape, dtype and device. With ``additive=True`` the noise is added to the
    honest update instead (:math:`\tilde u = u + \mathcal N(0, \sigma^2 I)`), a
    noise-disguised variant.
    """
    u = _as_tensor(u, "u")
    sigma = check_finite_number(sigma, "sigma", nonneg=True)
    noise = _randn_like(u, generator) * sigma
    return u + noise if additive else noise


def free_ride(u: torch.Tensor, noise: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Free-riding: :math:`\tilde u = 0` (return the global model unchanged), or
    :math:`\tilde u \sim \mathcal N(0, \text{noise}^2 I)` to disguise it.

    Lin et al., "Free-riders in federated learning: attacks and defenses", 2019; Fraboni
    et al., AISTATS'21. ``u`` only gives shape, dtype and device. A zero update has zero
    cosine divergence to anything, which FedAgain-style ``1/(E*D)`` trust rewards.
    """
    u = _as_tensor(u, "u")
    noise = check_finite_number(noise, "noise", nonneg=True)
    if noise == 0.0:
        return torch.zeros_like(u)
    return _randn_like(u, generator) * noise


# ------------------------------------------------------------------ colluding attacks
def alie(honest: torch.Tensor, z: float) -> torch.Tensor:
    r"""A Little Is Enough (ALIE): per coordinate :math:`\tilde u_j = \mu_j - z\,\sigma_j`.

    :math:`\mu` and :math:`\sigma` are the coordinate-wise mean and standard deviation
    (ddof=1) of the honest updates. Baruch, Baruch & Goldberg, "A little is enough:
    circumventing defenses for distributed learning", NeurIPS'19. Small z keeps the
    update inside the honest spread, so it passes median, MAD and cosine checks. Prefer a
    fixed z sweep (0.5, 1.0, 1.5) to :func:`alie_z_from_formula` at small n.
    """
    honest = check_stack(honest, min_rows=2, why="ALIE needs a standard deviation with ddof=1")
    z = check_finite_number(z, "z")
    h = honest.double()
    mal = h.mean(dim=0) - z * h.std(dim=0, unbiased=True)
    return mal.to(honest.dtype)


def alie_z_from_formula(n: int, f: int, *, form: Literal["frameworks", "paper"] = "frameworks") -> float:
    r"""ALIE's z from the number of hospitals n and attackers f.

    With :math:`s = \lfloor n/2 + 1 \rfloor - f` (the honest hospitals the attackers
    must "recruit" to form a majority):

    * ``form="frameworks"`` (what Blades and FLPoison compute):
      :math:`z = \Phi^{-1}\big((n - f - s)/(n - f)\big)`.
      **This is 0 at (n=10, f=2)** (and at (5, 1), (8, 2)), i.e. ALIE degenerates to
      sending the honest mean, a no-op; it is even negative at (10, 1).
    * ``form="paper"`` (Baruch et al., NeurIPS'19, Algorithm 3):
      :math:`z = \Phi^{-1}\big((n - s)/n\big)`, 0.25 at (10, 2).

    Kept to document the pitfall (anchors §4.3); use fixed z values in experiments.
    """
    n = check_count(n, "n", minimum=2)
    f = check_count(f, "f", minimum=0)
    if f >= n:
        raise ValueError(f"f must be < n, got n={n}, f={f}")
    s = math.floor(n / 2 + 1) - f
    if form == "frameworks":
        p = (n - f - s) / (n - f)
    elif form == "paper":
        p = (n - s) / n
    else:
        raise ValueError(f"form must be 'frameworks' or 'paper', got {form!r}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"z is undefined for n={n}, f={f} ({form} form gives cdf {p:.3f}, outside (0, 1))")
    z = NormalDist().inv_cdf(p)
    return 0.0 if abs(z) < 1e-12 else z


def ipm(honest: torch.Tensor, eps: float) -> torch.Tensor:
    r"""Inner Product Manipulation: :math:`\tilde u = -\varepsilon\,\bar u`.

    :math:`\bar u` is the mean honest update. Xie, Koyejo & Gupta, "Fall of empires:
    breaking Byzantine-tolerant SGD by inner product manipulation", UAI'20. Small
    :math:`\varepsilon` (0.1, 0.5) can pass norm checks while making the aggregate's
    inner product with the true gradient negative when enough attackers collude; large
    :math:`\varepsilon` (100) breaks mean-style rules outright.
    """
    honest = check_stack(honest, min_rows=1)
    eps = check_finite_number(eps, "eps", nonneg=True)
    return (-eps * honest.double().mean(dim=0)).to(honest.dtype)


def perturbation_vector(honest: torch.Tensor, perturbation: str = "std") -> torch.Tensor:
    r"""The direction :math:`p` of Min-Max/Min-Sum (float64):

    * ``"std"``: :math:`p = -\sigma` (coordinate-wise std, ddof=1);
    * ``"unit"``: :math:`p = -\bar u / \lVert \bar u \rVert` (inverse unit mean);
    * ``"sign"``: :math:`p = -\operatorname{sign}(\bar u)`.
    """
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {perturbation!r}")
    honest = check_stack(honest, min_rows=2, why="Min-Max/Min-Sum need at least two honest updates")
    h = honest.double()
    mean = h.mean(dim=0)
    if perturbation == "std":
        return -h.std(dim=0, unbiased=True)
    if perturbation == "unit":
        norm = torch.linalg.vector_norm(mean)
        return -mean / norm if norm > 0 else torch.zeros_like(mean)
    return -torch.sign(mean)


def _sq_pairwise(h: torch.Tensor) -> torch.Tensor:
    """(n, n) squared Euclidean distances of a float64 stack (Gram identity, clamped at 0,
    exact zeros on the diagonal).
    """
    sq = (h * h).sum(dim=1)
    d2 = torch.clamp(sq.unsqueeze(1) + sq.unsqueeze(0) - 2.0 * (h @ h.T), min=0.0)
    d2.fill_diagonal_(0.0)
    return d2


def _largest_feasible_gamma(a2: torch.Tensor, b: torch.Tensor, c: float, bound: float) -> float:
    r"""Largest :math:`\gamma \ge 0` with :math:`a2 + 2\gamma b + \gamma^2 c \le bound`
    (a convex quadratic that is feasible at :math:`\gamma=0`).
    """
    if c <= 0.0:
        return 0.0
    disc = torch.clamp(b * b - c * (a2 - bound), min=0.0)
    roots = (-b + torch.sqrt(disc)) / c
    return max(float(roots.min()), 0.0)


def _bisect_gamma(feasible, gamma_init: float, tol: float, max_iter: int = 200) -> float:
    """Shejwalkar & Houmansadr's search: grow until infeasible, then bisect."""
    lo, hi = 0.0, float(gamma_init)
    for _ in range(max_iter):  # find an infeasible upper bound
        if not feasible(hi):
            break
        lo, hi = hi, hi * 2.0
    else:
        return lo
    for _ in range(max_iter):
        if hi - lo <= tol:
            break
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo


def min_max_gamma(
    honest: torch.Tensor,
    perturbation: str = "std",
    *,
    method: Literal["exact", "bisection"] = "exact",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> float:
    r"""The largest :math:`\gamma \ge 0` such that :math:`\tilde u = \bar u + \gamma p` satisfies

    .. math:: \max_i \lVert \tilde u - u_i \rVert \le \max_{i,j} \lVert u_i - u_j \rVert.

    The constraint is a convex quadratic in :math:`\gamma` per honest update and holds at
    :math:`\gamma=0`, so the feasible set is an interval :math:`[0, \gamma^*]`.
    ``method="exact"`` solves the quadratics in closed form; ``"bisection"`` is the
    paper's search (start ``gamma_init``, stop at ``tol``).
    """
    return _min_max_parts(honest, perturbation, method, gamma_init, tol)[0]


def _min_max_parts(honest, perturbation, method, gamma_init, tol):
    p = perturbation_vector(honest, perturbation)
    h = honest.double()
    mean = h.mean(dim=0)
    bound = float(_sq_pairwise(h).max())
    a = mean.unsqueeze(0) - h  # (n, d): mean - u_i
    a2 = (a * a).sum(dim=1)
    b = a @ p
    c = float(p @ p)
    return _solve_gamma(a2, b, c, bound, method, gamma_init, tol), mean, p


def min_sum_gamma(
    honest: torch.Tensor,
    perturbation: str = "std",
    *,
    method: Literal["exact", "bisection"] = "exact",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> float:
    r"""The largest :math:`\gamma \ge 0` such that :math:`\tilde u = \bar u + \gamma p` satisfies

    .. math:: \sum_i \lVert \tilde u - u_i \rVert^2 \le \max_i \sum_j \lVert u_i - u_j \rVert^2.

    Feasible at :math:`\gamma = 0` because the mean minimises the sum of squared
    distances. ``method`` as in :func:`min_max_gamma`.
    """
    return _min_sum_parts(honest, perturbation, method, gamma_init, tol)[0]


def _solve_gamma(a2, b, c, bound, method, gamma_init, tol) -> float:
    """Largest gamma with max_i (a2_i + 2 gamma b_i + gamma^2 c) <= bound: closed form or bisection."""
    if method == "exact":
        return _largest_feasible_gamma(a2, b, c, bound)
    if method == "bisection":
        feasible = lambda g: float((a2 + 2 * g * b + g * g * c).max()) <= bound  # noqa: E731
        return _bisect_gamma(feasible, gamma_init, tol)
    raise ValueError(f"method must be 'exact' or 'bisection', got {method!r}")


def _min_sum_parts(honest, perturbation, method, gamma_init, tol):
    p = perturbation_vector(honest, perturbation)
    h = honest.double()
    mean = h.mean(dim=0)
    bound = float(_sq_pairwise(h).sum(dim=1).max())
    a = mean.unsqueeze(0) - h
    a2 = torch.tensor([float((a * a).sum())], dtype=torch.float64)
    b = torch.tensor([float((a @ p).sum())], dtype=torch.float64)
    c = float(p @ p) * h.shape[0]
    return _solve_gamma(a2, b, c, bound, method, gamma_init, tol), mean, p


def min_max(
    honest: torch.Tensor,
    perturbation: str = "std",
    *,
    method: Literal["exact", "bisection"] = "exact",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> torch.Tensor:
    r"""AGR-agnostic Min-Max: :math:`\tilde u = \bar u + \gamma^* p`.

    Shejwalkar & Houmansadr, "Manipulating the Byzantine: optimizing model poisoning
    attacks and defenses for federated learning", NDSS'21. :math:`p` is
    :func:`perturbation_vector` (``"std"``: :math:`-\sigma`, ``"unit"``:
    :math:`-\bar u/\lVert\bar u\rVert`, ``"sign"``: :math:`-\operatorname{sign}\bar u`) and
    :math:`\gamma^*` is the largest value keeping the malicious update's largest distance
    to any honest update within the largest honest pairwise distance
    (:func:`min_max_gamma`, which also explains ``method``, ``gamma_init``, ``tol``).
    """
    gamma, mean, p = _min_max_parts(honest, perturbation, method, gamma_init, tol)
    return (mean + gamma * p).to(honest.dtype)


def min_sum(
    honest: torch.Tensor,
    perturbation: str = "std",
    *,
    method: Literal["exact", "bisection"] = "exact",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> torch.Tensor:
    r"""AGR-agnostic Min-Sum: :math:`\tilde u = \bar u + \gamma^* p`, with :math:`\gamma^*`
    the largest value keeping the malicious update's sum of squared distances to the
    honest updates within the largest such sum of any honest update
    (:func:`min_sum_gamma`). Shejwalkar & Houmansadr, NDSS'21.
    """
    gamma, mean, p = _min_sum_parts(honest, perturbation, method, gamma_init, tol)
    return (mean + gamma * p).to(honest.dtype)


def fang_trimmed_mean(
    honest: torch.Tensor, num_malicious: int, *, b: float = 2.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    r"""Fang et al.'s full-knowledge attack on trimmed mean; returns ``(m, d)``.

    Fang, Cao, Jia & Gong, "Local model poisoning attacks to Byzantine-robust federated
    learning", USENIX Security'20. Per coordinate j, with
    :math:`s_j = \operatorname{sign}(\bar u_j)` (the honest direction of change; 0 is
    treated as +1), :math:`w^{\max}_j`, :math:`w^{\min}_j` the honest extremes and
    :math:`b > 1` (paper: 2), each attacker draws independently and uniformly from

    * :math:`s_j > 0`: :math:`[w^{\min}_j / b,\ w^{\min}_j]` if :math:`w^{\min}_j > 0`,
      else :math:`[b\,w^{\min}_j,\ w^{\min}_j]` (at or below the honest minimum);
    * :math:`s_j < 0`: :math:`[w^{\max}_j,\ b\,w^{\max}_j]` if :math:`w^{\max}_j > 0`,
      else :math:`[w^{\max}_j,\ w^{\max}_j / b]` (at or above the honest maximum),

    i.e. beyond the honest range, opposite to the honest direction. The paper states the
    rule on model parameters; on updates (parameters minus the same global model) it is
    the same rule.
    """
    honest = check_stack(honest, min_rows=1)
    m = check_count(num_malicious, "num_malicious")
    b = check_finite_number(b, "b")
    if b <= 1.0:
        raise ValueError(f"b must be > 1, got {b}")
    h = honest.double()
    s = torch.sign(h.mean(dim=0))
    wmin, wmax = h.min(dim=0).values, h.max(dim=0).values
    # s >= 0: go below the minimum; s < 0: go above the maximum
    low_far = torch.where(wmin > 0, wmin / b, wmin * b)  # interval [low_far, wmin]
    high_far = torch.where(wmax > 0, wmax * b, wmax / b)  # interval [wmax, high_far]
    t = _rand_like((m, h.shape[1]), honest, generator, torch.float64)
    down = low_far + t * (wmin - low_far)
    up = wmax + t * (high_far - wmax)
    mal = torch.where((s < 0).unsqueeze(0), up, down)
    return mal.to(honest.dtype)


def fang_median(
    honest: torch.Tensor, num_malicious: int, *, b: float = 2.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    r"""Fang et al.'s full-knowledge attack on coordinate-wise median; returns ``(m, d)``.

    Fang et al., USENIX Security'20, attack the median with the same crafting rule as
    the trimmed mean (Section 4: "we use the attack to trimmed mean to attack median"),
    see :func:`fang_trimmed_mean`: values beyond the honest min/max, opposite to the
    sign of the honest mean, so the median is dragged towards the honest extreme.
    """
    return fang_trimmed_mean(honest, num_malicious, b=b, generator=generator)


def mimic(honest: torch.Tensor, target_index: int = 0) -> torch.Tensor:
    r"""Mimic: :math:`\tilde u = u_{t}` (a copy of honest update ``target_index``).

    Karimireddy, He & Jaggi, "Byzantine-robust learning on heterogeneous datasets via
    bucketing", ICLR'22: all attackers copying one honest hospital over-weights it,
    which under heterogeneity biases the model, and is invisible to outlier filters.
    """
    honest = check_stack(honest, min_rows=1)
    n = honest.shape[0]
    if isinstance(target_index, bool) or int(target_index) != target_index:
        raise TypeError(f"target_index must be an integer, got {target_index!r}")
    if not 0 <= int(target_index) < n:
        raise ValueError(f"target_index must be in [0, {n}), got {target_index}")
    return honest[int(target_index)].clone()


def sybil(update: torch.Tensor, m: int) -> torch.Tensor:
    r"""Sybil / colluding copies: ``(m, d)``, every row equal to ``update``.

    Fung, Yoon & Beschastnikh, "The limitations of federated learning in Sybil settings"
    (FoolsGold), RAID'20. Identical updates capture peer-agreement trust and medians.
    """
    update = _as_tensor(update, "update")
    if update.dim() != 1:
        raise ValueError(f"update must be a (d,) tensor, got shape {tuple(update.shape)}")
    m = check_count(m, "m")
    return update.unsqueeze(0).repeat(m, 1)


def jittered_copies(
    update: torch.Tensor, m: int, relative_noise: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    r"""``(m, d)`` copies of ``update``, each plus its own noise of norm
    ``relative_noise`` x :math:`\lVert u\rVert` in a uniformly random direction.

    The adaptive colluder's answer to a duplicate check: in high dimension the noises are
    nearly orthogonal to ``u`` and to each other, so two copies have cosine about
    :math:`1 / (1 + r^2)` (r = 0.2: 0.96), while their mean stays within
    :math:`r / \sqrt{m}` of ``u``. ``relative_noise`` 0 gives :func:`sybil`'s exact copies.
    """
    copies = sybil(update, m)
    r = check_finite_number(relative_noise, "relative_noise", nonneg=True)
    if r == 0.0:
        return copies
    noise = _randn_like(copies, generator)
    noise = noise / torch.linalg.vector_norm(noise, dim=1, keepdim=True).clamp_min(1e-30)
    return copies + r * torch.linalg.vector_norm(update) * noise


# ------------------------------------------------------------------- backdoor projection
def neurotoxin_mask(honest: torch.Tensor, top_fraction: float) -> torch.Tensor:
    r"""The coordinates a Neurotoxin attacker may use: all but the ``top_fraction`` the honest
    updates change most (largest :math:`|\bar u_j|`, ``honest`` averaged over its rows when 2-D).

    Parameters
    ----------
    honest : torch.Tensor
        ``(n, d)`` honest updates, or ``(d,)`` an estimate of their mean (Neurotoxin's attacker
        uses the last round's global update).
    top_fraction : float
        Share of the coordinates masked out, in [0, 1); ``ceil(top_fraction * d)`` of them.

    Returns
    -------
    torch.Tensor
        ``(d,)`` bool: True where the backdoor may go. Ties at the cut keep the lower index out.
    """
    honest = _as_tensor(honest, "honest")
    if honest.dim() not in (1, 2):
        raise ValueError(f"honest must be (n, d) or (d,), got shape {tuple(honest.shape)}")
    frac = check_finite_number(top_fraction, "top_fraction", nonneg=True)
    if frac >= 1.0:
        raise ValueError(f"top_fraction must be in [0, 1), got {frac}")
    benign = honest.double().mean(dim=0) if honest.dim() == 2 else honest.double()
    d = benign.numel()
    k = math.ceil(frac * d)
    mask = torch.ones(d, dtype=torch.bool, device=benign.device)
    if k:
        mask[torch.sort(benign.abs(), descending=True, stable=True).indices[:k]] = False
    return mask


def neurotoxin(backdoor: torch.Tensor, honest: torch.Tensor, top_fraction: float = 0.1) -> torch.Tensor:
    r"""Neurotoxin: the backdoor update projected onto the coordinates the honest updates change
    least, :math:`\tilde u = b \odot \mathbb 1[j \notin \mathrm{top}_k(|\bar u|)]`
    (:func:`neurotoxin_mask`).

    Zhang, Panda, Song, Yang, Mahoney, Mittal, Ramchandran, Gonzalez, "Neurotoxin: Durable
    Backdoors in Federated Learning", ICML 2022: coordinates that benign training rarely moves
    are rarely overwritten after the attacker stops, so the backdoor lasts. The paper projects
    every local gradient step (projected gradient descent on the mask); projecting the final
    update is the same projection applied once, which is what an update-level attack can do.
    ``top_fraction`` is hospitrust's default (the paper sweeps the masked share).

    Parameters
    ----------
    backdoor : torch.Tensor
        ``(d,)`` the attacker's backdoor update (trained on triggered data).
    honest : torch.Tensor
        ``(n, d)`` honest updates or ``(d,)`` an estimate of their mean.
    top_fraction : float
        Share of the coordinates masked out, in [0, 1).

    Returns
    -------
    torch.Tensor
        ``(d,)`` the projected update, ``backdoor``'s dtype.
    """
    backdoor = _as_tensor(backdoor, "backdoor")
    mask = neurotoxin_mask(honest, top_fraction)
    if backdoor.shape != mask.shape:
        raise ValueError(f"backdoor must have shape ({mask.numel()},) like the honest updates, got {tuple(backdoor.shape)}")
    return backdoor * mask.to(backdoor.device)


__all__ = [
    "PERTURBATIONS",
    "neurotoxin",
    "neurotoxin_mask",
    "jittered_copies",
    "alie",
    "alie_z_from_formula",
    "fang_median",
    "fang_trimmed_mean",
    "free_ride",
    "gaussian_noise",
    "ipm",
    "mimic",
    "min_max",
    "min_max_gamma",
    "min_sum",
    "min_sum_gamma",
    "perturbation_vector",
    "scale",
    "sign_flip",
    "sybil",
]

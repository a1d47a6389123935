r"""Attacks whose strength is searched against the aggregation rule in use.

* :func:`tailored_alie`, :func:`tailored_ipm`: ALIE's z or IPM's epsilon chosen, per round, to
  maximise the distance between the rule's output (with the malicious rows in) and the honest
  mean, by an expanding then contracting line search with the rule itself in the loop (the
  search of ByzFL's ``Optimal_ALittleIsEnough`` / ``Optimal_InnerProductManipulation``);
* :func:`agr_tailored_selection`, :func:`agr_tailored_distance` and their wrappers for Krum,
  Multi-Krum, Bulyan, trimmed mean and median: Shejwalkar and Houmansadr's AGR-tailored attacks
  (NDSS 2021), :math:`\bar u + \gamma p` with the largest :math:`\gamma` their halving search finds.

The rule is any callable from an ``(n, d)`` stack to a ``(d,)`` aggregate (see
:func:`with_pre_aggregation` for a pre-aggregation chain in front of it). The malicious rows are
appended after the honest ones, every attacker sending the same update. Pure torch, no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from hospitrust.aggregation import bulyan_select, coordinate_median, krum_select, multi_krum_select, trimmed_mean
from hospitrust.aggregation.pre_aggregation import StepRecord, chain

from .update import alie, check_count, check_finite_number, check_stack, ipm, perturbation_vector

__all__ = [
    "maximise_strength",
    "within_bound",
    "with_pre_aggregation",
    "tailored_alie",
    "tailored_ipm",
    "agr_tailored_selection",
    "agr_tailored_distance",
    "agr_tailored_krum",
    "agr_tailored_multi_krum",
    "agr_tailored_bulyan",
    "agr_tailored_trimmed_mean",
    "agr_tailored_median",
]

Rule = Callable[[torch.Tensor], torch.Tensor]


def maximise_strength(objective: Callable[[float], float], start: float = 0.0, step: float = 10.0, evals: int = 20,
                      ratio: float = 0.8, both_directions: bool = False) -> tuple[float, float]:
    """Line search for the strength that maximises ``objective``, in ``evals`` evaluations.

    Expansion: from ``start``, step by ``step``, doubling it after every improvement, until a
    step does not improve (then the step shrinks by ``ratio``). Contraction: with the remaining
    evaluations, try ``best + step`` and shrink the step by ``ratio`` each time, keeping any
    improvement. Only strictly better values move the best. This is ByzFL's search (one
    direction, the sign of ``step``).

    With ``both_directions``, a step that does not improve is tried the other way too before the
    step shrinks: the first step finds the direction the expansion follows (``start - step`` when
    ``start + step`` is no better), and every contraction tries ``best + step``, then, unless that
    improved, ``best - step``. An objective of ``-inf`` (a strength the attacker may not use, e.g. a
    row above the server's norm bound) is never better than a usable one.

    Parameters
    ----------
    objective : callable
        Strength -> value to maximise.
    start : float
        First strength evaluated.
    step : float
        First step, non-zero (its sign is the first direction tried).
    evals : int
        Evaluations of ``objective`` in all, >= 1.
    ratio : float
        Shrink factor of the step, in (0.5, 1).
    both_directions : bool
        Try every step both ways (see above); False: ByzFL's one-way search.

    Returns
    -------
    tuple of float
        The best strength and its value.
    """
    evals = check_count(evals, "evals")
    step = check_finite_number(step, "step")
    if step == 0:
        raise ValueError("step must be non-zero")
    ratio = check_finite_number(ratio, "ratio")
    if not 0.5 < ratio < 1.0:
        raise ValueError(f"ratio must be in (0.5, 1), got {ratio}")
    best_x = check_finite_number(start, "start")
    best_y = objective(best_x)
    left = evals - 1
    ways = (1.0, -1.0) if both_directions else (1.0,)

    def probe(s: float) -> bool:
        """Try ``best + s`` then (both ways) ``best - s``; move the best to the first that improves."""
        nonlocal best_x, best_y, left, step
        for way in ways:
            if left == 0:
                return False
            y = objective(best_x + way * s)
            left -= 1
            if y > best_y:
                best_x, best_y = best_x + way * s, y
                step = way * s
                return True
        return False

    if probe(step):  # expansion, in the direction that improved
        step *= 2.0
        while left > 0:
            y = objective(best_x + step)
            left -= 1
            if y > best_y:
                best_x, best_y = best_x + step, y
                step *= 2.0
            else:
                break
    step *= ratio
    while left > 0:  # contraction
        probe(step)
        step = abs(step) * ratio if both_directions else step * ratio
    return best_x, best_y


def with_pre_aggregation(rule: Rule, steps: Sequence[Callable[[torch.Tensor], tuple[torch.Tensor, StepRecord]]]) -> Rule:
    """The rule applied after a pre-aggregation chain (:func:`~hospitrust.aggregation.pre_aggregation.chain`).

    Parameters
    ----------
    rule : callable
        ``(n', d)`` stack -> ``(d,)`` aggregate.
    steps : sequence of callables
        The chain's ``*_mixing`` steps, options bound.

    Returns
    -------
    callable
        ``(n, d)`` stack -> ``(d,)`` aggregate.
    """
    return lambda x: rule(chain(x, steps)[0])


def _distance_after(honest: torch.Tensor, malicious: torch.Tensor, num_malicious: int, rule: Rule) -> float:
    stack = torch.cat([honest, malicious.unsqueeze(0).expand(num_malicious, -1)], dim=0)
    out = rule(stack)
    return float(torch.linalg.vector_norm(out.double() - honest.double().mean(0)))


#: A crafted row's norm is kept this far below the server's bound: the server computes the norm again in
#: float32 and compares it with the bound; the attacker must not lose its row to that rounding.
BOUND_MARGIN = 1e-5


def within_bound(row: torch.Tensor, max_norm: float | None, copy_noise: float = 0.0) -> bool:
    r"""Whether ``row`` and every copy of it with relative noise ``copy_noise`` stays within the server's
    bound on an update's norm (``max-update-norm``): :math:`\lVert u\rVert (1 + r) \le C (1 - 10^{-5})`
    (the triangle inequality bounds every copy :func:`~hospitrust.attacks.math.update.jittered_copies`
    makes). Always True when ``max_norm`` is None.

    Parameters
    ----------
    row : torch.Tensor
        ``(d,)`` the crafted update.
    max_norm : float or None
        The server's bound; None: no bound.
    copy_noise : float
        The relative norm of each copy's noise (>= 0).

    Returns
    -------
    bool
        True when every copy is accepted by the server's norm check.
    """
    if max_norm is None:
        return True
    norm = float(torch.linalg.vector_norm(row.double()))
    return math.isfinite(norm) and norm * (1.0 + copy_noise) <= max_norm * (1.0 - BOUND_MARGIN)


def _tailored(honest, rule, num_malicious, craft, start, step, evals, ratio, max_norm=None, copy_noise=0.0,
              both_directions=False):
    m = check_count(num_malicious, "num_malicious")
    if max_norm is not None:
        max_norm = check_finite_number(max_norm, "max_norm", positive=True)
    copy_noise = check_finite_number(copy_noise, "copy_noise", nonneg=True)

    def objective(strength: float) -> float:
        row = craft(strength)
        if not within_bound(row, max_norm, copy_noise):
            return -math.inf  # the server would reject the row: not a strength the attacker can use
        return _distance_after(honest, row, m, rule)

    best, dist = maximise_strength(objective, start, step, evals, ratio, both_directions)
    return craft(best), {"strength": best, "distance": dist}


def tailored_alie(honest: torch.Tensor, rule: Rule, num_malicious: int, *, start: float = 0.0, step: float = 10.0,
                  evals: int = 20, ratio: float = 0.8,
                  max_norm: float | None = None, copy_noise: float = 0.0, both_directions: bool = False
                  ) -> tuple[torch.Tensor, dict]:
    r"""ALIE (:math:`\bar u - z\sigma`, :func:`~hospitrust.attacks.math.update.alie`) with the z that
    moves ``rule``'s output furthest from the honest mean, found by :func:`maximise_strength`.

    The objective is :math:`\lVert \mathrm{rule}(u_1..u_h, \tilde u, .., \tilde u) - \bar u\rVert`.
    ByzFL's ``Optimal_ALittleIsEnough`` searches :math:`\tau` in :math:`\bar u + \tau\sigma` (so its
    :math:`\tau = -z`) with the same search; ``step=-10.0`` here is its ``delta=10.0``.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates, h >= 2.
    rule : callable
        ``(h + m, d)`` stack -> ``(d,)`` aggregate.
    num_malicious : int
        ``m >= 1`` identical malicious rows.
    start : float
        First z tried.
    step : float
        First step of z (sign: direction).
    evals : int
        Rule evaluations in all.
    ratio : float
        Step shrink factor in (0.5, 1).
    max_norm : float or None
        The server's bound on an update's norm (``max-update-norm``): a strength whose row (with its
        copy noise) could exceed it is never chosen (:func:`within_bound`); None: no bound.
    copy_noise : float
        The relative noise each attacker adds to its copy (the caller adds it; the bound accounts for it).
    both_directions : bool
        Search the strength both ways from ``start`` (:func:`maximise_strength`); False: ByzFL's search.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` malicious update and ``{"strength": z, "distance": ...}``.
    """
    honest = check_stack(honest, min_rows=2, why="ALIE needs a standard deviation with ddof=1")
    return _tailored(honest, rule, num_malicious, lambda z: alie(honest, z), start, step, evals, ratio, max_norm,
                     copy_noise, both_directions)


def tailored_ipm(honest: torch.Tensor, rule: Rule, num_malicious: int, *, start: float = 0.0, step: float = 10.0,
                 evals: int = 20, ratio: float = 0.8,
                  max_norm: float | None = None, copy_noise: float = 0.0, both_directions: bool = False
                  ) -> tuple[torch.Tensor, dict]:
    r"""IPM (:math:`-\varepsilon \bar u`, :func:`~hospitrust.attacks.math.update.ipm`) with the
    :math:`\varepsilon` that moves ``rule``'s output furthest from the honest mean
    (:func:`maximise_strength`; ByzFL's ``Optimal_InnerProductManipulation`` with the same search).
    The search may try negative :math:`\varepsilon`; the update is then :math:`|\varepsilon| \bar u`.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    rule : callable
        ``(h + m, d)`` stack -> ``(d,)`` aggregate.
    num_malicious : int
        ``m >= 1`` identical malicious rows.
    start : float
        First epsilon tried.
    step : float
        First step of epsilon.
    evals : int
        Rule evaluations in all.
    ratio : float
        Step shrink factor in (0.5, 1).
    max_norm : float or None
        The server's bound on an update's norm (``max-update-norm``): a strength whose row (with its
        copy noise) could exceed it is never chosen (:func:`within_bound`); None: no bound.
    copy_noise : float
        The relative noise each attacker adds to its copy (the caller adds it; the bound accounts for it).
    both_directions : bool
        Search the strength both ways from ``start`` (:func:`maximise_strength`); False: ByzFL's search.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` malicious update and ``{"strength": eps, "distance": ...}``.
    """
    honest = check_stack(honest, min_rows=1)
    mean = honest.double().mean(0)

    def craft(eps: float) -> torch.Tensor:
        return ipm(honest, eps) if eps >= 0 else (-eps * mean).to(honest.dtype)

    return _tailored(honest, rule, num_malicious, craft, start, step, evals, ratio, max_norm, copy_noise,
                     both_directions)


def _halving_search(success: Callable[[float], bool], gamma_init: float, tol: float, max_iter: int = 200) -> float:
    """Shejwalkar and Houmansadr's search (NDSS 2021, Algorithm 1): from ``gamma_init``, step up by
    half the last step on success, down on failure, the step halving each time; the last
    successful gamma (0 if none).
    """
    gamma, step, best = gamma_init, gamma_init, 0.0
    for _ in range(max_iter):
        if abs(best - gamma) <= tol:
            break
        if success(gamma):
            best = gamma
            gamma += step / 2.0
        else:
            gamma -= step / 2.0
        step /= 2.0
    return best


def _crafted(honest: torch.Tensor, perturbation: str, gamma: float) -> torch.Tensor:
    return (honest.double().mean(0) + gamma * perturbation_vector(honest, perturbation)).to(honest.dtype)


def agr_tailored_selection(honest: torch.Tensor, num_malicious: int, select: Callable[[torch.Tensor], torch.Tensor],
                           perturbation: str = "unit", *, gamma_init: float = 10.0, tol: float = 1e-5,
                           max_norm: float | None = None) -> tuple[torch.Tensor, dict]:
    r"""AGR-tailored attack on a selection rule: :math:`\tilde u = \bar u + \gamma p` with the largest
    :math:`\gamma` the halving search finds for which the rule selects the malicious rows (all
    of them when it selects at least m rows, else only malicious rows).

    Shejwalkar, Houmansadr, "Manipulating the Byzantine", NDSS 2021 (Krum, Multi-Krum and
    Bulyan's selection stage). Here the malicious rows come *first* in the stack, as in the
    authors' code.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates, h >= 2.
    num_malicious : int
        ``m >= 1``.
    select : callable
        ``(m + h, d)`` stack -> the selected row indices.
    perturbation : str
        ``std``, ``unit`` or ``sign`` (:func:`~hospitrust.attacks.math.update.perturbation_vector`).
    gamma_init : float
        First :math:`\gamma` (> 0).
    tol : float
        Stop when the step is below this.
    max_norm : float or None
        The server's bound on an update's norm: a gamma whose row exceeds it counts as a failure
        (:func:`within_bound`), so the search ends inside the bound; None: no bound.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` malicious update and ``{"gamma": ...}``.
    """
    honest = check_stack(honest, min_rows=2, why="the perturbation needs two honest updates")
    m = check_count(num_malicious, "num_malicious")

    def success(gamma: float) -> bool:
        mal = _crafted(honest, perturbation, gamma)
        if not within_bound(mal, max_norm):
            return False
        chosen = torch.as_tensor(select(torch.cat([mal.unsqueeze(0).expand(m, -1), honest]))).flatten()
        malicious = int((chosen < m).sum())
        return malicious == min(m, chosen.numel())

    gamma = _halving_search(success, check_finite_number(gamma_init, "gamma_init", positive=True), tol)
    return _crafted(honest, perturbation, gamma), {"gamma": gamma}


def agr_tailored_distance(honest: torch.Tensor, num_malicious: int, rule: Rule, perturbation: str = "unit", *,
                          gamma_init: float = 10.0, tol: float = 1e-5, max_norm: float | None = None
                          ) -> tuple[torch.Tensor, dict]:
    r"""AGR-tailored attack on an averaging rule: :math:`\tilde u = \bar u + \gamma p`, the halving
    search moving :math:`\gamma` up whenever the rule's output moved further from the honest mean
    than at the previous try (the authors' code for trimmed mean and median).

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates, h >= 2.
    num_malicious : int
        ``m >= 1``.
    rule : callable
        ``(m + h, d)`` stack -> ``(d,)`` aggregate.
    perturbation : str
        ``std``, ``unit`` or ``sign``.
    gamma_init : float
        First :math:`\gamma` (> 0).
    tol : float
        Stop when the step is below this.
    max_norm : float or None
        The server's bound on an update's norm: a gamma whose row exceeds it counts as a failure
        (:func:`within_bound`), so the search ends inside the bound; None: no bound.

    Returns
    -------
    tuple of torch.Tensor and dict
        The ``(d,)`` malicious update and ``{"gamma": ..., "distance": ...}``.
    """
    honest = check_stack(honest, min_rows=2, why="the perturbation needs two honest updates")
    m = check_count(num_malicious, "num_malicious")
    previous = [-1.0]

    def distance(gamma: float) -> float:
        mal = _crafted(honest, perturbation, gamma)
        out = rule(torch.cat([mal.unsqueeze(0).expand(m, -1), honest]))
        return float(torch.linalg.vector_norm(out.double() - honest.double().mean(0)))

    def success(gamma: float) -> bool:
        if not within_bound(_crafted(honest, perturbation, gamma), max_norm):
            return False
        now = distance(gamma)
        better = now > previous[0]
        previous[0] = now
        return better

    gamma = _halving_search(success, check_finite_number(gamma_init, "gamma_init", positive=True), tol)
    return _crafted(honest, perturbation, gamma), {"gamma": gamma, "distance": distance(gamma)}


def agr_tailored_krum(honest: torch.Tensor, num_malicious: int, f: int, perturbation: str = "unit") -> tuple[torch.Tensor, dict]:
    """AGR-tailored attack on Krum: the largest gamma for which Krum selects a malicious row.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    num_malicious : int
        ``m >= 1``.
    f : int
        Krum's f.
    perturbation : str
        ``std``, ``unit`` or ``sign``.

    Returns
    -------
    tuple of torch.Tensor and dict
        The malicious update and ``{"gamma": ...}``.
    """
    return agr_tailored_selection(honest, num_malicious, lambda x: torch.tensor([krum_select(x, f)]), perturbation)


def agr_tailored_multi_krum(honest: torch.Tensor, num_malicious: int, f: int, perturbation: str = "unit") -> tuple[torch.Tensor, dict]:
    """AGR-tailored attack on Multi-Krum (n - f selected): the largest gamma keeping every malicious row selected.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    num_malicious : int
        ``m >= 1``.
    f : int
        Multi-Krum's f.
    perturbation : str
        ``std``, ``unit`` or ``sign``.

    Returns
    -------
    tuple of torch.Tensor and dict
        The malicious update and ``{"gamma": ...}``.
    """
    return agr_tailored_selection(honest, num_malicious, lambda x: multi_krum_select(x, f), perturbation)


def agr_tailored_bulyan(honest: torch.Tensor, num_malicious: int, f: int, perturbation: str = "unit") -> tuple[torch.Tensor, dict]:
    """AGR-tailored attack on Bulyan: the largest gamma keeping every malicious row in its selection stage.

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    num_malicious : int
        ``m >= 1``.
    f : int
        Bulyan's f.
    perturbation : str
        ``std``, ``unit`` or ``sign``.

    Returns
    -------
    tuple of torch.Tensor and dict
        The malicious update and ``{"gamma": ...}``.
    """
    return agr_tailored_selection(honest, num_malicious, lambda x: bulyan_select(x, f), perturbation)


def agr_tailored_trimmed_mean(honest: torch.Tensor, num_malicious: int, f: int, perturbation: str = "unit") -> tuple[torch.Tensor, dict]:
    """AGR-tailored attack on the trimmed mean (:func:`agr_tailored_distance`).

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    num_malicious : int
        ``m >= 1``.
    f : int
        Values trimmed at each end.
    perturbation : str
        ``std``, ``unit`` or ``sign``.

    Returns
    -------
    tuple of torch.Tensor and dict
        The malicious update and ``{"gamma": ..., "distance": ...}``.
    """
    return agr_tailored_distance(honest, num_malicious, lambda x: trimmed_mean(x, f), perturbation)


def agr_tailored_median(honest: torch.Tensor, num_malicious: int, perturbation: str = "unit") -> tuple[torch.Tensor, dict]:
    """AGR-tailored attack on the coordinate-wise median (:func:`agr_tailored_distance`).

    Parameters
    ----------
    honest : torch.Tensor
        ``(h, d)`` honest updates.
    num_malicious : int
        ``m >= 1``.
    perturbation : str
        ``std``, ``unit`` or ``sign``.

    Returns
    -------
    tuple of torch.Tensor and dict
        The malicious update and ``{"gamma": ..., "distance": ...}``.
    """
    return agr_tailored_distance(honest, num_malicious, coordinate_median, perturbation)

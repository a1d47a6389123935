"""DnC, divide and conquer (Shejwalkar and Houmansadr, NDSS 2021)."""

from __future__ import annotations

import torch

from ._validation import check_f, check_updates
from .kernels import weighted_row_sum
from .records import RuleRecord

__all__ = ["random_coordinates", "dnc"]


def random_coordinates(d: int, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random set of ``count`` of the ``d`` coordinates, sorted (all of them if ``count >= d``).

    Draws with replacement and drops repeats while ``count`` is small against ``d`` (a
    permutation of 11 million coordinates costs more than the rule), so the set is uniform
    among the ``count``-subsets.

    Parameters
    ----------
    d : int
        Number of coordinates.
    count : int
        Coordinates wanted, >= 1.
    generator : torch.Generator or None
        The random source; None: the global generator.

    Returns
    -------
    torch.Tensor
        int64 ``(min(count, d),)`` sorted indices on the CPU.
    """
    if count >= d:
        return torch.arange(d)
    if 4 * count >= d:
        return torch.sort(torch.randperm(d, generator=generator)[:count]).values
    picked = torch.empty(0, dtype=torch.long)
    while picked.numel() < count:
        draw = torch.randint(d, (count + count // 4 + 16,), generator=generator)
        picked = torch.unique(torch.cat([picked, draw]))
    keep = torch.randperm(picked.numel(), generator=generator)[:count]
    return torch.sort(picked[keep]).values


def dnc(x: torch.Tensor, f: int, *, sub_dim: int = 10_000, iters: int = 1, filter_frac: float = 1.0,
        generator: torch.Generator | None = None) -> tuple[torch.Tensor, RuleRecord]:
    r"""DnC: on random coordinate subsets, score every update by its squared projection on the top
    singular vector of the centred updates; keep the ``n - c f`` lowest scores, intersected over
    the iterations; average the kept updates.

    For each of ``iters`` iterations, with ``r`` a random set of ``b`` coordinates:
    :math:`\mu = \mathrm{mean}_i x_i[r]`, :math:`v` = top right singular vector of
    :math:`(x_i[r] - \mu)_i`, :math:`s_i = ((x_i[r] - \mu)^\top v)^2`, good :math:`\leftarrow`
    good :math:`\cap` {the :math:`n - \lfloor c f\rfloor` smallest :math:`s_i`}. Shejwalkar,
    Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning Attacks and Defenses
    for Federated Learning", NDSS 2021, Algorithm 2; defaults ``b = 10000``, one iteration,
    ``c = 1`` as in Blades. If the intersection is empty the last iteration's set is kept.

    One pass over the kept rows for the mean; the scoring reads ``n b`` numbers per iteration.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``floor(c f) < n``.
    sub_dim : int
        ``b``, coordinates per iteration (all if ``b >= d``).
    iters : int
        Iterations, >= 1.
    filter_frac : float
        ``c >= 0``, the filtering fraction.
    generator : torch.Generator or None
        Draws the coordinates; None: the global generator.

    Returns
    -------
    tuple of torch.Tensor and RuleRecord
        The ``(d,)`` aggregate and the record (``detail``: ``scores`` of the last iteration).
    """
    n, d = check_updates(x)
    f = check_f(f)
    removed = int(filter_frac * f)
    if not filter_frac >= 0 or removed >= n:
        raise ValueError(f"dnc requires filter_frac >= 0 and floor(filter_frac * f) < n; got n={n}, f={f}, "
                         f"filter_frac={filter_frac}")
    if isinstance(sub_dim, bool) or not isinstance(sub_dim, int) or sub_dim < 1:
        raise ValueError(f"dnc requires an int sub_dim >= 1; got {sub_dim!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"dnc requires an int iters >= 1; got {iters!r}")
    good = torch.ones(n, dtype=torch.bool)
    scores = torch.zeros(n, dtype=torch.float64)
    keep = good
    for _ in range(iters):
        r = random_coordinates(d, sub_dim, generator).to(x.device)
        sub = x.index_select(1, r).double().cpu()
        centred = sub - sub.mean(0)
        # (c_i . v)^2 for the top right singular vector v of C is lambda a_i^2, (lambda, a) the top
        # eigenpair of C C^T: an (n, n) problem instead of an SVD of the (n, b) block
        vals, vecs = torch.linalg.eigh(centred @ centred.T)
        scores = vals[-1].clamp_min(0.0) * vecs[:, -1].square()
        keep = torch.zeros(n, dtype=torch.bool)
        keep[torch.sort(scores, stable=True).indices[: n - removed]] = True
        good &= keep
    if not bool(good.any()):
        good = keep
    w = good.double() / int(good.sum())
    return weighted_row_sum(x, w), RuleRecord(good, w, {"scores": scores})

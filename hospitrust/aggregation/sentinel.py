"""Sentinel: every step the model takes is checked on the server's own images against the step the
server would take alone.

Each round the server has its own update g (the global model trained on its reference cohort, as
FLTrust's root update) and a loss L on that cohort (class-balanced cross-entropy). Every hospital's
update is clipped to ``step-bound`` x ||g|| (a bound the colluders cannot move), ranked by the loss of
the model it alone would give, and the federation's candidates are the examples-weighted means of
the k best-ranked updates, k = 1..n. The round's step is the candidate with the lowest loss on the
cohort, unless the server's own update g does better: then g (the fall-back no hospital can move).
With honest hospitals the chosen step is FedAvg's mean of (nearly) all of them; a hospital whose
update makes the model worse on the server's images joins no step that is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ._validation import check_updates, check_vector
from .reference import reference_trimmed_mean

__all__ = ["balanced_cross_entropy", "sentinel"]


def balanced_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over the classes present in ``labels`` of the mean cross-entropy of that class's images
    (a rare class counts as much as a common one, as balanced accuracy does).

    Parameters
    ----------
    logits : torch.Tensor
        ``(m, C)``.
    labels : torch.Tensor
        ``(m,)`` integer labels.

    Returns
    -------
    float
    """
    if logits.dim() != 2 or labels.dim() != 1 or logits.shape[0] != labels.shape[0] or logits.shape[0] == 0:
        raise ValueError(f"logits must be (m, C) and labels (m,) with m >= 1; got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    per_image = torch.nn.functional.cross_entropy(logits.double(), labels.long(), reduction="none")
    classes = torch.unique(labels)
    return float(torch.stack([per_image[labels == c].mean() for c in classes]).mean())


def sentinel(
    x: torch.Tensor,
    anchor: torch.Tensor,
    num_examples: torch.Tensor,
    losses: Callable[[torch.Tensor], torch.Tensor],
    *,
    step_bound: float,
    candidates: str = "prefixes",
    trim: int = 0,
    may_keep: bool = False,
) -> dict[str, torch.Tensor | float | int | bool | str]:
    r"""One round of sentinel.

    .. code-block:: text

        b      = kappa ||g||                                   (the server's own step sets the bound)
        x_i'   = x_i min(1, b / ||x_i||)
        l_i    = L(w + x_i')                                   (each update alone, on the cohort)
        a_k    = sum_{j in best k} n_j x_j' / sum_{j in best k} n_j      (best: lowest l, ties by row)
        k*     = argmin_k L(w + a_k)                           (ties: the larger k)
        step   = a_k*  if L(w + a_k*) <= L(w + g)  else  g

    Parameters
    ----------
    x : torch.Tensor
        ``(n, d)`` the hospitals' updates.
    anchor : torch.Tensor
        ``(d,)`` g, the server's own update this round.
    num_examples : torch.Tensor
        ``(n,)`` the examples each hospital reported (> 0).
    losses : callable
        ``(k, d)`` candidate steps -> ``(k,)`` the cohort loss of the global model plus each step.
    step_bound : float
        kappa > 0 (``math.inf``: no bound beyond the server's).
    candidates : str
        The hospitals' candidate steps: ``"prefixes"`` (a_k above), ``"trimmed-mean"`` (the coordinate-wise
        mean of the clipped updates without the ``trim`` largest and smallest values of each coordinate), or
        ``"trimmed-and-mean"`` (that, and the examples-weighted mean of every clipped update).
    trim : int
        The values dropped at each end by the trimmed mean (at most (n - 1) // 2 are).
    may_keep : bool
        The fall-back is the better of g and keeping the model (a zero step, loss L(w)) on the check: a
        round in which every step, the server's too, makes the held-out loss worse takes none.

    Returns
    -------
    dict
        ``update`` (d,), ``weights`` (n,) each update's share of the step (all 0 on a fall-back),
        ``clipped_loss`` (n,) l_i, ``rank`` (n,) 1 = best, ``clip_factor`` (n,), ``bound`` (float),
        ``prefix_loss`` (n,) L(w + a_k) for k = 1..n, ``anchor_loss`` (float), ``chosen`` (int, k*;
        0 on a fall-back), ``fell_back`` (bool).
    """
    n, d = check_updates(x)
    g = check_vector(anchor, d, "anchor", x)
    counts = num_examples.double().cpu()
    if counts.shape != (n,) or bool((counts <= 0).any()) or not bool(torch.isfinite(counts).all()):
        raise ValueError(f"num_examples must be ({n},) finite and > 0, got {num_examples.tolist()}")
    if not (step_bound > 0):
        raise ValueError(f"step_bound must be > 0, got {step_bound}")
    xd = x.double()
    gnorm = float(torch.linalg.vector_norm(g.double()))
    bound = step_bound * gnorm if math.isfinite(step_bound) else math.inf
    norms = torch.linalg.vector_norm(xd, dim=1).cpu()
    if math.isinf(bound):
        factor = torch.ones(n, dtype=torch.float64)
    else:
        factor = torch.where(norms > bound, bound / norms.clamp_min(1e-300), torch.ones_like(norms))
    clipped = xd * factor.to(xd.device).unsqueeze(1)

    def check(steps: torch.Tensor) -> torch.Tensor:
        out = torch.as_tensor(losses(steps.to(x.dtype)), dtype=torch.float64).cpu().reshape(-1)
        if out.shape[0] != steps.shape[0]:
            raise ValueError(f"losses returned {out.shape[0]} values for {steps.shape[0]} candidates")
        # a candidate whose loss is not a number is no candidate (it diverged)
        return torch.where(torch.isfinite(out), out, torch.full_like(out, math.inf))

    if candidates not in ("prefixes", "trimmed-mean", "trimmed-and-mean"):
        raise ValueError(f"candidates must be 'prefixes', 'trimmed-mean' or 'trimmed-and-mean', got {candidates!r}")
    if trim < 0:
        raise ValueError(f"trim must be >= 0, got {trim}")
    if candidates != "prefixes":
        return _robust(clipped, g, counts, check, factor, bound, candidates, min(trim, (n - 1) // 2), x.dtype, may_keep)
    alone = check(clipped)
    order = sorted(range(n), key=lambda i: (float(alone[i]), i))
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.tensor(order)] = torch.arange(1, n + 1)
    cum = torch.cumsum(counts[order], 0)
    ordered = clipped[order] * counts[order].to(xd.device).unsqueeze(1)
    prefixes = torch.cumsum(ordered, 0) / cum.to(xd.device).unsqueeze(1)
    prefix_loss = check(prefixes)
    # the lowest loss, and among equal losses the most hospitals
    best = min(range(n), key=lambda k: (float(prefix_loss[k]), -k))
    fallback, anchor_loss, fallback_name = _fall_back(g, check, may_keep)
    weights = torch.zeros(n, dtype=torch.float64)
    fell_back = not (float(prefix_loss[best]) <= anchor_loss)
    if fell_back:
        update = fallback
    else:
        update = prefixes[best]
        kept = torch.tensor(order[: best + 1])
        weights[kept] = counts[kept] / float(cum[best])
    return {
        "update": update.to(x.dtype),
        "weights": weights,
        "clipped_loss": alone,
        "rank": rank,
        "clip_factor": factor,
        "bound": bound,
        "prefix_loss": prefix_loss,
        "anchor_loss": anchor_loss,
        "chosen": 0 if fell_back else best + 1,
        "fell_back": fell_back,
        "candidate": fallback_name if fell_back else f"best-{best + 1}",
    }


def _fall_back(g: torch.Tensor, check: Callable[[torch.Tensor], torch.Tensor], may_keep: bool
               ) -> tuple[torch.Tensor, float, str]:
    """The step no hospital moves, its check loss and its name: g, or with ``may_keep`` the better of g and
    the zero step (ties: g).
    """
    gd = g.double()
    if not may_keep:
        return gd.clone(), float(check(gd.unsqueeze(0))[0]), "server"
    both = check(torch.stack([gd, torch.zeros_like(gd)]))
    if float(both[0]) <= float(both[1]):
        return gd.clone(), float(both[0]), "server"
    return torch.zeros_like(gd), float(both[1]), "keep"


def _robust(clipped: torch.Tensor, g: torch.Tensor, counts: torch.Tensor, check: Callable[[torch.Tensor], torch.Tensor],
            factor: torch.Tensor, bound: float, candidates: str, trim: int, dtype: torch.dtype, may_keep: bool
            ) -> dict[str, torch.Tensor | float | int | bool | str]:
    """The robust candidates: the trimmed mean of the clipped updates (and their mean), against g."""
    n = clipped.shape[0]
    trimmed = reference_trimmed_mean(clipped, trim)
    steps = [trimmed]
    names = ["trimmed-mean"]
    if candidates == "trimmed-and-mean":
        steps.append((clipped * counts.to(clipped.device).unsqueeze(1)).sum(0) / counts.sum())
        names.append("mean")
    loss = check(torch.stack(steps))
    best = min(range(len(steps)), key=lambda k: (float(loss[k]), k))  # ties: the trimmed mean
    fallback, anchor_loss, fallback_name = _fall_back(g, check, may_keep)
    fell_back = not (float(loss[best]) <= anchor_loss)
    if fell_back:
        update, weights = fallback, torch.zeros(n, dtype=torch.float64)
    elif names[best] == "mean":
        update, weights = steps[best], counts / counts.sum()
    else:  # every row takes part in the trimmed mean, coordinate by coordinate
        update, weights = steps[best], torch.full((n,), 1.0 / n, dtype=torch.float64)
    return {
        "update": update.to(dtype),
        "weights": weights,
        "clipped_loss": torch.full((n,), math.nan, dtype=torch.float64),  # no row is checked alone
        "rank": torch.zeros(n, dtype=torch.long),
        "clip_factor": factor,
        "bound": bound,
        "prefix_loss": loss,
        "anchor_loss": anchor_loss,
        "chosen": 0 if fell_back else best + 1,
        "fell_back": fell_back,
        "candidate": fallback_name if fell_back else names[best],
    }

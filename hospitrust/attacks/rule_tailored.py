"""Rule-tailored colluding attacks: the strength searched against the run's own rule, every round.

* ``tailored-alie``, ``tailored-ipm``: ALIE's z and IPM's epsilon that move the rule's output
  (behind the run's pre-aggregation chain) furthest from the honest mean (ByzFL's "optimal"
  attacks; :func:`~hospitrust.attacks.math.tailored.tailored_alie`);
* ``agr-tailored``: Shejwalkar and Houmansadr's AGR-tailored attacks (NDSS 2021) for the rules they
  define: Krum, Multi-Krum and Bulyan (the largest gamma the rule still selects), trimmed mean and
  median (gamma moved while the output moves further).

The rule is the simulated adversary's (:class:`~hospitrust.attacks.interfaces.RoundView`): the run's
strategy evaluated on a private copy of its state, so the search changes nothing of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, field_validator

from hospitrust.attacks.interfaces import RoundAwareColludingAttack, RoundView
from hospitrust.attacks.math import tailored as T
from hospitrust.attacks.math import update as U
from hospitrust.options import Options

def _finite_nonzero(v: float) -> float:
    if not math.isfinite(v) or v == 0:
        raise ValueError(f"must be finite and non-zero, got {v}")
    return v


class TailoredOptions(Options):
    """The strength search's options (ByzFL's optimal attacks' search)."""

    evals: int = Field(20, ge=1, le=500, description=(
        "Evaluations of the rule per round: the search's budget (ByzFL's 20)."
    ))
    step: float = Field(10.0, description=(
        "The search's first step of the strength (its sign is the first direction tried; it doubles while the "
        "rule's output moves further from the honest mean, then shrinks by 0.8)."
    ))
    directions: Literal["both", "one"] = Field("both", description=(
        "both: a step that does not move the output further is tried the other way too, so the search finds a "
        "better strength on either side of 0; one: ByzFL's search, in the direction of step only."
    ))
    copy_noise: float = Field(0.0, ge=0.0, description=(
        "Each attacker adds its own random noise of this norm (relative to the crafted update), so the copies are "
        "not identical; the strength is kept low enough that every noisy copy stays within max-update-norm. "
        "0: identical copies."
    ))
    _step = field_validator("step")(_finite_nonzero)

    @field_validator("copy_noise")
    @classmethod
    def _finite_noise(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        return v


class AGRTailoredOptions(Options):
    """AGR-tailored's options: the perturbation direction and where gamma's search starts."""

    perturbation: Literal["std", "unit", "sign"] = Field("unit", description=(
        "p in mean + gamma p: -std (std), -mean / norm (unit) or -sign(mean) (sign)."
    ))
    gamma_init: float = Field(10.0, gt=0.0, description="Gamma's first value in the halving search (the paper's 10).")

    @field_validator("gamma_init")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        return v


def _copies(one: torch.Tensor, m: int) -> torch.Tensor:
    return one.unsqueeze(0).expand(m, -1).clone()


class TailoredALIE(RoundAwareColludingAttack):
    """ALIE (``mean - z std``) with z searched every round against the run's rule.

    The search keeps z where every row it sends stays within the server's bound on an update's norm
    (``RoundView.max_norm``, the run's ``max-update-norm``): a row above it would be rejected.

    Parameters
    ----------
    evals : int
        Rule evaluations per round.
    step : float
        The search's first step of z (non-zero).
    directions : {"both", "one"}
        Search both ways from 0, or ByzFL's way (the sign of ``step`` only).
    copy_noise : float
        Relative noise each attacker adds to its copy (0: identical copies).
    """

    name = "tailored-alie"
    Options = TailoredOptions
    #: the key of the chosen strength in the round's record
    strength_key = "z"

    def __init__(self, evals: int = 20, step: float = 10.0, directions: str = "both", copy_noise: float = 0.0) -> None:
        self.evals = U.check_count(evals, "evals")
        self.step = _finite_nonzero(U.check_finite_number(step, "step"))
        if directions not in ("both", "one"):
            raise ValueError(f"directions must be 'both' or 'one', got {directions!r}")
        self.directions = directions
        self.copy_noise = U.check_finite_number(copy_noise, "copy_noise", nonneg=True)

    def search(self, view: RoundView, m: int) -> tuple[torch.Tensor, dict]:
        return T.tailored_alie(view.honest, view.rule_on_appended(), m, **self._search_options(view))

    def _search_options(self, view: RoundView) -> dict:
        return {"step": self.step, "evals": self.evals, "max_norm": view.max_norm, "copy_noise": self.copy_noise,
                "both_directions": self.directions == "both"}

    def craft_round(self, view: RoundView):
        m = len(view.malicious_rows)
        one, found = self.search(view, m)
        rows = U.jittered_copies(one, m, self.copy_noise, view.generator)
        norm = float(torch.linalg.vector_norm(rows.double(), dim=1).max())
        return rows, {self.strength_key: found["strength"], "distance": found["distance"], "norm": norm}


class TailoredIPM(TailoredALIE):
    """IPM (``-eps mean``) with epsilon searched every round against the run's rule, within the server's
    norm bound (see :class:`TailoredALIE`).

    Parameters
    ----------
    evals : int
        Rule evaluations per round.
    step : float
        The search's first step of epsilon (non-zero).
    directions : {"both", "one"}
        Search both ways from 0, or ByzFL's way (the sign of ``step`` only).
    copy_noise : float
        Relative noise each attacker adds to its copy (0: identical copies).
    """

    name = "tailored-ipm"
    strength_key = "eps"

    def search(self, view: RoundView, m: int) -> tuple[torch.Tensor, dict]:
        return T.tailored_ipm(view.honest, view.rule_on_appended(), m, **self._search_options(view))


class AGRTailored(RoundAwareColludingAttack):
    """Shejwalkar and Houmansadr's AGR-tailored attack on the run's rule: ``mean + gamma p``.

    For Krum, Multi-Krum and Bulyan, the largest gamma for which the rule (its own selection, on a
    private copy) still selects the malicious rows; for the trimmed mean and the median, gamma moved
    up while the rule's output moves further from the honest mean. Other rules are refused.

    Parameters
    ----------
    perturbation : {"std", "unit", "sign"}
        The direction p.
    gamma_init : float
        The halving search's first gamma (> 0).
    """

    name = "agr-tailored"
    Options = AGRTailoredOptions

    def __init__(self, perturbation: str = "unit", gamma_init: float = 10.0) -> None:
        if perturbation not in U.PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {', '.join(U.PERTURBATIONS)}, got {perturbation!r}")
        self.perturbation = perturbation
        self.gamma_init = U.check_finite_number(gamma_init, "gamma_init", positive=True)

    @staticmethod
    def check_rule(rule: type, pre_aggregation: tuple[str, ...] = (), defined: Sequence[str] = ()) -> str:
        """How AGR-tailored is defined against ``rule`` (a strategy class: its ``agr_tailored`` tag, "selection" or
        "distance"); ValueError where it is not, or where pre-aggregation stands in front of the rule. ``defined``:
        the registered rules that carry the tag, for the message (the caller knows the registry; attacks do not).
        """
        kind = getattr(rule, "agr_tailored", None)
        name = getattr(rule, "name", "") or rule.__name__
        if kind not in ("selection", "distance"):
            which = f"the rules {', '.join(defined)}" if defined else "the rules tagged agr_tailored"
            raise ValueError(
                f"attack 'agr-tailored' is defined for {which} (Shejwalkar and Houmansadr, NDSS 2021), not for "
                f"strategy {name!r}; against any rule use their AGR-agnostic attacks 'min-max' or 'min-sum', or "
                "'tailored-alie' / 'tailored-ipm' (strength searched against the rule itself)")
        if pre_aggregation:
            raise ValueError(
                f"attack 'agr-tailored' is defined against the rule alone, and this run puts the pre-aggregation chain "
                f"{','.join(pre_aggregation)!r} in front of {name!r}; use 'tailored-alie' or 'tailored-ipm', whose search "
                "has the chain in the loop")
        return kind

    def craft_round(self, view: RoundView):
        if view.strategy is None:
            raise ValueError("attack 'agr-tailored' needs the run's rule (RoundView.strategy): it runs in a run")
        rule = type(view.strategy())
        kind = self.check_rule(rule, view.pre_aggregation)
        m, honest = len(view.malicious_rows), view.honest
        honest_rows = view.honest_rows

        def in_row_order(malicious_first: torch.Tensor) -> torch.Tensor:
            return view.with_rows(malicious_first[:m])

        if kind == "selection":
            if view.aggregate is None:
                raise ValueError("attack 'agr-tailored' on a selection rule needs RoundView.aggregate (the rule's selection)")
            aggregate = view.aggregate
            position = {r: i for i, r in enumerate(view.malicious_rows)}
            position.update({r: m + i for i, r in enumerate(honest_rows)})

            def select(malicious_first: torch.Tensor) -> torch.Tensor:
                chosen = torch.nonzero(aggregate(in_row_order(malicious_first)).selected.cpu()).flatten().tolist()
                return torch.tensor([position[int(r)] for r in chosen], dtype=torch.long)

            one, found = T.agr_tailored_selection(honest, m, select, self.perturbation, gamma_init=self.gamma_init,
                                                  max_norm=view.max_norm)
        else:
            rule_fn = view.require_rule()
            one, found = T.agr_tailored_distance(honest, m, lambda x: rule_fn(in_row_order(x)), self.perturbation,
                                                 gamma_init=self.gamma_init, max_norm=view.max_norm)
        return _copies(one, m), {"rule": rule.name, "perturbation": self.perturbation, **found}


__all__ = ["AGRTailored", "AGRTailoredOptions", "TailoredALIE", "TailoredIPM", "TailoredOptions"]

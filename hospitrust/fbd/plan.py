"""The shipping plan: which hospitals may write which colors, and who writes what each round.

A plan has ``num_colors`` colors and, per hospital, the colors it may write. Validation
(``validate``) checks every color index is in range, no hospital lists a color twice,
every color has at least ``redundancy`` writers, and that the round schedule reaches every
color. It does not demand that a hospital leave colors untouched, but unlearning a
hospital that wrote every color is impossible (no donors) and says so.

Generated plans (``make_plan``) follow the FED-FBD spec: the colors are permuted by seed
and hospital ``i`` owns the cyclic interval ``perm[(i*k + j) % N], j < k`` with
``k = N*r/C``; every color then has exactly ``r`` writers. With 6 hospitals, 6 colors and
r = 3 this gives two groups of three hospitals sharing three colors each: nothing a group
writes (or distills from) ever reaches the other group's colors.

Schedule: in round ``t`` each hospital writes one of its colors, rotating, and no color
is written by two hospitals in the same round (direct replacement would otherwise keep
only the last write). A hospital whose colors are all taken that round sits it out.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PlanError(ValueError):
    """A shipping plan is inconsistent; the message names the hospital or color."""


@dataclass(frozen=True)
class ShippingPlan:
    """Which hospitals may write which colors, and the round schedule (see the module docstring).

    Parameters
    ----------
    num_colors : int
        The colors in the warehouse (>= 1).
    colors_of : dict[str, tuple[int, ...]]
        Hospital -> the colors it may write, in order.
    redundancy : int
        The fewest writers every color must have.
    seed : int
        The seed the plan was made with (recorded in its JSON).
    hospitals : tuple[str, ...]
        The schedule's hospital order; empty: the order of ``colors_of``.
    """

    num_colors: int
    colors_of: dict[str, tuple[int, ...]]  # hospital -> colors it may write (ordered)
    redundancy: int = 1
    seed: int = 0
    hospitals: tuple[str, ...] = field(default=())  # schedule order; defaults to colors_of's order

    def __post_init__(self) -> None:
        if not self.hospitals:
            object.__setattr__(self, "hospitals", tuple(self.colors_of))

    # ---- views ---------------------------------------------------------------------------
    def writers(self, color: int) -> list[str]:
        return [h for h in self.hospitals if color in self.colors_of.get(h, ())]

    def may_write(self, hospital: str, color: int) -> bool:
        return color in self.colors_of.get(hospital, ())

    def untouched_colors(self, hospital: str) -> list[int]:
        own = set(self.colors_of.get(hospital, ()))
        return [m for m in range(self.num_colors) if m not in own]

    def schedule(self, server_round: int) -> dict[str, int]:
        """Hospital -> the one color it writes in ``server_round`` (1-based); hospitals left
        out sit the round out. No color appears twice.
        """
        t = max(int(server_round) - 1, 0)
        order = list(self.hospitals)
        n = len(order)
        taken: set[int] = set()
        out: dict[str, int] = {}
        for j in range(n):
            h = order[(t + j) % n]  # n > 0 inside the loop
            own = list(self.colors_of.get(h, ()))
            if not own:
                continue
            # hospitals sharing their first color start at different positions of their lists,
            # so a group of writers with the same colors rotates without collisions
            rank = self.writers(own[0]).index(h)
            for step in range(len(own)):
                color = own[(t + rank + step) % len(own)]
                if color not in taken:
                    taken.add(color)
                    out[h] = color
                    break
        return {h: out[h] for h in order if h in out}

    def sibling(self, hospital: str, color: int, server_round: int, seed: int) -> int:
        """The sibling color a writer distills from: one of its other colors, drawn by seed;
        -1 when it owns only ``color``.
        """
        others = [m for m in self.colors_of.get(hospital, ()) if m != color]
        if not others:
            return -1
        rng = random.Random(f"{seed}/{hospital}/{server_round}")
        return rng.choice(others)

    # ---- checks ----------------------------------------------------------------------------
    def validate(self) -> "ShippingPlan":
        if self.num_colors < 1:
            raise PlanError(f"num-colors must be >= 1, got {self.num_colors}")
        if self.redundancy < 1:
            raise PlanError(f"redundancy must be >= 1, got {self.redundancy}")
        if set(self.hospitals) != set(self.colors_of) or len(self.hospitals) != len(set(self.hospitals)):
            raise PlanError(f"plan hospitals {list(self.hospitals)} do not match its color map {sorted(self.colors_of)}")
        for h, colors in self.colors_of.items():
            bad = [c for c in colors if not (isinstance(c, int) and 0 <= c < self.num_colors)]
            if bad:
                raise PlanError(f"hospital {h!r}: colors {bad} out of range; expected integers 0..{self.num_colors - 1}")
            if len(set(colors)) != len(colors):
                raise PlanError(f"hospital {h!r} lists a color twice: {list(colors)}")
        for m in range(self.num_colors):
            w = self.writers(m)
            if not w:
                raise PlanError(f"color {m} has no writer; every color needs at least {self.redundancy}")
            if len(w) < self.redundancy:
                raise PlanError(f"color {m} has {len(w)} writer(s) {w}, redundancy {self.redundancy} needs {self.redundancy}")
        horizon = max((len(c) for c in self.colors_of.values()), default=1) * max(len(self.hospitals), 1)
        reached = {m for t in range(1, horizon + 1) for m in self.schedule(t).values()}
        never = sorted(set(range(self.num_colors)) - reached)
        if never:
            raise PlanError(f"the round schedule never writes colors {never}; give them a writer with fewer colors")
        return self

    # ---- persistence -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "num_colors": self.num_colors,
            "redundancy": self.redundancy,
            "seed": self.seed,
            "hospitals": list(self.hospitals),
            "colors_of": {h: list(c) for h, c in self.colors_of.items()},
            "writers": {str(m): self.writers(m) for m in range(self.num_colors)},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ShippingPlan":
        try:
            plan = cls(
                num_colors=int(data["num_colors"]),
                colors_of={str(h): tuple(int(c) for c in cs) for h, cs in data["colors_of"].items()},
                redundancy=int(data.get("redundancy", 1)),
                seed=int(data.get("seed", 0)),
                hospitals=tuple(data.get("hospitals", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"plan JSON lacks or mistypes {exc}; expected num_colors, colors_of") from None
        return plan.validate()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ShippingPlan":
        return cls.from_json(json.loads(Path(path).read_text()))


def make_plan(hospitals: list[str], num_colors: int, redundancy: int, seed: int = 0) -> ShippingPlan:
    """The FED-FBD plan: permuted colors, cyclic intervals of k = N*r/C colors per hospital.

    Parameters
    ----------
    hospitals : list[str]
        The hospitals, in schedule order.
    num_colors : int
        C, the colors; ``C x r`` must be a multiple of the hospitals.
    redundancy : int
        r, the writers per color (between 1 and the hospitals).
    seed : int
        Seeds the color permutation.

    Returns
    -------
    ShippingPlan
        The validated plan.
    """
    n_h = len(hospitals)
    if n_h < 1:
        raise PlanError("a plan needs at least one hospital")
    if not 1 <= redundancy <= n_h:
        raise PlanError(f"redundancy {redundancy} must be between 1 and the number of hospitals ({n_h})")
    if (num_colors * redundancy) % n_h:
        raise PlanError(
            f"num-colors x redundancy = {num_colors} x {redundancy} must be a multiple of the hospitals ({n_h}) "
            "for every hospital to write the same number of colors; change fbd.colors or fbd.redundancy, or give fbd.plan"
        )
    k = num_colors * redundancy // n_h
    if k > num_colors:
        raise PlanError(f"each hospital would need {k} of {num_colors} colors; lower fbd.redundancy")
    perm = list(range(num_colors))
    random.Random(seed).shuffle(perm)
    colors_of = {h: tuple(perm[(i * k + j) % num_colors] for j in range(k)) for i, h in enumerate(hospitals)}
    return ShippingPlan(num_colors, colors_of, redundancy, seed, tuple(hospitals)).validate()


def parse_plan(text: str, hospitals: list[str], num_colors: int, redundancy: int, seed: int = 0) -> ShippingPlan:
    """A plan from the run config: ``'hospital-0:0,1,2; hospital-1:3,4,5'`` (a bare index ``0``
    means ``hospital-0``), or the path of a plan JSON file. Hospitals are checked against
    the ones that answered the query round.

    Parameters
    ----------
    text : str
        ``fbd.plan``: the entries, or a ``.json`` path.
    hospitals : list[str]
        The hospitals in the federation, in schedule order.
    num_colors : int
        ``fbd.colors`` (the plan must have as many).
    redundancy : int
        ``fbd.redundancy``.
    seed : int
        The run's seed (recorded in the plan).

    Returns
    -------
    ShippingPlan
        The validated plan (PlanError naming the entry otherwise).
    """
    text = text.strip()
    if text.endswith(".json"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise PlanError(f"fbd.plan file {str(path)!r} not found")
        plan = ShippingPlan.load(path)
    else:
        colors_of: dict[str, tuple[int, ...]] = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            if ":" not in part:
                raise PlanError(f"fbd.plan entry {part!r} is not 'hospital:color,color,...'")
            name, colors = (s.strip() for s in part.split(":", 1))
            if name.isdigit() and name not in hospitals:
                name = f"hospital-{name}"
            try:
                parsed = tuple(int(c) for c in colors.split(",") if c.strip())
            except ValueError:
                raise PlanError(f"fbd.plan entry {part!r}: colors must be integers, got {colors!r}") from None
            if name in colors_of:
                raise PlanError(f"fbd.plan names hospital {name!r} twice")
            colors_of[name] = parsed
        if not colors_of:
            raise PlanError("fbd.plan is empty; expected 'hospital:color,color; ...' or a .json path")
        plan = ShippingPlan(num_colors, colors_of, redundancy, seed, tuple(h for h in hospitals if h in colors_of)
                            + tuple(h for h in colors_of if h not in hospitals))
    unknown = sorted(set(plan.colors_of) - set(hospitals))
    if unknown:
        raise PlanError(f"fbd.plan names hospitals {unknown} that are not in the federation {sorted(hospitals)}")
    if plan.num_colors != num_colors:
        raise PlanError(f"fbd.plan has {plan.num_colors} colors but fbd.colors is {num_colors}")
    return plan.validate()

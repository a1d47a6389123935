"""Who attacks: the fixed set of malicious hospitals of a run (simulation ground truth)."""

from __future__ import annotations

import numpy as np


def parse_int_list(raw: str, what: str, *, minimum: int = 0) -> tuple[int, ...]:
    """``"1, 3,5"`` -> ``(1, 3, 5)``; ``""`` -> ``()``; ValueError names the bad item.

    Parameters
    ----------
    raw : str
        Comma-separated integers (blank items are skipped).
    what : str
        The key named in error messages (``"malicious-hospitals"``).
    minimum : int
        The smallest value allowed.

    Returns
    -------
    tuple[int, ...]
        The integers in the given order (no repeats allowed).
    """
    out: list[int] = []
    for part in str(raw).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not an integer (expected comma-separated integers)") from None
        if v < minimum:
            raise ValueError(f"{what}: {v} must be >= {minimum}")
        if v in out:
            raise ValueError(f"{what}: {v} is listed twice")
        out.append(v)
    return tuple(out)


def malicious_set(num_hospitals: int, *, malicious_fraction: float = 0.0, malicious_hospitals: str = "",
                  seed: int = 0) -> frozenset[int]:
    """The fixed set of malicious hospital indices (0-based partition ids).

    * ``malicious-hospitals`` given: exactly those (each must be < ``num_hospitals``);
    * else ``malicious-fraction`` f > 0: ``max(1, round(f * n))`` indices drawn without
      replacement by ``seed`` (deterministic; at least one hospital stays honest);
    * else the empty set.

    The set is fixed for the whole run (not resampled per round).

    Parameters
    ----------
    num_hospitals : int
        The number of hospitals n (>= 1).
    malicious_fraction : float
        Share f of hospitals drawn malicious (run config ``malicious-fraction``).
    malicious_hospitals : str
        Comma-separated partition ids (run config ``malicious-hospitals``); excludes
        ``malicious_fraction``.
    seed : int
        Seeds the draw.

    Returns
    -------
    frozenset[int]
        The malicious partition ids.
    """
    if isinstance(num_hospitals, bool) or int(num_hospitals) != num_hospitals or num_hospitals < 1:
        raise ValueError(f"num_hospitals must be an integer >= 1, got {num_hospitals!r}")
    n = int(num_hospitals)
    named = parse_int_list(malicious_hospitals, "malicious-hospitals", minimum=0)
    if named and malicious_fraction > 0:
        raise ValueError("set either malicious-fraction or malicious-hospitals, not both")
    if named:
        bad = [h for h in named if h >= n]
        if bad:
            raise ValueError(f"malicious-hospitals {bad} out of range: hospitals are 0..{n - 1}")
        return frozenset(named)
    f = float(malicious_fraction)
    if f <= 0:
        return frozenset()
    m = max(1, int(round(f * n)))
    if m >= n:
        raise ValueError(
            f"malicious-fraction {f} of {n} hospitals makes {m} malicious, leaving no honest hospital"
        )
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xA77AC]))
    return frozenset(int(i) for i in rng.choice(n, size=m, replace=False))

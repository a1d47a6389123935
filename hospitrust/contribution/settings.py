"""Cross-checks of the contribution and secure-aggregation run config keys (called by RunConfig)."""

from __future__ import annotations

# strategies whose aggregate is a weighted mean M = M0 + sum_i w_i U_i: the counterfactual
# models M - U_i and M0 + U_i (and Shapley's coalition models) are defined for them
WEIGHTED_MEAN_STRATEGIES = ("fedavg", "fedprox", "contribution")


def selfish_ids(value: str) -> list[int]:
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"contribution-selfish-hospitals must be partition ids like '0' or '0,3', got {value!r}")
        ids.append(int(part))
    return ids


def check_contribution_settings(cfg) -> None:
    """Raises ValueError naming the keys when contribution/secure settings cannot work together."""
    selfish_ids(cfg.contribution_selfish_hospitals)
    if cfg.contribution_scoring and cfg.strategy not in WEIGHTED_MEAN_STRATEGIES:
        raise ValueError(
            f"contribution-scoring needs a weighted-mean strategy ({', '.join(WEIGHTED_MEAN_STRATEGIES)}); "
            f"strategy {cfg.strategy!r} has no leave-one-out model M - U_i"
        )
    if cfg.strategy == "contribution" and not cfg.contribution_scoring:
        raise ValueError("strategy 'contribution' weights hospitals by their scores: set contribution-scoring = true")
    if cfg.secure_aggregation:
        if cfg.strategy != "fedavg":
            raise ValueError(
                f"secure-aggregation hands the server only the sum of the updates: strategy must be 'fedavg', got {cfg.strategy!r}"
            )
        if cfg.fraction_train < 1.0:
            raise ValueError("secure-aggregation asks every hospital each round: fraction-train must be 1.0")
        from hospitrust.attacks.base import ColludingAttack
        from hospitrust.attacks.registry import build_attack

        attack = build_attack(cfg.attacks.attack, cfg.attacks)
        if isinstance(getattr(attack, "attack", attack), ColludingAttack):
            raise ValueError(
                f"attack {cfg.attacks.attack!r} is a colluding adversary that rewrites the stacked updates on the "
                "server, which secure-aggregation never holds"
            )

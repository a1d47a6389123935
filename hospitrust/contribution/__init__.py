"""Contribution evaluation: who contributed what, computable under secure aggregation.

``scores``     pure math: LOO, IOI, Fair-Private, Everybody-Else, COS, exact and multi-round Shapley
``interface``  the narrow interface scoring sees (aggregates and reported scalars) and the ledger
``federation`` the server's side in a Flower round
``options``    the contribution-scoring section and its checks against the rest of the run config

A hospital's own evaluations and the ClientApp mods are ``hospitrust.client_app.contribution``.
"""

from hospitrust.contribution.scores import (
    coalition_values,
    coalition_weights,
    cosine_to_aggregate,
    everybody_else,
    everybody_else_published,
    fair_private,
    fair_private_published,
    include_one_in,
    leave_one_out,
    marginals_from_table,
    multi_round_shapley,
    shapley_exact,
    spearman,
)

__all__ = [
    "coalition_values", "coalition_weights", "cosine_to_aggregate", "everybody_else", "everybody_else_published",
    "fair_private", "fair_private_published",
    "include_one_in", "leave_one_out", "marginals_from_table", "multi_round_shapley", "shapley_exact", "spearman",
]

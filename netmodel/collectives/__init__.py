"""Collective algorithms, one module each, found by name through :data:`ALGORITHMS`.

Adding an algorithm touches its own module and one line here.
"""

from __future__ import annotations

from netmodel.collectives import alltoall, dissemination, halving_doubling, hierarchical, ring, tree
from netmodel.collectives.base import OPS, Algorithm, CollectiveCall
from netmodel.errors import ConfigError

ALGORITHMS: dict[str, Algorithm] = {
    algo.name: algo
    for algo in (
        ring.RING,
        tree.DOUBLE_BINARY_TREE,
        halving_doubling.HALVING_DOUBLING,
        alltoall.PAIRWISE,
        alltoall.DIRECT,
        hierarchical.HIERARCHICAL,
        dissemination.DISSEMINATION,
    )
}

# The algorithm used when neither the call nor the tier's ``algorithms`` names one.
DEFAULTS: dict[str, str] = {
    "all_reduce": "ring",
    "reduce_scatter": "ring",
    "all_gather": "ring",
    "broadcast": "ring",
    "reduce": "ring",
    "all_to_all": "pairwise",
    "barrier": "dissemination",
}


def get_algorithm(name: str, op: str) -> Algorithm:
    """The algorithm called ``name``; unknown names or unsupported ops fail listing the options."""
    if op not in OPS:
        raise ConfigError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    algo = ALGORITHMS.get(name)
    if algo is None:
        raise ConfigError(f"unknown collective algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    if op not in algo.ops:
        able = sorted(n for n, a in ALGORITHMS.items() if op in a.ops)
        raise ConfigError(f"algorithm {name!r} does not implement {op}; algorithms that do: {', '.join(able)}")
    return algo


__all__ = ["ALGORITHMS", "DEFAULTS", "Algorithm", "CollectiveCall", "get_algorithm"]

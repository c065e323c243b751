"""Permutations as the e-graph's strings ("0,2,1,3") and the lookup tables each e-graph loads: how two
transposes compose and where a transpose puts K's last two axes. Pure Python: the rules only read the tables."""

from __future__ import annotations

import itertools

__all__ = ["perm_string", "perm_table", "swap_table"]


def perm_string(perm: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(int(p)) for p in perm)


def perm_table(ranks: tuple[int, ...] = (3, 4, 5)) -> list[tuple[str, str, str]]:
    """All ``(first, then, composed)`` triples for the given ranks (6² + 24² rows, and 6² at rank 5: cheap to
    load). At rank 5 only the permutations that keep the batch and the last axis: grouped heads (B, K, G, T, X)
    have their middle axes reordered (the full table would be 120² rows, 14 ms an e-graph, for nothing)."""
    rows = []
    for rank in ranks:
        perms = [p for p in itertools.permutations(range(rank)) if rank < 5 or (p[0], p[-1]) == (0, rank - 1)]
        for first in perms:
            for then in perms:
                composed = tuple(first[i] for i in then)
                rows.append((perm_string(first), perm_string(then), perm_string(composed)))
    return rows


def swap_table(ranks: tuple[int, ...] = (3, 4)) -> list[tuple[str, str]]:
    rows = []
    for rank in ranks:
        for perm in itertools.permutations(range(rank)):
            swapped = (*perm[:-2], perm[-1], perm[-2])
            rows.append((perm_string(perm), perm_string(swapped)))
    return rows

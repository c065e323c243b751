"""Extraction of our own: one best e-node per e-class under a target's cost model, DAG-aware.

egglog's built-in extractor sums *tree* costs: a residual stream or mask used by every layer is counted once
per use, costs grow exponentially with depth and overflow. Here a term's cost is its own cost plus the own
cost of each distinct e-class it reaches (greedy DAG cost: shared K/V/mask count once), in Python floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from egfuse.session import EClass, ENode

_MAX_PASSES = 64


class CostModel(Protocol):
    """What a target can run and what it costs. ``None`` means the target cannot run this e-node."""

    def cost(self, node: ENode) -> float | None: ...


@dataclass(frozen=True)
class Choice:
    node: ENode
    own: float
    total: float
    reached: frozenset[EClass]


def extract(classes: dict[EClass, list[ENode]], model: CostModel) -> dict[EClass, Choice]:
    """Worklist relaxation: a class is (re)considered only when one of its children got a (better) choice."""
    own = {node: (None if node.op == "ref" else model.cost(node)) for nodes in classes.values() for node in nodes}
    parents: dict[EClass, set[EClass]] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            for child in node.children:
                parents.setdefault(child, set()).add(cid)
    best: dict[EClass, Choice] = {}
    pending = sorted(classes)
    queued = set(pending)
    updates = 0
    limit = _MAX_PASSES * max(1, len(classes))
    while pending and updates < limit:
        cid = pending.pop()
        queued.discard(cid)
        improved = False
        for node in classes[cid]:
            cost = own[node]
            kids = node.children
            if cost is None or any(k not in best for k in kids):
                continue
            reached = frozenset().union(*(best[k].reached for k in kids), kids)
            if cid in reached:
                continue  # a cycle back into this class
            candidate = Choice(node, cost, cost + sum(best[c].own for c in reached), reached)
            current = best.get(cid)
            if current is None or _better(candidate, current):
                best[cid] = candidate
                improved = True
        if improved:
            updates += 1
            for parent in sorted(parents.get(cid, ())):
                if parent not in queued:
                    queued.add(parent)
                    pending.append(parent)
    return best


def _better(a: Choice, b: Choice) -> bool:
    if abs(a.total - b.total) > 1e-9:
        return a.total < b.total
    return (a.node.op, repr(a.node.args)) < (b.node.op, repr(b.node.args))  # deterministic ties

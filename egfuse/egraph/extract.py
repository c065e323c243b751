"""Extraction of our own: one best e-node per e-class under a target's cost model, DAG-aware.

egglog's built-in extractor sums *tree* costs: a residual stream or mask used by every layer is counted once
per use, costs grow exponentially with depth and overflow. Here a term's cost is its own cost plus the own
cost of each distinct e-class it reaches (greedy DAG cost: shared K/V/mask count once), in Python floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from egfuse.egraph.session import EClass, ENode

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
    _relax(classes, own, parents, best, sorted(classes))
    for _ in range(_CYCLE_ROUNDS):
        # A choice made when its children chose otherwise can close a cycle later (A picks B, then B comes to
        # pick A through C): such choices are dropped and their classes chosen again from what stands.
        cyclic = _on_cycles(best)
        if not cyclic:
            break
        for cid in cyclic:
            del best[cid]
        _relax(classes, own, parents, best, sorted(cyclic | {p for c in cyclic for p in parents.get(c, ())}))
    return best


_CYCLE_ROUNDS = 8


def _on_cycles(best: dict[EClass, Choice]) -> set[EClass]:
    """The classes whose chosen node leads back to them through the chosen nodes."""
    state: dict[EClass, int] = {}  # 1: on the DFS path, 2: done
    cyclic: set[EClass] = set()
    for start in best:
        if start in state:
            continue
        stack = [(start, iter(best[start].node.children))]
        state[start] = 1
        path = [start]
        while stack:
            cid, kids = stack[-1]
            for kid in kids:
                if kid not in best:
                    continue
                if state.get(kid) == 1:
                    cyclic.update(path[path.index(kid) :])
                elif kid not in state:
                    state[kid] = 1
                    path.append(kid)
                    stack.append((kid, iter(best[kid].node.children)))
                    break
            else:
                state[cid] = 2
                stack.pop()
                path.pop()
    return cyclic


def _relax(
    classes: dict[EClass, list[ENode]],
    own: dict[ENode, float | None],
    parents: dict[EClass, set[EClass]],
    best: dict[EClass, Choice],
    pending: list[EClass],
) -> None:
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


def _better(a: Choice, b: Choice) -> bool:
    if abs(a.total - b.total) > 1e-9:
        return a.total < b.total
    return (a.node.op, repr(a.node.args)) < (b.node.op, repr(b.node.args))  # deterministic ties

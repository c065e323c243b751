"""The fused forms a region's e-class held and what each is predicted to cost on the target — the report's
candidate table, and why a region stayed as written when its own ops are predicted cheaper."""

from __future__ import annotations

from typing import TYPE_CHECKING

from egfuse.egraph.cost import CostModel
from egfuse.egraph.enodes import value_index, view
from egfuse.egraph.extract import Choice, extract
from egfuse.egraph.session import EClass, ENode, Session
from egfuse.egraph.shapes import class_shapes
from egfuse.lowering.lower import Lowerer
from egfuse.targets.spec import FUSED, TargetSpec

if TYPE_CHECKING:
    from egfuse.analysis.facts import GraphFacts
    from egfuse.kinds.regions import Region

_WRAPPERS = frozenset({"transpose", "merge_heads", "split_heads", "merge_lead", "split_lead", "reshape", "cast",
                       "nan_to_zero"})  # fmt: skip
"""Layout and guard constructors between a region's output and its attention (followed to find candidates)."""


def priced_forms(main: EClass, classes: dict[EClass, list[ENode]], choice: dict, model: CostModel) -> list[dict]:
    """The fused forms the region's e-class held, each with the predicted cost (µs) of the region written with
    it — its own cost, what it reads, and the layout ops between it and the region's output — cheapest first.
    Forms the target cannot write are listed with ``cost_us`` None and why."""
    found: dict[tuple[str, str], dict] = {}
    stack: list[tuple[EClass, float, int]] = [(main, 0.0, 0)]
    seen: set[EClass] = set()
    while stack:
        cid, path_cost, depth = stack.pop()
        if cid in seen or depth > 6:
            continue
        seen.add(cid)
        for node in classes.get(cid, []):
            if node.op in FUSED:
                op = model.spec.op_for(node.op)
                own = model.cost(node)
                entry = {"form": node.op, "op": op.label if op else None, "cost_us": None, "work": ""}
                if own is None or any(c not in choice for c in node.children):
                    entry["why_not"] = "the target has no op for this form" if op is None else "the op refuses it"
                else:
                    reached = frozenset().union(*(choice[c].reached for c in node.children), node.children)
                    entry["cost_us"] = round(path_cost + own + sum(choice[c].own for c in reached), 3)
                    entry["own_us"], entry["roofline_us"] = round(own, 3), round(model.roofline(node) or 0.0, 3)
                    entry["work"] = model.explain(node)
                key = (node.op, entry["op"] or "")
                if key not in found or (entry["cost_us"] or 1e30) < (found[key]["cost_us"] or 1e30):
                    found[key] = entry
            elif node.op in _WRAPPERS and node.children:
                own = model.cost(node)
                if own is not None:
                    stack.append((view(node).a, path_cost + own, depth + 1))
    unfused = _unfused_cost(main, classes, model)
    if unfused is not None:
        found["unfused", ""] = {
            "form": "unfused",
            "op": "the graph's own ops",
            "cost_us": round(unfused, 3),
            "work": "",
        }
    return sorted(found.values(), key=lambda e: (e["cost_us"] is None, e["cost_us"] or 0.0, e["form"]))


def cheaper_unfused(candidates: list[dict], target: str) -> str | None:
    """Why a recognised region stayed as it was when the target could write it: its own ops are predicted
    cheaper (a single-head block is already what the npu target writes)."""
    priced = [c for c in candidates if c.get("cost_us") is not None]
    if len(priced) < 2 or priced[0]["form"] != "unfused":
        return None
    best = priced[1]
    return (
        f"kept as written: on target {target!r} the graph's own ops are predicted cheaper "
        f"({priced[0]['cost_us']:.1f} µs) than its cheapest fused form "
        f"({best['form']} → {best['op']}, {best['cost_us']:.1f} µs)"
    )


class _Unfused:
    """A cost model that writes no fused op: the region as the graph spelled it (or its cheapest rewrite)."""

    def __init__(self, model: CostModel) -> None:
        self.model = model

    def cost(self, node: ENode) -> float | None:
        return None if node.op in FUSED else self.model.time(node)


def _unfused_cost(main: EClass, classes: dict[EClass, list[ENode]], model: CostModel) -> float | None:
    """The predicted cost of the region without a fused op, over the e-classes it reaches."""
    reach = _reached(main, classes, lambda node: node.children)
    best = extract({cid: classes[cid] for cid in reach}, _Unfused(model))
    return best[main].total if main in best else None


def written_cost(
    region: Region, facts: GraphFacts, opset: int, spec: TargetSpec, value_types: frozenset[str]
) -> float | None:
    """The predicted cost of the region's ops exactly as the graph spells them: the region lowered alone and not
    saturated, so its e-graph holds no rewrite of them. A region that is not fused is kept as written, so this,
    not the cheapest rewrite of its own ops (which egfuse never writes), is what a fused form must beat."""
    session = Session()
    lowerer = Lowerer(facts, session.names, opset)
    lowerer.lower(region)
    session.add(lowerer.table.commands)
    classes, _ = session.freeze()
    output = lowerer.table.id_of(region.main_output)
    main = next(
        (c for c, nodes in classes.items() if any(n.op == "ref" and value_index(n) == output for n in nodes)), None
    )
    if main is None:
        return None
    best = extract(classes, _Unfused(CostModel(spec, class_shapes(classes, lowerer.table, facts), value_types)))
    return best[main].total if main in best else None


def fused_choice(main: EClass, classes: dict[EClass, list[ENode]], model: CostModel) -> dict[EClass, Choice]:
    """The cheapest program for ``main`` that goes through a fused op: its class, and the layout and guard
    wrappers below it, keep only fused forms and wrappers."""
    spine = _reached(main, classes, lambda node: [view(node).a] if node.op in _WRAPPERS and node.children else [])
    restricted = {
        cid: [n for n in nodes if n.op in FUSED or n.op in _WRAPPERS] if cid in spine else nodes
        for cid, nodes in classes.items()
    }
    return extract(restricted, model)


def _reached(main: EClass, classes: dict[EClass, list[ENode]], follow) -> set[EClass]:
    """``main`` and the classes reached from it through ``follow(node)`` (the child classes an e-node leads to)."""
    reach, stack = set(), [main]
    while stack:
        cid = stack.pop()
        if cid in reach or cid not in classes:
            continue
        reach.add(cid)
        stack.extend(c for node in classes[cid] for c in follow(node))
    return reach

"""``If`` nodes whose condition is known, replaced by the branch they take.

torchlib's functions of torch 2.1–2.2 guard ops with tests the exporter could not decide (``IsScalar(x)``, an
empty gather, a comparison of dims). Inlined into the main graph, each hides the plain ops attention is
written with inside a subgraph no region can see; with the graph's facts the condition is a constant, so the
``If`` is its branch. Kept apart from inlining (:mod:`egfuse.preparation.functions`): it runs on every search, on the
graph's facts, and inlined functions are only one source of such ``If``s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from egfuse.analysis.facts import GraphFacts


def fold_constant_ifs(graph: ir.Graph, facts: GraphFacts) -> int:
    """Replace each ``If`` whose condition ``facts`` knows by the branch it takes (``If(true, a, b) = a``).

    torchlib functions of torch 2.1–2.2 wrap ops in ``If(IsScalar(x), Unsqueeze(x), Identity(x))`` (aten_softmax
    on both sides of the Softmax): with x's rank known the condition is a constant, and the regions must see
    the branch's plain ops. Returns how many were folded (the caller recomputes ``facts`` then)."""
    folded = 0
    for node in list(graph):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        cond = facts.const(node.inputs[0])
        if cond is None and facts.truth(node.inputs[0]) is not None:
            cond = np.array(facts.truth(node.inputs[0]))  # a comparison of dims (DeBERTa's q_len == k_len)
        if cond is None and _is_scalar_test(node.inputs[0], facts) is not None:
            cond = np.array(False)  # Size(Shape(x)) is x's rank, which is at least one
        if cond is None and _empty_gather_either_way(node, facts):
            cond = np.array(False)  # both branches give x's shape, empty when x is: the gather is the meaning
        if cond is None or cond.size != 1:
            continue
        branch = node.attributes["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"].as_graph()
        outputs = list(branch.outputs)
        if len(outputs) != len(node.outputs) or any(v.producer() is None for v in outputs):
            continue  # a branch returning an outer value as is: left alone
        other = node.attributes["else_branch" if bool(cond.reshape(-1)[0]) else "then_branch"].as_graph()
        for dropped in list(other.all_nodes()):  # its nodes read outer values: they must not count as readers
            for i in range(len(dropped.inputs)):
                dropped.replace_input_with(i, None)
        nodes = list(branch)
        branch.outputs.clear()  # its output values become the If's: one graph may own them
        branch.remove(nodes, safe=False)
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=nodes,
            old_values=node.outputs,
            new_values=outputs,
        )
        folded += 1
    return folded


_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Identity", "Cast", "CastLike", "Neg", "Sqrt"})


def _empty_gather_either_way(node: ir.Node, facts: GraphFacts) -> bool:
    """torchlib's aten_gather of torch 2.1: ``If(Size(i) == 0, CastLike(i, x), GatherElements(x, Cast(i)))``.
    Both branches give a tensor of i's shape; when i is empty so is each, and equal — so the If is its
    else branch whatever i's size."""
    equal = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if equal is None or equal.op_type != "Equal" or len(equal.inputs) != 2:
        return False
    size = equal.inputs[0].producer()
    if facts.scalar(equal.inputs[1]) != 0 or size is None or size.op_type != "Size":
        return False
    index = size.inputs[0]

    def through_casts(value: ir.Value | None) -> ir.Value | None:
        while value is not None and value.producer() is not None and value.producer().op_type in ("Cast", "CastLike"):
            value = value.producer().inputs[0]
        return value

    then_out = node.attributes["then_branch"].as_graph().outputs
    else_out = node.attributes["else_branch"].as_graph().outputs
    if len(then_out) != 1 or len(else_out) != 1 or through_casts(then_out[0]) is not index:
        return False
    gather = else_out[0].producer()
    return gather is not None and gather.op_type == "GatherElements" and through_casts(gather.inputs[1]) is index


def _is_scalar_test(value: ir.Value, facts: GraphFacts) -> ir.Value | None:
    """The x of ``Equal(Size(Shape(x)), 0)`` (torchlib's IsScalar) when x provably has rank ≥ 1, else None."""
    equal = value.producer()
    if equal is None or equal.op_type != "Equal" or facts.scalar(equal.inputs[1]) != 0:
        return None
    size = equal.inputs[0].producer()
    shape = size.inputs[0].producer() if size is not None and size.op_type == "Size" else None
    if shape is None or shape.op_type != "Shape" or shape.attributes.get("start") or shape.attributes.get("end"):
        return None
    x = shape.inputs[0]
    return x if _rank_at_least(x, facts) >= 1 else None


def _rank_at_least(value: ir.Value | None, facts: GraphFacts, depth: int = 8) -> int:
    """A lower bound of ``value``'s rank: its known rank, or through elementwise ops (broadcasting never lowers
    a rank) the largest bound of their inputs."""
    if value is None:
        return 0
    rank = facts.rank(value)
    if rank is not None:
        return rank
    node = value.producer()
    if node is None or depth == 0 or node.op_type not in _ELEMENTWISE:
        return 0
    return max((_rank_at_least(v, facts, depth - 1) for v in node.inputs), default=0)

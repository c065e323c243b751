"""The tanh GELU as a region kind: ``x · ½ · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`` (GPT-2's ``gelu_new``,
BLOOM, Gemma, Keras' approximate GELU, torch's ``approximate="tanh"`` decomposed) written as one op.

The first kind added after kinds became plug-ins, and all of it: the region (the neighbourhood of a ``Tanh``),
its explanation of a miss (read off the e-graph), and the op each target writes for it — the standard ``Gelu``
with ``approximate="tanh"`` where the target writes the standard exact GELU, onnxruntime's ``FastGelu`` where
it writes onnxruntime's. Its constructors and rules are one rule family (:mod:`egfuse.rules.tanh_gelu`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.kinds.activation_walk import activation_forward, with_constant
from egfuse.kinds.base import RegionKind
from egfuse.kinds.layers import not_chosen, write_one_op
from egfuse.kinds.regions import Found, Region, anchored_regions, single_consumer
from egfuse.report import RegionReport
from egfuse.targets.spec import FusedOp, TargetSpec
from egfuse.writing.region_writer import RegionWriter

FORM = "gelu_tanh"
"""The fused constructor (:data:`egfuse.rules.tanh_gelu.CONSTRUCTORS`)."""
_ARGUMENT_OPS = frozenset({"Mul", "Add", "Pow", "Div"})
"""What tanh's argument is computed with: the cube, the coefficient, the sum, √(2/π)."""
_MAX_DEPTH = 6


def offer(target: TargetSpec) -> TargetSpec:
    """The target writing the tanh GELU as it writes the exact one: the standard ``Gelu`` with
    ``approximate="tanh"`` (same opset), or ``com.microsoft.FastGelu`` beside onnxruntime's ``Gelu`` (same
    kernel family, so the same measured speed). A target without a GELU op gets none."""
    return replace(target, ops=(*target.ops, *_twins(target.ops)),
                   below_opset_ops=(*target.below_opset_ops, *_twins(target.below_opset_ops)))  # fmt: skip


def _twins(ops: tuple[FusedOp, ...]) -> Iterator[FusedOp]:
    for op in ops:
        if op.constructor != "gelu":
            continue
        if op.domain == "":
            yield replace(op, constructor=FORM, attributes=(("approximate", "tanh"),), flops_per_element=14.0)
        else:  # FastGelu was never seen to run in bfloat16 on CUDA (targets/ort.CUDA_BFLOAT16: only ops seen)
            yield replace(op, constructor=FORM, op="FastGelu", flops_per_element=14.0, dtypes=op.dtypes - {"bfloat16"})


def find(graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], target: TargetSpec) -> list[Region]:
    """Each ``Tanh`` no other kind holds whose argument is computed from one value ``x`` and whose result is
    raised by a constant and multiplied by ``x`` (a pooler's or a soft cap's tanh is not)."""
    if target.op_for(FORM) is None:
        return []

    def region_at(node: ir.Node, claimed: set[ir.Node]) -> Found | None:
        return _region(node, facts, claimed) if node.op_type == "Tanh" else None

    return anchored_regions(graph, claimed, region_at)


def _region(tanh: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> Found | None:
    argument, inputs = _argument(tanh, facts, claimed)
    if len(inputs) != 1:
        return None
    (x,) = inputs
    forward = activation_forward(tanh, x, facts, claimed)
    if not forward or forward[0].op_type != "Add" or not any(n.op_type == "Mul" for n in forward):
        return None
    members = {tanh, *argument, *forward}
    for n in forward:  # ½ · x multiplied in before the bracket
        for value in n.inputs:
            if value is not None and value is not x:
                members |= with_constant(value, ("Mul", "Div"), facts, claimed | members)
    return members, forward[-1].outputs[0]


def _argument(tanh: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> tuple[set[ir.Node], set[ir.Value]]:
    """The nodes computing tanh's argument (each read once, within the chain) and the computed values they
    start from: one, ``x``, for a GELU."""
    nodes: set[ir.Node] = set()
    inputs: set[ir.Value] = set()
    frontier = [(tanh.inputs[0], 0)]
    while frontier:
        value, depth = frontier.pop()
        if value is None or facts.const(value) is not None:
            continue
        node = value.producer()
        inner = node is not None and node not in claimed and node.domain in ("", "ai.onnx")
        if not inner or node.op_type not in _ARGUMENT_OPS or depth > _MAX_DEPTH or single_consumer(value) is None:
            inputs.add(value)  # read more than once (x: by the cube, the sum, the outer product) or computed elsewhere
            continue
        if node not in nodes:
            nodes.add(node)
            frontier.extend((v, depth + 1) for v in node.inputs)
    return nodes, inputs


def write(region: Region, writer: RegionWriter) -> RegionReport:
    """The region as its target's tanh GELU op, or kept with the first step the rules did not reach."""
    return write_one_op(region, writer, KIND.name, frozenset({FORM}), _why_not)


def _why_not(region: Region, writer: RegionWriter) -> str:
    """The first canonical term of :mod:`egfuse.rules.tanh_gelu` no e-class of the region's values holds, in
    the order the rules build the op."""
    g = writer.reader(region)
    if FORM in g.ops(region.main_output):
        return not_chosen(region, writer, [FORM])
    reached = set().union(*(g.ops(v) for n in region.nodes for v in n.outputs))
    steps = (  # each step's canonical terms (a factored polynomial skips gelu_tanh_poly), then what is missing
        ({"square", "cube"}, "tanh's argument holds no x³ (Pow(x, 3), x·x·x) nor x²"),
        (
            {"gelu_tanh_quad", "gelu_tanh_poly"},
            "x³ is not added to x with the coefficient 0.044715 (x + a·x³ or x·(1 + a·x²))",
        ),
        ({"gelu_tanh_arg"}, "the polynomial x + 0.044715·x³ is not multiplied by √(2/π)"),
        ({"gelu_tanh_cdf"}, "1 is not added to tanh(√(2/π)·(x + 0.044715·x³))"),
    )
    last = max((i for i, (forms, _) in enumerate(steps) if forms & reached), default=-1)
    if last + 1 < len(steps):
        return steps[last + 1][1]
    return "the bracket 1 + tanh(…) is not multiplied by x and ½ (in any order)"


KIND = RegionKind(name="tanh_gelu", report_list="layer_ops", find=find, write=write, offer=offer)

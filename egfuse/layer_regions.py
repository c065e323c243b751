"""The rest of a layer — norms and activations: regions found beside the attention regions, lowered into the
same e-graph, written after extraction and judged like attention.

* a **norm** region is the neighbourhood of a ``Sqrt`` whose input reduces with ``ReduceMean``: back to the
  input the means read, forward through the division and the per-feature scale and shift;
* a **GELU** region is the neighbourhood of an ``Erf``: its scaled input, forward through ``1 +``, the
  products with the input and with ½;
* a **residual norm** region (targets whose norm adds the residual) is a ``LayerNormalization`` op and the
  sum it normalizes, or a norm in primitive ops with its sum.

Regions are found structurally; the rules (:mod:`egfuse.rules.norms`, :mod:`egfuse.rules.gelu`) decide what
each computes, extraction chooses the target's op by cost, and a region whose written op differs from the
original on onnxruntime is put back alone.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from egfuse.facts import GraphFacts
from egfuse.regions import Region, _with_outputs, single_consumer
from egfuse.report import RegionReport, Status
from egfuse.session import EClass
from egfuse.targets.spec import LAYER_OPS, FusedOp

NORM_VOCABULARY = frozenset({"ReduceMean", "Sub", "Pow", "Mul", "Div", "Add", "Sqrt", "Reciprocal", "Cast"})
"""The ops a norm is spelled with."""
_MAX_DEPTH = 8
_NORM_FORWARD = frozenset({"Div", "Reciprocal", "Mul", "Add", "Cast"})
_GELU_FORWARD = frozenset({"Add", "Mul", "Div"})
_SCALES = ("Mul", "Div")


def find_layer_regions(
    graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], *, residual_norms: bool = False
) -> list[Region]:
    """The norm and GELU regions among the nodes no attention region holds (``claimed``), in graph order; with
    ``residual_norms`` (a target that adds the residual in its norm), each ``LayerNormalization`` of a sum too."""
    order = {node: i for i, node in enumerate(graph)}
    claimed = set(claimed)
    regions: list[Region] = []
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node in claimed:
            continue
        if node.op_type == "Sqrt":
            found = _norm(node, facts, claimed, residual_norms)
        elif node.op_type == "Erf":
            found = _gelu(node, facts, claimed)
        elif node.op_type == "LayerNormalization" and residual_norms:
            found = _residual_norm(node, facts, claimed)
        else:
            continue
        if found is None:
            continue
        members, main = found
        claimed |= members
        region = Region(index=len(regions), softmax=node, nodes=sorted(members, key=order.__getitem__))
        regions.append(_with_outputs(region, main))
    return regions


def _norm(
    sqrt: ir.Node, facts: GraphFacts, claimed: set[ir.Node], residual: bool = False
) -> tuple[set[ir.Node], ir.Value] | None:
    """A norm spelled in primitive ops around ``sqrt``; with ``residual``, the sum it normalizes too (a residual
    ``Add`` of two computed values, before the widening ``Cast`` of a half-precision model's norm)."""
    back = _backward(sqrt.inputs[0], claimed, facts)
    if not any(n.op_type == "ReduceMean" for n in back):
        return None
    forward = _forward(sqrt, facts, claimed, _NORM_FORWARD)
    members = back | {sqrt} | set(forward)
    for n in forward:
        for value in n.inputs:
            if value is not None:
                members |= _backward(value, claimed | members, facts)
    if residual:
        members |= _residual_sums(members, facts, claimed)
    return members, (forward[-1] if forward else sqrt).outputs[0]


def _residual_sums(members: set[ir.Node], facts: GraphFacts, claimed: set[ir.Node]) -> set[ir.Node]:
    """The residual sum a norm's members read: an ``Add`` of two computed values outside them."""
    sums = set()
    for node in members:
        for value in node.inputs:
            add = value.producer() if value is not None else None
            if add is None or add in members or add in claimed or add.op_type != "Add":
                continue
            if add.domain in ("", "ai.onnx") and all(v is not None and facts.const(v) is None for v in add.inputs):
                sums.add(add)
    return sums if len(sums) == 1 else set()


def _residual_norm(norm: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> tuple[set[ir.Node], ir.Value] | None:
    """A layer norm op whose input is the sum of two computed values (a residual)."""
    add = norm.inputs[0].producer() if norm.inputs[0] is not None else None
    if add is None or add in claimed or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    if any(v is None or facts.const(v) is not None for v in add.inputs):
        return None
    return {add, norm}, norm.outputs[0]


def _gelu(erf: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> tuple[set[ir.Node], ir.Value] | None:
    members = {erf} | _with_constant(erf.inputs[0], _SCALES, facts, claimed)
    for scaling in list(members - {erf}):  # the input's own bias (a projection's), which BiasGelu adds itself
        x = next(v for v in scaling.inputs if v is not None and facts.const(v) is None)
        members |= _with_constant(x, ("Add",), facts, claimed)
    forward = _forward(erf, facts, claimed, _GELU_FORWARD)
    if not forward:
        return None
    members |= set(forward)
    for n in forward:  # ½ · x multiplied in: a product of the input with a constant
        for value in n.inputs:
            if value is not None:
                members |= _with_constant(value, _SCALES, facts, claimed | members)
    return members, forward[-1].outputs[0]


def _with_constant(value: ir.Value, ops: tuple[str, ...], facts: GraphFacts, claimed: set[ir.Node]) -> set[ir.Node]:
    """``value``'s producer when it is one of ``ops`` with a constant operand (x / √2, ½ · x, a projection's
    bias), else nothing."""
    node = value.producer()
    if node is None or node in claimed or node.op_type not in ops or node.domain not in ("", "ai.onnx"):
        return set()
    return {node} if any(v is not None and facts.const(v) is not None for v in node.inputs) else set()


def _backward(start: ir.Value, claimed: set[ir.Node], facts: GraphFacts) -> set[ir.Node]:
    """Producers of ``start`` within the norm vocabulary, stopping at the value the means normalize and at
    residual sums (an ``Add`` of two computed values)."""
    found: set[ir.Node] = set()
    frontier = [(start, 0)]
    while frontier:
        value, depth = frontier.pop()
        node = value.producer()
        if node is None or node in found or node in claimed or depth > _MAX_DEPTH or _normalized_input(value):
            continue
        if node.op_type not in NORM_VOCABULARY or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Add" and not any(facts.const(v) is not None for v in node.inputs if v is not None):
            continue  # a residual sum: the input of the norm, not a step of it
        found.add(node)
        frontier.extend((v, depth + 1) for v in node.inputs if v is not None and facts.const(v) is None)
    return found


def _normalized_input(value: ir.Value) -> bool:
    """A value a mean reads that is not itself a square (the variance's): what the norm normalizes."""
    if not any(use.node.op_type == "ReduceMean" for use in value.uses()):
        return False
    producer = value.producer()
    if producer is None:
        return True
    if producer.op_type == "Pow":
        return False
    return not (producer.op_type == "Mul" and producer.inputs[0] is producer.inputs[1])


def _forward(start: ir.Node, facts: GraphFacts, claimed: set[ir.Node], ops: frozenset[str]) -> list[ir.Node]:
    """The chain of single readers after ``start`` among ``ops``, stopping at a sum with a computed value
    (a residual after the norm)."""
    chain: list[ir.Node] = []
    value = start.outputs[0]
    for _ in range(4):
        nxt = single_consumer(value)
        if nxt is None or nxt in claimed or nxt.op_type not in ops or nxt.domain not in ("", "ai.onnx"):
            break
        others = [v for v in nxt.inputs if v is not value]
        if nxt.op_type == "Add" and not all(v is not None and facts.const(v) is not None for v in others):
            break
        chain.append(nxt)
        value = nxt.outputs[0]
    return chain


def write_layer_regions(
    regions: list[Region],
    class_of: dict[ir.Value, EClass],
    choice: dict,
    excluded: dict,
    write: Callable[[Region], FusedOp],
    entries: list[RegionReport],
) -> set[tuple[str, int]]:
    """Each region written with its extracted form (``write(region)`` inserts the nodes and returns the op it
    wrote, or raises ValueError when the form cannot be written). Returns the (domain, opset) pairs used."""
    opsets: set[tuple[str, int]] = set()
    for region in regions:
        entry = RegionReport(region.index, region.name, Status.NOT_FUSED, output=region.main_output.name)
        entries.append(entry)
        main = class_of.get(region.main_output)
        chosen = choice[main].node if main is not None and main in choice else None
        if chosen is None or chosen.op not in LAYER_OPS:
            what = "norm" if region.softmax.op_type == "Sqrt" else "GELU"
            entry.reason = f"not a {what} the rules know (no fused term in the output's e-class)"
            continue
        if ("layer", region.index) in excluded:
            reason, diff = excluded["layer", region.index]
            entry.status, entry.reason, entry.max_abs_diff = Status.ROLLED_BACK, reason, diff
            continue
        try:
            written = write(region)
        except (ValueError, KeyError) as err:
            entry.reason = f"the fused form could not be written as ONNX: {err}"
            continue
        entry.status, entry.form, entry.fused_into = Status.FUSED, chosen.op, written.label
        opsets.add((written.domain, written.opset))
    return opsets

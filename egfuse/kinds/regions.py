"""Candidate attention regions: the neighbourhood of each last-axis Softmax.

A region is the set of nodes the rules may rewrite for one attention block: back from the softmax to the
Q/K/V projections, forward through the ``@ V`` MatMul and the output layout. Everything else stays out of
the e-graph, so one odd block cannot slow or break another, and a region that fails validation can be put
back alone. Regions are found structurally (no attention pattern is matched here): the rules decide later
whether a region really is attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.kinds.values import constant, is_weight, normalized

PIECES = frozenset({"Concat", "Slice", "Split", "Squeeze"})
"""Ops that also compute shapes (integer tensors); in a region only where they carry attention's floats: a KV
cache's split scores, Q/K/V split head by head."""
# Ops the rules reason about. A value produced by any other op enters the region as an opaque leaf.
VOCABULARY = PIECES | frozenset({
    "MatMul", "Transpose", "Reshape", "Mul", "Div", "Add", "Sub", "Where", "IsNaN", "Cast", "Sqrt", "Tanh", "Softmax",
    "Unsqueeze", "Expand",  # repeat_kv (GQA/MQA)
    "Einsum",  # tf2onnx writes projections and attention as Einsum
    "Max",  # OPT's clamp of the masked scores at finfo.min
    "Conv",  # 1×1 convolutions as projections on channel-first (B, C, S) tensors (SqueezeBERT)
    "Identity",  # torch's clone() in old dynamo exports
    "CastLike",  # torch 2.1: a Cast to the dtype of another value (lowered like Cast)
    "ReduceMax",  # the row max a stable softmax subtracts (gpt-oss)
})  # fmt: skip
# Reshape: 3D (B·N, S, T) probabilities; Dropout: the identity at inference (checked by is_inference_dropout);
# Expand: dynamo's batched MatMul expands P to the shape it has before folding it to 3D; Identity: clone();
# Squeeze/Unsqueeze/Transpose: tf2onnx's Einsum adds and removes unit axes around its MatMul, and moves them (a
# unit axis moved is a view); Mul: Keras zeroes masked probabilities after the softmax, as m·p or as
# m·p + (1 − m)·0 (whether the rules read them decides)
_FORWARD_GUARDS = frozenset({"Where", "IsNaN", "Cast", "CastLike", "Reshape", "Dropout", "Expand", "Identity",
                             "Squeeze", "Unsqueeze", "Transpose", "Mul", "Add"})  # fmt: skip
_FORWARD_LAYOUT = frozenset({"Transpose", "Reshape", "Squeeze"})  # a unit axis put in starts the next op's layout
_MAX_BACKWARD_DEPTH = 16  # dynamo 2.1–2.4 adds Expand → Reshape before each MatMul; softcap, casts, repeat_kv add more


@dataclass
class Region:
    """The nodes one fused op may replace, found from its anchor (an attention region's Softmax, a norm's Sqrt,
    a GELU's Erf, a rotation's rotate): what is lowered into the e-graph and written over, or kept, as one."""

    index: int
    anchor: ir.Node
    nodes: list[ir.Node] = field(default_factory=list)  # in graph order
    outputs: list[ir.Value] = field(default_factory=list)  # values used outside the region
    main_output: ir.Value | None = None

    @property
    def name(self) -> str:
        return self.anchor.name or f"{self.anchor.op_type.lower()}_{self.index}"


def single_consumer(value: ir.Value) -> ir.Node | None:
    users = {use.node for use in value.uses()}
    if len(users) != 1 or value.is_graph_output():
        return None
    return next(iter(users))


def is_inference_dropout(node: ir.Node, facts: GraphFacts | None = None) -> bool:
    """A Dropout that passes its input through: no ``training_mode`` input (or a constant false one: an
    initializer, a ``Constant`` node — what functions hold after inlining — or a value ``facts`` computed)
    and no reader of its mask output. Exporters leave these behind with ratio 0 or in eval mode; the ratio
    input does not matter then."""
    if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
        return False
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        flag = constant(training, facts)
        if flag is None or bool(flag.any()):
            return False
    return len(node.outputs) < 2 or not (node.outputs[1].uses() or node.outputs[1].is_graph_output())


def reads_type_only(node: ir.Node, value: ir.Value) -> bool:
    """``node`` needs only ``value``'s shape or dtype, not its elements: no step of attention's data flow."""
    return node.op_type in ("Shape", "Size") or (
        node.op_type == "CastLike" and len(node.inputs) == 2 and node.inputs[0] is not value
    )


def _forward(softmax: ir.Node, facts: GraphFacts | None = None) -> list[ir.Node]:
    """Softmax → (guard / cast)* → MatMul(·, V) → (Transpose / Reshape)*."""
    chain: list[ir.Node] = []
    value = softmax.outputs[0]
    for _ in range(8):
        # A Shape reading the probabilities only needs their shape (TorchScript's reshape bookkeeping), a
        # CastLike taking them as its "like" operand only their dtype (torch 2.1's masked_fill casts its fill so).
        # Users in a nested graph (an If branch reading the probabilities) are not steps of this graph's flow.
        users = [
            use.node for use in value.uses() if not reads_type_only(use.node, value) and use.node.graph is softmax.graph
        ]
        matmuls = [n for n in users if n.op_type in ("MatMul", "Einsum") and value in n.inputs]
        if len(matmuls) == 1 and len(users) == 1:
            chain.append(matmuls[0])
            break
        split_score = _split_score(value, users)
        if split_score:
            chain.extend(split_score)
            break
        if len(users) == 1 and users[0].op_type == "Slice" and users[0].inputs[0] is value:
            chain.append(users[0])  # one piece kept (gpt-oss cuts its sinks' column off): the rules read the cut
            value = users[0].outputs[0]
            continue
        # The IsNaN guard reads the probabilities twice (IsNaN(p) and Where(…, p)).
        guards = [
            n
            for n in users
            if n.op_type in _FORWARD_GUARDS and (n.op_type != "Dropout" or is_inference_dropout(n, facts))
        ]
        wheres = [n for n in guards if n.op_type == "Where"]
        if len(guards) != len(users) or not guards:
            return chain
        if wheres:
            isnan = [n for n in guards if n.op_type == "IsNaN"]
            chain.extend(isnan + wheres[:1])
            value = wheres[0].outputs[0]
        else:
            chain.append(guards[0])
            value = guards[0].outputs[0]
    if not chain or chain[-1].op_type not in ("MatMul", "Einsum", "Add"):
        return chain
    value = chain[-1].outputs[0]
    for _ in range(5):  # tf2onnx's grouped einsum: Reshape → Squeeze → Transpose → Reshape, then the heads merged
        nxt = single_consumer(value)
        if nxt is None or nxt.op_type not in _FORWARD_LAYOUT or nxt.inputs[0] is not value:
            break
        chain.append(nxt)
        value = nxt.outputs[0]
    return chain


def _is_float(value: ir.Value) -> bool:
    return value.dtype is not None and value.dtype.is_floating_point()


def _split_score(value: ir.Value, users: list[ir.Node]) -> list[ir.Node]:
    """Probabilities cut into pieces (a KV cache's split-score form: over the cache and over the new keys), each
    piece times its values, the products added: those nodes, or none where the probabilities go elsewhere."""
    if len(users) < 2 or any(n.op_type != "Slice" or n.inputs[0] is not value for n in users):
        return []
    products = [single_consumer(n.outputs[0]) for n in users]
    pairs = zip(products, users, strict=True)
    if any(m is None or m.op_type != "MatMul" or m.inputs[0] is not s.outputs[0] for m, s in pairs):
        return []
    adds: list[ir.Node] = []
    pending = {m.outputs[0] for m in products}
    while len(pending) > 1:  # the sum, as a chain or a tree of binary Adds
        ready = [(v, single_consumer(v)) for v in pending]
        add = next((a for v, a in ready if a is not None and a.op_type == "Add" and set(a.inputs) <= pending), None)
        if add is None:
            return []
        adds.append(add)
        pending = (pending - set(add.inputs)) | {add.outputs[0]}
    return [*users, *products, *adds]


def _backward(starts: list[ir.Value], claimed: set[ir.Node]) -> set[ir.Node]:
    """Producers of ``starts`` within the vocabulary, stopping at projections (their input is a leaf)."""
    found: set[ir.Node] = set()
    frontier = [(v, 0) for v in starts]
    while frontier:
        value, depth = frontier.pop()
        node = value.producer()
        if node is None or node in found or node in claimed or depth > _MAX_BACKWARD_DEPTH:
            continue
        if node.op_type not in VOCABULARY or node.domain not in ("", "ai.onnx") or node.op_type == "Softmax":
            continue
        if node.op_type in PIECES and not _is_float(node.outputs[0]):
            continue
        if normalized(value):
            continue  # a Q/K norm's output (Flux, SD3, Qwen3): the block starts there, the norm is a region of its own
        found.add(node)
        if node.op_type in ("MatMul", "Einsum", "Conv") and len(node.inputs) > 1 and is_weight(node.inputs[1]):
            continue  # a projection: its activation input is where the block starts
        for inp in node.inputs:
            if inp is not None:
                frontier.append((inp, depth + 1))
    return found


def find_regions(graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node] | None = None) -> list[Region]:
    """One region per Softmax; nodes already ``claimed`` (a rotation's) stay outside every region."""
    order = {node: i for i, node in enumerate(graph)}
    regions: list[Region] = []
    claimed = set(claimed or ())
    for node in graph:
        if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
            continue
        forward = _forward(node, facts)
        starts = [node.inputs[0]]
        for n in forward:
            starts.extend(v for v in n.inputs if v is not None and v.producer() not in forward)
        members = _backward(starts, claimed) | {node} | set(forward)
        members -= claimed
        members &= order.keys()  # a node of a nested graph (an If branch) is never a member
        claimed |= members
        region = Region(index=len(regions), anchor=node, nodes=sorted(members, key=order.__getitem__))
        tail = forward[-1] if forward else node
        regions.append(_with_outputs(region, tail.outputs[0]))
    return _joined_heads(regions, order)


def _joined_heads(regions: list[Region], order: dict[ir.Node, int]) -> list[Region]:
    """Attention written head by head (single-head attention): the regions whose outputs are joined by one
    Concat (each maybe through an Unsqueeze) become one region with it, so the rules see the heads joined."""
    by_output = {r.main_output: r for r in regions}
    merged: dict[int, Region] = {}
    gone: set[int] = set()
    for node in list(order):
        if node.op_type != "Concat" or len(node.inputs) < 2:
            continue
        parts, extra = [], [node]
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.op_type == "Unsqueeze" and single_consumer(value) is node:
                extra.append(producer)
                value = producer.inputs[0]
            region = by_output.get(value)
            if region is None or region.index in gone or single_consumer(value) not in (node, extra[-1]):
                break
            parts.append(region)
        else:
            first = parts[0]
            nodes = {n for r in parts for n in r.nodes} | set(extra)
            joined = Region(index=first.index, anchor=first.anchor, nodes=sorted(nodes, key=order.__getitem__))
            gone.update(r.index for r in parts)
            merged[first.index] = _with_outputs(joined, node.outputs[0])
    kept = [merged.get(r.index, r) for r in regions if r.index not in gone or r.index in merged]
    for i, region in enumerate(kept):
        region.index = i
    return kept


Found = tuple[set[ir.Node], ir.Value]
"""A region's nodes and its main output, as a kind's finder gives them."""


def anchored_regions(
    graph: ir.Graph, claimed: set[ir.Node], region_at: Callable[[ir.Node, set[ir.Node]], Found | None]
) -> list[Region]:
    """One region per anchor, in graph order: ``region_at`` gives a default-domain node no region holds yet its
    region (or None: not an anchor), and that region's nodes are held before the next anchor is tried.
    ``claimed`` (what kinds found before hold) is left as it was."""
    order = {node: i for i, node in enumerate(graph)}
    claimed = set(claimed)
    regions: list[Region] = []
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node in claimed:
            continue
        found = region_at(node, claimed)
        if found is None:
            continue
        members, main = found
        claimed |= members
        region = Region(index=len(regions), anchor=node, nodes=sorted(members, key=order.__getitem__))
        regions.append(_with_outputs(region, main))
    return regions


def _with_outputs(region: Region, main_output: ir.Value) -> Region:
    """``region`` with the values it must keep producing: those read outside it, and its main output."""
    region.outputs = _escaping_values(region.nodes)
    region.main_output = main_output
    if main_output not in region.outputs:
        region.outputs.append(main_output)
    return region


def _escaping_values(nodes: list[ir.Node]) -> list[ir.Value]:
    inside = set(nodes)
    out = []
    for node in nodes:
        for value in node.outputs:
            if value.is_graph_output() or any(use.node not in inside for use in value.uses()):
                out.append(value)
    return out

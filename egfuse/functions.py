"""Model-local functions: inline what fusion has to see, keep the rest as the exporter wrote it.

torch's dynamo exporter of 2023–2024 (``torch.onnx.dynamo_export``) writes every module as an ONNX function:
the main graph is one node calling the model's function and attention lives two or three calls deep. The
regions and rules see one graph, so functions are inlined first (onnx-ir's ``InlinePass``). Each node of a
function body is tagged with the function it came from (node metadata survives inlining, the innermost
function's tag winning) and the tags are read back as a map from the inlined node's (unique) name — names,
unlike metadata, survive onnx's version converter —, so after fusion the functions that held a fused region
are known, and a second inlining can keep every other function as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse import protos

if TYPE_CHECKING:
    from egfuse.facts import GraphFacts

FUNCTION_TAG = "egfuse.function"
"""Node metadata key: the ``domain::name`` of the model-local function a node was inlined from."""


def function_label(op_id: ir.OperatorIdentifier) -> str:
    domain, name, overload = op_id
    return f"{domain}::{name}" + (f":{overload}" if overload else "")


def calls_local_functions(proto: onnx.ModelProto) -> bool:
    """The main graph calls a function the model defines (anything else leaves the regions nothing to lose)."""
    local = {(f.domain, f.name) for f in proto.functions}
    return bool(local) and any((n.domain, n.op_type) in local for n in proto.graph.node)


@dataclass
class Inlined:
    """A model with some of its functions inlined, and what was done."""

    proto: onnx.ModelProto
    inlined: list[str] = field(default_factory=list)  # labels of the functions inlined
    kept: list[str] = field(default_factory=list)  # labels of the functions left as functions
    origins: dict[str, str] = field(default_factory=dict)  # inlined node name → label of its function


def inline(proto: onnx.ModelProto, only: set[str] | None = None) -> Inlined:
    """Inline the model-local functions (all of them, or those labelled in ``only`` and every function that
    calls one of them: a call left in place would hide the inlined body again). Nodes are tagged first."""
    model = ir.serde.deserialize_model(proto)
    for op_id, function in model.functions.items():
        label = function_label(op_id)
        for node in function:
            node.metadata_props.setdefault(FUNCTION_TAG, label)
    labels = {function_label(op_id): op_id for op_id in model.functions}
    chosen = set(labels) if only is None else callers_closure(model, only & set(labels))
    ir_passes.InlinePass(criteria=lambda f: function_label(f.identifier()) in chosen)(model)
    kept = sorted(function_label(op_id) for op_id in model.functions)
    inlined = sorted(set(labels) - set(kept))
    origins: dict[str, str] = {}
    # Tags are bookkeeping for this module: read back, then removed from the graph and the kept functions.
    for node in model.graph.all_nodes():
        label = node.metadata_props.pop(FUNCTION_TAG, None)
        if label and node.name:
            origins[node.name] = label
    for function in model.functions.values():
        for node in function:
            node.metadata_props.pop(FUNCTION_TAG, None)
    proto = ir.serde.serialize_model(model)
    if inlined:
        retype_contradicted_hints(proto)
    return Inlined(proto, inlined, kept, origins)


def retype_contradicted_hints(proto: onnx.ModelProto) -> list[str]:
    """Replace each declared value type (``value_info``) that ONNX type inference contradicts — another dtype,
    rank or size than its producer computes — by the inferred one; returns the names retyped.

    Exporters type the values inside functions too (torch 2.4's dynamo exporter writes ``function/value``
    entries in the main graph's ``value_info``) and inlining carries those types onto the inlined values. Some
    are wrong: torch 2.4 types BERT's ``expand`` — the token-type ids expanded, int64 — as the float
    (B, 1, S, S) mask, a name two of its values share. onnxruntime ignores types inside functions, so the model
    loads, but refuses the inlined graph (``Type (tensor(float)) of output arg (expand) ... does not match``).
    Sizes too: the same function types its ``size_1`` as 4 entries where its producer gives 2. A hint is not the
    computation: where the two disagree (dtype, rank or a known size) the op wins, and hints that agree stay (they carry
    the exporter's symbolic dim names)."""
    probe = protos.inference_probe(proto)
    del probe.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # inference refuses the graph: nothing to weigh the hints against
        return []
    computed = {v.name: v for v in inferred.graph.value_info}
    retyped: list[str] = []
    for info in proto.graph.value_info:
        other = computed.get(info.name)
        if other is None or not info.type.HasField("tensor_type") or not other.type.HasField("tensor_type"):
            continue
        declared, found = info.type.tensor_type, other.type.tensor_type
        dtype_differs = declared.elem_type and found.elem_type and declared.elem_type != found.elem_type
        shape_differs = (
            declared.HasField("shape")
            and found.HasField("shape")
            and (
                len(declared.shape.dim) != len(found.shape.dim)
                or any(
                    a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
                    for a, b in zip(declared.shape.dim, found.shape.dim, strict=True)
                )
            )
        )
        if dtype_differs or shape_differs:
            info.type.CopyFrom(other.type)
            retyped.append(info.name)
    return retyped


def callers_closure(model: ir.Model, labels: Iterable[str]) -> set[str]:
    """``labels`` and every function that (transitively) calls one of them."""
    callers: dict[str, set[str]] = {}
    for op_id, function in model.functions.items():
        for node in function:
            if node.op_identifier() in model.functions:
                callers.setdefault(function_label(node.op_identifier()), set()).add(function_label(op_id))
    out, stack = set(), list(labels)
    while stack:
        label = stack.pop()
        if label not in out:
            out.add(label)
            stack.extend(callers.get(label, ()))
    return out


def origin(nodes: Iterable[ir.Node], origins: dict[str, str] | None) -> list[str]:
    """The functions the given (inlined) nodes came from, in first-seen order."""
    if not origins:
        return []
    seen: dict[str, None] = {}
    for node in nodes:
        label = origins.get(node.name or "")
        if label:
            seen.setdefault(label, None)
    return list(seen)


def softmaxes_in_subgraphs(proto: onnx.ModelProto) -> list[str]:
    """Softmax nodes no region can cover: inside If/Loop/Scan bodies, or in functions left as functions.
    Returned as "where: node name" strings for the report."""
    found: list[str] = []

    def walk(graph: onnx.GraphProto, where: str, top: bool) -> None:
        for node in graph.node:
            if node.op_type == "Softmax" and not top:
                found.append(f"{where}: {node.name or node.output[0]}")
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, f"{node.op_type} {node.name!r} body", False)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g, f"{node.op_type} {node.name!r} body", False)

    walk(proto.graph, "main graph", True)
    called = {(n.domain, n.op_type) for n in proto.graph.node}
    for function in proto.functions:
        for node in function.node:
            called.add((node.domain, node.op_type))
    for function in proto.functions:
        if (function.domain, function.name) not in called:
            continue
        where = f"function {function.domain}::{function.name}"
        for node in function.node:
            if node.op_type == "Softmax":
                found.append(f"{where}: {node.name or node.output[0]}")
    return found


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


def concat_sequences(graph: ir.Graph) -> int:
    """Replace ``ConcatFromSequence(SequenceConstruct(a, b, …), axis)`` (no new axis) by ``Concat(a, b, …, axis)``:
    torch 2.1's dynamo exporter writes ``torch.cat`` so (RoPE's rotate_half, a partial rotation's putback), and
    the two are the same tensor. Returns how many were replaced."""
    replaced = 0
    for node in list(graph):
        if node.op_type != "ConcatFromSequence" or node.domain not in ("", "ai.onnx"):
            continue
        attr = node.attributes.get("new_axis")
        seq = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
        if (attr is not None and attr.value) or seq is None or seq.op_type != "SequenceConstruct":
            continue
        axis = ir.AttrInt64("axis", node.attributes["axis"].value)
        concat = ir.Node("", "Concat", list(seq.inputs), attributes=[axis], name=node.name)
        concat.outputs[0].dtype = node.outputs[0].dtype
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[concat],
            old_values=node.outputs,
            new_values=concat.outputs,
        )
        replaced += 1
        if not seq.outputs[0].uses():  # left read by nothing: its inputs' readers are the Concat's alone again
            graph.remove(seq, safe=True)
    return replaced


def split_sequence_items(graph: ir.Graph, facts: GraphFacts) -> int:
    """Replace ``SequenceAt(SplitToSequence(x, split, axis), i)`` (known split and i ≥ 0) by the ``Slice`` of x it
    is; returns how many were replaced.

    torch 2.4's dynamo exporter writes ``torch.split`` so (GPT-2's fused QKV projection, ``c_attn(x).split(n,
    dim=2)``): the regions must see Q, K and V as slices of one tensor, as TorchScript's ``Split`` gives them.
    Item i of a split by sizes ``s`` is ``x[sum(s[:i]) : sum(s[:i+1])]`` along the axis; of a split by one size
    ``n`` it is ``x[i·n : (i+1)·n]`` (Slice clips the last, shorter chunk as the split does)."""
    replaced = 0
    for node in list(graph):
        if node.op_type != "SequenceAt" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        split_node = node.inputs[0].producer() if node.inputs[0] is not None else None
        index = facts.const(node.inputs[1])
        if split_node is None or split_node.op_type != "SplitToSequence" or index is None or index.size != 1:
            continue
        i = int(index.reshape(-1)[0])
        sizes = facts.const(split_node.inputs[1]) if len(split_node.inputs) > 1 else None
        if i < 0 or sizes is None or sizes.ndim > 1:
            continue  # a negative index needs the count; no split input means unit chunks squeezed
        if sizes.ndim == 0:
            start, end = i * int(sizes), (i + 1) * int(sizes)
        elif i < sizes.size:
            start, end = int(sizes[:i].sum()), int(sizes[: i + 1].sum())
        else:
            continue
        axis = int(split_node.attributes["axis"].value) if "axis" in split_node.attributes else 0

        named = ((start, "start"), (end, "end"), (axis, "axis"))
        starts, ends, axes = (_constant(np.array([v], np.int64), f"{node.name}_{label}") for v, label in named)
        slice_ = ir.Node(
            "",
            "Slice",
            [split_node.inputs[0], starts.outputs[0], ends.outputs[0], axes.outputs[0]],
            name=node.name,
        )
        slice_.outputs[0].dtype = split_node.inputs[0].dtype
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[starts, ends, axes, slice_],
            old_values=node.outputs,
            new_values=slice_.outputs,
        )
        replaced += 1
        if not split_node.outputs[0].uses():
            graph.remove(split_node, safe=True)
    return replaced


def _constant(value: np.ndarray, name: str) -> ir.Node:
    """A ``Constant`` node holding ``value``: a folded literal, a Slice's starts/ends/axes."""
    return ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(value))], name=name)


_LITERAL_ARITHMETIC = frozenset(
    {"Cast", "Reshape", "Add", "Sub", "Mul", "Div", "Neg", "Squeeze", "Unsqueeze", "Concat", "Identity"}
)


def fold_literal_arithmetic(graph: ir.Graph, facts: GraphFacts) -> int:
    """Replace integer arithmetic on literals (``Constant`` outputs, initializers, or results of such arithmetic)
    by ``Constant`` nodes of its value; returns how many nodes were replaced.

    torchlib functions of torch 2.1–2.2 pass their attributes as inputs and reshape them in the body:
    ``Slice(Shape(x), Reshape(Constant(1), [1]), Reshape(Add(Constant(1), 1), [1]))`` for ``x.size(1)``,
    ``Unsqueeze(x, Cast(Constant(1)))``. ONNX shape inference reads an input's value only where it is a
    literal, so after inlining it loses every rank downstream (LLaMA's causal mask: ``Expand(fill, size)`` of
    unknown rank, then ``Slice`` of ``?``), and the regions with it. The values are the same; only integers
    (sizes, axes, indices) are folded — float arithmetic is the model's own computation."""
    literal = {v for v in graph.initializers.values()}
    folded = 0
    for node in list(graph):
        outputs = list(node.outputs)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            literal.update(outputs)
            continue
        if node.op_type not in _LITERAL_ARITHMETIC or node.domain not in ("", "ai.onnx") or len(outputs) != 1:
            continue
        if not node.inputs or any(v is not None and v not in literal for v in node.inputs):
            continue
        value = facts.const(outputs[0])
        if value is None or not np.issubdtype(value.dtype, np.integer):
            continue
        constant = _constant(value, node.name)
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[constant],
            old_values=outputs,
            new_values=constant.outputs,
        )
        literal.add(constant.outputs[0])
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

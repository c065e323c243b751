"""Model-local functions: inline what fusion has to see, keep the rest as the exporter wrote it.

torch's dynamo exporter of 2023–2024 (``torch.onnx.dynamo_export``) writes every module as an ONNX function:
the main graph is one node calling the model's function and attention lives two or three calls deep. The
regions and rules see one graph, so functions are inlined first (onnx-ir's ``InlinePass``). Each node of a
function body is tagged with the function it came from (node metadata survives inlining, the innermost
function's tag winning) and the tags are read back as a map from the inlined node's (unique) name — names,
unlike metadata, survive onnx's version converter —, so after fusion the functions that held a fused region
are known, and a second inlining can keep every other function as it was.

What the old exporter's inlined bodies spell in ways the regions cannot read is undone elsewhere, one habit a
module (:mod:`egfuse.preparation.if_folding`, :mod:`egfuse.preparation.literal_folding`,
:mod:`egfuse.preparation.sequences`), which the search runs after inlining.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse.files import protos

__all__ = [
    "FUNCTION_TAG",
    "Inlined",
    "callers_closure",
    "calls_local_functions",
    "function_label",
    "inline",
    "origin",
    "retype_contradicted_hints",
    "softmaxes_in_subgraphs",
]

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

"""Shape reads of fused-away values: ``Shape(x)`` of a value only a ``Shape`` still reads is rebuilt from the
shapes of values the model computes anyway, so the work that made ``x`` can go.

After a region is written, its interior (scores, softmax, probabilities) is dead unless something still reads
it. Exporters that lower with dynamic dims (tf2onnx's Einsum lowering, batched-3D MatMuls) compute reshape
targets as ``Shape(probabilities)``: the fused model was correct but still computed the scores and softmax
for their shape alone. A shape is known symbolically (:meth:`egfuse.analysis.facts.GraphFacts.shape`); each of its dims
is a number or a symbol that some surviving value also carries on an axis, and ``Shape(v)[a:a+1]`` reads it
there at run time. Where a dim has no such source the read is left alone — the model stays correct, only
slower — and validation runs on the whole rewritten model as always.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim
from egfuse.analysis.facts import GraphFacts
from egfuse.writing.node_builder import NodeBuilder


def rewrite_dead_shape_reads(graph: ir.Graph, facts: GraphFacts, opset: int) -> int:
    """Rebuild every ``Shape`` read of a value that nothing but ``Shape`` reads; returns how many were."""
    if any(_has_subgraph(node) for node in graph):
        return 0  # values read inside a branch are not followed here: leave such graphs as they are
    live = _live_ignoring_shape_reads(graph)
    outputs = set(graph.outputs)
    reads = [
        n for n in graph if n in live and _is_shape_read(n) and _dead(n.inputs[0], live) and n.outputs[0] not in outputs
    ]
    rewritten = 0
    for read in reads:
        builder = NodeBuilder(graph, f"egfuse/shape_of/{read.name or 'Shape'}", opset)
        sources = _sources(graph, facts, live, read)
        value = _rebuilt(read, facts, sources, builder)
        if value is None:
            continue
        graph.insert_before(read, builder.new_nodes)
        read.outputs[0].replace_all_uses_with(value)
        rewritten += 1
    return rewritten


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def _is_shape_read(node: ir.Node) -> bool:
    is_shape = node.domain in ("", "ai.onnx") and node.op_type == "Shape"
    return is_shape and bool(node.inputs) and node.inputs[0] is not None


def _live_ignoring_shape_reads(graph: ir.Graph) -> set[ir.Node]:
    """The nodes the outputs need when a ``Shape`` read does not keep its input's producer alive."""
    live: set[ir.Node] = set()
    stack = [v.producer() for v in graph.outputs if v.producer() is not None]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        if _is_shape_read(node):
            continue
        stack.extend(v.producer() for v in node.inputs if v is not None and v.producer() is not None)
    return live


def _dead(value: ir.Value, live: set[ir.Node]) -> bool:
    producer = value.producer()
    return producer is not None and producer not in live


def _downstream(read: ir.Node) -> set[ir.Node]:
    """Nodes computed from ``read``: a dim read from them would make a cycle."""
    seen: set[ir.Node] = set()
    stack = [read]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(use.node for out in node.outputs for use in out.uses())
    return seen


def _sources(graph: ir.Graph, facts: GraphFacts, live: set[ir.Node], read: ir.Node) -> dict[Dim, tuple[ir.Value, int]]:
    """Each symbolic dim a surviving value carries, and where to read it: graph inputs first (read before
    anything runs), then values the outputs need anyway, never one computed from ``read`` itself."""
    after = _downstream(read)
    candidates = list(graph.inputs) + [
        out for node in graph if node in live and node not in after and not _is_shape_read(node) for out in node.outputs
    ]
    found: dict[Dim, tuple[ir.Value, int]] = {}
    for value in candidates:
        for axis, dim in enumerate(facts.shape(value) or ()):
            if dim is not None and dim.syms and not dim.invented and dim not in found:
                found[dim] = (value, axis)
    return found


def _rebuilt(
    read: ir.Node, facts: GraphFacts, sources: dict[Dim, tuple[ir.Value, int]], builder: NodeBuilder
) -> ir.Value | None:
    """``read``'s result from numbers and dims of surviving values, or ``None`` where a dim has no source."""
    shape = facts.shape(read.inputs[0])
    if shape is None:
        return None
    start, end = (read.attributes[k].value if k in read.attributes else None for k in ("start", "end"))
    parts = []
    for dim in shape[slice(start, end)]:
        if dim is None or dim.invented:
            return None
        if not dim.syms:
            parts.append(builder.const(np.array([dim.coef], np.int64), "dim"))
        elif dim in sources:
            value, axis = sources[dim]
            parts.append(builder.shape(value, axis, axis + 1))
        else:
            return None
    if not parts:
        return builder.const(np.zeros((0,), np.int64), "no_dims")
    whole = parts[0] if len(parts) == 1 else builder.node("Concat", parts, {"axis": 0})
    whole.dtype, whole.shape = ir.DataType.INT64, ir.Shape([len(parts)])
    return whole

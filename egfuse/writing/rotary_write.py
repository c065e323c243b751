"""Writing an extracted ``rotary`` e-node as one standard ``RotaryEmbedding`` (the ``rotary`` writer).

The rules (:mod:`egfuse.rules.rotary`) proved the tables repeat what the op reads; what only shapes can say is
checked here, where a failed check means the op cannot be written (a ValueError: the region keeps its ops and
the report says why). onnxruntime's kernel refuses tables whose length or width is not x's, so a table the
graph broadcast against x can never silently differ.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim
from egfuse.egraph.enodes import view
from egfuse.egraph.session import ENode
from egfuse.targets.spec import FusedOp
from egfuse.writing.emitter_protocol import EmitterProtocol

HEADS_FIRST, SEQ_FIRST = 1, 2
"""The axis of x's heads: the op's 4D form (B, N, S, H), or (B, S, N, H), written as its 3D form."""


def rotary(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    r = view(node)
    x, cos, sin = e.value(r.x), e.value(r.cos), e.value(r.sin)
    heads_axis, interleaved, width = int(r.heads_axis), bool(int(r.interleaved)), int(r.rotary_dim)
    x_shape = e.facts.shape(x) if x not in e.created else None
    x_shape = x_shape or e.shapes.get(r.x)  # an x written here (DeepSeek's features de-interleaved)
    if x_shape is None or len(x_shape) != 4 or x_shape[-1] is None or x_shape[-1].static is None:
        raise ValueError("the rotated tensor is not a 4D tensor with a known head size")
    head_size = x_shape[-1].static
    dtype = np.dtype(x.dtype.numpy()).name if x.dtype is not None else "unknown"
    if dtype not in op.dtypes:
        raise ValueError(f"onnxruntime has no RotaryEmbedding kernel for {dtype}")
    expand = False
    tables = []
    for table, cid, name in ((cos, r.cos, "cos"), (sin, r.sin, "sin")):
        shape = e.facts.shape(table) if table not in e.created else None
        shape = shape or e.shapes.get(cid)  # a table written here (its cos taken after the heads axis was added)
        if shape is not None and len(shape) == 2:  # (S, width), broadcast over the batch: (1, S, width) for the op
            table = e.node("Unsqueeze", [table, e.const(np.array([0], np.int64), "batch_axis")], like=table)
            shape = (Dim(1), *shape)
        expand |= _check_table(table, shape, name, x, x_shape, width, heads_axis, interleaved)
        tables.append(table)
    cos, sin = tables
    if not interleaved:  # the op reads the first of the two equal halves
        bounds = [e.const(np.array([v], np.int64), "half") for v in (0, width // 2, -1)]
        cos, sin = (e.node("Slice", [t, *bounds], like=t) for t in (cos, sin))
    if expand:  # the graph broadcast a table's batch of 1 against x's; the op wants x's
        batch = e.node("Shape", [x], {"start": 0, "end": 1})
        target = e.node("Concat", [batch, e.const(np.array([1, 1], np.int64), "ones")], {"axis": 0})
        cos, sin = (e.node("Expand", [t, target], like=t) for t in (cos, sin))
    attrs: dict[str, object] = {"interleaved": 1} if interleaved else {}
    if width != head_size:
        attrs["rotary_embedding_dim"] = width
    if heads_axis == HEADS_FIRST:
        out = e.node("RotaryEmbedding", [x, cos, sin], attrs, like=x)
    else:  # (B, S, N, H): the op's 3D form on the merged heads (views, no copies), then split again
        heads = x_shape[2].static if x_shape[2] is not None else None
        if heads is None:
            raise ValueError("the number of heads is not known statically")
        merged = e.node("Reshape", [x, e.const(np.array([0, 0, -1], np.int64), "shape")], like=x)
        rotated = e.node("RotaryEmbedding", [merged, cos, sin], {**attrs, "num_heads": heads}, like=x)
        out = e.node("Reshape", [rotated, e.node("Shape", [x])], like=x)
    out.shape = x.shape
    return out


def _check_table(
    table: ir.Value,
    shape: tuple | None,
    name: str,
    x: ir.Value,
    x_shape: tuple,
    width: int,
    heads_axis: int,
    interleaved: bool,
) -> bool:
    """Raises where the op cannot read ``table`` (of ``shape``); returns whether its batch must be expanded to
    x's."""
    if shape is None or len(shape) != 3:
        raise ValueError(f"the {name} table's shape is not known to be (batch, seq, width)")
    if table.dtype != x.dtype:
        raise ValueError(f"the {name} table and x have different element types")
    if not same_dim(shape[2], Dim(width // 2 if interleaved else width)):
        raise ValueError(f"the {name} table does not have the rotated width")
    if not same_dim(shape[1], x_shape[2 if heads_axis == HEADS_FIRST else 1]):
        raise ValueError(f"the {name} table's sequence length is not provably x's")
    # Expanding to x's batch is right whether the table's is B or 1, so it is written unless they are provably equal.
    return shape[0] is None or shape[0] != x_shape[0]


def same_dim(table: Dim | None, x: Dim | None) -> bool:
    """Equal dims, or a dim shape inference invented against one that is not 1: the graph multiplies the two,
    which is legal only where they are equal or one is 1, and onnxruntime's RotaryEmbedding refuses tables
    whose length or width is not x's (measured; the width is in the op's definition), so the op can never
    silently differ."""
    if table is None or x is None:
        return False
    return table == x or ((table.invented or x.invented) and Dim(1) not in (table, x))

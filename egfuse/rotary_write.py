"""Writing a proven rotation as one ``RotaryEmbedding`` node in place of its ops."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.facts import GraphFacts
from egfuse.node_builder import NodeBuilder, replace_output
from egfuse.rotary import Rotation
from egfuse.rotary_tables import HEADS_FIRST


class RotaryWriter:
    """Writes ``RotaryEmbedding`` nodes; a table's first half is sliced once and shared by every layer."""

    def __init__(self, graph: ir.Graph, facts: GraphFacts) -> None:
        self.graph, self.facts = graph, facts
        self.build = NodeBuilder(graph, "egfuse/rope")
        self._halves: dict[ir.Value, ir.Value] = {}

    def write(self, rotation: Rotation, at: ir.Node) -> None:
        r, b = rotation, self.build
        cos, sin = (t if r.interleaved else self._half(t, r.rotary_dim) for t in (r.cos, r.sin))
        if r.expand_batch:
            batch = b.node("Shape", [r.x], {"start": 0, "end": 1})
            target = b.node("Concat", [batch, b.const(np.array([1, 1], np.int64))], {"axis": 0})
            cos, sin = (b.node("Expand", [t, target]) for t in (cos, sin))
        attrs: dict[str, object] = {"interleaved": 1} if r.interleaved else {}
        if r.rotary_dim != r.head_size:
            attrs["rotary_embedding_dim"] = r.rotary_dim
        if r.heads_axis == HEADS_FIRST:  # the op's 4D form is (B, N, S, H)
            out = b.node("RotaryEmbedding", [r.x, cos, sin], attrs)
        else:  # (B, S, N, H): the op's 3D form on the merged heads (views, no copies), then split again
            merged = b.node("Reshape", [r.x, b.const(np.array([0, 0, -1], np.int64))])
            rotated = b.node("RotaryEmbedding", [merged, cos, sin], {**attrs, "num_heads": r.heads})
            out = b.node("Reshape", [rotated, b.node("Shape", [r.x])])
        out.dtype, out.shape = r.output.dtype, r.output.shape
        self.graph.insert_before(at, b.take_nodes())
        self.facts.carry_over(r.output, out)  # the attention regions read its shape next
        replace_output(self.graph, r.output, out, fresh=True)

    def _half(self, table: ir.Value, width: int) -> ir.Value:
        if table not in self._halves:
            bounds = [self.build.const(np.array([b], np.int64)) for b in (0, width // 2, -1)]
            self._halves[table] = self.build.node("Slice", [table, *bounds])
        return self._halves[table]

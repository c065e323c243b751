"""Rotary position embeddings (RoPE): find them, prove them, write one ``RotaryEmbedding`` op for each.

Exporters spell rotate-half RoPE as ``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = [−x₂, x₁]`` (the two
halves of the rotated width R swapped, the first negated) and ``cos``/``sin`` tables of width R; partial RoPE
rotates the first R of H features and concatenates the rest back unchanged. The op computes
``[x₁·c − x₂·s, x₂·c + x₁·s]`` from tables ``c``, ``s`` of width R/2, so the two agree exactly when the
graph's tables repeat their first half — ``cos = f(Concat(θ, θ))`` for an elementwise ``f``. That is proven
here from the graph (or from the values, for a stored table), never assumed; the op then reads the tables'
first halves.

A rotation is found from its one unmistakable node, the ``Concat(Neg(x₂), x₁)`` of ``rotate_half``; every
check after that says in the report why it failed. Rotations stay out of the attention e-graph: their output
is an ordinary value to the attention regions, so a rotation that is not fused never blocks attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim
from egfuse.facts import GraphFacts
from egfuse.raise_ import replace_output

# Ops through which a table keeps "second half equals first half" along its last axis.
_ELEMENTWISE = frozenset({"Cos", "Sin", "Cast", "Identity", "Neg"})
_MAX_TABLE_DEPTH = 8


class NoMatch(Exception):
    """Why a candidate is not a rotation this module can fuse (the message goes to the report)."""


@dataclass
class Rotation:
    """A proven rotate-half RoPE on ``x`` of shape (B, N, S, H)."""

    x: ir.Value
    output: ir.Value  # the value the rotation computes (the Add, or the Concat that puts back x[..., R:])
    cos: ir.Value  # (b, S, R) tables whose halves are proven equal; b is B or 1
    sin: ir.Value
    rotary_dim: int  # R
    head_size: int  # H
    expand_batch: bool  # the tables have batch 1 and x may not: onnxruntime wants them expanded to B

    @property
    def variant(self) -> str:
        if self.rotary_dim == self.head_size:
            return "rotate-half"
        return f"rotate-half, partial ({self.rotary_dim} of {self.head_size} features)"


@dataclass
class Candidate:
    index: int
    anchor: ir.Node  # the rotate_half Concat
    rotation: Rotation | None
    reason: str | None  # why ``rotation`` is None

    @property
    def output_name(self) -> str:
        value = self.rotation.output if self.rotation else self.anchor.outputs[0]
        return value.name or ""


def find_rotations(graph: ir.Graph, facts: GraphFacts) -> list[Candidate]:
    found: list[Candidate] = []
    for node in graph:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or not _is_rotate_half(node):
            continue
        try:
            rotation, reason = _match(node, facts), None
        except NoMatch as why:
            rotation, reason = None, str(why)
        found.append(Candidate(len(found), node, rotation, reason))
    return found


def _is_rotate_half(concat: ir.Node) -> bool:
    """``Concat(Neg(Slice(x)), Slice(x))``: the shape of rotate_half, before any proof."""
    if len(concat.inputs) != 2:
        return False
    neg, first = (v.producer() if v is not None else None for v in concat.inputs)
    if neg is None or first is None or neg.op_type != "Neg" or first.op_type != "Slice":
        return False
    second = neg.inputs[0].producer() if neg.inputs[0] is not None else None
    return second is not None and second.op_type == "Slice" and second.inputs[0] is first.inputs[0]


def _match(concat: ir.Node, facts: GraphFacts) -> Rotation:
    neg = concat.inputs[0].producer()
    first_slice = concat.inputs[1].producer()
    second_slice = neg.inputs[0].producer()
    xr = first_slice.inputs[0]
    shape = facts.shape(xr)
    if shape is None or len(shape) != 4:
        raise NoMatch("the rotated tensor is not known to be 4D (B, N, S, H)")
    width = shape[-1].static if shape[-1] is not None else None
    if width is None or width % 2:
        raise NoMatch("the rotated width is not a known even number")
    if _axis(concat.attributes, 4) != 3:
        raise NoMatch("rotate_half does not concatenate along the last axis")
    half = width // 2
    if _slice_range(first_slice, facts, width) != (0, half) or _slice_range(second_slice, facts, width) != (
        half,
        width,
    ):
        raise NoMatch("the swapped halves are not x[..., :R/2] and x[..., R/2:]")
    rotated = concat.outputs[0]
    mul_sin = _only_consumer(rotated, "Mul")
    sin4 = _other_input(mul_sin, rotated)
    add = _only_consumer(mul_sin.outputs[0], "Add")
    mul_cos = _other_input(add, mul_sin.outputs[0]).producer()
    if mul_cos is None or mul_cos.op_type != "Mul" or xr not in mul_cos.inputs:
        raise NoMatch("the rotation's other term is not x · cos")
    cos4 = _other_input(mul_cos, xr)
    x, output, head = xr, add.outputs[0], width
    source = first_slice.inputs[0].producer()
    if source is not None and source.op_type == "Slice":  # partial: x[..., :R] rotated, x[..., R:] kept
        x = source.inputs[0]
        x_shape = facts.shape(x)
        head = x_shape[-1].static if x_shape and len(x_shape) == 4 and x_shape[-1] is not None else None
        if head is None or _slice_range(source, facts, head) != (0, width):
            raise NoMatch("the rotated part is not x[..., :R] of a 4D x with a known head size")
        putback = _only_consumer(output, "Concat")
        kept = putback.inputs[1].producer() if len(putback.inputs) == 2 and putback.inputs[0] is output else None
        if (
            kept is None
            or kept.op_type != "Slice"
            or kept.inputs[0] is not x
            or _slice_range(kept, facts, head) != (width, head)
            or _axis(putback.attributes, 4) != 3
        ):
            raise NoMatch("the rotated part is not concatenated back with x[..., R:]")
        output = putback.outputs[0]
    cos, cos_batch = _table(cos4, x, width, facts, "cos")
    sin, sin_batch = _table(sin4, x, width, facts, "sin")
    if not (x.dtype == cos.dtype == sin.dtype):
        raise NoMatch("the cos/sin tables and x have different element types")
    return Rotation(x, output, cos, sin, width, head, expand_batch=cos_batch or sin_batch)


def _table(table4: ir.Value, x: ir.Value, width: int, facts: GraphFacts, name: str) -> tuple[ir.Value, bool]:
    """The (b, S, R) table behind the (b, 1, S, R) multiplier, and whether b must be expanded to x's batch."""
    node = table4.producer()
    axes = facts.const(node.inputs[1]) if node is not None and node.op_type == "Unsqueeze" else None
    if axes is None or [int(a) % 4 for a in np.ravel(axes)] != [1]:
        raise NoMatch(f"the {name} table is not a (batch, seq, R) table unsqueezed at the head axis")
    table = node.inputs[0]
    t_shape, x_shape = facts.shape(table), facts.shape(x)
    if t_shape is None or len(t_shape) != 3 or x_shape is None:
        raise NoMatch(f"the {name} table's shape is not known to be (batch, seq, R)")
    if t_shape[2] != Dim(width):
        raise NoMatch(f"the {name} table is not {width} wide")
    if not _same_length(t_shape[1], x_shape[2]):
        raise NoMatch(f"the {name} table's sequence length is not provably x's")
    if t_shape[0] is not None and t_shape[0] == x_shape[0]:
        expand = False
    elif t_shape[0] == Dim(1):
        expand = True
    else:
        raise NoMatch(f"the {name} table's batch is neither 1 nor x's")
    why = _repeated_halves(table, facts, _MAX_TABLE_DEPTH)
    if why is not None:
        raise NoMatch(f"the {name} table's halves are not provably equal ({why})")
    return table, expand


def _same_length(table: Dim | None, x: Dim | None) -> bool:
    """Equal dims, or a dim shape inference invented against one that is not 1: the graph multiplies the two,
    which is legal only where they are equal or one is 1, and onnxruntime's RotaryEmbedding refuses tables
    whose length is not x's (measured), so the op can never silently differ."""
    if table is None or x is None:
        return False
    return table == x or ((table.invented or x.invented) and Dim(1) not in (table, x))


def _repeated_halves(value: ir.Value, facts: GraphFacts, depth: int) -> str | None:
    """None when ``value[..., R/2:] == value[..., :R/2]`` is proven: it is ``f(Concat(t, t))`` along the last
    axis for an elementwise ``f`` (a scalar factor included), a Gather of rows of such a table, or a constant
    with equal halves. Otherwise why not."""
    stored = facts.weight(value)
    if stored is not None:
        half = stored.shape[-1] // 2
        same = stored.shape[-1] % 2 == 0 and np.array_equal(stored[..., :half], stored[..., half:])
        return None if same else "a stored table whose halves differ"
    node = value.producer()
    if node is None or depth == 0:
        return "an input of the graph" if node is None else "too deep"
    rank = len(value.shape) if value.shape is not None else None
    op = node.op_type
    if op == "Concat" and len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]:
        return None if rank is not None and _axis(node.attributes, rank) == rank - 1 else "concatenated elsewhere"
    if op in _ELEMENTWISE:
        return _repeated_halves(node.inputs[0], facts, depth - 1)
    if op in ("Mul", "Div") and len(node.inputs) == 2:
        if facts.scalar(node.inputs[1]) is not None:
            return _repeated_halves(node.inputs[0], facts, depth - 1)
        if op == "Mul" and facts.scalar(node.inputs[0]) is not None:
            return _repeated_halves(node.inputs[1], facts, depth - 1)
    if op == "Gather" and rank is not None and _axis(node.attributes, rank, default=0) != rank - 1:
        return _repeated_halves(node.inputs[0], facts, depth - 1)  # rows of a table (cos_cached[position_ids])
    return f"it comes from {op}"


def _slice_range(node: ir.Node, facts: GraphFacts, dim: int) -> tuple[int, int] | None:
    """The [start, end) a last-axis, step-1 Slice takes of a ``dim``-wide axis, clamped as ONNX does."""
    ins = [facts.const(v) if v is not None else None for v in node.inputs[1:]]
    if len(ins) < 3 or ins[0] is None or ins[1] is None or ins[2] is None or ins[0].size != 1:
        return None
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 4
    if int(np.ravel(ins[2])[0]) % rank != rank - 1:
        return None
    if len(ins) > 3 and ins[3] is not None and int(np.ravel(ins[3])[0]) != 1:
        return None

    def clamp(i: int) -> int:
        return min(max(i + dim if i < 0 else i, 0), dim)

    return clamp(int(np.ravel(ins[0])[0])), clamp(int(np.ravel(ins[1])[0]))


def _axis(attributes, rank: int, default: int | None = None) -> int | None:
    attr = attributes.get("axis")
    axis = default if attr is None else attr.value
    return None if axis is None else int(axis) % rank


def _only_consumer(value: ir.Value, op: str) -> ir.Node:
    users = {use.node for use in value.uses()}
    if len(users) != 1 or value.is_graph_output():
        raise NoMatch(f"{value.name} is read by more than the rotation's {op}")
    node = next(iter(users))
    if node.op_type != op or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"{value.name} goes to {node.op_type}, not the rotation's {op}")
    return node


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value:
    others = [v for v in node.inputs if v is not value]
    if len(node.inputs) != 2 or len(others) != 1 or others[0] is None:
        raise NoMatch(f"{node.op_type} {node.name} is not a product or sum of two terms")
    return others[0]


class RotaryWriter:
    """Writes ``RotaryEmbedding`` nodes; the tables' first halves are sliced once and shared by every layer."""

    def __init__(self, graph: ir.Graph, facts: GraphFacts) -> None:
        self.graph, self.facts = graph, facts
        self._halves: dict[tuple[ir.Value, int], ir.Value] = {}
        self._count = 0

    def write(self, rotation: Rotation, at: ir.Node) -> None:
        nodes: list[ir.Node] = []
        cos = self._half(rotation.cos, rotation.rotary_dim, nodes)
        sin = self._half(rotation.sin, rotation.rotary_dim, nodes)
        if rotation.expand_batch:
            batch = self._node("Shape", [rotation.x], nodes, start=0, end=1)
            ones = self._const(np.array([1, 1], np.int64), nodes)
            target = self._node("Concat", [batch, ones], nodes, axis=0)
            cos, sin = (self._node("Expand", [t, target], nodes) for t in (cos, sin))
        attrs = {"rotary_embedding_dim": rotation.rotary_dim} if rotation.rotary_dim != rotation.head_size else {}
        out = self._node("RotaryEmbedding", [rotation.x, cos, sin], nodes, **attrs)
        out.dtype, out.shape = rotation.output.dtype, rotation.output.shape
        self.graph.insert_before(at, nodes)
        self.facts.carry_over(rotation.output, out)  # the attention regions read its shape next
        replace_output(self.graph, rotation.output, out, fresh=True)

    def _half(self, table: ir.Value, width: int, nodes: list[ir.Node]) -> ir.Value:
        key = (table, width)
        if key not in self._halves:
            bounds = [self._const(np.array([b], np.int64), nodes) for b in (0, width // 2, -1)]
            self._halves[key] = self._node("Slice", [table, *bounds], nodes)
        return self._halves[key]

    def _const(self, array: np.ndarray, nodes: list[ir.Node]) -> ir.Value:
        return self._node("Constant", [], nodes, value=ir.tensor(array, name=self._name("const")))

    def _node(self, op: str, inputs: list[ir.Value], nodes: list[ir.Node], **attrs: object) -> ir.Value:
        node = ir.Node("", op, inputs, attributes=ir.convenience.convert_attributes(attrs), name=self._name(op))
        node.outputs[0].name = f"{node.name}/out"
        nodes.append(node)
        return node.outputs[0]

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"egfuse/rope/{hint}_{self._count}"

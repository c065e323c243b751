"""Rotary position embeddings (RoPE): find them, prove them, write one ``RotaryEmbedding`` op for each.

Exporters spell RoPE as ``x·cos + rotate(x)·sin`` on the first R of H features of each head (R = H, or
partial: the rest concatenated back unchanged), in one of two pairings of the features:

- rotate-half (Llama): ``rotate(x) = [−x₂, x₁]`` for the two halves of x, with tables of width R that must
  repeat their halves — ``cos = f(Concat(θ, θ))`` for an elementwise ``f``;
- interleaved (GPT-J): ``rotate(x)`` pairs features (2i, 2i+1) into ``(−x₂ᵢ₊₁, x₂ᵢ)`` (``Slice`` with step 2,
  stacked and flattened), with tables whose features come in equal adjacent pairs — ``repeat_interleave(c, 2)``
  (a size-1 axis broadcast to 2 and merged into the last).

The op computes ``[x₁·c − x₂·s, x₂·c + x₁·s]`` from tables ``c``, ``s`` of width R/2, in the same pairing, so
the two agree exactly when the tables have that repeated structure. That is proven here from the graph (or
from the values, for a stored table), never assumed; the op then reads the half-width tables. x is
(B, N, S, H) (tables unsqueezed at axis 1: the op's 4D form) or (B, S, N, H) (tables unsqueezed at axis 2: the
op's 3D form, on x with its heads merged).

A rotation is found from its one unmistakable node, the ``Concat`` that puts ``Neg`` in front; every check
after that says in the report why it failed. Rotations stay out of the attention e-graph: their output is an
ordinary value to the attention regions, so a rotation that is not fused never blocks attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim
from egfuse.facts import GraphFacts
from egfuse.raise_ import NodeBuilder, replace_output
from egfuse.regions import single_consumer

# Ops through which a table keeps "second half equals first half" along its last axis.
_ELEMENTWISE = frozenset({"Cos", "Sin", "Cast", "Identity", "Neg"})
_MAX_TABLE_DEPTH = 8
_HEADS_FIRST, _SEQ_FIRST = 1, 2  # the axis of x's heads, where the tables are unsqueezed


class NoMatch(Exception):
    """Why a candidate is not a rotation this module can fuse (the message goes to the report)."""


@dataclass
class Rotation:
    """A proven RoPE on a 4D ``x``: (B, N, S, H) when ``heads_axis`` is 1, (B, S, N, H) when it is 2."""

    x: ir.Value
    output: ir.Value  # the value the rotation computes (the Add, or the Concat that puts back x[..., R:])
    cos: ir.Value  # (b, S, R/2) tables (interleaved), or (b, S, R) whose first half the op reads; b is B or 1
    sin: ir.Value
    rotary_dim: int  # R
    head_size: int  # H
    heads: int  # N
    heads_axis: int
    interleaved: bool
    expand_batch: bool  # the tables' batch may be 1 where x's is not: onnxruntime wants them expanded to B

    @property
    def variant(self) -> str:
        kind = "interleaved" if self.interleaved else "rotate-half"
        if self.rotary_dim == self.head_size:
            return kind
        return f"{kind}, partial ({self.rotary_dim} of {self.head_size} features)"


@dataclass
class Candidate:
    index: int
    anchor: ir.Node  # the node whose output is rotate(x)
    rotation: Rotation | None
    reason: str | None  # why ``rotation`` is None

    @property
    def output_name(self) -> str:
        value = self.rotation.output if self.rotation else self.anchor.outputs[0]
        return value.name or ""


def find_rotations(graph: ir.Graph, facts: GraphFacts) -> list[Candidate]:
    found: list[Candidate] = []
    for node in graph:
        spelling = _spelling(node)
        if spelling is None:
            continue
        anchor = node
        try:
            if spelling == "interleaved":  # the stacked pairs are flattened by the Reshape that reads them
                # (a Shape may read them too: TorchScript computes the flattened shape from them)
                users = [use.node for use in node.outputs[0].uses() if use.node.op_type != "Shape"]
                if len(users) != 1 or users[0].op_type != "Reshape":
                    raise NoMatch("the stacked pairs are not flattened by one Reshape")
                anchor = users[0]
            rotation, reason = _match(node, anchor, spelling == "interleaved", facts), None
        except NoMatch as why:
            rotation, reason = None, str(why)
        found.append(Candidate(len(found), anchor, rotation, reason))
    return found


def _spelling(concat: ir.Node) -> str | None:
    """``Concat(Neg(Slice(x)), Slice(x))`` is rotate-half; the same with an ``Unsqueeze`` on each side is
    interleaved — the shape of a rotation, before any proof."""
    if concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") or len(concat.inputs) != 2:
        return None
    first, second = (_producer(v) for v in concat.inputs)
    spelling = "rotate-half"
    if first is not None and second is not None and first.op_type == second.op_type == "Unsqueeze":
        first, second, spelling = _producer(first.inputs[0]), _producer(second.inputs[0]), "interleaved"
    if first is None or second is None or first.op_type != "Neg" or second.op_type != "Slice":
        return None
    negated = _producer(first.inputs[0])
    if negated is None or negated.op_type != "Slice" or negated.inputs[0] is not second.inputs[0]:
        return None
    return spelling


def _producer(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def _match(concat: ir.Node, anchor: ir.Node, interleaved: bool, facts: GraphFacts) -> Rotation:
    neg, kept_part = (_producer(v) for v in concat.inputs)
    if interleaved:
        neg, kept_part = _producer(neg.inputs[0]), _producer(kept_part.inputs[0])
    negated_part = _producer(neg.inputs[0])
    xr = kept_part.inputs[0]
    shape = facts.shape(xr)
    if shape is None or len(shape) != 4:
        raise NoMatch("the rotated tensor is not known to be 4D")
    width = shape[-1].static if shape[-1] is not None else None
    if width is None or width % 2:
        raise NoMatch("the rotated width is not a known even number")
    half = width // 2
    if interleaved:
        _check_interleaved(concat, anchor, kept_part, negated_part, xr, width, facts)
    else:
        if _axis(concat.attributes, 4) != 3:
            raise NoMatch("rotate_half does not concatenate along the last axis")
        if _slice_range(kept_part, facts, width) != (0, half, 1) or _slice_range(negated_part, facts, width) != (
            half,
            width,
            1,
        ):
            raise NoMatch("the swapped halves are not x[..., :R/2] and x[..., R/2:]")
    rotated = anchor.outputs[0]
    mul_sin = _only_consumer(rotated, "Mul")
    sin4 = _other_input(mul_sin, rotated)
    add = _only_consumer(mul_sin.outputs[0], "Add")
    mul_cos = _other_input(add, mul_sin.outputs[0]).producer()
    if mul_cos is None or mul_cos.op_type != "Mul" or xr not in mul_cos.inputs:
        raise NoMatch("the rotation's other term is not x · cos")
    cos4 = _other_input(mul_cos, xr)
    x, output, head = xr, add.outputs[0], width
    source = _producer(xr)
    if source is not None and source.op_type == "Slice":  # partial: x[..., :R] rotated, x[..., R:] kept
        x = source.inputs[0]
        x_shape = facts.shape(x)
        head = x_shape[-1].static if x_shape and len(x_shape) == 4 and x_shape[-1] is not None else None
        if head is None or _slice_range(source, facts, head) != (0, width, 1):
            raise NoMatch("the rotated part is not x[..., :R] of a 4D x with a known head size")
        putback = _only_consumer(output, "Concat")
        kept = _producer(putback.inputs[1]) if len(putback.inputs) == 2 and putback.inputs[0] is output else None
        if (
            kept is None
            or kept.op_type != "Slice"
            or kept.inputs[0] is not x
            or _slice_range(kept, facts, head) != (width, head, 1)
            or _axis(putback.attributes, 4) != 3
        ):
            raise NoMatch("the rotated part is not concatenated back with x[..., R:]")
        output = putback.outputs[0]
    cos, heads_axis, cos_batch = _table(cos4, x, width, interleaved, facts, "cos")
    sin, sin_heads_axis, sin_batch = _table(sin4, x, width, interleaved, facts, "sin")
    if heads_axis != sin_heads_axis:
        raise NoMatch("the cos and sin tables are unsqueezed at different axes")
    heads = facts.shape(x)[heads_axis]
    if heads is None or heads.static is None:
        raise NoMatch("the number of heads is not known statically")
    if not (x.dtype == cos.dtype == sin.dtype):
        raise NoMatch("the cos/sin tables and x have different element types")
    return Rotation(x, output, cos, sin, width, head, heads.static, heads_axis, interleaved, cos_batch or sin_batch)


def _check_interleaved(
    concat: ir.Node, reshape: ir.Node, even: ir.Node, odd: ir.Node, xr: ir.Value, width: int, facts: GraphFacts
) -> None:
    """``Reshape(Concat(Unsqueeze(−x[..., 1::2], -1), Unsqueeze(x[..., 0::2], -1), axis=-1))`` back to x's
    shape: the pairs (−x₂ᵢ₊₁, x₂ᵢ) flattened in order."""
    if _slice_range(even, facts, width) != (0, width, 2) or _slice_range(odd, facts, width) != (1, width, 2):
        raise NoMatch("the paired features are not x[..., 0::2] and x[..., 1::2]")
    for unsqueeze in (_producer(v) for v in concat.inputs):
        axes = facts.const(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
        if axes is None or [int(a) % 5 for a in np.ravel(axes)] != [4]:
            raise NoMatch("the pairs are not stacked on a new last axis")
    if _axis(concat.attributes, 5) != 4:
        raise NoMatch("the pairs are not stacked on a new last axis")
    if facts.shape(reshape.outputs[0]) != facts.shape(xr) or facts.shape(xr) is None:
        raise NoMatch("the stacked pairs are not flattened back to x's shape")


def _table(
    table4: ir.Value, x: ir.Value, width: int, interleaved: bool, facts: GraphFacts, name: str
) -> tuple[ir.Value, int, bool]:
    """The (b, S, R/2) table the op reads for the 4D multiplier ``table4``, the axis of x's heads (where
    the table is unsqueezed), and whether b must be expanded to x's batch."""
    if interleaved:
        table, heads_axis = _pairs_source(table4, facts, name)
    else:
        node = table4.producer()
        axes = facts.const(node.inputs[1]) if node is not None and node.op_type == "Unsqueeze" else None
        heads_axis = _single_axis(axes, 4)
        if heads_axis not in (_HEADS_FIRST, _SEQ_FIRST):
            raise NoMatch(f"the {name} table is not a (batch, seq, R) table unsqueezed at a head axis")
        table = node.inputs[0]
    t_shape, x_shape = facts.shape(table), facts.shape(x)
    seq_axis = 2 if heads_axis == _HEADS_FIRST else 1
    if t_shape is None or len(t_shape) != 3 or x_shape is None:
        raise NoMatch(f"the {name} table's shape is not known to be (batch, seq, R)")
    if not _same_dim(t_shape[2], Dim(width // 2 if interleaved else width)):
        raise NoMatch(f"the {name} table does not have the rotated width")
    if not _same_dim(t_shape[1], x_shape[seq_axis]):
        raise NoMatch(f"the {name} table's sequence length is not provably x's")
    # The graph broadcasts the table's batch (B or 1) against x's; the op wants B. Expand to x's batch is
    # right either way, so it is written unless the two are provably the same dim.
    expand = t_shape[0] is None or t_shape[0] != x_shape[0]
    if interleaved:
        return table, heads_axis, expand
    why = _repeated_halves(table, facts, _MAX_TABLE_DEPTH)
    if why is not None:
        raise NoMatch(f"the {name} table's halves are not provably equal ({why})")
    return table, heads_axis, expand


def _pairs_source(table4: ir.Value, facts: GraphFacts, name: str) -> tuple[ir.Value, int]:
    """For ``repeat_interleave(t, 2)`` unsqueezed at a head axis — ``Reshape(Expand|Tile(Unsqueeze(t)))``
    merging a broadcast pair axis into the last — the (b, S, R/2) table ``t`` and the head axis."""
    reshape = table4.producer()
    spread = _producer(reshape.inputs[0]) if reshape is not None and reshape.op_type == "Reshape" else None
    if spread is None or spread.op_type not in ("Expand", "Tile"):
        raise NoMatch(f"the {name} table is not repeat_interleave(t, 2) (Reshape of an Expand or Tile)")
    pairs, merged = facts.shape(spread.outputs[0]), facts.shape(table4)
    if (
        pairs is None
        or merged is None
        or len(pairs) != 5
        or len(merged) != 4
        or pairs[4] != Dim(2)
        or pairs[:3] != merged[:3]
        or pairs[3] is None
        or merged[3] != pairs[3] * Dim(2)
    ):
        raise NoMatch(f"the {name} table's Reshape does not merge a pair axis into the last")
    if spread.op_type == "Tile":
        repeats = facts.const(spread.inputs[1])
        if repeats is None or [int(r) for r in np.ravel(repeats)] != [1, 1, 1, 1, 2]:
            raise NoMatch(f"the {name} table's Tile repeats more than the pair axis")
    unsqueeze = _producer(spread.inputs[0])
    axes = facts.const(unsqueeze.inputs[1]) if unsqueeze is not None and unsqueeze.op_type == "Unsqueeze" else None
    axes = None if axes is None else sorted(int(a) % 5 for a in np.ravel(axes))
    if not axes or axes[-1] != 4 or facts.shape(unsqueeze.outputs[0]) is None:
        raise NoMatch(f"the {name} table's pair axis is not a new size-1 axis (Unsqueeze)")
    if facts.shape(unsqueeze.outputs[0])[4] != Dim(1):
        raise NoMatch(f"the {name} table's pair axis is not of size 1 before it is spread")
    source = unsqueeze.inputs[0]
    if axes[:-1]:  # Unsqueeze(t, [head, 4]) in one node
        heads_axis = _single_axis(np.array(axes[:-1]), 4)
    else:  # Unsqueeze(Unsqueeze(t, head), 4)
        inner = _producer(source)
        inner_axes = facts.const(inner.inputs[1]) if inner is not None and inner.op_type == "Unsqueeze" else None
        heads_axis, source = _single_axis(inner_axes, 4), inner.inputs[0] if inner is not None else source
    if heads_axis not in (_HEADS_FIRST, _SEQ_FIRST):
        raise NoMatch(f"the {name} table is not unsqueezed at a head axis")
    return source, heads_axis


def _single_axis(axes: np.ndarray | None, rank: int) -> int | None:
    flat = [] if axes is None else [int(a) % rank for a in np.ravel(axes)]
    return flat[0] if len(flat) == 1 else None


def _same_dim(table: Dim | None, x: Dim | None) -> bool:
    """Equal dims, or a dim shape inference invented against one that is not 1: the graph multiplies the two,
    which is legal only where they are equal or one is 1, and onnxruntime's RotaryEmbedding refuses tables
    whose length or width is not x's (measured; the width is in the op's definition), so the op can never
    silently differ."""
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


def _slice_range(node: ir.Node, facts: GraphFacts, dim: int) -> tuple[int, int, int] | None:
    """The [start, end) and step a last-axis Slice takes of a ``dim``-wide axis, clamped as ONNX does."""
    ins = [facts.const(v) if v is not None else None for v in node.inputs[1:]]
    if len(ins) < 3 or ins[0] is None or ins[1] is None or ins[2] is None or ins[0].size != 1:
        return None
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 4
    if int(np.ravel(ins[2])[0]) % rank != rank - 1:
        return None
    step = 1
    if len(ins) > 3 and ins[3] is not None:
        step = int(np.ravel(ins[3])[0])
    if step < 1:
        return None

    def clamp(i: int) -> int:
        return min(max(i + dim if i < 0 else i, 0), dim)

    return clamp(int(np.ravel(ins[0])[0])), clamp(int(np.ravel(ins[1])[0])), step


def _axis(attributes, rank: int, default: int | None = None) -> int | None:
    attr = attributes.get("axis")
    axis = default if attr is None else attr.value
    return None if axis is None else int(axis) % rank


def _only_consumer(value: ir.Value, op: str) -> ir.Node:
    node = single_consumer(value)
    if node is None:
        raise NoMatch(f"{value.name} is read by more than the rotation's {op}")
    if node.op_type != op or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"{value.name} goes to {node.op_type}, not the rotation's {op}")
    return node


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value:
    others = [v for v in node.inputs if v is not value]
    if len(node.inputs) != 2 or len(others) != 1 or others[0] is None:
        raise NoMatch(f"{node.op_type} {node.name} is not a product or sum of two terms")
    return others[0]


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
        if r.heads_axis == _HEADS_FIRST:  # the op's 4D form is (B, N, S, H)
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

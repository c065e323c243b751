"""The structural check's view of a rotation's cos/sin tables (:mod:`egfuse.rotary_check`): which table the
op would read and whether it has the structure ``RotaryEmbedding`` assumes — rotate-half tables whose halves
are equal (``f(Concat(θ, θ))``, rows of such a table, a stored table with equal halves), interleaved tables
that repeat each feature twice (``repeat_interleave(t, 2)``). The rules prove the same as facts
(:mod:`egfuse.rules.rotary`); this names what is missing when they do not."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim
from egfuse.facts import GraphFacts

_ELEMENTWISE = frozenset({"Cos", "Sin", "Cast", "Identity", "Neg"})
"""Ops through which a table keeps "second half equals first half" along its last axis."""
_MAX_TABLE_DEPTH = 8
HEADS_FIRST, SEQ_FIRST = 1, 2  # the axis of x's heads, where the tables are unsqueezed


class NoMatch(Exception):
    """Why a candidate is not a rotation this module can fuse (the message goes to the report)."""


def producer(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def axis_of(attributes, rank: int, default: int | None = None) -> int | None:
    attr = attributes.get("axis")
    axis = default if attr is None else attr.value
    return None if axis is None else int(axis) % rank


def table_for(
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
        if heads_axis not in (HEADS_FIRST, SEQ_FIRST):
            raise NoMatch(f"the {name} table is not a (batch, seq, R) table unsqueezed at a head axis")
        table = node.inputs[0]
    t_shape, x_shape = facts.shape(table), facts.shape(x)
    seq_axis = 2 if heads_axis == HEADS_FIRST else 1
    if t_shape is None or len(t_shape) != 3 or x_shape is None:
        raise NoMatch(f"the {name} table's shape is not known to be (batch, seq, R)")
    if not same_dim(t_shape[2], Dim(width // 2 if interleaved else width)):
        raise NoMatch(f"the {name} table does not have the rotated width")
    if not same_dim(t_shape[1], x_shape[seq_axis]):
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
    spread = producer(reshape.inputs[0]) if reshape is not None and reshape.op_type == "Reshape" else None
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
    unsqueeze = producer(spread.inputs[0])
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
        inner = producer(source)
        inner_axes = facts.const(inner.inputs[1]) if inner is not None and inner.op_type == "Unsqueeze" else None
        heads_axis, source = _single_axis(inner_axes, 4), inner.inputs[0] if inner is not None else source
    if heads_axis not in (HEADS_FIRST, SEQ_FIRST):
        raise NoMatch(f"the {name} table is not unsqueezed at a head axis")
    return source, heads_axis


def _single_axis(axes: np.ndarray | None, rank: int) -> int | None:
    flat = [] if axes is None else [int(a) % rank for a in np.ravel(axes)]
    return flat[0] if len(flat) == 1 else None


def same_dim(table: Dim | None, x: Dim | None) -> bool:
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
        return None if rank is not None and axis_of(node.attributes, rank) == rank - 1 else "concatenated elsewhere"
    if op in _ELEMENTWISE:
        return _repeated_halves(node.inputs[0], facts, depth - 1)
    if op in ("Mul", "Div") and len(node.inputs) == 2:
        if facts.scalar(node.inputs[1]) is not None:
            return _repeated_halves(node.inputs[0], facts, depth - 1)
        if op == "Mul" and facts.scalar(node.inputs[0]) is not None:
            return _repeated_halves(node.inputs[1], facts, depth - 1)
    if op == "Gather" and rank is not None and axis_of(node.attributes, rank, default=0) != rank - 1:
        return _repeated_halves(node.inputs[0], facts, depth - 1)  # rows of a table (cos_cached[position_ids])
    if op == "Slice" and rank is not None and len(node.inputs) > 3 and node.inputs[3] is not None:
        axes = facts.const(node.inputs[3])  # rows cut (cos_cached[:seq_len]): the last axis untouched
        if axes is not None and all(int(a) % rank != rank - 1 for a in np.ravel(axes)):
            return _repeated_halves(node.inputs[0], facts, depth - 1)
    return f"it comes from {op}"

"""The shape of every e-class, symbolic: what the cost model prices and what raising needs to split heads.

An e-class holding a graph value has that value's shape (:class:`egfuse.analysis.facts.GraphFacts`); a term the rules
built gets its shape from its constructor's meaning (``split_heads(x, N, H)`` is x's shape with its last dim
split into (N, H), ``mha`` returns (B, S, N·Hv) …: :mod:`egfuse.egraph.term_shapes`), computed to a fixpoint over the
e-graph. Dims stay symbolic (:class:`egfuse.analysis.dims.Dim`); :func:`bind` turns them into numbers for a given shape
binding.
"""

from __future__ import annotations

from collections.abc import Mapping

from egfuse.analysis.dims import Dim, evaluate
from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.enodes import value_index
from egfuse.egraph.session import EClass, ENode
from egfuse.egraph.term_shapes import term_shape
from egfuse.lowering.lower import Lowered

Shape = tuple[Dim | None, ...]

_MAX_PASSES = 8


def class_shapes(classes: Mapping[EClass, list[ENode]], lowered: Lowered, facts: GraphFacts) -> dict[EClass, Shape]:
    """Each e-class's shape where some member's meaning gives it (a class with none is absent)."""
    shapes: dict[EClass, Shape] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            if value_index(node) is not None:
                shape = _value_shape(lowered.values[value_index(node)], facts)
                if shape is not None:
                    shapes[cid] = tuple(shape)
                    break
            elif node.op in ("full_like", "no_bias"):
                shapes[cid] = ()
    for _ in range(_MAX_PASSES):
        changed = False
        for cid, nodes in classes.items():
            known = shapes.get(cid)
            if known is not None and not _invented(known):
                continue
            for node in nodes:
                shape = term_shape(node, shapes)
                # A member's meaning beats shape inference's invented names (a repeated cache's length).
                if shape is not None and (known is None or _invented(shape) < _invented(known)):
                    shapes[cid] = known = shape
                    changed = True
        if not changed:
            break
    return shapes


def _invented(shape: Shape) -> int:
    return sum(d is None or d.invented for d in shape)


def _value_shape(value: object, facts: GraphFacts) -> Shape | None:
    """A graph value's shape; where shape inference invented a dim of a Concat's output (a KV cache's
    ``past + new``), the sum of its inputs' dims along the axis."""
    shape = facts.shape(value)
    node = value.producer()
    if shape is None or not any(d is not None and d.invented for d in shape) or node is None:
        return None if shape is None else tuple(shape)
    if node.op_type != "Concat" or None in node.inputs or "axis" not in node.attributes:
        return tuple(shape)
    parts = [facts.shape(v) for v in node.inputs]
    if any(p is None or len(p) != len(shape) for p in parts):
        return tuple(shape)
    axis = node.attributes["axis"].value % len(shape)
    total = parts[0][axis]
    for part in parts[1:]:
        total = None if total is None or part[axis] is None else total.plus(part[axis])
    return tuple(total if i == axis else (parts[0][i] if d is None or d.invented else d) for i, d in enumerate(shape))


# --- binding: symbolic dims to numbers ------------------------------------------------------------------------

TYPICAL = {"batch": 1, "past": 256}
"""Sizes a dim whose symbol names it takes when the user binds nothing (substring match, first wins); every
other symbolic length is :data:`TYPICAL_LENGTH`."""
TYPICAL_LENGTH = 128


def bind(dim: Dim | None, binding: Mapping[str, int]) -> int:
    """A number for ``dim``: its value, or each symbol's bound size (the user's, else a typical one)."""
    if dim is None:
        return TYPICAL_LENGTH
    total = dim.coef
    for sym in dim.syms:
        total *= _bind_symbol(sym, binding)
    return max(1, total)


def _bind_symbol(sym: str, binding: Mapping[str, int]) -> int:
    if sym in binding:
        return int(binding[sym])
    if sym.startswith("unk__"):  # shape inference lost track, and no member's meaning said more (class_shapes
        return 1  # prefers one): often a broadcast axis, so 1, never 128 — a mask of four such dims is not 128⁴
    if not sym.isidentifier():  # an expression over symbols (``s0 + 1``, ``Max(0, 1 - s)``): its value
        value = evaluate(sym, lambda name: _bind_symbol(name, binding))
        return TYPICAL_LENGTH if value is None else value
    lowered = sym.lower()
    for word, size in TYPICAL.items():
        if word in lowered:
            return int(binding.get(word, size))
    return int(binding.get("seq", TYPICAL_LENGTH))


def bound(shape: Shape | None, binding: Mapping[str, int]) -> tuple[int, ...] | None:
    return None if shape is None else tuple(bind(d, binding) for d in shape)


def static(shape: Shape | None, axis: int) -> int | None:
    """The dim at ``axis`` where it is a number (None where the shape, the axis or the number is unknown)."""
    if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] is None:
        return None
    return shape[axis].static

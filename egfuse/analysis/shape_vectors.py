"""Shape vectors with symbolic entries: what ``Shape → Gather → Concat → Reshape`` and the arithmetic exporters
do on them compute, element by element, so a reshape target or a scale read off a shape at run time is a fact a
rule condition can compare. One rule per op type, in a table; each says what the op's output is known to hold
(:class:`Evaluated`) and :class:`egfuse.analysis.facts.GraphFacts` records it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, product
from egfuse.analysis.fact_queries import FactQueries
from egfuse.analysis.fold import attr, slice_values

Elems = tuple[Dim | None, ...]


@dataclass(frozen=True)
class Evaluated:
    """What an op's output is known to hold: a constant computed outright (its shape then needs no inference),
    the symbolic elements of a shape vector, or booleans known element by element (a comparison of dims)."""

    const: np.ndarray | None = None
    elems: Elems | None = None
    flags: tuple[bool, ...] | None = None


VectorRule = Callable[[FactQueries, ir.Node, ir.Value | None], Evaluated | None]
"""An op's :class:`Evaluated` output from the facts, the node and its first input (``None`` where it has none)."""


def symbolic_value(facts: FactQueries, node: ir.Node, op: str) -> Evaluated | None:
    """What ``node``'s output holds where its op's rule knows from the facts of its inputs, else ``None``."""
    x = node.inputs[0] if node.inputs else None
    rule = VECTOR_RULES.get(op)
    return None if rule is None else rule(facts, node, x)


def _add(a: Dim | None, b: Dim | None, subtract: bool) -> Dim | None:
    """A sum of two sizes where it is a size already named: numbers, a zero term, or terms that cancel
    (``s1 + (s1 - s1)·1`` is ``s1``: torch's mask code). A new sum (``past + seq``) stays unknown: the
    exporter has its own name for that length (``total``), and two names for one size would disagree."""
    if a is None or b is None:
        return None
    if b.static == 0:
        return a
    if a.static == 0 and not subtract:
        return b
    total = a.plus(b, -1 if subtract else 1)
    return None if total.summed else total


def _same_dim(a: Dim | None, b: Dim | None) -> bool | None:
    """Whether two dims are equal: the same dim, or two different numbers; ``None`` where that is not known."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    return False if a.static is not None and b.static is not None else None


def _extreme(a: Dim | None, b: Dim | None, larger: bool) -> Dim | None:
    """The larger (smaller) of two sizes where it is known: equal dims, or two numbers."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    if a.static is not None and b.static is not None:
        return Dim(max(a.static, b.static) if larger else min(a.static, b.static))
    return None


def _uniform(array: np.ndarray | None) -> float | None:
    """The one value of a constant whose elements are all equal."""
    if array is None or array.size == 0 or not np.all(array == array.reshape(-1)[0]):
        return None
    return float(array.reshape(-1)[0])


# --- reading and moving shape vectors ----------------------------------------------------------------------------


def _shape(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    shape = facts.shape(x)
    if shape is None:
        return None
    start = attr(node, "start", 0)
    end = attr(node, "end", None)
    return Evaluated(elems=tuple(shape[start:end]))


def _abs(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    """torchlib's aten_expand: Abs(shape), -1 → 1 (a symbolic dim is kept)."""
    if facts.elems(x) is None:
        return None
    return Evaluated(elems=tuple(None if d is None else d if d.syms else Dim(abs(d.coef)) for d in facts.elems(x)))


def _size(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    """Of a shape vector: the rank (torchlib's IsScalar)."""
    return None if facts.elems(x) is None else Evaluated(const=np.array(len(facts.elems(x)), np.int64))


def _moved(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    return None if facts.elems(x) is None else Evaluated(elems=facts.elems(x))


def _cast(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.elems(x) is not None:
        return Evaluated(elems=facts.elems(x))
    if facts.flags(x) is not None and attr(node, "to") == ir.DataType.BOOL:
        return Evaluated(flags=facts.flags(x))
    return None


def _cast_like(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.const(x) is not None and node.inputs[1].dtype is not None:
        return Evaluated(const=facts.const(x).astype(node.inputs[1].dtype.numpy()))
    return _moved(facts, node, x)


def _reshape(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    shaped = facts.elems(x) is not None and facts.const(node.inputs[1]) is not None
    if shaped and facts.const(node.inputs[1]).size == 1:  # a shape vector flattened to 1-D stays itself
        return Evaluated(elems=facts.elems(x))
    return None


def _concat(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if not all(facts.elems(v) is not None for v in node.inputs):
        return None
    return Evaluated(elems=tuple(d for v in node.inputs for d in facts.elems(v)))


def _gather(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.elems(x) is None or facts.const(node.inputs[1]) is None:
        return None
    items = facts.elems(x)
    idx = facts.const(node.inputs[1]).reshape(-1)
    return Evaluated(elems=tuple(items[int(i)] for i in idx))


def _slice(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.elems(x) is None or not all(facts.const(v) is not None for v in node.inputs[1:]):
        return None
    items = np.array(facts.elems(x), dtype=object)
    consts = [x, *[facts.const(v) for v in node.inputs[1:]]]
    return Evaluated(elems=tuple(slice_values(node, items, consts)))


# --- comparisons and choices -------------------------------------------------------------------------------------


def _not(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    return None if facts.flags(x) is None else Evaluated(flags=tuple(not f for f in facts.flags(x)))


def _equal(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.elems(x) is not None and _uniform(facts.const(node.inputs[1])) is not None:
        c = _uniform(facts.const(node.inputs[1]))
        # A symbolic dim is never negative, so it never equals the -1 that TorchScript's expand tests for.
        flags = [d.static == c if d is not None and d.static is not None else (False if c < 0 else None)
                 for d in facts.elems(x)]  # fmt: skip
        return Evaluated(flags=tuple(flags)) if None not in flags else None
    if facts.elems(x) is not None and facts.elems(node.inputs[1]) is not None:
        # Two sizes the graph reads from shapes (DeBERTa's ``q_len == k_len``, written as an If): equal
        # where they are the same dim, unequal where both are known numbers, else unknown.
        a, b = facts.elems(x), facts.elems(node.inputs[1])
        b = b * len(a) if len(b) == 1 else b
        a = a * len(b) if len(a) == 1 else a
        if len(a) == len(b):
            flags = [_same_dim(p, q) for p, q in zip(a, b, strict=True)]
            if None not in flags:
                return Evaluated(flags=tuple(flags))
    return None


def _where(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if facts.flags(node.inputs[0]) is None:
        return None
    a, b = (facts.elems(v) for v in node.inputs[1:])
    flags = facts.flags(node.inputs[0])
    if a is not None and b is not None:
        a = a * len(flags) if len(a) == 1 else a
        b = b * len(flags) if len(b) == 1 else b
        if len(a) == len(b) == len(flags):
            return Evaluated(elems=tuple(p if f else q for f, p, q in zip(flags, a, b, strict=True)))
    return None


# --- arithmetic on sizes -----------------------------------------------------------------------------------------


def _sum(subtract: bool, facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if not all(facts.elems(v) is not None for v in node.inputs):
        return None
    a, b = (facts.elems(v) for v in node.inputs)
    b = b * len(a) if len(b) == 1 else b
    summed = tuple(_add(p, q, subtract) for p, q in zip(a, b, strict=True)) if len(a) == len(b) else ()
    return Evaluated(elems=summed) if summed and None not in summed else None


def _reduce_prod(facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    """tf2onnx's Einsum: the batch dims folded into one, (B, N, …) → B·N, as a 1-element shape vector."""
    if facts.elems(x) is not None and len(node.inputs) == 1 and attr(node, "keepdims", 1):
        return Evaluated(elems=(product(facts.elems(x)),))
    return None


def _extremes(larger: bool, facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    """tf2onnx's Einsum broadcasts the batch dims of its operands: the larger of two equal dims is the dim."""
    if len(node.inputs) != 2 or not all(facts.elems(v) is not None for v in node.inputs):
        return None
    a, b = (facts.elems(v) for v in node.inputs)
    if len(a) != len(b):
        return None
    return Evaluated(elems=tuple(_extreme(p, q, larger) for p, q in zip(a, b, strict=True)))


def _scaled(divide: bool, facts: FactQueries, node: ir.Node, x: ir.Value | None) -> Evaluated | None:
    if not all(facts.elems(v) is not None for v in node.inputs):
        return None
    a, b = (facts.elems(v) for v in node.inputs)
    if len(b) == 1:
        b = b * len(a)
    if len(a) != len(b):
        return None
    combine = (lambda p, q: p.div(q)) if divide else (lambda p, q: p * q)
    return Evaluated(elems=tuple(None if p is None or q is None else combine(p, q) for p, q in zip(a, b, strict=True)))


VECTOR_RULES: dict[str, VectorRule] = {
    "Shape": _shape,
    "Abs": _abs,
    "Size": _size,
    **dict.fromkeys(("Identity", "Squeeze", "Unsqueeze"), _moved),
    "Cast": _cast,
    "CastLike": _cast_like,
    "Reshape": _reshape,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
    "Not": _not,
    "Equal": _equal,
    "Where": _where,
    "Add": partial(_sum, False),
    "Sub": partial(_sum, True),
    "ReduceProd": _reduce_prod,
    "Max": partial(_extremes, True),
    "Min": partial(_extremes, False),
    "Mul": partial(_scaled, False),
    "Div": partial(_scaled, True),
}
"""Each op type's rule; :func:`symbolic_value` looks a node's op type up here."""

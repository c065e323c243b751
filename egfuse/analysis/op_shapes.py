"""Output shapes of the ops around attention, where ONNX shape inference lost track: the symbolic dims a
rule condition compares (a Reshape target computed from ``Shape``, a mask broadcast, a buffer cut to the
sequence length) computed from what the facts (:class:`~egfuse.analysis.fact_queries.FactQueries`) know of the inputs.
One rule per op type, in a table (:data:`OUTPUT_SHAPES`); the cuts and counts along an axis live in
:mod:`egfuse.analysis.cut_shapes`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from egfuse.analysis.cut_shapes import chunk_shape, range_shape, slice_shape
from egfuse.analysis.dims import Dim, Shape, reshape_result
from egfuse.analysis.fact_queries import FactQueries
from egfuse.analysis.fold import attr

OutputShape = Callable[[FactQueries, ir.Node, list[Shape | None]], Shape | None]
"""An op's output shape from the facts, the node and its inputs' shapes (``None`` where one is unknown)."""


# Ops whose (first) output has the shape of their first input, including common contrib ops that ONNX
# shape inference does not know (LayerNormalization below opset 17, SkipLayerNormalization, Gelu …).
SAME_SHAPE = frozenset({
    "Softmax", "Cast", "CastLike", "Sqrt", "IsNaN", "Identity", "Neg", "Relu", "Gelu", "FastGelu", "BiasGelu", "Erf",
    "Tanh", "Sigmoid", "Exp", "Log", "Abs", "Dropout", "Not", "Trilu", "Sign", "Ceil", "Floor",
    "LayerNormalization", "SkipLayerNormalization",
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization", "QuickGelu",
})  # fmt: skip


# Elementwise ops with numpy broadcasting: their output shape is their inputs' broadcast (comparisons and
# logic included: causal masks are built from Less/Greater of aranges).
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Where", "Pow", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal",
    "And", "Or", "Xor", "Max", "Min",
})  # fmt: skip


def output_shape(facts: FactQueries, node: ir.Node, op: str) -> Shape | None:
    """The shape of ``node``'s output computed from what is known of its inputs, ``None`` where it cannot be:
    the caller keeps shape inference's dims where this names none."""
    ins = [facts.shape(v) for v in node.inputs]
    rule = OUTPUT_SHAPES.get(op)
    return None if rule is None else rule(facts, node, ins)


def _reshape(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if ins and facts.reshape_spec(node) is not None:
        return reshape_result(ins[0], facts.reshape_spec(node), bool(attr(node, "allowzero", 0)))
    return None


def _transpose(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if not ins or ins[0] is None:
        return None
    perm = attr(node, "perm") or list(reversed(range(len(ins[0]))))
    return tuple(ins[0][p] for p in perm)


def _matmul(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if len(ins) == 2 and ins[0] is not None and ins[1] is not None:
        a, b = ins
        if len(a) >= 2 and len(b) >= 2:
            return (*broadcast(a[:-2], b[:-2]), a[-2], b[-1])
    return None


def _broadcasting(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if not all(s is not None for s in ins):
        return None
    result = ins[0]
    for s in ins[1:]:
        result = broadcast(result, s)
    return result


def _same_shape(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    return ins[0] if ins and ins[0] is not None else None


def _gemm(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    """torch 2.1's addmm."""
    if len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
        a, b = ins[0], ins[1]
        if len(a) == 2 and len(b) == 2:
            return (a[1] if attr(node, "transA", 0) else a[0], b[0] if attr(node, "transB", 0) else b[1])
    return None


def _gather_nd(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    """torch 2.1's ``x[index]`` (RoPE's ``cos[ids]``)."""
    if len(ins) == 2 and ins[0] is not None and ins[1] is not None and ins[1]:
        depth, batch = ins[1][-1], int(attr(node, "batch_dims", 0))
        if depth is not None and depth.static is not None:
            return (*ins[1][:-1], *ins[0][batch + depth.static :])
    return None


def _concat(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if not (ins and all(s is not None and len(s) == len(ins[0]) for s in ins)):
        return None
    axis = int(attr(node, "axis", 0)) % len(ins[0]) if ins[0] else 0
    # The axis adds up only where that names no new size: at most one part symbolic (a sink's column after the
    # keys: T + 1), or one part. A cache's past + new keys stay the exporter's (or shape inference's) name for
    # the total length.
    sizes = [s[axis] for s in ins]
    total: Dim | None = sizes[0] if len(sizes) == 1 else None
    if len(sizes) > 1 and all(d is not None for d in sizes) and sum(d.static is None for d in sizes) <= 1:
        total = sizes[0]
        for d in sizes[1:]:
            total = total.plus(d)
    return tuple(total if i == axis else d for i, d in enumerate(ins[0])) if ins[0] else None


def _gather_elements(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    return ins[1] if len(ins) == 2 else None  # the output has the indices' shape


def _tile(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if ins and ins[0] is not None and facts.elems(node.inputs[1]) is not None:
        repeats = facts.elems(node.inputs[1])
        if len(repeats) == len(ins[0]):
            return tuple(None if d is None or r is None else d * r for d, r in zip(ins[0], repeats, strict=True))
    return None


def _squeeze(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    """torchlib's squeeze, its If folded."""
    if ins and ins[0] is not None:
        axes = facts.const(node.inputs[1]) if len(node.inputs) > 1 else attr(node, "axes")
        if axes is not None:
            drop = {int(a) % len(ins[0]) for a in np.asarray(axes).reshape(-1)}
            if all(ins[0][a] == Dim(1) for a in drop):
                return tuple(d for i, d in enumerate(ins[0]) if i not in drop)
    return None


def _unsqueeze(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if ins and ins[0] is not None:
        axes = facts.const(node.inputs[1]) if len(node.inputs) > 1 else attr(node, "axes")
        if axes is not None:
            rank = len(ins[0]) + len(np.asarray(axes).reshape(-1))
            out_dims = list(ins[0])
            for a in sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)):
                out_dims.insert(a, Dim(1))
            return tuple(out_dims)
    return None


def _expand(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if ins and ins[0] is not None and facts.elems(node.inputs[1]) is not None:
        target = tuple(d if d is not None and d != Dim(1) else (d if d is None else Dim(1))
                       for d in facts.elems(node.inputs[1]))  # fmt: skip
        return broadcast(ins[0], target)
    return None


def _gather(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if len(ins) == 2 and ins[0] is not None and ins[1] is not None:
        axis = int(attr(node, "axis", 0)) % len(ins[0])  # an embedding lookup keeps the ids' (B, S)
        return (*ins[0][:axis], *ins[1], *ins[0][axis + 1 :])
    return None


def _einsum(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    return _einsum_shape(str(attr(node, "equation", "")), ins) if all(s is not None for s in ins) else None


def _conv(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    if len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
        unit = all(d == Dim(1) for d in ins[1][2:]) and not any(attr(node, a) for a in ("pads", "auto_pad"))
        if unit and all(int(s) == 1 for s in attr(node, "strides") or [1]) and len(ins[0]) == len(ins[1]):
            return (ins[0][0], ins[1][0], *ins[0][2:])  # a 1×1 convolution keeps the spatial dims
    return None


def broadcast(a: Shape, b: Shape) -> Shape:
    n = max(len(a), len(b))
    a = (Dim(1),) * (n - len(a)) + tuple(a)
    b = (Dim(1),) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == Dim(1):
            out.append(y)
        elif y == Dim(1) or x == y:
            out.append(x)
        elif x is None or y is None:
            out.append(None)
        else:  # equal at run time: a symbol shape inference invented is the weaker name for it
            out.append(y if x.invented and not y.invented else x)
    return tuple(out)


def sharpened(known: Shape | None, computed: Shape) -> Shape:
    """``computed`` where it names a dim that ``known`` (shape inference's) lacks or invented, ``known`` elsewhere."""
    if known is None or len(known) != len(computed):
        return computed
    return tuple(c if (k is None or k.invented) and c is not None else k for k, c in zip(known, computed, strict=True))


def _einsum_shape(equation: str, shapes: list) -> Shape | None:
    """An explicit Einsum's output dims, each read from an operand that carries its letter (no ``...``)."""
    equation = equation.replace(" ", "")
    if "->" not in equation or "..." in equation:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return None
    dims: dict[str, Dim | None] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape):
            return None
        for letter, d in zip(term, shape, strict=True):
            if dims.get(letter) is None or dims[letter] == Dim(1):
                dims[letter] = d
    return tuple(dims.get(letter) for letter in out)


OUTPUT_SHAPES: dict[str, OutputShape] = {
    **dict.fromkeys(BROADCASTING, _broadcasting),
    **dict.fromkeys(SAME_SHAPE, _same_shape),
    "Reshape": _reshape,
    "Transpose": _transpose,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Slice": slice_shape,
    "SequenceAt": chunk_shape,
    "Range": range_shape,
    "GatherND": _gather_nd,
    "Concat": _concat,
    "GatherElements": _gather_elements,
    "Tile": _tile,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Expand": _expand,
    "Gather": _gather,
    "Einsum": _einsum,
    "Conv": _conv,
}
"""Each op type's output-shape rule; :func:`output_shape` looks a node's op type up here."""

"""Output shapes of the ops around attention, where ONNX shape inference lost track: the symbolic dims a
rule condition compares (a Reshape target computed from ``Shape``, a mask broadcast, a buffer cut to the
sequence length) computed from what :class:`~egfuse.facts.GraphFacts` knows of the inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim, Shape, reshape_result
from egfuse.fold import attr

if TYPE_CHECKING:
    from egfuse.facts import GraphFacts


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


def output_shape(facts: GraphFacts, node: ir.Node, op: str) -> Shape | None:
    """The shape of ``node``'s output computed from what is known of its inputs, ``None`` where it cannot be:
    the caller keeps shape inference's dims where this names none."""
    ins = [facts.shape(v) for v in node.inputs]
    result: Shape | None = None
    if op == "Reshape" and ins and facts.reshape_spec(node) is not None:
        result = reshape_result(ins[0], facts.reshape_spec(node), bool(attr(node, "allowzero", 0)))
    elif op == "Transpose" and ins and ins[0] is not None:
        perm = attr(node, "perm") or list(reversed(range(len(ins[0]))))
        result = tuple(ins[0][p] for p in perm)
    elif op == "MatMul" and len(ins) == 2 and ins[0] is not None and ins[1] is not None:
        a, b = ins
        if len(a) >= 2 and len(b) >= 2:
            result = (*broadcast(a[:-2], b[:-2]), a[-2], b[-1])
    elif op in BROADCASTING and all(s is not None for s in ins):
        result = ins[0]
        for s in ins[1:]:
            result = broadcast(result, s)
    elif op in SAME_SHAPE and ins and ins[0] is not None:
        result = ins[0]
    elif op == "Gemm" and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:  # torch 2.1's addmm
        a, b = ins[0], ins[1]
        if len(a) == 2 and len(b) == 2:
            result = (a[1] if attr(node, "transA", 0) else a[0], b[0] if attr(node, "transB", 0) else b[1])
    elif op == "Slice" and ins and ins[0] is not None:
        result = _sliced_shape(facts, node, ins[0])
    elif op == "SequenceAt":  # torch 2.1's tensor.split(n, dim): SplitToSequence into equal chunks
        result = _chunk_shape(facts, node)
    elif op == "Range" and len(node.inputs) == 3 and all(facts.elems(v) is not None for v in node.inputs):
        start, limit, delta = (facts.elems(v)[0] if len(facts.elems(v)) == 1 else None for v in node.inputs)
        if start is not None and limit is not None and delta == Dim(1):
            count = limit.plus(start, -1)  # arange(start, n): n - start elements (n ≥ start)
            result = None if count.summed else (count,)
    elif op == "Range" and len(node.inputs) == 3 and facts.elems(node.inputs[2]) == (Dim(1),):
        count = _offset_length(facts, node.inputs[0], node.inputs[1])
        result = None if count is None else (count,)
    elif op == "GatherND" and len(ins) == 2 and ins[0] is not None and ins[1] is not None and ins[1]:
        depth, batch = ins[1][-1], int(attr(node, "batch_dims", 0))  # torch 2.1's x[index] (RoPE's cos[ids])
        if depth is not None and depth.static is not None:
            result = (*ins[1][:-1], *ins[0][batch + depth.static :])
    elif op == "Concat" and ins and all(s is not None and len(s) == len(ins[0]) for s in ins):
        axis = int(attr(node, "axis", 0)) % len(ins[0]) if ins[0] else 0
        # The axis adds up only where that names no new size: all parts static, or one part. A cache's
        # past + new keys stay the exporter's (or shape inference's) name for the total length.
        sizes = [s[axis] for s in ins]
        total: Dim | None = sizes[0] if len(sizes) == 1 else None
        if len(sizes) > 1 and all(d is not None and d.static is not None for d in sizes):
            total = Dim(sum(d.static for d in sizes))
        result = tuple(total if i == axis else d for i, d in enumerate(ins[0])) if ins[0] else None
    elif op == "GatherElements" and len(ins) == 2:
        result = ins[1]  # the output has the indices' shape
    elif op == "Tile" and ins and ins[0] is not None and facts.elems(node.inputs[1]) is not None:
        repeats = facts.elems(node.inputs[1])
        if len(repeats) == len(ins[0]):
            result = tuple(None if d is None or r is None else d * r for d, r in zip(ins[0], repeats, strict=True))
    elif op == "Squeeze" and ins and ins[0] is not None:  # torchlib's squeeze, its If folded
        axes = facts.const(node.inputs[1]) if len(node.inputs) > 1 else attr(node, "axes")
        if axes is not None:
            drop = {int(a) % len(ins[0]) for a in np.asarray(axes).reshape(-1)}
            if all(ins[0][a] == Dim(1) for a in drop):
                result = tuple(d for i, d in enumerate(ins[0]) if i not in drop)
    elif op == "Unsqueeze" and ins and ins[0] is not None:
        axes = facts.const(node.inputs[1]) if len(node.inputs) > 1 else attr(node, "axes")
        if axes is not None:
            rank = len(ins[0]) + len(np.asarray(axes).reshape(-1))
            out_dims = list(ins[0])
            for a in sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)):
                out_dims.insert(a, Dim(1))
            result = tuple(out_dims)
    elif op == "Expand" and ins and ins[0] is not None and facts.elems(node.inputs[1]) is not None:
        target = tuple(d if d is not None and d != Dim(1) else (d if d is None else Dim(1))
                       for d in facts.elems(node.inputs[1]))  # fmt: skip
        result = broadcast(ins[0], target)
    elif op == "Gather" and len(ins) == 2 and ins[0] is not None and ins[1] is not None:
        axis = int(attr(node, "axis", 0)) % len(ins[0])  # an embedding lookup keeps the ids' (B, S)
        result = (*ins[0][:axis], *ins[1], *ins[0][axis + 1 :])
    elif op == "Einsum" and all(s is not None for s in ins):
        result = _einsum_shape(str(attr(node, "equation", "")), ins)
    elif op == "Conv" and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
        unit = all(d == Dim(1) for d in ins[1][2:]) and not any(attr(node, a) for a in ("pads", "auto_pad"))
        if unit and all(int(s) == 1 for s in attr(node, "strides") or [1]) and len(ins[0]) == len(ins[1]):
            result = (ins[0][0], ins[1][0], *ins[0][2:])  # a 1×1 convolution keeps the spatial dims
    return result


def _offset_length(facts: GraphFacts, start: ir.Value | None, limit: ir.Value | None) -> Dim | None:
    """n, where ``limit`` is ``start + n`` (through Casts and Reshapes of one element): ``arange(past, past +
    seq)`` — a decoder's positions over a cache — has seq elements, though the sum ``past + seq`` is no size
    the facts name (the exporter names the total length apart)."""

    def through(value: ir.Value | None) -> ir.Value | None:
        node = value.producer() if value is not None else None
        while node is not None and node.op_type in ("Cast", "Reshape", "Squeeze", "Unsqueeze", "Identity"):
            value = node.inputs[0]
            node = value.producer() if value is not None else None
        return value

    def one(value: ir.Value | None) -> Dim | None:
        elems = facts.elems(value)
        if elems is None:
            elems = facts.elems(through(value))
        return elems[0] if elems is not None and len(elems) == 1 else None

    first = one(start)
    add = through(limit).producer() if through(limit) is not None else None
    if first is None or add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    a, b = (one(v) for v in add.inputs)
    if a is not None and a == first:
        return b
    if b is not None and b == first:
        return a
    return None


def _sliced_shape(facts: GraphFacts, node: ir.Node, shape: Shape) -> Shape | None:
    """A Slice's output shape where its starts/ends/axes/steps are constants: a static dim sliced exactly, a
    symbolic one only when the slice keeps all of it (start 0, end past any size, step 1: torch's ``x[:, :]``)."""
    args = [facts.const(v) if v is not None else None for v in node.inputs[1:5]]
    symbolic_start = args[0] is None and facts.elems(node.inputs[1]) is not None if args else False
    if (
        len(args) >= 2
        and (args[0] is not None or symbolic_start)
        and args[1] is None
        and facts.elems(node.inputs[2]) is not None
    ):
        return _cut_to_length(facts, node, shape, args)
    if len(args) < 2 or args[0] is None or args[1] is None:
        return None
    starts, ends = args[0].reshape(-1), args[1].reshape(-1)
    given = _axes_and_steps(node, args, len(starts))
    if given is None:
        return None
    axes, steps = given
    out = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = int(axis) % len(shape)
        d = shape[axis]
        if d is not None and d.static is not None:
            out[axis] = Dim(len(range(d.static)[slice(int(start), int(end), int(step))]))
        elif not (int(start) == 0 and int(end) >= 2**31 - 1 and int(step) == 1):
            out[axis] = None
    return tuple(out)


def _cut_to_length(facts: GraphFacts, node: ir.Node, shape: Shape, args: list) -> Shape | None:
    """``buffer[..., :n]`` with ``n`` a symbolic size read off another tensor (``Shape(x)[1]``, the sequence
    length): the causal-mask buffers of GPT-2-style attention and the RoPE cos/sin tables cut to the
    sequence. The result has ``min(n, D) - start`` elements on a static axis of size ``D``; it is taken as
    ``n - start`` only where ``D`` is a buffer's fixed size (a constant: the model's maximum length), and
    ``start`` is 0 for a symbolic ``n`` — or ``start`` is symbolic too and ``n - start`` a size already named
    (GPT-2's ``bias[:, :, k - q : k]`` over a cache, where k = ``past + 1`` and q = 1: one row). Where ``n > D``
    the original fails wherever the cut is combined with an axis of length ``n`` (the broadcast against the
    scores, the rotation's product with Q), which is all its consumers in attention do — and validation on
    onnxruntime runs every fused region anyway."""
    if not _stored(facts, node.inputs[0]):
        return None  # only a stored buffer has the fixed "maximum length" the cut stays within
    ends = facts.elems(node.inputs[2])
    starts = args[0].reshape(-1) if args[0] is not None else facts.elems(node.inputs[1])
    given = _axes_and_steps(node, args, len(starts))
    if given is None or not len(starts) == len(ends) == len(given[0]) == len(given[1]):
        return None
    axes, steps = given
    out = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = int(axis) % len(shape)
        d = shape[axis]
        if isinstance(start, Dim) and start.static is not None:
            start = start.static
        if end is None or start is None or d is None or int(step) != 1 or d.static is None:
            return None
        if isinstance(start, Dim):  # both ends symbolic: their difference, where it names a size
            length = end.plus(start, -1)
            if length.summed or (length.static is not None and length.static < 0):
                return None
            out[axis] = length
        elif end.static is not None:  # a constant end among symbolic ones: exact
            out[axis] = Dim(len(range(d.static)[slice(int(start), end.static)]))
        elif int(start) == 0:
            out[axis] = end
        else:
            return None
    return tuple(out)


def _chunk_shape(facts: GraphFacts, node: ir.Node) -> Shape | None:
    """``SequenceAt(SplitToSequence(x, n, axis), i)`` where ``n`` divides x's static axis: every chunk has
    x's shape with ``n`` on that axis."""
    split = node.inputs[0].producer() if node.inputs[0] is not None else None
    if split is None or split.op_type != "SplitToSequence" or len(split.inputs) < 2:
        return None
    src, size = facts.shape(split.inputs[0]), facts.scalar(split.inputs[1])
    if src is None or size is None or not attr(split, "keepdims", 1):
        return None
    axis = attr(split, "axis", 0) % len(src)
    whole = src[axis]
    if whole is None or whole.static is None or size <= 0 or whole.static % int(size):
        return None
    return (*src[:axis], Dim(int(size)), *src[axis + 1 :])


def _stored(facts: GraphFacts, value: ir.Value | None, depth: int = 8) -> bool:
    """``value`` is a stored constant, or cut, cast or moved from one (torch slices a buffer axis by axis)."""
    if value is None or depth < 0:
        return False
    if facts.weight(value) is not None:
        return True
    node = value.producer()
    moves = ("Slice", "Cast", "Identity", "Unsqueeze", "Squeeze", "Transpose")
    return node is not None and node.op_type in moves and _stored(facts, node.inputs[0], depth - 1)


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


def _axes_and_steps(node: ir.Node, args: list, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A Slice's axes and steps from its constant inputs ``args`` (starts, ends, axes, steps), the defaults where
    absent; ``None`` where one is given but not a constant."""
    if (len(args) > 2 and node.inputs[3] is not None and args[2] is None) or (
        len(args) > 3 and node.inputs[4] is not None and args[3] is None
    ):
        return None
    axes = args[2].reshape(-1) if len(args) > 2 and args[2] is not None else np.arange(count)
    steps = args[3].reshape(-1) if len(args) > 3 and args[3] is not None else np.ones(count, np.int64)
    return axes, steps


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

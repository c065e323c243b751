"""Output shapes of the ops that cut or count along an axis — Slice, Range, SequenceAt — where the length is
read off another value: a buffer cut to the sequence length (``bias[:, :, :S]``), an ``arange`` over a cache's
positions, equal chunks of a split. The subtle part of :mod:`egfuse.analysis.op_shapes`, kept apart: each rule states
when a symbolic length may be named without changing what the graph computes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim, Shape
from egfuse.analysis.fact_queries import FactQueries
from egfuse.analysis.fold import attr


def slice_shape(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    return _sliced_shape(facts, node, ins[0]) if ins and ins[0] is not None else None


def range_shape(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    """``arange(start, limit)`` by 1: ``limit - start`` elements where that names a size (or ``limit`` is
    ``start + n``)."""
    if len(node.inputs) == 3 and all(facts.elems(v) is not None for v in node.inputs):
        start, limit, delta = (facts.elems(v)[0] if len(facts.elems(v)) == 1 else None for v in node.inputs)
        if start is not None and limit is not None and delta == Dim(1):
            count = limit.plus(start, -1)  # arange(start, n): n - start elements (n ≥ start)
            return None if count.summed else (count,)
        return None
    if len(node.inputs) == 3 and facts.elems(node.inputs[2]) == (Dim(1),):
        count = _offset_length(facts, node.inputs[0], node.inputs[1])
        return None if count is None else (count,)
    return None


def chunk_shape(facts: FactQueries, node: ir.Node, ins: list[Shape | None]) -> Shape | None:
    """torch 2.1's ``tensor.split(n, dim)``: SplitToSequence into equal chunks, each read by a SequenceAt."""
    return _chunk_shape(facts, node)


def _offset_length(facts: FactQueries, start: ir.Value | None, limit: ir.Value | None) -> Dim | None:
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


def _sliced_shape(facts: FactQueries, node: ir.Node, shape: Shape) -> Shape | None:
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


def _cut_to_length(facts: FactQueries, node: ir.Node, shape: Shape, args: list) -> Shape | None:
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


def _chunk_shape(facts: FactQueries, node: ir.Node) -> Shape | None:
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


def _stored(facts: FactQueries, value: ir.Value | None, depth: int = 8) -> bool:
    """``value`` is a stored constant, or cut, cast or moved from one (torch slices a buffer axis by axis)."""
    if value is None or depth < 0:
        return False
    if facts.weight(value) is not None:
        return True
    node = value.producer()
    moves = ("Slice", "Cast", "Identity", "Unsqueeze", "Squeeze", "Transpose")
    return node is not None and node.op_type in moves and _stored(facts, node.inputs[0], depth - 1)


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

"""The plain ONNX spelling of each primitive constructor of the language: ``{constructor: writer}``.

An extracted program is mostly primitive terms around one fused op: the layout the rules moved (transposes,
head splits and merges, slices of a packed projection), arithmetic, the mask's fills. Each writer here is the
one way its constructor becomes nodes, so :meth:`~egfuse.writing.raise_.Emitter._emit` is a table look-up and a
constructor's ONNX form is found by its name. Node and constant names come from a counter, so each writer
creates its nodes in the order it always has: the written model is the same byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from egfuse.egraph.session import EClass, ENode
from egfuse.writing.emitter_protocol import EmitterProtocol

PrimitiveWriter = Callable[[EmitterProtocol, ENode, Any, "EClass | None"], ir.Value]
"""``(emitter, e-node, its view, its e-class) → the value written``."""

SIMPLE = {"matmul": "MatMul", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "where": "Where",
          "isnan": "IsNaN", "sqrt": "Sqrt", "tanh": "Tanh", "reshape": "Reshape", "pow": "Pow",
          "reciprocal": "Reciprocal", "erf": "Erf", "maximum": "Max", "neg": "Neg", "cos": "Cos", "sin": "Sin",
          "rows": "Gather"}  # fmt: skip
"""Constructors that are one ONNX op over their operands, in order."""


def _int64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _graph_value(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    return e.lowered.values[a.index]


def _simple(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    inputs = [e.value(c) for c in n.args]
    if n.op == "add":
        inputs = _widest(e, inputs)
    return e.node(SIMPLE[n.op], inputs, like=inputs[1] if n.op == "where" else inputs[0])


def _widest(e: EmitterProtocol, inputs: list[ir.Value]) -> list[ir.Value]:
    """A half-precision operand of a sum with a float32 one cast up: that sum is taken in float32
    (:mod:`egfuse.rules.precision`, MPT's scores upcast before a float32 bias), and ONNX adds one type."""
    types = {v.dtype for v in inputs}
    if not {ir.DataType.FLOAT16, ir.DataType.BFLOAT16} & types or ir.DataType.FLOAT not in types:
        return inputs
    wide = ir.DataType.FLOAT
    return [v if v.dtype == wide else e.node("Cast", [v], {"to": wide}) for v in inputs]


def _full_like(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    like = e.value(a.like)
    dtype = np.dtype(like.dtype.numpy() if like.dtype is not None else np.float32)
    return e.const(np.array(e.fill_number(cid, float(a.fill), dtype), dtype=dtype), "fill")


def _zero_bias(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    weight = e.constant_array(a.weight)
    return e.const(np.zeros(weight.shape[-1], weight.dtype), "zero_bias")


def _unit_scale(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    return e.const(e.constant_array(cid), "unit_scale")


def _cast(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    out = e.node("Cast", [e.value(a.a)], {"to": int(a.to)})
    out.dtype = ir.DataType(int(a.to))  # typed, as a writer comparing element types reads it (a rotary table)
    return out


def _softmax(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    return e.node("Softmax", [e.value(a.a)], {"axis": -1}, like=e.value(a.a))


def _last_axis_reduction(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """``ReduceMean`` (``reduce_mean``) or ``ReduceMax`` (``row_max``) over the last axis, kept (the default):
    axes an input from opset 18, an attribute before."""
    x, op = e.value(a.a), _REDUCTIONS[n.op]
    if e.opset >= 18:
        return e.node(op, [x, e.const(_int64(-1), "axes")], like=x)
    return e.node(op, [x], {"axes": [-1]}, like=x)


_REDUCTIONS = {"reduce_mean": "ReduceMean", "row_max": "ReduceMax"}


def _padded(e: EmitterProtocol, x: ir.Value, rank: int, axis: int, before: ir.Value | int, after: int) -> ir.Value:
    """``x`` with zeros added along ``axis`` (counted from the end): ``before`` of them in front (a count, or a
    1-element int64 value the run knows), ``after`` behind. Pads an input from opset 11, an attribute before."""
    at = rank + axis
    if isinstance(before, int):
        pads = [0] * (2 * rank)
        pads[at], pads[rank + at] = before, after
        if e.opset < 11:
            return e.node("Pad", [x], {"pads": pads}, like=x)
        return e.node("Pad", [x, e.const(_int64(*pads), "pads")], like=x)
    if e.opset < 11:
        raise ValueError(f"Pad takes its pads as an attribute at opset {e.opset}: a length the run knows cannot be one")
    afters = [0] * rank
    afters[at] = after
    head = e.const(np.zeros(at, np.int64), "pads") if at else None  # the befores around the one the run knows
    tail = e.const(_int64(*([0] * (rank - at - 1) + afters)), "pads")
    pads = e.node("Concat", [v for v in (head, before, tail) if v is not None], {"axis": 0})
    return e.node("Pad", [x, pads], like=x)


def _zero_row_or_col(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """``zero_row``: one zero row after the last (axis −2); ``zero_col``: one zero column (axis −1)."""
    x = e.value(a.a)
    return _padded(e, x, e.rank(a.a, x), -2 if n.op == "zero_row" else -1, 0, 1)


def _sink_col(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """``e`` behind as many zero columns as ``k`` has rows: ``Pad`` by ``Shape(k)[-2]`` in front."""
    x, k = e.value(a.e), e.value(a.k)
    rank = e.rank(a.e, x)
    return _padded(e, x, rank, -1, e.shape(k, -2, -1), 0)


def _transpose(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x = e.value(a.a)
    return e.node("Transpose", [x], {"perm": [int(p) for p in a.perm.split(",")]}, like=x)


def _concat(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x, y = e.value(a.a), e.value(a.b)
    return e.node("Concat", [x, y], {"axis": int(a.axis)}, like=x)


def _part(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x = e.value(a.a)
    start, size = int(a.start), int(a.size)
    bounds = [e.const(_int64(v), hint) for v, hint in ((start, "at"), (start + size, "to"))]
    return e.node("Slice", [x, *bounds, e.const(_int64(int(a.axis)), "axis")], like=x)


def _columns(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """``cols_before`` / ``cols_from``: the last axis cut where a graph value says."""
    x, cut = e.value(a.a), e.lowered.cuts[a.n]
    before = n.op == "cols_before"
    ends = [e.const(_int64(0), "at"), cut] if before else [cut, e.const(_int64(2**63 - 1), "to_end")]
    return e.node("Slice", [x, *ends, e.const(_int64(-1), "axis")], like=x)


def _squeeze_or_unsqueeze(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    return getattr(e, n.op)(e.value(a.a), int(a.axis))


def _strided(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """``a[..., start::2]``."""
    x = e.value(a.a)
    ins = [e.const(_int64(v), "at") for v in (int(a.start), 2**62, -1, 2)]
    return e.node("Slice", [x, *ins], like=x)


def _nan_to_zero(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x, zero = e.value(a.a), e.value(a.zero)
    return e.node("Where", [e.node("IsNaN", [x]), zero, x], like=x)


def _split_or_merge_heads(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x = e.value(a.a)
    rank = e.rank(a.a, x)
    spec = [0] * (rank - 1) + [int(a.heads), int(a.head_dim)] if n.op == "split_heads" else [0] * (rank - 2) + [-1]
    return e.node("Reshape", [x, e.const(np.array(spec, np.int64), "shape")], like=x)


def _repeat_heads(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """Unsqueeze(x, 2) → Expand(·, (B, N, r, T, H)) → Reshape(·, (B, N·r, T, H))."""
    x = e.value(a.a)
    times = e.const(_int64(int(a.times)), "times")
    axes = e.const(_int64(2), "axes")
    wide = e.node("Unsqueeze", [x, axes], like=x)
    shape = e.node("Shape", [x])
    head, tail = (
        e.node("Slice", [shape, e.const(_int64(start), "at"), e.const(_int64(end), "to")])
        for start, end in ((0, 2), (2, 4))
    )
    wide = e.node("Expand", [wide, e.node("Concat", [head, times, tail], {"axis": 0})], like=x)
    batch = e.node("Slice", [shape, e.const(_int64(0), "at"), e.const(_int64(1), "to")])
    target = e.node("Concat", [batch, e.const(_int64(-1), "minus_one"), tail], {"axis": 0})
    return e.node("Reshape", [wide, target], like=x)


def _tile_lead(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """Tile(Squeeze(m, 0), (B, 1, …)) with B = like's folded batch / second."""
    m, like = e.value(a.m), e.value(a.like)
    rank = e.rank(a.m, m)
    squeezed = e.node("Squeeze", [m, e.const(_int64(0), "axes")], like=m)
    folded = e.node("Slice", [e.node("Shape", [like]), e.const(_int64(0), "at"), e.const(_int64(1), "to")])
    batch = e.node("Div", [folded, e.lead_count(a.second)])
    ones = e.const(np.ones(rank - 2, np.int64), "ones")
    return e.node("Tile", [squeezed, e.node("Concat", [batch, ones], {"axis": 0})], like=m)


def _group_or_ungroup_heads(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    """Reshape to (B, -1, G, T, X) or (B, -1, T, X)."""
    x = e.value(a.a)
    grouping = n.op == "group_heads"
    middle = [-1, int(a.groups)] if grouping else [-1]
    lead, tail = e.shape(x, 0, 1), e.shape(x, 2 if grouping else 3)
    spec = e.node("Concat", [lead, e.const(np.array(middle, np.int64), "shape"), tail], {"axis": 0})
    return e.node("Reshape", [x, spec], like=x)


def _merge_or_split_lead(e: EmitterProtocol, n: ENode, a: Any, cid: EClass | None) -> ir.Value:
    x = e.value(a.a)
    merging = n.op == "merge_lead"
    shape = e.shape(x, 2 if merging else 1)
    if not merging and not a.second.isdigit():  # a count only the run knows, read off the graph
        head = [e.const(_int64(-1), "shape"), e.lead_count(a.second)]
    else:
        head = [e.const(np.array([-1] if merging else [-1, int(a.second)], np.int64), "shape")]
    return e.node("Reshape", [x, e.node("Concat", [*head, shape], {"axis": 0})], like=x)


PRIMITIVE_WRITERS: dict[str, PrimitiveWriter] = {
    "value": _graph_value,
    **dict.fromkeys(SIMPLE, _simple),
    "full_like": _full_like,
    "zero_bias": _zero_bias,
    "unit_scale": _unit_scale,
    "cast": _cast,
    "softmax": _softmax,
    "reduce_mean": _last_axis_reduction,
    "transpose": _transpose,
    "row_max": _last_axis_reduction,
    "zero_row": _zero_row_or_col,
    "zero_col": _zero_row_or_col,
    "sink_col": _sink_col,
    "concat": _concat,
    "part": _part,
    "cols_before": _columns,
    "cols_from": _columns,
    "unsqueeze": _squeeze_or_unsqueeze,
    "squeeze": _squeeze_or_unsqueeze,
    "strided": _strided,
    "nan_to_zero": _nan_to_zero,
    "split_heads": _split_or_merge_heads,
    "merge_heads": _split_or_merge_heads,
    "repeat_heads": _repeat_heads,
    "tile_lead": _tile_lead,
    "group_heads": _group_or_ungroup_heads,
    "ungroup_heads": _group_or_ungroup_heads,
    "merge_lead": _merge_or_split_lead,
    "split_lead": _merge_or_split_lead,
}
"""Every constructor written as plain ONNX ops; the rest are fused ops, written by the target's writers."""

"""Constant folding of the bookkeeping ops exporters write around attention (shape arithmetic, masks built
from aranges, scales computed at run time), in numpy: :mod:`egfuse.analysis.facts` calls it where every input of a
node is a known small constant."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

MAX_CONST_ELEMENTS = 4096  # larger constants are weights: never needed as facts


def attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a / b)).astype(a.dtype)
    return (a / b).astype(a.dtype)


def slice_values(node: ir.Node, data: np.ndarray, ins: list) -> np.ndarray | None:
    starts, ends = ins[1], ins[2]
    axes = ins[3] if len(ins) > 3 and ins[3] is not None else np.arange(len(starts))
    steps = ins[4] if len(ins) > 4 and ins[4] is not None else np.ones(len(starts), np.int64)
    index = [slice(None)] * data.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        index[int(ax)] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def result_size(op: str, ins: list) -> float:
    """The element count an evaluation would produce, known before computing it: a causal mask buffer of
    (max_positions)² elements must never be materialised just to learn it is too big to be a fact."""
    try:
        if op == "ConstantOfShape":
            return float(np.prod([float(d) for d in ins[0].reshape(-1)]))
        if op == "Range":
            return max(0.0, np.ceil((float(ins[1]) - float(ins[0])) / float(ins[2])))
        if op in (
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Equal",
            "Where",
            "Greater",
            "Less",
            "GreaterOrEqual",
            "LessOrEqual",
        ):
            return float(np.prod(np.broadcast_shapes(*(np.shape(x) for x in ins))))
    except (ValueError, ZeroDivisionError, TypeError):
        return float("inf")
    return float(sum(np.size(x) for x in ins if x is not None))


def unsqueezed(shape: tuple[int, ...], axes) -> tuple[int, ...]:
    axes = np.asarray(axes).reshape(-1)  # torch 2.1's dynamo export passes one axis as a 0-d tensor
    out = list(shape)
    rank = len(shape) + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        out.insert(a, 1)
    return tuple(out)


# numpy evaluation of each op (all inputs known).
NUMPY: dict[str, Callable[[ir.Node, list], np.ndarray | None]] = {
    "Identity": lambda n, x: x[0],
    "Cast": lambda n, x: x[0].astype(ir.DataType(attr(n, "to")).numpy()),
    "CastLike": lambda n, x: x[0].astype(x[1].dtype),
    "IsNaN": lambda n, x: np.isnan(x[0]),
    "IsInf": lambda n, x: (
        (np.isposinf(x[0]) & bool(attr(n, "detect_positive", 1)))
        | (np.isneginf(x[0]) & bool(attr(n, "detect_negative", 1)))
    ),
    "Sqrt": lambda n, x: np.sqrt(x[0]),
    "Reciprocal": lambda n, x: (1 / x[0]).astype(x[0].dtype),
    "Neg": lambda n, x: -x[0],
    "Abs": lambda n, x: np.abs(x[0]),
    "Add": lambda n, x: x[0] + x[1],
    "Sub": lambda n, x: x[0] - x[1],
    "Mul": lambda n, x: x[0] * x[1],
    "Div": lambda n, x: np_div(x[0], x[1]),
    "Pow": lambda n, x: np.power(x[0], x[1]).astype(x[0].dtype),
    "Equal": lambda n, x: np.equal(x[0], x[1]),
    "Greater": lambda n, x: np.greater(x[0], x[1]),
    "Less": lambda n, x: np.less(x[0], x[1]),
    "GreaterOrEqual": lambda n, x: np.greater_equal(x[0], x[1]),
    "LessOrEqual": lambda n, x: np.less_equal(x[0], x[1]),
    "Not": lambda n, x: np.logical_not(x[0]),
    "And": lambda n, x: np.logical_and(x[0], x[1]),
    "Or": lambda n, x: np.logical_or(x[0], x[1]),
    "Sign": lambda n, x: np.sign(x[0]),
    "Log": lambda n, x: np.log(x[0]),
    "Exp": lambda n, x: np.exp(x[0]),
    "Ceil": lambda n, x: np.ceil(x[0]),
    "Floor": lambda n, x: np.floor(x[0]),
    "Max": lambda n, x: functools.reduce(np.maximum, x),
    "Min": lambda n, x: functools.reduce(np.minimum, x),
    "Expand": lambda n, x: x[0] * np.ones([int(d) for d in x[1]], x[0].dtype),
    "Transpose": lambda n, x: np.transpose(x[0], attr(n, "perm")),
    "Size": lambda n, x: np.array(np.size(x[0]), np.int64),
    "Shape": lambda n, x: np.array(np.shape(x[0])[attr(n, "start", 0) : attr(n, "end", None)], np.int64),
    "Where": lambda n, x: np.where(x[0], x[1], x[2]),
    "Concat": lambda n, x: np.concatenate(x, axis=attr(n, "axis", 0)),
    "Gather": lambda n, x: np.take(x[0], x[1], axis=attr(n, "axis", 0)),
    "Unsqueeze": lambda n, x: np.reshape(x[0], unsqueezed(x[0].shape, x[1] if len(x) > 1 else attr(n, "axes"))),
    "Squeeze": lambda n, x: np.squeeze(
        x[0], axis=tuple(int(a) for a in (x[1] if len(x) > 1 else attr(n, "axes", ()))) or None
    ),
    "Reshape": lambda n, x: np.reshape(x[0], [int(d) if d != 0 else x[0].shape[i] for i, d in enumerate(x[1])]),
    "Slice": lambda n, x: slice_values(n, x[0], x),
    "ConstantOfShape": lambda n, x: np.full(
        tuple(int(d) for d in x[0]),
        attr(n, "value").numpy().reshape(-1)[0] if attr(n, "value") is not None else np.float32(0),
    ),
    "Range": lambda n, x: np.arange(x[0], x[1], x[2]).astype(x[0].dtype),
}

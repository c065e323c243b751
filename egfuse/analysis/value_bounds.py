"""Whether a value's elements are finite, and how large they can be, as far as its producers show. A mask built
once and shared by every layer is computed outside all regions but the first; without these facts the later
regions could not prove it finite and keep a NaN guard the first one drops, and a select fill could not be
scaled to absorb the scores. :class:`egfuse.analysis.facts.GraphFacts` memoizes each answer; the rules here recurse
through its queries (:class:`~egfuse.analysis.fact_queries.FactQueries`)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from egfuse.analysis.fact_queries import FactQueries
from egfuse.analysis.fold import attr
from egfuse.analysis.weight_summary import summarize

_FINITE_LAYOUT = frozenset(
    {"Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Slice", "Gather", "Flatten", "Tile"}
)
"""Ops that only move, copy or select elements: a result of finite elements has finite elements."""


def _element_type(value: ir.Value, depth: int = 8) -> ir.DataType | None:
    """``value``'s element type; where shape inference left it unset, a Cast's target or the type of the first
    typed input of the elementwise op that made it."""
    if value.dtype not in (None, ir.DataType.UNDEFINED):
        return value.dtype
    node = value.producer()
    if node is None or depth == 0:
        return None
    if node.op_type == "Cast":
        return ir.DataType(attr(node, "to"))
    for x in node.inputs:
        found = _element_type(x, depth - 1) if x is not None else None
        if found is not None:
            return found
    return None


def _fits(bound: float | None, dtype: ir.DataType | None) -> bool:
    """A float type holds every value of magnitude at most ``bound`` (rounding never reaches infinity)."""
    if bound is None or dtype is None or not dtype.is_floating_point():
        return False
    return bound < float(ml_dtypes.finfo(dtype.numpy()).max)  # ml_dtypes: bfloat16 and float8 too


def all_finite(facts: FactQueries, value: ir.Value) -> bool:
    """:meth:`egfuse.analysis.facts.GraphFacts.finite`, computed once for ``value``."""
    summary = facts.summary(value)  # bfloat16 too: ml_dtypes gives it isfinite, though it is no np.number
    if summary is not None:
        return summary.finite
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    op, inputs = node.op_type, node.inputs
    if op == "Where":
        return facts.finite(inputs[1]) and facts.finite(inputs[2])
    if op in _FINITE_LAYOUT:
        return facts.finite(inputs[0])
    if op == "Concat":
        return all(facts.finite(x) for x in inputs)
    if op == "Cast":
        source, target = inputs[0].dtype, ir.DataType(attr(node, "to"))
        if source is None or not target.is_floating_point():
            return False
        if source == ir.DataType.BOOL:
            return True
        if source.is_floating_point() and source.itemsize <= target.itemsize and facts.finite(inputs[0]):
            return True
    return _fits(facts.magnitude(value), _element_type(value))


def magnitude_bound(facts: FactQueries, value: ir.Value) -> float | None:
    """:meth:`egfuse.analysis.facts.GraphFacts.magnitude`, computed once for ``value``."""
    dtype = value.dtype
    if dtype == ir.DataType.BOOL:
        return 1.0
    if dtype is not None and dtype.is_integer():
        info = np.iinfo(dtype.numpy())
        return float(max(abs(int(info.min)), int(info.max)))
    summary = facts.summary(value)
    if summary is not None:
        return summary.bound
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    op, inputs = node.op_type, node.inputs
    if op == "Cast":
        bound = facts.magnitude(inputs[0])
        return bound if _fits(bound, _element_type(value)) else None
    if op in _FINITE_LAYOUT or op in ("Neg", "Abs", "Relu"):
        return facts.magnitude(inputs[0])
    parts = [inputs[1], inputs[2]] if op == "Where" and len(inputs) == 3 else list(inputs)
    bounds = [facts.magnitude(x) for x in parts]
    if any(b is None for b in bounds) or op not in ("Where", "Concat", "Max", "Min", "Mul", "Add", "Sub"):
        return None
    if op == "Mul":
        return float(np.prod(bounds))
    if op in ("Add", "Sub"):
        return float(sum(bounds))
    return max(bounds)


def finite_magnitude_bound(facts: FactQueries, value: ir.Value) -> float | None:
    """:meth:`egfuse.analysis.facts.GraphFacts.finite_magnitude`, computed once for ``value``."""
    node = value.producer()
    summary = facts.summary(value)
    if summary is not None:
        return summary.finite_bound
    if node is not None and node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        fill = attr(node, "value")
        return summarize(fill.numpy() if fill is not None else np.zeros(1, np.float32)).finite_bound
    if node is None or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    op, inputs = node.op_type, node.inputs
    if op in _FINITE_LAYOUT or op in ("Trilu", "Neg", "Abs", "Relu"):
        return facts.finite_magnitude(inputs[0])
    if op == "Where" and len(inputs) == 3:
        bounds = [facts.finite_magnitude(inputs[1]), facts.finite_magnitude(inputs[2])]
        return None if None in bounds else max(bounds)
    return facts.magnitude(value)

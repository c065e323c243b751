"""What a value is, read off its producers: a constant, a stored weight, a norm's output. Structural facts the
region finders stop or start at."""

from __future__ import annotations

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts

MEANS = frozenset({"ReduceMean", "GlobalAveragePool"})
"""The ops a norm's means are spelled with (the pool averages the last axis of a rank-3 tensor: Keras')."""


def constant(value: ir.Value, facts: GraphFacts | None):
    """``value``'s constant array, from the value itself, its ``Constant`` producer or ``facts``."""
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and "value" in node.attributes:
        return node.attributes["value"].value.numpy()
    return facts.const(value) if facts is not None else None


def is_weight(value: ir.Value | None) -> bool:
    return value is not None and value.const_value is not None and value.producer() is None


def normalized(value: ir.Value, depth: int = 0) -> bool:
    """A value a norm computes: x divided by (or times the reciprocal of) the root of a mean (√(mean + ε)), then
    scaled by a weight γ and shifted by β, casts between. (A score divided by √d is not: that root's input
    is no mean.)"""
    node = value.producer()
    if node is None or depth > 4 or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ("Cast", "CastLike"):  # CastLike: torch's type_as (Gemma 4 casts each norm's output so)
        return normalized(node.inputs[0], depth + 1)
    if node.op_type in ("Mul", "Div") and any(
        _root_of_mean(v) for v in node.inputs[1 if node.op_type == "Div" else 0 :]
    ):
        return True
    if node.op_type in ("Mul", "Add") and any(_stored(v) for v in node.inputs):  # γ, β
        return any(normalized(v, depth + 1) for v in node.inputs if v is not None and not _stored(v))
    return False


def _stored(value: ir.Value | None) -> bool:
    """A stored weight, or one behind an ``Identity`` (TorchScript shares equal initializers that way)."""
    node = value.producer() if value is not None else None
    return is_weight(value) or (node is not None and node.op_type == "Identity" and is_weight(node.inputs[0]))


def _is_one(value: ir.Value | None) -> bool:
    return _scalar(value) == 1.0


def _scalar(value: ir.Value | None) -> float | None:
    array = constant(value, None) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def reciprocal_root(node: ir.Node, facts: GraphFacts | None = None) -> bool:
    """``Pow(s, −½)``: the root and its reciprocal in one op (Gemma 4 writes its norms ``x · (mean x² + ε)^(−½)``)."""
    if node.op_type != "Pow" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return False
    exponent = node.inputs[1]
    if exponent is None:
        return False
    value = facts.scalar(exponent) if facts is not None else _scalar(exponent)
    return value == -0.5


def _root_of_mean(value: ir.Value | None) -> bool:
    """√(mean(·) + ε), or its reciprocal (``Reciprocal``, ``1 / ·`` as TorchScript writes ``rsqrt``, or the power
    ``(·)^(−½)``)."""
    node = value.producer() if value is not None else None
    if node is not None and (node.op_type == "Reciprocal" or (node.op_type == "Div" and _is_one(node.inputs[0]))):
        node = node.inputs[-1].producer() if node.inputs[-1] is not None else None
    if node is None or node.op_type not in ("Sqrt", "Pow") or node.inputs[0] is None:
        return False
    if node.op_type == "Pow" and not reciprocal_root(node):
        return False
    inner = node.inputs[0].producer()
    if inner is not None and inner.op_type == "Add":
        return any(v is not None and v.producer() is not None and v.producer().op_type in MEANS for v in inner.inputs)
    return inner is not None and inner.op_type in MEANS

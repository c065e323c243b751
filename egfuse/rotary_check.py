"""The structural check of a rotation: what the report says when the rules prove no ``rotary`` term for a
region that looks like one (onnxscript's rewriter calls this a ``check``: a failed match explained).

It walks the same spelling the rules state (:mod:`egfuse.rules.rotary`) — ``x·cos + rotate(x)·sin`` in its
rotate-half or interleaved pairing, full or partial, with tables of the op's structure — and names the first
thing that is not there. The rules decide; this only explains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from egfuse.facts import GraphFacts
from egfuse.regions import single_consumer
from egfuse.rotary_tables import NoMatch, axis_of, producer, table_for


def explain(concat: ir.Node, anchor: ir.Node, interleaved: bool, facts: GraphFacts) -> tuple[str | None, str]:
    """Why the rotation at ``concat`` (its rotate(x) the output of ``anchor``) is not one RotaryEmbedding can
    compute (None: the check sees no reason), and its variant as the report names it."""
    kind = "interleaved" if interleaved else "rotate-half"
    try:
        return None, _match(concat, anchor, interleaved, facts).variant
    except NoMatch as why:
        return str(why), kind


@dataclass
class Rotation:
    """A proven RoPE on a 4D ``x``: (B, N, S, H) when ``heads_axis`` is 1, (B, S, N, H) when it is 2."""

    x: ir.Value
    output: ir.Value  # the value the rotation computes (the Add, or the Concat that puts back x[..., R:])
    cos: ir.Value  # (b, S, R/2) tables (interleaved), or (b, S, R) whose first half the op reads; b is B or 1
    sin: ir.Value
    rotary_dim: int  # R
    head_size: int  # H
    heads: int  # N
    heads_axis: int
    interleaved: bool
    expand_batch: bool  # the tables' batch may be 1 where x's is not: onnxruntime wants them expanded to B

    @property
    def variant(self) -> str:
        kind = "interleaved" if self.interleaved else "rotate-half"
        if self.rotary_dim == self.head_size:
            return kind
        return f"{kind}, partial ({self.rotary_dim} of {self.head_size} features)"


def _match(concat: ir.Node, anchor: ir.Node, interleaved: bool, facts: GraphFacts) -> Rotation:
    neg, kept_part = (producer(v) for v in concat.inputs)
    if interleaved:
        neg, kept_part = producer(neg.inputs[0]), producer(kept_part.inputs[0])
    negated_part = producer(neg.inputs[0])
    xr = kept_part.inputs[0]
    shape = facts.shape(xr)
    if shape is None or len(shape) != 4:
        raise NoMatch("the rotated tensor is not known to be 4D")
    width = shape[-1].static if shape[-1] is not None else None
    if width is None or width % 2:
        raise NoMatch("the rotated width is not a known even number")
    if interleaved:
        _check_interleaved(concat, anchor, kept_part, negated_part, xr, width, facts)
    else:
        _check_rotate_half(concat, kept_part, negated_part, width, facts)
    rotated = anchor.outputs[0]
    mul_sin = _only_consumer(rotated, "Mul")
    sin4 = _other_input(mul_sin, rotated)
    add = _only_consumer(mul_sin.outputs[0], "Add")
    mul_cos = _other_input(add, mul_sin.outputs[0]).producer()
    if mul_cos is None or mul_cos.op_type != "Mul" or xr not in mul_cos.inputs:
        raise NoMatch("the rotation's other term is not x · cos")
    cos4 = _other_input(mul_cos, xr)
    x, output, head = _whole_head(xr, add.outputs[0], width, facts)
    cos, heads_axis, cos_batch = table_for(cos4, x, width, interleaved, facts, "cos")
    sin, sin_heads_axis, sin_batch = table_for(sin4, x, width, interleaved, facts, "sin")
    if heads_axis != sin_heads_axis:
        raise NoMatch("the cos and sin tables are unsqueezed at different axes")
    heads = facts.shape(x)[heads_axis]
    if heads is None or heads.static is None:
        raise NoMatch("the number of heads is not known statically")
    if not (x.dtype == cos.dtype == sin.dtype):
        raise NoMatch("the cos/sin tables and x have different element types")
    return Rotation(x, output, cos, sin, width, head, heads.static, heads_axis, interleaved, cos_batch or sin_batch)


def _check_rotate_half(
    concat: ir.Node, kept_part: ir.Node, negated_part: ir.Node, width: int, facts: GraphFacts
) -> None:
    """``Concat(−x[..., R/2:], x[..., :R/2])`` along the last axis; raises :class:`NoMatch` otherwise."""
    half = width // 2
    if axis_of(concat.attributes, 4) != 3:
        raise NoMatch("rotate_half does not concatenate along the last axis")
    if _slice_range(kept_part, facts, width) != (0, half, 1) or _slice_range(negated_part, facts, width) != (
        half,
        width,
        1,
    ):
        raise NoMatch("the swapped halves are not x[..., :R/2] and x[..., R/2:]")


def _whole_head(xr: ir.Value, output: ir.Value, width: int, facts: GraphFacts) -> tuple[ir.Value, ir.Value, int]:
    """The tensor rotated, the rotation's output and the head size: ``xr`` itself, or — a partial rotation,
    ``Concat(rotate(x[..., :R]), x[..., R:])`` — the whole x, the Concat putting the rest back, and x's width."""
    source = producer(xr)
    if source is None or source.op_type != "Slice":
        return xr, output, width
    x = source.inputs[0]  # partial: x[..., :R] rotated, x[..., R:] kept
    x_shape = facts.shape(x)
    head = x_shape[-1].static if x_shape and len(x_shape) == 4 and x_shape[-1] is not None else None
    if head is None or _slice_range(source, facts, head) != (0, width, 1):
        raise NoMatch("the rotated part is not x[..., :R] of a 4D x with a known head size")
    putback = _only_consumer(output, "Concat")
    kept = producer(putback.inputs[1]) if len(putback.inputs) == 2 and putback.inputs[0] is output else None
    if (
        kept is None
        or kept.op_type != "Slice"
        or kept.inputs[0] is not x
        or _slice_range(kept, facts, head) != (width, head, 1)
        or axis_of(putback.attributes, 4) != 3
    ):
        raise NoMatch("the rotated part is not concatenated back with x[..., R:]")
    return x, putback.outputs[0], head


def _check_interleaved(
    concat: ir.Node, reshape: ir.Node, even: ir.Node, odd: ir.Node, xr: ir.Value, width: int, facts: GraphFacts
) -> None:
    """``Reshape(Concat(Unsqueeze(−x[..., 1::2], -1), Unsqueeze(x[..., 0::2], -1), axis=-1))`` back to x's
    shape: the pairs (−x₂ᵢ₊₁, x₂ᵢ) flattened in order."""
    if _slice_range(even, facts, width) != (0, width, 2) or _slice_range(odd, facts, width) != (1, width, 2):
        raise NoMatch("the paired features are not x[..., 0::2] and x[..., 1::2]")
    for unsqueeze in (producer(v) for v in concat.inputs):
        axes = facts.const(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
        if axes is None or [int(a) % 5 for a in np.ravel(axes)] != [4]:
            raise NoMatch("the pairs are not stacked on a new last axis")
    if axis_of(concat.attributes, 5) != 4:
        raise NoMatch("the pairs are not stacked on a new last axis")
    if facts.shape(reshape.outputs[0]) != facts.shape(xr) or facts.shape(xr) is None:
        raise NoMatch("the stacked pairs are not flattened back to x's shape")


def _slice_range(node: ir.Node, facts: GraphFacts, dim: int) -> tuple[int, int, int] | None:
    """The [start, end) and step a last-axis Slice takes of a ``dim``-wide axis, clamped as ONNX does."""
    ins = [facts.const(v) if v is not None else None for v in node.inputs[1:]]
    if len(ins) < 3 or ins[0] is None or ins[1] is None or ins[2] is None or ins[0].size != 1:
        return None
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 4
    if int(np.ravel(ins[2])[0]) % rank != rank - 1:
        return None
    step = 1
    if len(ins) > 3 and ins[3] is not None:
        step = int(np.ravel(ins[3])[0])
    if step < 1:
        return None

    def clamp(i: int) -> int:
        return min(max(i + dim if i < 0 else i, 0), dim)

    return clamp(int(np.ravel(ins[0])[0])), clamp(int(np.ravel(ins[1])[0])), step


def _only_consumer(value: ir.Value, op: str) -> ir.Node:
    node = single_consumer(value)
    if node is None:
        raise NoMatch(f"{value.name} is read by more than the rotation's {op}")
    if node.op_type != op or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"{value.name} goes to {node.op_type}, not the rotation's {op}")
    return node


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value:
    others = [v for v in node.inputs if v is not value]
    if len(node.inputs) != 2 or len(others) != 1 or others[0] is None:
        raise NoMatch(f"{node.op_type} {node.name} is not a product or sum of two terms")
    return others[0]

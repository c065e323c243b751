"""Which e-classes hold float32 values in a half-precision model: a mask computed in float32 beside half
scores (MPT's ALiBi bias and select, added to scores upcast for them; :mod:`egfuse.rules.precision`).

onnxruntime's contrib attention ops take a bias of Q's type only, and rounding a float32 mask to float16 would
change it (a 2048-long ALiBi bias to steps of 1, finfo(float32).min to −inf); the standard ``Attention``'s mask
type is free. The cost model refuses the contrib ops such a bias (:meth:`egfuse.egraph.cost.CostModel._takes`)."""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from egfuse.egraph.enodes import value_index, view
from egfuse.egraph.session import EClass, ENode
from egfuse.lowering.lower import Lowered

__all__ = ["float32_classes"]

_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "maximum", "neg", "where"})
"""Ops whose result has their widest float operand's type (a select's condition is no operand here)."""


def float32_classes(classes: Mapping[EClass, list[ENode]], lowered: Lowered) -> frozenset[EClass]:
    """The e-classes with a float32 member: a graph value of that type, a cast to it, a fill shaped like one,
    or arithmetic with such an operand — to a fixpoint (a class's members are one value)."""
    wide: set[EClass] = set()
    changed = True
    while changed:
        changed = False
        for cid, nodes in classes.items():
            if cid not in wide and any(_is_float32(node, wide, lowered) for node in nodes):
                wide.add(cid)
                changed = True
    return frozenset(wide)


def _is_float32(node: ENode, wide: set[EClass], lowered: Lowered) -> bool:
    index = value_index(node)
    if index is not None:
        return lowered.values[index].dtype == ir.DataType.FLOAT
    if node.op == "cast":
        return int(view(node).to) == ir.DataType.FLOAT
    if node.op == "full_like":
        return view(node).like in wide
    if node.op == "where":
        return view(node).a in wide or view(node).b in wide
    return node.op in _ARITHMETIC and any(c in wide for c in node.children)

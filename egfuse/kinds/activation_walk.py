"""Walking a layer op's neighbourhood in the graph: what the GELU kinds (:mod:`egfuse.kinds.layers`' exact
GELU, :mod:`egfuse.kinds.tanh_gelu`) take around their anchor, and the chain of single readers a norm follows
too. Structural only: the rules decide what the region computes."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.kinds.regions import single_consumer

_FORWARD = frozenset({"Add", "Mul", "Div"})
"""What follows an activation's anchor: ``1 +``, the products with its input and with ½, a division by 2."""


def with_constant(value: ir.Value, ops: tuple[str, ...], facts: GraphFacts, claimed: set[ir.Node]) -> set[ir.Node]:
    """``value``'s producer when it is one of ``ops`` with a constant operand (x / √2, ½ · x, a projection's
    bias), else nothing."""
    node = value.producer()
    if node is None or node in claimed or node.op_type not in ops or node.domain not in ("", "ai.onnx"):
        return set()
    return {node} if any(v is not None and facts.const(v) is not None for v in node.inputs) else set()


def single_reader_chain(
    start: ir.Node,
    claimed: set[ir.Node],
    ops: frozenset[str],
    accepts: Callable[[ir.Node, list[ir.Value | None]], bool],
) -> list[ir.Node]:
    """The chain of (at most four) single readers after ``start`` among ``ops``, each one ``accepts`` given its
    other operands: a norm's division and affine part, an activation's bracket and products."""
    chain: list[ir.Node] = []
    value = start.outputs[0]
    for _ in range(4):
        nxt = single_consumer(value)
        if nxt is None or nxt in claimed or nxt.op_type not in ops or nxt.domain not in ("", "ai.onnx"):
            break
        if not accepts(nxt, [v for v in nxt.inputs if v is not value]):
            break
        chain.append(nxt)
        value = nxt.outputs[0]
    return chain


def activation_forward(anchor: ir.Node, x: ir.Value, facts: GraphFacts, claimed: set[ir.Node]) -> list[ir.Node]:
    """The single readers after an activation's ``anchor`` (its erf, its tanh): sums and products with
    constants, products with its input ``x`` or with ``x`` times a constant — never with another computed
    value, so a gated unit's other half (GEGLU's ``gelu(gate) · up``) stays out of the region."""

    def accepts(reader: ir.Node, others: list[ir.Value | None]) -> bool:
        return all(v is not None and _is_x_side(v, x, reader, facts) for v in others)

    return single_reader_chain(anchor, claimed, _FORWARD, accepts)


def _is_x_side(value: ir.Value, x: ir.Value, reader: ir.Node, facts: GraphFacts) -> bool:
    if facts.const(value) is not None:
        return True
    if reader.op_type != "Mul":
        return False
    producer = value.producer()
    return value is x or (
        producer is not None
        and producer.op_type == "Mul"
        and x in producer.inputs
        and all(v is x or (v is not None and facts.const(v) is not None) for v in producer.inputs)
    )

"""Integer arithmetic on literals folded into ``Constant`` nodes, so shape inference reads the values.

torchlib's functions pass their attributes as inputs and reshape them in the body; once inlined, shape
inference sees arithmetic where it reads only literals, and loses every rank downstream. A separate module
from the sequence rewrites (:mod:`egfuse.preparation.sequences`) and If-folding (:mod:`egfuse.preparation.if_folding`):
each undoes one habit of the old dynamo exporter, and the search runs them as it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from egfuse.analysis.facts import GraphFacts


def constant_node(value: np.ndarray, name: str) -> ir.Node:
    """A ``Constant`` node holding ``value``: a folded literal, a Slice's starts/ends/axes."""
    return ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(value))], name=name)


_LITERAL_ARITHMETIC = frozenset(
    {"Cast", "Reshape", "Add", "Sub", "Mul", "Div", "Neg", "Squeeze", "Unsqueeze", "Concat", "Identity"}
)


def fold_literal_arithmetic(graph: ir.Graph, facts: GraphFacts) -> int:
    """Replace integer arithmetic on literals (``Constant`` outputs, initializers, or results of such arithmetic)
    by ``Constant`` nodes of its value; returns how many nodes were replaced.

    torchlib functions of torch 2.1–2.2 pass their attributes as inputs and reshape them in the body:
    ``Slice(Shape(x), Reshape(Constant(1), [1]), Reshape(Add(Constant(1), 1), [1]))`` for ``x.size(1)``,
    ``Unsqueeze(x, Cast(Constant(1)))``. ONNX shape inference reads an input's value only where it is a
    literal, so after inlining it loses every rank downstream (LLaMA's causal mask: ``Expand(fill, size)`` of
    unknown rank, then ``Slice`` of ``?``), and the regions with it. The values are the same; only integers
    (sizes, axes, indices) are folded — float arithmetic is the model's own computation."""
    literal = {v for v in graph.initializers.values()}
    folded = 0
    for node in list(graph):
        outputs = list(node.outputs)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            literal.update(outputs)
            continue
        if node.op_type not in _LITERAL_ARITHMETIC or node.domain not in ("", "ai.onnx") or len(outputs) != 1:
            continue
        if not node.inputs or any(v is not None and v not in literal for v in node.inputs):
            continue
        value = facts.const(outputs[0])
        if value is None or not np.issubdtype(value.dtype, np.integer):
            continue
        constant = constant_node(value, node.name)
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[constant],
            old_values=outputs,
            new_values=constant.outputs,
        )
        literal.add(constant.outputs[0])
        folded += 1
    return folded

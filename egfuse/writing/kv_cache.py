"""KV cache: ``Concat(past, new)`` on K and V absorbed into the fused op's past inputs and present outputs.

Decoders with a cache attend over ``present_key = Concat(past_key, key)`` (and the same for values) and
return the concatenations as graph outputs. Both the standard ``Attention`` op and ``MultiHeadAttention``
take ``past_key``/``past_value`` and return exactly that concatenation as ``present_key``/``present_value``,
so the op can take the new K/V and the cache, and its present outputs can stand in for the Concat values —
the graph outputs keep their names and hold the same tensors.

The absorption is refused when anything the op reads is computed from a Concat output (a mask sized from
the present length, say): standing in for it would make the op depend on its own output.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts

SEQUENCE_AXIS = 2
"""The sequence axis of (B, N, T, H) keys and values, along which caches grow."""


@dataclass(frozen=True)
class CacheConcat:
    """The two concatenations of one attention's cache: ``present = Concat(past, new)``."""

    past_key: ir.Value
    new_key: ir.Value
    present_key: ir.Value
    past_value: ir.Value
    new_value: ir.Value
    present_value: ir.Value


def _split_concat(value: ir.Value, facts: GraphFacts) -> tuple[ir.Value, ir.Value] | None:
    node = value.producer()
    if node is None or node.op_type != "Concat" or len(node.inputs) != 2 or None in node.inputs:
        return None
    rank = facts.rank(value)
    axis = node.attributes.get("axis")
    if rank != 4 or axis is None or axis.value % rank != SEQUENCE_AXIS:
        return None
    past, new = node.inputs
    return past, new


def find_cache(key: ir.Value, value: ir.Value, facts: GraphFacts) -> CacheConcat | None:
    """The cache concatenations feeding an attention's (B, N, T, H) key and value, if both are ones."""
    k, v = _split_concat(key, facts), _split_concat(value, facts)
    if k is None or v is None or key is value:
        return None
    return CacheConcat(k[0], k[1], key, v[0], v[1], value)


def depends_on(inputs: list[ir.Value | None], targets: set[ir.Value]) -> bool:
    """Whether any of ``inputs`` is, or is computed from, one of ``targets`` (graph-wide ancestor search)."""
    seen: set[ir.Value] = set()
    stack = [v for v in inputs if v is not None]
    while stack:
        value = stack.pop()
        if value in targets:
            return True
        if value in seen:
            continue
        seen.add(value)
        node = value.producer()
        if node is not None:
            stack.extend(v for v in node.inputs if v is not None)
    return False

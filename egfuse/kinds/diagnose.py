"""Explanations for the report: which spelling a region used, and — when it did not fuse — which step of the
algebra it did not reach (like onnxscript's ``check`` that explains a failed match).

Variants are read off the original region (what the exporter wrote); the failure step is read off the
saturated e-graph (what the rules proved): softmax input ⇒ ``scores``, softmax ⇒ ``probs``, ``@ V`` ⇒
``attend``, then whether the target can run any member of the class.
"""

from __future__ import annotations

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass, ENode
from egfuse.kinds.regions import VOCABULARY, Region, reads_type_only

_PASS_THROUGH = ("Transpose", "Reshape", "Mul", "Div", "Cast")


def _producer(value: ir.Value | None, region: set[ir.Node]) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node in region else None


def _path_to_matmul(value: ir.Value | None, members: set[ir.Node], depth: int = 10) -> list[ir.Node] | None:
    """The nodes from ``value`` back to the nearest MatMul (inclusive), through data inputs only."""
    node = _producer(value, members)
    if node is None or depth == 0:
        return None
    if node.op_type == "MatMul":
        return [node]
    for inp in node.inputs:
        rest = _path_to_matmul(inp, members, depth - 1)
        if rest is not None:
            return [node, *rest]
    return None


def variants(region: Region, facts: GraphFacts) -> dict[str, str]:
    members = set(region.nodes)
    out: dict[str, str] = {}
    scale_on: list[str] = []
    mask = "none"
    path = _path_to_matmul(region.anchor.inputs[0], members) or []
    tanh = next((i for i, node in enumerate(path) if node.op_type == "Tanh"), None)
    capping = set() if tanh is None else {tanh - 1, tanh + 1}  # the ÷c and ·c around the tanh
    if tanh is not None:
        cap = next((facts.scalar(v) for v in path[tanh - 1].inputs if facts.scalar(v) is not None), None)
        out["softcap"] = f"c·tanh(x/c), c = {cap:g}" if cap is not None else "tanh"
    for i, node in enumerate(path[:-1]):
        if i in capping:
            continue
        if node.op_type in ("Mul", "Div") and any(facts.scalar(v) is not None for v in node.inputs):
            scale_on.append(f"QKᵀ ({node.op_type})")
        elif node.op_type == "Add":
            mask = "additive"
        elif node.op_type == "Where":
            fill = next((facts.scalar(v) for v in node.inputs[1:] if facts.scalar(v) is not None), None)
            mask = f"select (Where, fill {fill:g})" if fill is not None else "select (Where)"
    qk = path[-1] if path else None
    if qk is not None:
        for side, value in (("Q", qk.inputs[0]), ("K", qk.inputs[1])):
            chain = _chain(value, members, facts)
            scale_on.extend(f"{side} ({op})" for op in chain if op in ("Mul", "Div"))
            if side == "K":
                out["k_layout"] = "→".join(op for op in reversed(chain) if op not in ("Mul", "Div")) or "as is"
    out["scale"] = " and ".join(scale_on) if scale_on else "none (1.0)"
    out["mask"] = mask
    if any(n.op_type == "IsNaN" for n in region.nodes):
        out["guard"] = "Where(IsNaN)"
    return out


def _chain(value: ir.Value, members: set[ir.Node], facts: GraphFacts) -> list[str]:
    ops: list[str] = []
    node = _producer(value, members)
    while node is not None and node.op_type in _PASS_THROUGH and len(ops) < 6:
        label = node.op_type
        if label == "Transpose" and node.attributes.get("perm") is not None:
            label = f"Transpose({','.join(map(str, node.attributes['perm'].value))})"
        if label in ("Mul", "Div") and not any(facts.scalar(v) is not None for v in node.inputs):
            break
        ops.append(label if label not in ("Mul", "Div") else node.op_type)
        data = [v for v in node.inputs if v is not None and facts.const(v) is None]
        node = _producer(data[0], members) if data else None
    return ops


def why_not(
    region: Region,
    class_of: dict[ir.Value, EClass],
    classes: dict[EClass, list[ENode]],
    runnable: set[str],
    target: str,
) -> str:
    """The first step of the algebra the region did not reach."""

    def ops(value: ir.Value | None) -> set[str]:
        cid = class_of.get(value) if value is not None else None
        return {n.op for n in classes.get(cid, [])} if cid is not None else set()

    softmax = region.anchor
    if "softmax" not in ops(softmax.outputs[0]):
        axis = softmax.attributes.get("axis")
        return f"softmax is not over the last axis (axis={axis.value if axis else 'default'})"
    members = set(region.nodes)
    matmuls = [n for n in region.nodes if n.op_type in ("MatMul", "Einsum") and n.inputs[0] is not None]
    pv = next((n for n in matmuls if any(_feeds_from(v, softmax) for v in n.inputs if v is not None)), None)
    if pv is None:
        quantized = _quantized(softmax)
        if quantized is not None:
            return quantized
        return "the softmax output is not multiplied by V (no MatMul consumes it)" + _where_forward_stops(
            softmax, members
        )
    probabilities = softmax.outputs[0]
    users = [use.node for use in probabilities.uses()]
    if len(users) == 1 and users[0].op_type == "Cast":  # a half-precision model's float32 softmax, cast back
        probabilities = users[0].outputs[0]
    if "probs" not in ops(probabilities):
        stop = _first_unrecognised(softmax.inputs[0], members, ops)
        if "scores" not in ops(softmax.inputs[0]) and "add" not in ops(softmax.inputs[0]):
            return (
                "softmax input is not recognised as scale·Q·Kᵀ (+ mask): K layout, scale or Q rank not understood"
                + stop
            )
        return "softmax input is not scale·Q·Kᵀ plus an additive or select mask" + stop
    found = ops(pv.outputs[0])
    if not found & {"attend", "attend_z", "mha", "gqa"}:
        value = next((v for v in pv.inputs if v is not None and not _feeds_from(v, softmax)), None)
        return "probabilities @ V not recognised (V is not a rank-4 (B, N, S, H) tensor)" + _first_unrecognised(
            value, members, ops
        )
    cid = class_of.get(pv.outputs[0])
    capped = any(n.op in ("attend", "attend_z") and float(view(n).cap) != 0.0 for n in classes.get(cid, []))
    what = "soft-capped attention" if capped else "attention"
    return f"{what} recognised, but target {target!r} can run none of its forms ({', '.join(sorted(runnable))})"


def _quantized(softmax: ir.Node) -> str | None:
    """Why a quantized block stays unfused: its probabilities (or scores) are rounded to an integer grid
    (QuantizeLinear → DequantizeLinear, as ``quantize_static`` writes around every MatMul input) between the
    ops a fused attention would replace. No fused op rounds inside itself, and dropping the rounding changes
    the outputs by the quantization error (0.03 on a tiny block whose outputs are ~1: far above validation's
    1e-4), so the block keeps its meaning only unfused."""
    values = [softmax.outputs[0]]
    values += [use.node.outputs[0] for use in softmax.outputs[0].uses() if use.node.op_type in ("Cast", "Where")]
    if any(use.node.op_type == "QuantizeLinear" for value in values for use in value.uses()):
        return (
            "the softmax output is quantized (QuantizeLinear → DequantizeLinear) before ·V: "
            "no fused op rounds its probabilities"
        )
    producer = softmax.inputs[0].producer() if softmax.inputs[0] is not None else None
    if producer is not None and producer.op_type == "DequantizeLinear":
        return (
            "the scores are quantized (QuantizeLinear → DequantizeLinear) before the softmax: no fused op rounds them"
        )
    return None


def _feeds_from(value: ir.Value, softmax: ir.Node, depth: int = 8) -> bool:
    """``value`` is computed from the softmax's output within ``depth`` steps — as far as regions look forward
    (guards, casts, clone, Dropout, Expand → Reshape, Keras' zeroing ``m·p + ¬m·0``), through any data input."""
    node = value.producer()
    if node is None or depth == 0:
        return False
    if node is softmax:
        return True
    data = node.inputs[:1] if node.op_type in _SHAPED_BY_SECOND else node.inputs
    return any(v is not None and _feeds_from(v, softmax, depth - 1) for v in data)


# Ops whose e-class holding nothing but these means the lowering gave the node no meaning the rules can use.
_OPAQUE = frozenset({"value", "ref", "reshape"})


_SHAPED_BY_SECOND = frozenset({"Reshape", "Expand", "Unsqueeze", "Squeeze", "Slice", "Tile"})
"""Ops whose inputs after the first are shapes, axes or indices: bookkeeping, not the data recognition follows."""


def _is_bookkeeping(value: ir.Value) -> bool:
    """An integer or boolean tensor (a shape, an index, a mask condition is not followed: its Where is the step)."""
    return value.dtype is not None and (value.dtype.is_integer() or value.dtype == ir.DataType.BOOL)


def _describe(node: ir.Node) -> str:
    shapes = [str(v.shape) if v is not None and v.shape is not None else "?" for v in node.inputs[:1]]
    out = str(node.outputs[0].shape) if node.outputs and node.outputs[0].shape is not None else "?"
    return f"{node.op_type} {node.name or node.outputs[0].name!r} ({shapes[0] if shapes else '?'} → {out})"


def _first_unrecognised(value: ir.Value | None, members: set[ir.Node], ops) -> str:
    """``"; recognition stopped at …"``: the region node nearest ``value`` (searching back through data
    inputs) whose result the lowering could not read as anything but an opaque value or a Reshape with no
    layout meaning — the step the rules never got past, like onnxscript's ``MatchResult.fail``. Empty when
    every step was understood (then the algebra, not a node, is what is missing)."""
    seen: set[ir.Node] = set()
    frontier = [value]
    outside: list[ir.Node] = []  # producers beyond the region the walk reached, nearest first
    while frontier:
        v = frontier.pop(0)
        node = _producer(v, members)
        if node is None and v is not None and v.producer() is not None:
            outside.append(v.producer())
        if node is None or node in seen:
            continue
        seen.add(node)
        known = ops(node.outputs[0])
        if not known:  # constant bookkeeping, never lowered: a leaf to its users
            continue
        if not known - _OPAQUE:
            why = "a Reshape with no layout meaning" if "reshape" in known else "an op form the rules do not read"
            return f"; recognition stopped at {_describe(node)}: {why}"
        data = node.inputs[:1] if node.op_type in _SHAPED_BY_SECOND else node.inputs
        frontier.extend(i for i in data if i is not None and not _is_bookkeeping(i))
    strange = [n for n in outside if n.op_type not in VOCABULARY and n.op_type not in ("Constant", "Shape")]
    if strange:
        return f"; recognition stopped at {_describe(strange[0])}: an op outside those the rules reason about"
    return ""


def _where_forward_stops(softmax: ir.Node, members: set[ir.Node]) -> str:
    """``"; it goes to …"``: the first node after the softmax (through the region's guards) that is not part
    of the region — the step between the probabilities and ``·V`` that was not understood."""
    value = softmax.outputs[0]
    for _ in range(8):
        users = [use.node for use in value.uses() if not reads_type_only(use.node, value)]
        outside = [n for n in users if n not in members]
        if outside:
            node = outside[0]
            why = ""
            if node.op_type == "Dropout":
                why = ": a Dropout whose training_mode is not a constant false, or whose mask is read"
            elif node.op_type == "Expand":
                why = ": an Expand that broadcasts"
            return f"; the probabilities go to {_describe(node)}{why}"
        if not users:
            return "; the probabilities are not used"
        value = users[0].outputs[0]
    return ""

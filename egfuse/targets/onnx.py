"""The portable target: the standard ``Attention`` op (ONNX opset 23).

onnxruntime's kernel reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0 for a query row
masked entirely that way; :meth:`Target.mask_fill` keeps such rows' meaning (the mean of V) by writing the
fill one ulp above ``lowest``. Fully masked rows filled with −inf still differ (NaN in the graph, 0 in the
kernel) and are rolled back by validation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from egfuse.session import ENode
from egfuse.targets.base import Target

if TYPE_CHECKING:
    import onnx_ir as ir

    from egfuse.raise_ import Emitter


def standard_attention_cost(node: ENode, cost: float) -> float | None:
    """onnxruntime rejects a non-positive ``scale`` attribute on the standard op."""
    return None if float(node.args[4]) <= 0 else cost


def emit_standard_attention(node: ENode, e: Emitter) -> ir.Value:
    """``attend``/``attend_z`` (4D, grouped K/V heads native) or ``mha``/``gqa`` (3D) as one standard
    ``Attention``."""
    q, k, v, bias, scale, cap = node.args[:6]
    three_d = node.op in ("mha", "gqa")
    seq_axis = 1 if three_d else 2
    inputs, mask, cache = e.operands(q, k, v, bias, seq_axis, seq_axis, cache_allowed=not three_d)
    mask = e.finite_mask(bias, mask)
    attrs: dict[str, object] = {"scale": float(scale)}
    if float(cap) != 0.0:
        attrs["softcap"] = float(cap)
    if three_d:
        heads = int(node.args[6])
        attrs.update(q_num_heads=heads, kv_num_heads=int(node.args[7]) if node.op == "gqa" else heads)
    if cache is not None:
        args = [*inputs, mask, cache.past_key, cache.past_value]
    else:
        args = [*inputs, mask] if mask is not None else inputs
    return e.with_cache("Attention", args, attrs, "", inputs[0], cache)


class OnnxTarget(Target):
    name = "onnx"
    description = "standard ONNX Attention (opset 23)"
    # 3D (unsplit) inputs save the head split/merge layout ops around the op, so both forms cost the same.
    # 4D attend takes grouped K/V heads natively (no repeat_heads copies); 3D mha saves the head split.
    fused_costs = {"attend": 12.0, "attend_z": 12.0, "mha": 12.0, "gqa": 12.0}  # noqa: RUF012

    def cost(self, node: ENode) -> float | None:
        if node.op in self.fused_costs:
            return standard_attention_cost(node, self.fused_costs[node.op])
        return super().cost(node)

    def emit(self, node: ENode, e: Emitter) -> ir.Value:
        return emit_standard_attention(node, e)

    def op_name(self, node: ENode) -> str:
        return "Attention"

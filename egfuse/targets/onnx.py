"""The portable target: the standard ``Attention`` op (ONNX opset 23).

onnxruntime's kernel reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0 for a query row
masked entirely that way, where the primitive ops give the mean of V. Models that mask padded *queries* with
``finfo.min`` (DeBERTa) keep their meaning by writing the fill one ulp above ``lowest``: added to any score
it still rounds to the fill itself, so the row stays uniform exactly as in the original graph."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egfuse.session import ENode
from egfuse.targets.base import Target

if TYPE_CHECKING:
    import onnx_ir as ir

    from egfuse.raise_ import Emitter


class OnnxTarget(Target):
    name = "onnx"
    description = "standard ONNX Attention (opset 23)"
    # 3D (unsplit) inputs save the head split/merge layout ops around the op, so both forms cost the same.
    # 4D attend takes grouped K/V heads natively (no repeat_heads copies); 3D mha saves the head split.
    fused_costs = {"attend": 12.0, "attend_z": 12.0, "mha": 12.0}  # noqa: RUF012
    opsets = {"": 23}  # noqa: RUF012

    def cost(self, node: ENode) -> float | None:
        # onnxruntime rejects a non-positive ``scale`` attribute on the standard op.
        if node.op in self.fused_costs and float(node.args[4]) <= 0:
            return None
        return super().cost(node)

    def mask_fill(self, fill: float, dtype: np.dtype) -> float:
        lowest = np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else None
        if lowest is not None and fill == float(lowest):
            return float(np.nextafter(lowest, dtype.type(0)))
        return fill

    def emit(self, node: ENode, e: Emitter) -> ir.Value:
        q, k, v, bias, scale, cap = node.args[:6]
        seq_axis = 1 if node.op == "mha" else 2
        inputs, mask, cache = e.operands(q, k, v, bias, seq_axis, seq_axis, cache_allowed=node.op != "mha")
        attrs: dict[str, object] = {"scale": float(scale)}
        if float(cap) != 0.0:
            attrs["softcap"] = float(cap)
        if node.op == "mha":
            heads = int(node.args[6])
            attrs.update(q_num_heads=heads, kv_num_heads=heads)
        if cache is not None:
            args = [*inputs, mask, cache.past_key, cache.past_value]
        else:
            args = [*inputs, mask] if mask is not None else inputs
        return e.with_cache("Attention", args, attrs, "", inputs[0], cache)

    def op_name(self, node: ENode) -> str:
        return "Attention"

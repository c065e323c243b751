"""What onnxruntime runs fastest: its contrib ops ``com.microsoft.MultiHeadAttention`` and packed-QKV
``Attention``, and the standard ``Attention`` (opset 23) where K/V are (B, N, T, H) tensors — grouped-query
heads included, which no contrib op takes without a proof that the mask is causal (GroupQueryAttention
always masks causally)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from egfuse.session import ENode
from egfuse.targets.base import Target
from egfuse.targets.onnx import emit_standard_attention, standard_attention_cost

if TYPE_CHECKING:
    import onnx_ir as ir

    from egfuse.raise_ import Emitter


class OrtTarget(Target):
    name = "ort"
    description = "onnxruntime com.microsoft MultiHeadAttention / Attention; standard Attention for 4D K/V"
    # Packed Attention also absorbs three projections (3 × (MatMul + Add) = 36): measured fastest on ORT CPU.
    # MultiHeadAttention with (B, N, T, H) K/V: the same kernel, but the caller pays for the head split of K/V.
    # The standard op on (B, N, S, H) inputs: measured 1.05-1.75× faster than MultiHeadAttention with the
    # query's head merge around it, and 1.1-3× faster on grouped K/V heads than repeating them; on grouped 3D
    # projections (gqa) 1.0-1.6× faster than MultiHeadAttention on repeated heads (model-level figures:
    # experiments/bench_latency.py).
    fused_costs = {  # noqa: RUF012
        "mha": 12.0, "mha_kv4": 12.5, "packed_attention": 12.0, "attend": 12.0, "attend_z": 12.0, "gqa": 12.0,
    }  # fmt: skip
    STANDARD = frozenset({"attend", "attend_z", "gqa"})

    def __init__(self, standard_attention: bool = True) -> None:
        # Off when the model cannot be raised to opset 23: grouped K/V heads are then repeated for MHA.
        self.standard_attention = standard_attention

    def rotary_embedding(self) -> str | None:
        if self.standard_attention:
            return None
        return "the model cannot be raised to opset 23, which defines RotaryEmbedding"

    def cost(self, node: ENode) -> float | None:
        if node.op in self.STANDARD:
            return standard_attention_cost(node, self.fused_costs[node.op]) if self.standard_attention else None
        # MultiHeadAttention has no softcap attribute (GroupQueryAttention's is causal-only).
        if node.op in ("mha", "mha_kv4") and float(node.args[5]) != 0.0:
            return None
        return super().cost(node)

    def emit(self, node: ENode, e: Emitter) -> ir.Value:
        if node.op in self.STANDARD:
            return emit_standard_attention(node, e)
        if node.op in ("mha", "mha_kv4"):
            q, k, v, bias, scale, _cap, heads = node.args
            # (B, S, N·H) query; key (B, T, N·H) for mha, (B, N, T, H) for mha_kv4 (which may come from a cache)
            kv4 = node.op == "mha_kv4"
            inputs, mask, cache = e.operands(q, k, v, bias, 1, 2 if kv4 else 1, cache_allowed=kv4)
            attrs = {"num_heads": int(heads), "scale": float(scale)}
            if cache is not None:
                args = [*inputs, None, None, mask, cache.past_key, cache.past_value]
            else:
                args = [*inputs, None, None, mask] if mask is not None else inputs
            return e.with_cache("MultiHeadAttention", args, attrs, "com.microsoft", inputs[0], cache)
        x, wq, wk, wv, bq, bk, bv, bias, scale, heads = node.args
        xv = e.value(x)
        weights = [e.constant_array(c) for c in (wq, wk, wv)]
        biases = [_flat_bias(e.constant_array(c)) for c in (bq, bk, bv)]
        w = e.initializer(np.concatenate(weights, axis=1), "qkv_weight")
        b = e.initializer(np.concatenate(biases, axis=0), "qkv_bias")
        mask = e.bias(bias, xv, xv, 1, 1)
        attrs: dict[str, object] = {"num_heads": int(heads), "scale": float(scale)}
        sizes = [int(a.shape[1]) for a in weights]
        if len(set(sizes)) > 1:
            attrs["qkv_hidden_sizes"] = sizes
        args = [xv, w, b, None, None, mask] if mask is not None else [xv, w, b]
        return e.node("Attention", args, attrs, domain="com.microsoft", like=xv)

    def op_name(self, node: ENode) -> str:
        return "MultiHeadAttention" if node.op in ("mha", "mha_kv4") else "Attention"

    def op_domain(self, node: ENode) -> str:
        return "" if node.op in self.STANDARD else "com.microsoft"


def _flat_bias(bias: np.ndarray) -> np.ndarray:
    """A projection bias as the 1-D vector packed Attention wants ((1, 1, N·H) → (N·H,))."""
    if bias.size != bias.shape[-1]:
        raise ValueError(f"a bias of shape {bias.shape} does not pack into Attention's 1-D bias")
    return bias.reshape(-1)

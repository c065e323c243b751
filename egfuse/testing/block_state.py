"""What writing one attention block carries from part to part: the builder, the variant's sizes, the graph's
inputs and outputs as they are declared, the tensors each part hands the next, and the small spellings several
parts share (a scalar, a projection, a QDQ pair, the head split, repeat_kv, the scale, the cache's Concat).

:func:`egfuse.testing.model.attention_model` writes the block one part at a time (projections, query, keys,
scores, mask, probabilities, context); each part reads and sets fields here. Node and constant names are numbered
in the order they are made, and the weights drawn from one generator, so the parts run in a fixed order and the
same variant always gives the same bytes.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from egfuse.testing.axes import SOFTCAP
from egfuse.testing.blocks import Builder
from egfuse.testing.rope import Rope
from egfuse.testing.variant import Variant


class BlockState:
    """One block being written for variant ``v``. Construction declares the graph's own inputs (``x``, the
    cross-attention ``memory``, RoPE's tables) and writes RoPE's table ops, before any projection."""

    def __init__(self, v: Variant) -> None:
        self.b = b = Builder(v)
        self.v = v
        self.hidden, self.heads, self.hd, self.kv = v.hidden, v.heads, v.head_dim, v.n_kv
        self.np_type = np.dtype(v.dtype)
        self.onnx_type = helper.np_dtype_to_tensor_dtype(self.np_type)
        self.scale = 1.0 / np.sqrt(self.hd)
        # tf2onnx's grouped einsum: K/V stay (B, kv, T, H) and the MatMul groups Q (Keras' caches are no Concat:
        # with one, the K/V heads are repeated as transformers does)
        self.grouped = v.matmul == "tf2onnx_einsum" and self.kv != self.heads and not v.past
        if v.symbolic:
            self.seq, self.kv_seq = "seq", ("kv_seq" if v.cross else "total_seq" if v.past else "seq")
        else:
            self.seq, self.kv_seq = 5, (7 if v.cross else 8 if v.past else 5)
        self.batch = "batch" if v.symbolic else 2
        self.past_len = "past_seq" if v.symbolic else 3
        self.kv_len = self.kv_seq
        self.x = "x"
        self.memory = "memory" if v.cross else self.x
        self.inputs = [helper.make_tensor_value_info("x", self.onnx_type, [self.batch, self.seq, self.hidden])]
        self.outputs = [helper.make_tensor_value_info("y", self.onnx_type, None)]
        if v.cross:
            memory = helper.make_tensor_value_info("memory", self.onnx_type, [self.batch, self.kv_seq, self.hidden])
            self.inputs.append(memory)
        self.rope = Rope(b, v, self.inputs, self.batch, self.seq, self.onnx_type) if v.rope else None
        self.layout, self.folded = v.heads_layout, v.heads_layout == "batch_folded"
        # XLNet's bind,bjnd->bnij: Q and K read as (B, S, N, H) by the Einsum, no head transpose
        self.bsnh_einsum = v.einsum and self.layout == "split" and v.k_layout == "transpose_0231"
        # The tensors the parts hand on (names of graph values; K and V are pairs in split-score form).
        self.q = self.q_plain = self.k = self.kt = self.v_ = self.k_bsnh = self.v_bsnh = None
        self.s = self.mask = self.p = self.o = None
        self.rank = 4
        self.scaled = self.unfolded = False

    def scalar(self, value: float, hint: str) -> str:
        return self.b.const(np.array(value, self.np_type), hint)

    def proj(self, x: str, tag: str, width: int) -> str:
        b, hidden, np_type = self.b, self.hidden, self.np_type
        w = b.const((b.rng.standard_normal((hidden, width)) * 1.5 / np.sqrt(hidden)).astype(np_type), f"w{tag}")
        y = b.op("MatMul", [x, w])
        if self.v.proj_bias:
            y = b.comm("Add", y, b.const(b.rng.standard_normal(width).astype(np_type) * 0.1, f"b{tag}"))
        return self.quantized(y, 0.05)

    def quantized(self, y: str, step: float) -> str:  # int8 per-tensor QDQ pair (zero point 0)
        if self.v.qdq == "none":
            return y
        b = self.b
        params = [b.const(np.array(step, self.np_type), "q_scale"), b.const(np.array(0, np.int8), "q_zero")]
        return b.op("DequantizeLinear", [b.op("QuantizeLinear", [y, *params]), *params])

    def split(self, y: str, n: int) -> str:  # (B, S, n·H) → (B, S, n, H)
        return self.b.op("Reshape", [y, self.b.const(np.array([0, 0, n, self.hd], np.int64), "shape")])

    def repeat_kv(self, t: str, length: int | str | None = None) -> str:
        """(B, kv, T, H) → (B, N, T, H), as transformers' repeat_kv exports."""
        b, heads, kv, hd = self.b, self.heads, self.kv, self.hd
        if kv == heads or self.grouped:
            return t
        wide = b.op("Unsqueeze", [t, b.const(np.array([2], np.int64), "axes")])
        if self.v.symbolic:
            shape = b.op("Shape", [t])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([heads // kv], np.int64)), tail], axis=0)
        else:
            target = b.const(np.array([2, kv, heads // kv, length or self.kv_len, hd], np.int64), "shape")
        return b.op("Reshape", [b.op("Expand", [wide, target]), b.const(np.array([0, heads, -1, hd], np.int64))])

    def mul_scalar(self, x: str, value: float, op: str = "Mul") -> str:
        c = self.scalar(value if op == "Mul" else 1.0 / value, "scale")
        return self.b.comm("Mul", x, c) if op == "Mul" else self.b.op("Div", [x, c])

    def cached(self, t: str, name: str) -> str:
        """Concat(past, new) on the sequence axis, returned as "present"."""
        if not self.v.past:
            return t
        shape = [self.batch, self.kv, self.past_len, self.hd]
        self.inputs.append(helper.make_tensor_value_info(f"past_{name}", self.onnx_type, shape))
        self.outputs.append(helper.make_tensor_value_info(f"present_{name}", self.onnx_type, None))
        self.b.nodes.append(helper.make_node("Concat", [f"past_{name}", t], [f"present_{name}"], axis=2))
        return f"present_{name}"

    def rotated(self, t: str, layout: str) -> str:
        """RoPE where the variant applies it: before or after the transpose."""
        wanted = "bsnh" if self.v.rope_seq_first else "bnsh"
        return self.rope(t) if self.rope is not None and layout == wanted else t

    def apply_scale(self, t: str) -> str:
        """The scale on the scores, where the variant puts it there (``q``: the query as the scores read it)."""
        v, b = self.v, self.b
        if v.scale == "qk_mul":
            return self.mul_scalar(t, self.scale)
        if v.scale == "qk_div":
            return self.mul_scalar(t, self.scale, "Div")
        if v.scale == "custom":
            return self.mul_scalar(t, 0.3)
        if v.scale == "per_head":  # SwinV2's learned logit scale: one factor per head, (N, 1, 1)
            factor = self.scale * (0.5 + b.rng.random((self.heads, 1, 1)))
            return b.comm("Mul", t, b.const(factor.astype(self.np_type), "head_scale"))
        if v.scale == "runtime":  # Shape → Slice → Cast → Sqrt → Div, as dynamo writes it
            shape = b.op("Shape", [self.q])
            d = b.op("Slice", [shape, b.const(np.array([-1], np.int64)), b.const(np.array([4], np.int64))])
            root = b.op("Sqrt", [b.op("Cast", [d], to=self.onnx_type)])
            return b.op("Div", [t, root])
        return t

    def soft_cap(self, t: str) -> str:
        if self.v.softcap == "none":
            return t
        inside = self.mul_scalar(t, 1.0 / SOFTCAP, "Div" if self.v.softcap == "div" else "Mul")
        return self.mul_scalar(self.b.op("Tanh", [inside]), SOFTCAP)

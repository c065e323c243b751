"""One self-attention block (projections → heads → scores → mask → softmax → @V → merged heads) written in
the spelling a :class:`~egfuse.testing.variant.Variant` chooses, each choice independent of the others."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from egfuse.testing.blocks import (
    _EINSUM_CONTEXT,
    _EINSUM_SCORES,
    Builder,
    _buffer_causal,
    _causal,
    _channel_heads,
    _conv,
    _dropout,
    _fold,
    _matmul,
    _query_bias,
    _query_biased_scores,
    _unfold,
)
from egfuse.testing.rope import Rope
from egfuse.testing.variant import SOFTCAP, Variant


def attention_model(v: Variant = Variant()) -> onnx.ModelProto:
    b = Builder(v)
    hidden, heads, hd, kv = v.hidden, v.heads, v.head_dim, v.n_kv
    np_type = np.dtype(v.dtype)
    onnx_type = helper.np_dtype_to_tensor_dtype(np_type)
    scale = 1.0 / np.sqrt(hd)

    def scalar(value: float, hint: str) -> str:
        return b.const(np.array(value, np_type), hint)

    def proj(x: str, tag: str, width: int) -> str:
        w = b.const((b.rng.standard_normal((hidden, width)) * 1.5 / np.sqrt(hidden)).astype(np_type), f"w{tag}")
        y = b.op("MatMul", [x, w])
        if v.proj_bias:
            y = b.comm("Add", y, b.const(b.rng.standard_normal(width).astype(np_type) * 0.1, f"b{tag}"))
        return quantized(y, 0.05)

    def quantized(y: str, step: float) -> str:  # int8 per-tensor QDQ pair (zero point 0)
        if v.qdq == "none":
            return y
        params = [b.const(np.array(step, np_type), "q_scale"), b.const(np.array(0, np.int8), "q_zero")]
        return b.op("DequantizeLinear", [b.op("QuantizeLinear", [y, *params]), *params])

    def split(y: str, n: int) -> str:  # (B, S, n·H) → (B, S, n, H)
        return b.op("Reshape", [y, b.const(np.array([0, 0, n, hd], np.int64), "shape")])

    # tf2onnx's grouped einsum: K/V stay (B, kv, T, H) and the MatMul groups Q (Keras' caches are no Concat: with
    # one, the K/V heads are repeated as transformers does)
    grouped = v.matmul == "tf2onnx_einsum" and kv != heads and not v.past

    def repeat_kv(t: str, length: int | str | None = None) -> str:  # (B, kv, T, H) → (B, N, T, H), as transformers'
        # repeat_kv exports
        if kv == heads or grouped:
            return t
        wide = b.op("Unsqueeze", [t, b.const(np.array([2], np.int64), "axes")])
        if v.symbolic:
            shape = b.op("Shape", [t])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([heads // kv], np.int64)), tail], axis=0)
        else:
            target = b.const(np.array([2, kv, heads // kv, length or kv_len, hd], np.int64), "shape")
        return b.op("Reshape", [b.op("Expand", [wide, target]), b.const(np.array([0, heads, -1, hd], np.int64))])

    def mul_scalar(x: str, value: float, op: str = "Mul") -> str:
        c = scalar(value if op == "Mul" else 1.0 / value, "scale")
        return b.comm("Mul", x, c) if op == "Mul" else b.op("Div", [x, c])

    if v.symbolic:
        seq, kv_seq = "seq", ("kv_seq" if v.cross else "total_seq" if v.past else "seq")
    else:
        seq, kv_seq = 5, (7 if v.cross else 8 if v.past else 5)
    batch = "batch" if v.symbolic else 2
    past_len = "past_seq" if v.symbolic else 3
    kv_len = kv_seq
    x = "x"
    memory = "memory" if v.cross else x
    inputs = [helper.make_tensor_value_info("x", onnx_type, [batch, seq, hidden])]
    outputs = [helper.make_tensor_value_info("y", onnx_type, None)]
    if v.cross:
        inputs.append(helper.make_tensor_value_info("memory", onnx_type, [batch, kv_seq, hidden]))
    rope = Rope(b, v, inputs, batch, seq, onnx_type) if v.rope else None

    def cached(t: str, name: str) -> str:  # Concat(past, new) on the sequence axis, returned as "present"
        if not v.past:
            return t
        inputs.append(helper.make_tensor_value_info(f"past_{name}", onnx_type, [batch, kv, past_len, hd]))
        outputs.append(helper.make_tensor_value_info(f"present_{name}", onnx_type, None))
        b.nodes.append(helper.make_node("Concat", [f"past_{name}", t], [f"present_{name}"], axis=2))
        return f"present_{name}"

    def rotated(t: str, layout: str) -> str:  # RoPE where the variant applies it: before or after the transpose
        return rope(t) if rope is not None and layout == ("bsnh" if v.rope_seq_first else "bnsh") else t

    layout, folded = v.heads_layout, v.heads_layout == "batch_folded"
    bsnh_einsum = v.einsum and layout == "split" and v.k_layout == "transpose_0231"  # XLNet's bind,bjnd->bnij
    v_bsnh = None
    if layout == "channel_first":  # SqueezeBERT: 1×1 convolutions on (B, C, S), heads split off the channels
        xc = b.op("Transpose", [x], perm=[0, 2, 1])
        mc = b.op("Transpose", [memory], perm=[0, 2, 1]) if v.cross else xc
        q = b.op("Transpose", [_channel_heads(b, v, _conv(b, v, xc, "q"))], perm=[0, 1, 3, 2])
        kt = k = _channel_heads(b, v, _conv(b, v, mc, "k"))  # (B, N, H, T): Kᵀ with no Transpose
        v_ = _channel_heads(b, v, _conv(b, v, mc, "v"))  # (B, N, H, T); transposed below for a MatMul
        if not v.einsum:
            v_ = b.op("Transpose", [v_], perm=[0, 1, 3, 2])
    elif layout == "single":  # (B, S, H): no heads axis at all
        q, k, v_ = proj(x, "q", hidden), proj(memory, "k", hidden), proj(memory, "v", hidden)
        kt = b.op("Transpose", [k], perm=[0, 2, 1])
    else:
        q_bsnh = rotated(split(proj(x, "q", hidden), heads), "bsnh")
        q = rotated(b.op("Transpose", [q_bsnh], perm=[0, 2, 1, 3]), "bnsh")
        k_bsnh = split(proj(memory, "k", kv * hd), kv)
        v_bsnh = split(proj(memory, "v", kv * hd), kv)
        if bsnh_einsum:
            q = q_bsnh
        else:
            v_new = b.op("Transpose", [v_bsnh], perm=[0, 2, 1, 3])
            v_ = repeat_kv(cached(v_new, "value"))
            if v.split_score:
                v_ = (repeat_kv("past_value", past_len), repeat_kv(v_new, seq))

    q_plain = q  # the query before its content bias u: the position term and the gate read it
    if v.query_bias == "relative":  # (Q + u)·Kᵀ: u per head, broadcast over batch and positions
        u_shape = (heads, hd) if bsnh_einsum else (heads, 1, hd)
        q = b.comm("Add", q, b.const(b.rng.standard_normal(u_shape).astype(np_type) * 0.5, "u"))
    if v.scale == "q_mul":
        q = mul_scalar(q, scale)
    if v.scale == "split_sqrt":
        q = mul_scalar(q, np.sqrt(scale))
    if layout in ("channel_first", "single"):
        pass
    elif bsnh_einsum:
        k = k_bsnh
    elif v.k_layout == "transpose_0231" and not v.einsum:
        kt = b.op("Transpose", [k_bsnh], perm=[0, 2, 3, 1])
        if folded:  # BLOOM: permute(0, 2, 3, 1).reshape(B·N, H, T)
            kt = _fold(b, kt)
    else:
        k = rotated(b.op("Transpose", [rotated(k_bsnh, "bsnh")], perm=[0, 2, 1, 3]), "bnsh")
        k_new, k = k, repeat_kv(cached(k, "key"))
        if v.split_score:  # the cache's keys and the new ones apart (the Concat only returns the present)
            k = (repeat_kv("past_key", past_len), repeat_kv(k_new, seq))
        if folded:  # bmm: (B, N, T, H) → (B·N, T, H), transposed in 3D
            k = _fold(b, k)
            kt = k if v.einsum else b.op("Transpose", [k], perm=[0, 2, 1])
        elif v.einsum:
            pass
        elif v.split_score:
            kt = tuple(b.op("Transpose", [part], perm=[0, 1, 3, 2]) for part in k)
        elif v.k_layout == "transpose_0132":
            kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        else:  # dynamo: fold (B, N) into one dim, transpose the last two, unfold
            shape = b.op("Shape", [k])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            k3 = b.op("Reshape", [k, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])
            k3t = b.op("Transpose", [k3], perm=[0, 2, 1])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            seq_dim = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([hd], np.int64)), seq_dim], axis=0)
            kt = b.op("Reshape", [k3t, target])
    if v.einsum:
        kt = k
    if v.scale == "k_div":
        kt = mul_scalar(kt, scale, "Div")
    if v.scale == "split_sqrt":
        kt = mul_scalar(kt, np.sqrt(scale))
    q_in = _fold(b, q) if folded else q
    if v.query_bias == "rel_pos_uv":  # split heads' MatMul scores only (see _compatible)
        s = _query_biased_scores(b, v, q, kt, inputs, seq, kv_seq, np_type)
    elif v.split_score:
        s = b.op("Concat", [_matmul(b, v, q_in, part) for part in kt], axis=-1)
    elif not v.einsum:
        s = _matmul(b, v, q_in, kt)
    else:
        s = b.op("Einsum", [q_in, kt], equation=_EINSUM_SCORES["bsnh" if bsnh_einsum else layout])

    rank = 3 if layout == "single" else 4
    dims = [batch, 1, 1, kv_seq] if rank == 4 else [batch, 1, kv_seq]
    mask = None
    if v.mask.startswith("additive"):
        inputs.append(helper.make_tensor_value_info("mask", onnx_type, dims))
        mask = "mask"
    elif v.mask.startswith("where") or v.mask == "keras_select":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, dims))
        mask = "mask"
    elif v.mask == "padding_int":  # HF eager: (1 - mask[:, None, None, :].float()) * finfo.min
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, kv_seq]))
        axes = [1, 2] if rank == 4 else [1]
        expanded = b.op("Unsqueeze", ["attention_mask", b.const(np.array(axes, np.int64), "axes")])
        inverted = b.op("Sub", [scalar(1.0, "one"), b.op("Cast", [expanded], to=onnx_type)])
        if v.query_bias == "relative":  # XLNet/Funnel subtract it from the summed terms: S − big·(1 − mask)
            mask = b.comm("Mul", inverted, scalar(np.finfo(np_type).max, "max"))
        else:
            mask = b.comm("Mul", inverted, scalar(np.finfo(np_type).min, "min"))

    def apply_scale(t: str) -> str:
        if v.scale == "qk_mul":
            return mul_scalar(t, scale)
        if v.scale == "qk_div":
            return mul_scalar(t, scale, "Div")
        if v.scale == "custom":
            return mul_scalar(t, 0.3)
        if v.scale == "per_head":  # SwinV2's learned logit scale: one factor per head, (N, 1, 1)
            factor = scale * (0.5 + b.rng.random((heads, 1, 1)))
            return b.comm("Mul", t, b.const(factor.astype(np_type), "head_scale"))
        if v.scale == "runtime":  # Shape → Slice → Cast → Sqrt → Div, as dynamo writes it
            shape = b.op("Shape", [q])
            d = b.op("Slice", [shape, b.const(np.array([-1], np.int64)), b.const(np.array([4], np.int64))])
            root = b.op("Sqrt", [b.op("Cast", [d], to=onnx_type)])
            return b.op("Div", [t, root])
        return t

    def soft_cap(t: str) -> str:
        if v.softcap == "none":
            return t
        inside = mul_scalar(t, 1.0 / SOFTCAP, "Div" if v.softcap == "div" else "Mul")
        return mul_scalar(b.op("Tanh", [inside]), SOFTCAP)

    scaled = False
    unfolded = folded and (v.mask != "none" or v.position_bias or v.causal != "none")
    if folded:  # the 3D scores: scaled (and biased, for baddbmm) in 3D, viewed as (B, N, S, T) for the masks
        if v.baddbmm:  # alibi.baddbmm(Q, Kᵀ, beta=1, alpha=scale), alibi built as (B, N, T) → (B·N, 1, T)
            inputs.append(helper.make_tensor_value_info("alibi", onnx_type, [batch, heads, kv_seq]))
            t = b.op(
                "Slice", [b.op("Shape", ["alibi"]), b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))]
            )
            alibi = b.op("Reshape", ["alibi", b.op("Concat", [b.const(np.array([-1, 1], np.int64)), t], axis=0)])
            s = b.comm("Add", b.comm("Mul", alibi, scalar(1.0, "beta")), apply_scale(s))
            scaled = True
        elif v.mask != "additive_before_scale":
            s, scaled = soft_cap(apply_scale(s)), True
        if unfolded:
            s = _unfold(b, s, q)

    if v.position_bias:  # T5 adds its relative position bias to the unscaled scores
        pb_dims = [1, heads, seq, kv_seq] if rank == 4 else [1, seq, kv_seq]
        inputs.append(helper.make_tensor_value_info("position_bias", onnx_type, pb_dims))
        s = b.comm("Add", s, "position_bias")
    if v.query_bias in ("relative", "gated"):  # XLNet: (AC + BD)·scale, the mask after; WavLM: the gated bias
        s = b.comm("Add", s, _query_bias(b, v, q_plain, bsnh_einsum, inputs, seq, kv_seq, onnx_type))

    if v.mask == "additive_before_scale":
        s = _buffer_causal(b, v, apply_scale(b.comm("Add", s, mask)), q, kt, np_type)
    else:
        if not scaled:
            s = soft_cap(apply_scale(s))
        s = _buffer_causal(b, v, s, q, kt, np_type)
        if v.mask == "padding_int" and v.query_bias == "relative":
            s = b.op("Sub", [s, mask])
        elif v.mask in ("additive", "padding_int"):
            s = b.op("Add", [s, mask])
        elif v.mask == "additive_first":
            s = b.op("Add", [mask, s])
        elif v.mask in ("where_neginf", "where_finfo"):
            fill = -np.inf if v.mask == "where_neginf" else np.finfo(np_type).min
            s = b.op("Where", [mask, s, scalar(fill, "fill")])
        elif v.mask == "keras_select":  # tf2onnx's SelectV2(m, S, F) as arithmetic: m·S + ¬m·F
            keep, hide = (b.op("Cast", [flag], to=onnx_type) for flag in (mask, b.op("Not", [mask])))
            fill = scalar(-1e4 if v.dtype == "float16" else -1e9, "fill")
            s = b.op("Add", [b.comm("Mul", keep, s), b.comm("Mul", fill, hide)])
        elif v.mask == "where_reversed":  # mask True = masked out
            inverted = b.op("Not", [mask])
            s = b.op("Where", [inverted, scalar(-1e4 if v.dtype == "float16" else -1e9, "fill"), s])
    s = _causal(b, v, s, x, np_type, "past_key" if v.past else None)
    if v.clamp:
        s = b.op("Max", [s, scalar(np.finfo(np_type).min, "lowest")])
    if unfolded:
        s = _fold(b, s)
    if v.dtype == "float16":  # transformers: softmax(..., dtype=float32).to(query.dtype)
        s = b.op("Cast", [s], to=TensorProto.FLOAT)
    p = b.op("Softmax", [s], axis=-1)
    if v.dtype == "float16":
        p = b.op("Cast", [p], to=onnx_type)
    if v.zeroed:  # Keras' Softmax(mask): the probabilities of hidden keys zeroed with the same mask
        p = b.comm("Mul", p, b.op("Cast", [mask], to=onnx_type))
    if v.guard:
        p = b.op("Where", [b.op("IsNaN", [p]), scalar(0.0, "zero"), p])
    p = _dropout(b, v, p)
    if v.qdq == "probs":
        p = quantized(p, 1.0 / 127)
    if bsnh_einsum:  # bnij,bjnd->bind: the context comes out as (B, S, N, H)
        o = b.op("Einsum", [p, v_bsnh], equation=_EINSUM_CONTEXT["bsnh"])
        o = b.op("Reshape", [o, b.const(np.array([0, 0, hidden], np.int64), "shape")])
    elif layout == "single":
        o = b.op("Einsum", [p, v_], equation=_EINSUM_CONTEXT[layout]) if v.einsum else b.op("MatMul", [p, v_])
    elif layout == "channel_first":  # (B, N, H, S) → (B, C, S), back to (B, S, C) for the next block
        if v.einsum:
            o = b.op("Einsum", [p, v_], equation=_EINSUM_CONTEXT[layout])
        else:
            o = b.op("Transpose", [b.op("MatMul", [p, v_])], perm=[0, 1, 3, 2])
        o = b.op("Reshape", [o, b.const(np.array([0, hidden, -1], np.int64), "shape")])
        o = b.op("Transpose", [o], perm=[0, 2, 1])
    else:
        v_in = _fold(b, v_) if folded else v_
        if v.split_score:  # the probabilities cut at the cache's length, each piece times its values
            length = b.op("Slice", [b.op("Shape", ["past_key"]), b.const(np.array([2], np.int64)),
                                    b.const(np.array([3], np.int64))])  # fmt: skip
            last = b.const(np.array([-1], np.int64), "axis")
            pieces = (b.op("Slice", [p, b.const(np.array([0], np.int64)), length, last]),
                      b.op("Slice", [p, length, b.const(np.array([2**63 - 1], np.int64)), last]))  # fmt: skip
            o = b.comm("Add", *(b.op("MatMul", [piece, part]) for piece, part in zip(pieces, v_in, strict=True)))
        elif v.einsum:
            o = b.op("Einsum", [p, v_in], equation=_EINSUM_CONTEXT[layout])
        else:
            o = _matmul(b, v, p, v_in)
        if folded:
            o = _unfold(b, o, q)
        o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
        o = b.op("Reshape", [o, b.const(np.array([0, 0, hidden], np.int64), "shape")])
    b.nodes.append(helper.make_node("Identity", [o], ["y"], name="n_output"))
    if v.text_dims:
        for info in inputs:
            for d in info.type.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    d.dim_param = str(d.dim_value)
    graph = helper.make_graph(b.nodes, "attention", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="egfuse.testing")
    model.ir_version = 8
    return model

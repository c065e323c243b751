"""The scores' way to probabilities in a generated attention block: the mask input, the scale and soft-cap
(in 3D for folded heads), additive biases, the mask in the variant's spelling, the causal term, the softmax and
what exporters put after it.

Parts of :func:`egfuse.testing.model.attention_model`, apart from the projections and layouts there: the axes
that spell masks and scales meet here, the ones that spell layouts there.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from egfuse.testing.block_state import BlockState
from egfuse.testing.blocks import _buffer_causal, _causal, _dropout, _fold, _query_bias, _unfold


def declare_mask(st: BlockState) -> None:
    """The mask input (float, boolean, or HF's int padding mask made additive)."""
    b, v = st.b, st.v
    st.rank = 3 if st.layout == "single" else 4
    dims = [st.batch, 1, 1, st.kv_seq] if st.rank == 4 else [st.batch, 1, st.kv_seq]
    if v.mask.startswith("additive"):
        st.inputs.append(helper.make_tensor_value_info("mask", st.onnx_type, dims))
        st.mask = "mask"
    elif v.mask.startswith("where") or v.mask == "keras_select":
        st.inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, dims))
        st.mask = "mask"
    elif v.mask == "padding_int":  # HF eager: (1 - mask[:, None, None, :].float()) * finfo.min
        st.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [st.batch, st.kv_seq]))
        axes = [1, 2] if st.rank == 4 else [1]
        expanded = b.op("Unsqueeze", ["attention_mask", b.const(np.array(axes, np.int64), "axes")])
        inverted = b.op("Sub", [st.scalar(1.0, "one"), b.op("Cast", [expanded], to=st.onnx_type)])
        if v.query_bias == "relative":  # XLNet/Funnel subtract it from the summed terms: S − big·(1 − mask)
            st.mask = b.comm("Mul", inverted, st.scalar(np.finfo(st.np_type).max, "max"))
        else:
            st.mask = b.comm("Mul", inverted, st.scalar(np.finfo(st.np_type).min, "min"))


def scale_folded(st: BlockState) -> None:
    """Folded heads' 3D scores: scaled (and biased, for baddbmm) in 3D, viewed as (B, N, S, T) for the masks."""
    b, v = st.b, st.v
    st.scaled = False
    st.unfolded = st.folded and (v.mask != "none" or v.position_bias or v.causal != "none")
    if not st.folded:
        return
    if v.baddbmm:  # alibi.baddbmm(Q, Kᵀ, beta=1, alpha=scale), alibi built as (B, N, T) → (B·N, 1, T)
        st.inputs.append(helper.make_tensor_value_info("alibi", st.onnx_type, [st.batch, st.heads, st.kv_seq]))
        t = b.op(
            "Slice", [b.op("Shape", ["alibi"]), b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))]
        )
        alibi = b.op("Reshape", ["alibi", b.op("Concat", [b.const(np.array([-1, 1], np.int64)), t], axis=0)])
        st.s = b.comm("Add", b.comm("Mul", alibi, st.scalar(1.0, "beta")), st.apply_scale(st.s))
        st.scaled = True
    elif v.mask != "additive_before_scale":
        st.s, st.scaled = st.soft_cap(st.apply_scale(st.s)), True
    if st.unfolded:
        st.s = _unfold(b, st.s, st.q)


def add_biases(st: BlockState) -> None:
    """Additive biases on the unscaled scores: T5's position bias, XLNet's relative term or WavLM's gate."""
    b, v = st.b, st.v
    if v.position_bias:  # T5 adds its relative position bias to the unscaled scores
        pb_dims = [1, st.heads, st.seq, st.kv_seq] if st.rank == 4 else [1, st.seq, st.kv_seq]
        st.inputs.append(helper.make_tensor_value_info("position_bias", st.onnx_type, pb_dims))
        st.s = b.comm("Add", st.s, "position_bias")
    if v.query_bias in ("relative", "gated"):  # XLNet: (AC + BD)·scale, the mask after; WavLM: the gated bias
        bias = _query_bias(b, v, st.q_plain, st.bsnh_einsum, st.inputs, st.seq, st.kv_seq, st.onnx_type)
        st.s = b.comm("Add", st.s, bias)


def apply_mask(st: BlockState) -> None:
    """The scale (where not yet applied), soft-cap, causal buffer and the mask in the variant's spelling."""
    b, v, s, mask, np_type = st.b, st.v, st.s, st.mask, st.np_type
    if v.mask == "additive_before_scale":
        st.s = _buffer_causal(b, v, st.apply_scale(b.comm("Add", s, mask)), st.q, st.kt, np_type)
        return
    if not st.scaled:
        s = st.soft_cap(st.apply_scale(s))
    s = _buffer_causal(b, v, s, st.q, st.kt, np_type)
    if v.mask == "padding_int" and v.query_bias == "relative":
        s = b.op("Sub", [s, mask])
    elif v.mask in ("additive", "padding_int"):
        s = b.op("Add", [s, mask])
    elif v.mask == "additive_first":
        s = b.op("Add", [mask, s])
    elif v.mask in ("where_neginf", "where_finfo"):
        fill = -np.inf if v.mask == "where_neginf" else np.finfo(np_type).min
        s = b.op("Where", [mask, s, st.scalar(fill, "fill")])
    elif v.mask == "keras_select":  # tf2onnx's SelectV2(m, S, F) as arithmetic: m·S + ¬m·F
        keep, hide = (b.op("Cast", [flag], to=st.onnx_type) for flag in (mask, b.op("Not", [mask])))
        fill = st.scalar(-1e4 if v.dtype == "float16" else -1e9, "fill")
        s = b.op("Add", [b.comm("Mul", keep, s), b.comm("Mul", fill, hide)])
    elif v.mask == "where_reversed":  # mask True = masked out
        inverted = b.op("Not", [mask])
        s = b.op("Where", [inverted, st.scalar(-1e4 if v.dtype == "float16" else -1e9, "fill"), s])
    st.s = s


def probabilities(st: BlockState) -> None:
    """The causal term, OPT's clamp, the softmax (in float32 for float16), Keras' zeroing, the NaN guard,
    dropout and a QDQ pair on the probabilities."""
    b, v, np_type, onnx_type = st.b, st.v, st.np_type, st.onnx_type
    s = _causal(b, v, st.s, st.x, np_type, "past_key" if v.past else None)
    if v.clamp:
        s = b.op("Max", [s, st.scalar(np.finfo(np_type).min, "lowest")])
    if st.unfolded:
        s = _fold(b, s)
    if v.dtype == "float16":  # transformers: softmax(..., dtype=float32).to(query.dtype)
        s = b.op("Cast", [s], to=TensorProto.FLOAT)
    p = b.op("Softmax", [s], axis=-1)
    if v.dtype == "float16":
        p = b.op("Cast", [p], to=onnx_type)
    if v.zeroed:  # Keras' Softmax(mask): the probabilities of hidden keys zeroed with the same mask
        p = b.comm("Mul", p, b.op("Cast", [st.mask], to=onnx_type))
    if v.guard:
        p = b.op("Where", [b.op("IsNaN", [p]), st.scalar(0.0, "zero"), p])
    p = _dropout(b, v, p)
    if v.qdq == "probs":
        p = st.quantized(p, 1.0 / 127)
    st.s, st.p = s, p

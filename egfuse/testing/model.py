"""One self-attention block (projections → heads → scores → mask → softmax → @V → merged heads) written in
the spelling a :class:`~egfuse.testing.variant.Variant` chooses, each choice independent of the others.

One function per part of the block, in the order the block is written (:mod:`~egfuse.testing.block_state`
carries what each part hands the next): the order is part of the output, since node names are numbered and
weights drawn as they are made.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from egfuse.testing.block_state import BlockState
from egfuse.testing.blocks import (
    _EINSUM_CONTEXT,
    _EINSUM_SCORES,
    _channel_heads,
    _conv,
    _fold,
    _matmul,
    _query_biased_scores,
    _unfold,
)
from egfuse.testing.probabilities import add_biases, apply_mask, declare_mask, probabilities, scale_folded
from egfuse.testing.variant import Variant


def attention_model(v: Variant = Variant()) -> onnx.ModelProto:
    """The block in ``v``'s spelling as an opset-17 model: input ``x`` (and the inputs the variant declares),
    output ``y``; the same variant always gives the same bytes."""
    st = BlockState(v)
    for part in _PARTS:
        part(st)
    return _model(st)


def _project(st: BlockState) -> None:
    """Q, K and V from the input (and the cross-attention memory), in the variant's head layout."""
    b, v, x, memory, hidden = st.b, st.v, st.x, st.memory, st.hidden
    if st.layout == "channel_first":  # SqueezeBERT: 1×1 convolutions on (B, C, S), heads split off the channels
        xc = b.op("Transpose", [x], perm=[0, 2, 1])
        mc = b.op("Transpose", [memory], perm=[0, 2, 1]) if v.cross else xc
        st.q = b.op("Transpose", [_channel_heads(b, v, _conv(b, v, xc, "q"))], perm=[0, 1, 3, 2])
        st.kt = st.k = _channel_heads(b, v, _conv(b, v, mc, "k"))  # (B, N, H, T): Kᵀ with no Transpose
        st.v_ = _channel_heads(b, v, _conv(b, v, mc, "v"))  # (B, N, H, T); transposed below for a MatMul
        if not v.einsum:
            st.v_ = b.op("Transpose", [st.v_], perm=[0, 1, 3, 2])
    elif st.layout == "single":  # (B, S, H): no heads axis at all
        st.q, st.k, st.v_ = st.proj(x, "q", hidden), st.proj(memory, "k", hidden), st.proj(memory, "v", hidden)
        st.kt = b.op("Transpose", [st.k], perm=[0, 2, 1])
    else:
        q_bsnh = st.rotated(st.split(st.proj(x, "q", hidden), st.heads), "bsnh")
        st.q = st.rotated(b.op("Transpose", [q_bsnh], perm=[0, 2, 1, 3]), "bnsh")
        st.k_bsnh = st.split(st.proj(memory, "k", st.kv * st.hd), st.kv)
        st.v_bsnh = st.split(st.proj(memory, "v", st.kv * st.hd), st.kv)
        if st.bsnh_einsum:
            st.q = q_bsnh
        else:
            v_new = b.op("Transpose", [st.v_bsnh], perm=[0, 2, 1, 3])
            st.v_ = st.repeat_kv(st.cached(v_new, "value"))
            if v.split_score:
                st.v_ = (st.repeat_kv("past_value", st.past_len), st.repeat_kv(v_new, st.seq))


def _query(st: BlockState) -> None:
    """The query as the scores read it: a content bias u added, the scale on Q (or √scale on Q and on K)."""
    b, v = st.b, st.v
    st.q_plain = st.q  # the query before its content bias u: the position term and the gate read it
    if v.query_bias == "relative":  # (Q + u)·Kᵀ: u per head, broadcast over batch and positions
        u_shape = (st.heads, st.hd) if st.bsnh_einsum else (st.heads, 1, st.hd)
        st.q = b.comm("Add", st.q, b.const(b.rng.standard_normal(u_shape).astype(st.np_type) * 0.5, "u"))
    if v.scale == "q_mul":
        st.q = st.mul_scalar(st.q, st.scale)
    if v.scale == "split_sqrt":
        st.q = st.mul_scalar(st.q, np.sqrt(st.scale))


def _keys(st: BlockState) -> None:
    """Kᵀ in the variant's K layout (RoPE, the cache and repeat_kv on the way), then its part of the scale."""
    b, v = st.b, st.v
    if st.layout in ("channel_first", "single"):
        pass
    elif st.bsnh_einsum:
        st.k = st.k_bsnh
    elif v.k_layout == "transpose_0231" and not v.einsum:
        st.kt = b.op("Transpose", [st.k_bsnh], perm=[0, 2, 3, 1])
        if st.folded:  # BLOOM: permute(0, 2, 3, 1).reshape(B·N, H, T)
            st.kt = _fold(b, st.kt)
    else:
        _split_keys(st)
    if v.einsum:
        st.kt = st.k
    if v.scale == "k_div":
        st.kt = st.mul_scalar(st.kt, st.scale, "Div")
    if v.scale == "split_sqrt":
        st.kt = st.mul_scalar(st.kt, np.sqrt(st.scale))


def _split_keys(st: BlockState) -> None:
    """K as (B, N, T, H) — through RoPE, the cache, repeat_kv — and its transpose as the variant writes it."""
    b, v, hd = st.b, st.v, st.hd
    k = st.rotated(b.op("Transpose", [st.rotated(st.k_bsnh, "bsnh")], perm=[0, 2, 1, 3]), "bnsh")
    k_new, k = k, st.repeat_kv(st.cached(k, "key"))
    if v.split_score:  # the cache's keys and the new ones apart (the Concat only returns the present)
        k = (st.repeat_kv("past_key", st.past_len), st.repeat_kv(k_new, st.seq))
    st.k = k
    if st.folded:  # bmm: (B, N, T, H) → (B·N, T, H), transposed in 3D
        st.k = _fold(b, k)
        st.kt = st.k if v.einsum else b.op("Transpose", [st.k], perm=[0, 2, 1])
    elif v.einsum:
        pass
    elif v.split_score:
        st.kt = tuple(b.op("Transpose", [part], perm=[0, 1, 3, 2]) for part in k)
    elif v.k_layout == "transpose_0132":
        st.kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    else:  # dynamo: fold (B, N) into one dim, transpose the last two, unfold
        shape = b.op("Shape", [k])
        tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
        k3 = b.op("Reshape", [k, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])
        k3t = b.op("Transpose", [k3], perm=[0, 2, 1])
        lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
        seq_dim = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))])
        target = b.op("Concat", [lead, b.const(np.array([hd], np.int64)), seq_dim], axis=0)
        st.kt = b.op("Reshape", [k3t, target])


def _scores(st: BlockState) -> None:
    """Q·Kᵀ: a MatMul (two against a split cache), an Einsum, or with the relative term that reads Q."""
    b, v = st.b, st.v
    q_in = _fold(b, st.q) if st.folded else st.q
    if v.query_bias == "rel_pos_uv":  # split heads' MatMul scores only (see repair.compatible)
        st.s = _query_biased_scores(b, v, st.q, st.kt, st.inputs, st.seq, st.kv_seq, st.np_type)
    elif v.split_score:
        st.s = b.op("Concat", [_matmul(b, v, q_in, part) for part in st.kt], axis=-1)
    elif not v.einsum:
        st.s = _matmul(b, v, q_in, st.kt)
    else:
        st.s = b.op("Einsum", [q_in, st.kt], equation=_EINSUM_SCORES["bsnh" if st.bsnh_einsum else st.layout])


def _context(st: BlockState) -> None:
    """P·V, and the heads merged back into (B, S, N·H) from wherever the layout left them."""
    b, v, p, v_, hidden = st.b, st.v, st.p, st.v_, st.hidden
    if st.bsnh_einsum:  # bnij,bjnd->bind: the context comes out as (B, S, N, H)
        o = b.op("Einsum", [p, st.v_bsnh], equation=_EINSUM_CONTEXT["bsnh"])
        o = b.op("Reshape", [o, b.const(np.array([0, 0, hidden], np.int64), "shape")])
    elif st.layout == "single":
        o = b.op("Einsum", [p, v_], equation=_EINSUM_CONTEXT[st.layout]) if v.einsum else b.op("MatMul", [p, v_])
    elif st.layout == "channel_first":  # (B, N, H, S) → (B, C, S), back to (B, S, C) for the next block
        if v.einsum:
            o = b.op("Einsum", [p, v_], equation=_EINSUM_CONTEXT[st.layout])
        else:
            o = b.op("Transpose", [b.op("MatMul", [p, v_])], perm=[0, 1, 3, 2])
        o = b.op("Reshape", [o, b.const(np.array([0, hidden, -1], np.int64), "shape")])
        o = b.op("Transpose", [o], perm=[0, 2, 1])
    else:
        o = _split_context(st)
    st.o = o


def _split_context(st: BlockState) -> str:
    """P·V on split or folded heads (two products over a split cache), transposed and merged back."""
    b, v, p = st.b, st.v, st.p
    v_in = _fold(b, st.v_) if st.folded else st.v_
    if v.split_score:  # the probabilities cut at the cache's length, each piece times its values
        length = b.op("Slice", [b.op("Shape", ["past_key"]), b.const(np.array([2], np.int64)),
                                b.const(np.array([3], np.int64))])  # fmt: skip
        last = b.const(np.array([-1], np.int64), "axis")
        pieces = (b.op("Slice", [p, b.const(np.array([0], np.int64)), length, last]),
                  b.op("Slice", [p, length, b.const(np.array([2**63 - 1], np.int64)), last]))  # fmt: skip
        o = b.comm("Add", *(b.op("MatMul", [piece, part]) for piece, part in zip(pieces, v_in, strict=True)))
    elif v.einsum:
        o = b.op("Einsum", [p, v_in], equation=_EINSUM_CONTEXT[st.layout])
    else:
        o = _matmul(b, v, p, v_in)
    if st.folded:
        o = _unfold(b, o, st.q)
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    return b.op("Reshape", [o, b.const(np.array([0, 0, st.hidden], np.int64), "shape")])


_PARTS = (
    _project,
    _query,
    _keys,
    _scores,
    declare_mask,
    scale_folded,
    add_biases,
    apply_mask,
    probabilities,
    _context,
)
"""The parts in the order they are written."""


def _model(st: BlockState) -> onnx.ModelProto:
    """The output named ``y``, fixed input sizes as text dims where the variant asks, opset 17."""
    st.b.nodes.append(helper.make_node("Identity", [st.o], ["y"], name="n_output"))
    if st.v.text_dims:
        for info in st.inputs:
            for d in info.type.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    d.dim_param = str(d.dim_value)
    graph = helper.make_graph(st.b.nodes, "attention", st.inputs, st.outputs, st.b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="egfuse.testing")
    model.ir_version = 8
    return model

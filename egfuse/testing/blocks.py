"""Building blocks of the generated graphs: the node :class:`Builder` and the pieces each spelling axis
writes (projections, heads folded into the batch, Einsums, causal masks, dropout, query-dependent biases)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from egfuse.testing.variant import Variant


class Builder:
    def __init__(self, v: Variant) -> None:
        self.v = v
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(v.seed)
        self.n = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def concat(self, inputs: list[str], axis: int) -> str:
        """``torch.cat`` in the variant's spelling (see CONCATS)."""
        if self.v.concat == "plain":
            return self.op("Concat", inputs, axis=axis)
        return self.op("ConcatFromSequence", [self.op("SequenceConstruct", inputs)], axis=axis)

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n_{out}", **attrs))
        return out

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def comm(self, op: str, a: str, b: str) -> str:
        return self.op(op, [b, a] if self.v.commuted else [a, b])


_EINSUM_SCORES = {"split": "bnid,bnjd->bnij", "bsnh": "bind,bjnd->bnij", "batch_folded": "bid,bjd->bij",
                  "single": "bid,bjd->bij", "channel_first": "bnid,bndj->bnij"}  # fmt: skip
"""The scores as exporters' Einsums, by where Q and K live (K untransposed; channel-first K is (B, N, H, T))."""


_EINSUM_CONTEXT = {"split": "bnij,bnjd->bnid", "bsnh": "bnij,bjnd->bind", "batch_folded": "bij,bjd->bid",
                   "single": "bij,bjd->bid", "channel_first": "bnij,bndj->bndi"}  # fmt: skip


def _fold(b: Builder, t: str) -> str:
    """(B, N, X, Y) → (B·N, X, Y), the trailing dims read from the shape as ``view(B * N, -1, H)`` exports."""
    tail = b.op("Slice", [b.op("Shape", [t]), b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
    return b.op("Reshape", [t, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])


def _unfold(b: Builder, t: str, like: str) -> str:
    """(B·N, X, Y) → (B, N, X, Y), (B, N) read from the 4D tensor ``like``."""
    lead = b.op("Slice", [b.op("Shape", [like]), b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
    tail = b.op("Slice", [b.op("Shape", [t]), b.const(np.array([1], np.int64)), b.const(np.array([3], np.int64))])
    return b.op("Reshape", [t, b.op("Concat", [lead, tail], axis=0)])


def _conv(b: Builder, v: Variant, x: str, tag: str) -> str:
    """A projection as SqueezeBERT writes it: ``Conv1d(C, C, kernel_size=1)`` on (B, C, S)."""
    np_type = np.dtype(v.dtype)
    w = (b.rng.standard_normal((v.hidden, v.hidden, 1)) * 1.5 / np.sqrt(v.hidden)).astype(np_type)
    inputs = [x, b.const(w, f"w{tag}")]
    if v.proj_bias:
        inputs.append(b.const(b.rng.standard_normal(v.hidden).astype(np_type) * 0.1, f"b{tag}"))
    return b.op("Conv", inputs, kernel_shape=[1])


def _query_bias(b: Builder, v: Variant, q: str, seq_first: bool, inputs: list, seq, kv_seq, onnx_type: int) -> str:
    """A bias computed from the query ``q`` (B, N, S, H) — or (B, S, N, H) when ``seq_first`` — through ops the
    rules do not see into (a relative shift's Pad/Slice, a gate's Sigmoid): the fused op must take it as its
    additive input, computed outside it from the same Q projection."""
    np_type = np.dtype(v.dtype)
    heads, hd = v.heads, v.head_dim
    if seq_first:
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])

    def i64(*values: int) -> str:
        return b.const(np.array(values, np.int64), "i")

    if v.query_bias == "gated":  # WavLM: g = sigmoid(Q·w), gate = g·(g·c − 1) + 2, times a position bias
        inputs.append(helper.make_tensor_value_info("gated_bias", onnx_type, [1, heads, seq, kv_seq]))
        g = b.op("Sigmoid", [b.op("MatMul", [q, b.const((b.rng.standard_normal((hd, 1)) * 0.3).astype(np_type))])])
        inner = b.op("Sub", [b.comm("Mul", g, b.const(np.array(1.5, np_type))), b.const(np.array(1.0, np_type))])
        gate = b.comm("Add", b.comm("Mul", g, inner), b.const(np.array(2.0, np_type)))
        return b.comm("Mul", gate, "gated_bias")
    # Relative: shift((Q + v)·Rᵀ), R the (T, N·H) position embeddings split into heads as (1, N, H, T).
    inputs.append(helper.make_tensor_value_info("rel_pos", onnx_type, [kv_seq, v.hidden]))
    r = b.op("Transpose", [b.op("Reshape", ["rel_pos", i64(1, -1, heads, hd)])], perm=[0, 2, 3, 1])
    qv = b.comm("Add", q, b.const(b.rng.standard_normal((heads, 1, hd)).astype(np_type) * 0.5, "v"))
    bd = b.op("MatMul", [qv, r])
    # Transformer-XL's shift: pad a zero column in front, view as (…, T + 1, S), drop the first row, view back.
    shape = b.op("Shape", [bd])
    padded = b.op("Pad", [bd, i64(0, 0, 0, 1, 0, 0, 0, 0), b.const(np.array(0.0, np_type))])
    t1 = b.op("Add", [b.op("Slice", [shape, i64(3), i64(4)]), i64(1)])
    lead, rows = b.op("Slice", [shape, i64(0), i64(2)]), b.op("Slice", [shape, i64(2), i64(3)])
    viewed = b.op("Reshape", [padded, b.op("Concat", [lead, t1, rows], axis=0)])
    return b.op("Reshape", [b.op("Slice", [viewed, i64(1), i64(2**31), i64(2)]), shape])


def _channel_heads(b: Builder, v: Variant, t: str) -> str:
    """(B, N·H, S) → (B, N, H, S): heads split off the channel axis."""
    return b.op("Reshape", [t, b.const(np.array([0, v.heads, v.head_dim, -1], np.int64), "shape")])


def _query_biased_scores(
    b: Builder, v: Variant, q: str, kt: str, inputs: list, seq: int | str, kv_seq: int | str, np_type: np.dtype
) -> str:
    """Q·Kᵀ, plus the unshifted relative term that reads Q for ``rel_pos_uv`` (see QUERY_BIASES)."""
    heads, hd = v.heads, v.head_dim
    onnx_type = helper.np_dtype_to_tensor_dtype(np_type)
    if v.query_bias == "rel_pos_uv":  # (Q + u)·Kᵀ + (Q + v)·Rᵀ, u and v (N, 1, H) per head
        u, w = (b.const((b.rng.standard_normal((heads, 1, hd)) * 0.5).astype(np_type), t) for t in ("pos_u", "pos_v"))
        inputs.append(helper.make_tensor_value_info("rel_pos", onnx_type, [1, heads, hd, kv_seq]))
        content = b.op("MatMul", [b.comm("Add", q, u), kt])
        return b.op("Add", [content, b.op("MatMul", [b.comm("Add", q, w), "rel_pos"])])
    return b.op("MatMul", [q, kt])


def _shape_part(b: Builder, shape: str, start: int, stop: int) -> str:
    """``shape[start:stop]`` of a 1-D shape tensor, as exporters slice ``Shape`` outputs."""
    return b.op("Slice", [shape, b.const(np.array([start], np.int64)), b.const(np.array([stop], np.int64))])


def _matmul(b: Builder, v: Variant, x: str, y: str) -> str:
    """``x @ y`` on (B, N, ·, ·) operands, plain or decomposed as torch 2.1–2.4's dynamo exporter writes it."""
    if v.matmul == "plain":
        return b.op("MatMul", [x, y])
    if v.matmul == "tf2onnx_einsum" and v.n_kv != v.heads and not v.past:
        return _grouped_einsum_as_tf2onnx(b, x, y, v.n_kv, v.heads // v.n_kv)
    if v.matmul == "tf2onnx_einsum":
        return _einsum_as_tf2onnx(b, x, y)

    folded = []
    for t in (x, y):
        shape = b.op("Shape", [t])
        wide = b.op("Expand", [t, shape])  # broadcasts the batch dims; here they already agree
        target = b.op("Concat", [b.const(np.array([-1], np.int64)), _shape_part(b, shape, 2, 4)], axis=0)
        folded.append(b.op("Reshape", [wide, target]))
    product = b.op("MatMul", folded)
    target = b.op(
        "Concat", [_shape_part(b, b.op("Shape", [x]), 0, 2), _shape_part(b, b.op("Shape", [product]), 1, 3)], axis=0
    )
    return b.op("Reshape", [product, target])


def _einsum_as_tf2onnx(b: Builder, x: str, y: str) -> str:
    """``bnsh,bnht->bnst`` as tf2onnx writes an Einsum: x gets the letter t as a unit axis (B, N, S, H, 1) and is
    transposed to (B, N, 1, S, H), y gets s (B, N, 1, H, T); each is reshaped to (B·N, ·, ·) by a target whose
    batch entry is ``ReduceProd`` of its first two dims; the 3D product goes back to (B, N, S, T, 1) and is
    squeezed."""

    def folded(t: str, axis: int, perm: list[int] | None) -> str:
        wide = b.op("Unsqueeze", [t, b.const(np.array([axis], np.int64))])
        if perm is not None:
            wide = b.op("Transpose", [wide], perm=perm)
        shape = b.op("Shape", [wide])
        batch = b.op("ReduceProd", [_shape_part(b, shape, 0, 2)], keepdims=1)
        return b.op("Reshape", [wide, b.op("Concat", [batch, _shape_part(b, shape, 3, 5)], axis=0)])

    product = b.op("MatMul", [folded(x, 4, [0, 1, 4, 2, 3]), folded(y, 2, None)])
    unit = b.const(np.array([1], np.int64))
    rows_cols = _shape_part(b, b.op("Shape", [product]), 1, 3)
    target = b.op("Concat", [_shape_part(b, b.op("Shape", [x]), 0, 2), rows_cols, unit], axis=0)
    return b.op("Squeeze", [b.op("Reshape", [product, target]), b.const(np.array([4], np.int64))])


def _grouped_einsum_as_tf2onnx(b: Builder, x: str, y: str, kv_heads: int, groups: int) -> str:
    """``x @ y`` for x (B, N, S, ·) with N = K·G query heads and y (B, K, ·, T) of K KV heads, as tf2onnx lowers
    Keras' grouped einsum (``bkgsh,bkht->bkgst``): x viewed as (B, K, G, S, ·), a unit axis added, the group packed
    into the rows of a (B·K, G·S, ·) batch, one 3D MatMul against y folded to (B·K, ·, T), the product viewed
    back as (B, K, G, S, T, 1), squeezed, and its groups joined to (B, N, S, T)."""

    shape_x, shape_y = b.op("Shape", [x]), b.op("Shape", [y])
    sizes = b.const(np.array([kv_heads, groups], np.int64), "groups")
    grouped = b.op(
        "Reshape", [x, b.op("Concat", [_shape_part(b, shape_x, 0, 1), sizes, _shape_part(b, shape_x, 2, 4)], axis=0)]
    )
    wide = b.op("Unsqueeze", [grouped, b.const(np.array([4], np.int64))])
    shape_wide = b.op("Shape", [wide])
    batch = b.op("ReduceProd", [_shape_part(b, shape_wide, 0, 2)], keepdims=1)
    rows = b.op("Concat", [batch, b.const(np.array([-1], np.int64)), _shape_part(b, shape_wide, 5, 6)], axis=0)
    folded_y = b.op("Concat", [b.const(np.array([-1], np.int64)), _shape_part(b, shape_y, 2, 4)], axis=0)
    product = b.op("MatMul", [b.op("Reshape", [wide, rows]), b.op("Reshape", [y, folded_y])])
    unit = b.const(np.array([1], np.int64))
    back = b.op("Concat", [_shape_part(b, b.op("Shape", [grouped]), 0, 4), _shape_part(b, shape_y, 3, 4), unit], axis=0)
    per_group = b.op("Squeeze", [b.op("Reshape", [product, back]), b.const(np.array([5], np.int64))])
    joined = b.op("Concat", [_shape_part(b, shape_x, 0, 3), _shape_part(b, shape_y, 3, 4)], axis=0)
    return b.op("Reshape", [per_group, joined])


def _dropout(b: Builder, v: Variant, p: str) -> str:
    """Eval-mode dropout on the probabilities, in the variant's spelling (see DROPOUTS)."""
    if v.dropout == "none":
        return p
    if v.dropout == "plain":
        return b.op("Dropout", [p])
    if v.dropout == "castlike":
        b.op("CastLike", [b.const(np.array(0, np.int64), "fill"), p])  # its value unused: dtype bookkeeping
        return b.op("CastLike", [p, p])

    def constant(array: np.ndarray) -> str:
        out = b.name("constant")
        b.nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(array)))
        return out

    ratio = np.array(0.1, np.float32)  # its own type parameter: float32 in half-precision models too
    if v.dropout == "ratio":
        out, mask = b.name("dropout"), b.name("dropout_mask")
        b.nodes.append(helper.make_node("Dropout", [p, b.const(ratio, "ratio")], [out, mask]))
        return out
    return b.op("Dropout", [p, constant(ratio), constant(np.array(False))])


def _causal(b: Builder, v: Variant, s: str, x: str, np_type: np.dtype, past: str | None) -> str:
    """Mask key j > query i + P (P cached positions), with lengths read from shapes as exporters do."""
    if v.causal in ("none", "buffer_where", "buffer_local"):
        return s

    def dim(value: str, axis: int) -> str:  # a 1-element shape slice
        at, to = b.const(np.array([axis], np.int64)), b.const(np.array([axis + 1], np.int64))
        return b.op("Slice", [b.op("Shape", [value]), at, to])

    length = dim(x, 1)
    cached = dim(past, 2) if past is not None else b.const(np.array([0], np.int64), "no_past")
    total = b.op("Add", [cached, length])
    if v.causal == "trilu":  # torch.triu(torch.full((S, T), -inf), diagonal=P + 1), added to the scores
        full = b.op(
            "ConstantOfShape",
            [b.op("Concat", [length, total], axis=0)],
            value=numpy_helper.from_array(np.array([-np.inf], np_type)),
        )
        diagonal = b.op("Squeeze", [b.op("Add", [cached, b.const(np.array([1], np.int64))])])
        return b.comm("Add", s, b.op("Trilu", [full, diagonal], upper=1))
    # arange(T)[None, :] > (P + arange(S))[:, None] → Where(future, finfo.min, scores)

    def arange(start: str, stop: str) -> str:
        scalars = [b.op("Squeeze", [t]) for t in (start, stop)]
        return b.op("Range", [*scalars, b.const(np.array(1, np.int64))])

    keys = b.op("Unsqueeze", [arange(b.const(np.array([0], np.int64)), total), b.const(np.array([0], np.int64))])
    queries = b.op("Unsqueeze", [arange(cached, total), b.const(np.array([1], np.int64))])
    future = b.op("Greater", [keys, queries])
    return b.op("Where", [future, b.const(np.array(np.finfo(np_type).min, np_type), "fill"), s])


BUFFER_POSITIONS = 16
"""Rows of the causal buffer (GPT-2's ``n_positions``): longer than any sequence the tests feed."""


LOCAL_WINDOW = 3
"""GPT-Neo's ``window_size`` of ``buffer_local``: small enough that the test sequences reach past it."""


def _buffer_causal(b: Builder, v: Variant, s: str, q: str, kt: str, np_type: np.dtype) -> str:
    """GPT-2 eager (transformers 4.36–4.42): ``Where(bias[:, :, T-S:T, :T], scores, finfo.min)`` with ``bias``
    a stored (1, 1, M, M) boolean tril buffer (GPT-Neo's local layers: tril XOR tril(−window)), S and T read
    from Q's and Kᵀ's shapes (``query.size(-2)``, ``key.size(-2)``) — before the padding mask is added."""
    if v.causal not in ("buffer_where", "buffer_local"):
        return s
    positions = BUFFER_POSITIONS
    allowed = np.tril(np.ones((positions, positions), bool))
    if v.causal == "buffer_local":
        allowed &= ~np.tril(allowed, -LOCAL_WINDOW)
    buffer = b.const(allowed.reshape(1, 1, positions, positions), "bias")
    query_length = b.op("Shape", [q], start=2, end=3)
    if v.past:  # P + S: GPT-2 reads T from the cache's Concat, which then stays outside the op (see kv_cache)
        key_length = b.op("Add", [b.op("Shape", ["past_key"], start=2, end=3), query_length])
    else:
        key_length = b.op("Shape", [kt], start=3, end=4)
    start = b.op("Sub", [key_length, query_length])
    rows = b.op("Slice", [buffer, start, key_length, b.const(np.array([2], np.int64))])
    zero = b.const(np.array([0], np.int64))
    causal = b.op("Slice", [rows, zero, key_length, b.const(np.array([3], np.int64))])
    return b.op("Where", [causal, s, b.const(np.array(np.finfo(np_type).min, np_type), "fill")])

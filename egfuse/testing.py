"""Build attention subgraphs in any of the spellings exporters use — for tests, fuzzing and bug reports.

``attention_model(Variant(...))`` writes one self-attention block (projections → heads → scores → mask →
softmax → @V → merged heads) as plain ONNX ops, with each spelling choice independent of the others. The
hypothesis strategy ``variants()`` draws those choices at random, so users can fuzz their own rules the
way egfuse's property tests do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCALES = ("qk_mul", "qk_div", "q_mul", "k_div", "split_sqrt", "runtime", "custom", "none")
K_LAYOUTS = ("transpose_0132", "transpose_0231", "dynamo_3d")
MASKS = ("none", "additive", "additive_first", "additive_before_scale", "where_neginf", "where_finfo",
         "where_reversed", "padding_int")  # fmt: skip
CAUSAL = ("none", "trilu", "range_greater", "buffer_where", "buffer_local")
"""``buffer_where``/``buffer_local``: transformers 4.36–4.42 GPT-2/GPT-Neo eager — ``Where(bias[:, :, T-S:T, :T],
scores, finfo.min)`` over a sliced boolean buffer (causal, or causal within a sliding window), applied *before*
the mask is added (the other causal values come after it)."""
SOFTCAPS = ("none", "div", "reciprocal")
QDQ = ("none", "inputs", "probs")
"""QuantizeLinear → DequantizeLinear pairs (int8, per tensor): on the Q/K/V projections' outputs (``inputs``:
outside attention, the fused op reads the dequantized values) or also on the probabilities before ·V
(``probs``, as ``quantize_static`` writes them on every MatMul input: no fused op rounds its probabilities, so
that block must stay unfused — a near miss, not drawn by ``variants()``)."""
SOFTCAP = 2.0
"""The cap of soft-capped variants: small enough that capping changes the scores of the drawn inputs."""
DTYPES = ("float32", "float16")
MATMULS = ("plain", "batched_3d")
"""How the two attention MatMuls are written: one 4D MatMul, or as torch 2.1–2.4's dynamo exporter decomposes
it: ``Expand`` (to the shape it has) → ``Reshape`` to (B·N, ·, ·) → 3D MatMul → ``Reshape`` back to (B, N, ·, ·)."""
DROPOUTS = ("none", "plain", "ratio", "training_false", "castlike")
"""An inference Dropout between the softmax and ``·V``: no extra input, a ratio input (and the unused mask
output), or ratio and ``training_mode`` from ``Constant`` nodes (false), as exporters write eval-mode dropout;
or none but torch 2.1's ``CastLike``s: the probabilities cast like themselves, and read as the "like" operand
of a fill's cast (its dtype only)."""
ROPE_TABLES = ("inputs", "positions", "buffer")
"""Where RoPE's cos/sin tables come from: graph inputs (nothing proves their halves equal, so the rotation
must stay as it is), computed from positions as transformers does (``cos(Concat(θ, θ))``: fusable), or stored
(max_positions, H) buffers cut to the sequence length read off the input (transformers 4.36's
``cos_cached[:seq_len]``: a Slice whose end is symbolic)."""
CONCATS = ("plain", "sequence")
"""How the rotation's ``torch.cat`` is written: ``Concat``, or ``ConcatFromSequence(SequenceConstruct(…))`` as
torch 2.1's dynamo exporter writes it."""
HEAD_LAYOUTS = ("split", "batch_folded", "channel_first", "single")
"""Where the heads live: split off the hidden axis into (B, N, S, H) (today's exporters); folded into the batch
as (B·N, S, H) around batched 3D MatMuls (``bmm``: older OPT/BART/Marian/Whisper code, BLOOM); split off the
channel axis of 1×1-convolution projections on (B, C, S), K arriving as (B, N, H, T) (SqueezeBERT); or no
heads axis at all, (B, S, H) (single-head attention)."""
CACHE_READS = ("joined", "split_score")
"""How attention reads a KV cache: over ``Concat(past, new)`` (exporters), or in the split-score form NPU
toolchains write — scores against the cache and against the new keys by two MatMuls, concatenated, one Softmax,
the probabilities sliced at the cache's length, two MatMuls against the cache's and the new values, added."""
QUERY_BIASES = ("none", "rel_pos_uv", "relative", "gated")
"""Additive terms computed from Q: Conformer's unshifted ``(Q + u)·Kᵀ + (Q + v)·Rᵀ`` (``rel_pos_uv``: u, v per
head, R the projected relative positions), Transformer-XL/XLNet/Funnel relative attention ``(Q + u)·Kᵀ +
shift((Q + v)·Rᵀ)`` (``relative``), or WavLM's gate computed from Q scaling a position bias (``gate(Q) · P``)."""


@dataclass(frozen=True)
class Variant:
    """One spelling of self-attention. Defaults are the classic BERT export."""

    scale: str = "qk_div"
    k_layout: str = "transpose_0231"
    mask: str = "additive"
    guard: bool = False  # Where(IsNaN(p), 0, p) after the softmax
    commuted: bool = False  # swap the operands of every commutative Mul/Add
    proj_bias: bool = True
    heads: int = 2
    head_dim: int = 8
    symbolic: bool = True  # batch and sequence as named dims
    causal: str = "none"  # a causal term on top of the mask: Trilu of a -inf square, or Range/Greater + Where
    kv_heads: int | None = None  # fewer K/V heads than query heads (GQA; 1 = MQA), repeated by repeat_kv
    cross: bool = False  # K/V from a second input ("memory") with its own length
    dtype: str = "float32"  # float16: the model in half precision, Softmax in float32 between two Casts
    past: bool = False  # KV cache: K/V = Concat(past, new) on the sequence axis, returned as present outputs
    cache_read: str = "joined"  # see CACHE_READS
    rope: bool = False  # rotary embedding (rotate-half) on Q and K
    rope_tables: str = "inputs"  # see ROPE_TABLES
    rope_partial: bool = False  # rotate only the first half of each head's features (Phi, GPT-NeoX)
    rope_interleaved: bool = False  # pair features (2i, 2i+1) with repeat_interleave'd tables (GPT-J)
    rope_seq_first: bool = False  # rotate (B, S, N, H) before the head transpose (GPT-J), not (B, N, S, H)
    concat: str = "plain"  # see CONCATS
    position_bias: bool = False  # an additive per-head (1, N, S, T) bias on the scores (T5, ALiBi)
    softcap: str = "none"  # Gemma 2: cap·tanh(scores / cap) before the mask, with Div or with Mul by 1/cap
    heads_layout: str = "split"  # see HEAD_LAYOUTS
    baddbmm: bool = False  # batch_folded only: scores = beta·alibi + alpha·(Q·Kᵀ), alibi (B·N, 1, T) (BLOOM)
    einsum: bool = False  # scores and context written as two-operand Einsums (TorchScript keeps them as one op)
    clamp: bool = False  # OPT: max(masked scores, finfo.min) before the softmax
    query_bias: str = "none"  # see QUERY_BIASES
    qdq: str = "none"  # see QDQ
    matmul: str = "plain"  # see MATMULS
    dropout: str = "none"  # see DROPOUTS
    text_dims: bool = False  # fixed sizes of graph inputs named as text dims ('16'), as old dynamo exports do
    seed: int = 0
    query_bias: str = "none"  # see QUERY_BIASES: split heads only, no soft-cap

    def __post_init__(self) -> None:
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"kv_heads={kv} does not divide heads={self.heads}")
        if self.cross and (self.causal != "none" or self.past or self.rope):
            raise ValueError("a causal mask, a self-attention cache or RoPE needs queries and keys over one sequence")
        if (kv != self.heads or self.past or self.rope) and self.k_layout == "transpose_0231":
            raise ValueError("repeat_kv, the cache and RoPE work on (B, N, T, H) keys; transpose_0231 has none")
        if self.qdq != "none" and self.dtype != "float32":
            raise ValueError("QDQ pairs quantize float32 tensors (QuantizeLinear before opset 19 takes no float16)")
        if self.softcap != "none" and (
            self.mask == "additive_before_scale" or self.position_bias or self.query_bias != "none"
        ):
            raise ValueError("soft-capping comes before the mask and any bias: none may be added inside it")
        if self.heads_layout not in HEAD_LAYOUTS:
            raise ValueError(f"heads_layout must be one of {HEAD_LAYOUTS}")
        if self.baddbmm and (self.heads_layout != "batch_folded" or self.scale != "qk_mul" or self.softcap != "none"):
            raise ValueError("baddbmm adds its bias to alpha·(Q·Kᵀ) on folded heads: alpha is the (qk_mul) scale")
        if self.heads_layout in ("channel_first", "single") and (kv != self.heads or self.past or self.rope):
            raise ValueError("channel-first and single-head blocks have no repeat_kv, cache or RoPE here")
        if (self.heads_layout != "split" or self.einsum) and self.causal in ("buffer_where", "buffer_local"):
            raise ValueError("the causal buffer is sliced by Kᵀ's shape: split heads' MatMul scores only")
        if self.einsum and self.query_bias == "rel_pos_uv":
            raise ValueError("the unshifted relative term is built from MatMul scores")
        if self.matmul != "plain" and (self.heads_layout != "split" or self.einsum or self.query_bias != "none"):
            raise ValueError("the batched-MatMul decomposition is of split heads' 4D MatMuls")
        if self.heads_layout == "single" and self.heads != 1:
            raise ValueError("single-head attention has one head")
        if self.query_bias not in QUERY_BIASES:
            raise ValueError(f"query_bias must be one of {QUERY_BIASES}")
        if self.query_bias != "none" and (self.heads_layout != "split" or self.softcap != "none"):
            raise ValueError("query-dependent biases are built on split heads, added outside any soft-cap")
        if self.cache_read not in CACHE_READS:
            raise ValueError(f"cache_read must be one of {CACHE_READS}")
        if self.split_score and (
            self.k_layout != "transpose_0132" or self.heads_layout != "split" or self.einsum or self.matmul != "plain"
            or self.query_bias != "none" or self.scale in ("k_div", "split_sqrt")
            or self.causal in ("buffer_where", "buffer_local")
        ):  # fmt: skip
            raise ValueError("split scores read a cache of (B, N, T, H) keys by plain MatMuls, scaled after Q·Kᵀ")

    def replaced(self, **changes) -> Variant:
        """This variant with some choices changed, and what no longer combines with them dropped."""
        return Variant(**_compatible({**asdict(self), **changes}))

    @property
    def split_score(self) -> bool:
        return self.past and self.cache_read == "split_score"

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads


class _Builder:
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


def attention_model(v: Variant = Variant()) -> onnx.ModelProto:
    b = _Builder(v)
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

    def repeat_kv(t: str, length: int | str | None = None) -> str:  # (B, kv, T, H) → (B, N, T, H), as transformers'
        # repeat_kv exports
        if kv == heads:
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
    rope = _Rope(b, v, inputs, batch, seq, onnx_type) if v.rope else None

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
    elif v.mask.startswith("where"):
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


_EINSUM_SCORES = {"split": "bnid,bnjd->bnij", "bsnh": "bind,bjnd->bnij", "batch_folded": "bid,bjd->bij",
                  "single": "bid,bjd->bij", "channel_first": "bnid,bndj->bnij"}  # fmt: skip
"""The scores as exporters' Einsums, by where Q and K live (K untransposed; channel-first K is (B, N, H, T))."""
_EINSUM_CONTEXT = {"split": "bnij,bnjd->bnid", "bsnh": "bnij,bjnd->bind", "batch_folded": "bij,bjd->bid",
                   "single": "bij,bjd->bid", "channel_first": "bnij,bndj->bndi"}  # fmt: skip


def _fold(b: _Builder, t: str) -> str:
    """(B, N, X, Y) → (B·N, X, Y), the trailing dims read from the shape as ``view(B * N, -1, H)`` exports."""
    tail = b.op("Slice", [b.op("Shape", [t]), b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
    return b.op("Reshape", [t, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])


def _unfold(b: _Builder, t: str, like: str) -> str:
    """(B·N, X, Y) → (B, N, X, Y), (B, N) read from the 4D tensor ``like``."""
    lead = b.op("Slice", [b.op("Shape", [like]), b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
    tail = b.op("Slice", [b.op("Shape", [t]), b.const(np.array([1], np.int64)), b.const(np.array([3], np.int64))])
    return b.op("Reshape", [t, b.op("Concat", [lead, tail], axis=0)])


def _conv(b: _Builder, v: Variant, x: str, tag: str) -> str:
    """A projection as SqueezeBERT writes it: ``Conv1d(C, C, kernel_size=1)`` on (B, C, S)."""
    np_type = np.dtype(v.dtype)
    w = (b.rng.standard_normal((v.hidden, v.hidden, 1)) * 1.5 / np.sqrt(v.hidden)).astype(np_type)
    inputs = [x, b.const(w, f"w{tag}")]
    if v.proj_bias:
        inputs.append(b.const(b.rng.standard_normal(v.hidden).astype(np_type) * 0.1, f"b{tag}"))
    return b.op("Conv", inputs, kernel_shape=[1])


def _query_bias(b: _Builder, v: Variant, q: str, seq_first: bool, inputs: list, seq, kv_seq, onnx_type: int) -> str:
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


def _channel_heads(b: _Builder, v: Variant, t: str) -> str:
    """(B, N·H, S) → (B, N, H, S): heads split off the channel axis."""
    return b.op("Reshape", [t, b.const(np.array([0, v.heads, v.head_dim, -1], np.int64), "shape")])


def _query_biased_scores(
    b: _Builder, v: Variant, q: str, kt: str, inputs: list, seq: int | str, kv_seq: int | str, np_type: np.dtype
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


def _matmul(b: _Builder, v: Variant, x: str, y: str) -> str:
    """``x @ y`` on (B, N, ·, ·) operands, plain or decomposed as torch 2.1–2.4's dynamo exporter writes it."""
    if v.matmul == "plain":
        return b.op("MatMul", [x, y])

    def part(shape: str, start: int, stop: int) -> str:
        return b.op("Slice", [shape, b.const(np.array([start], np.int64)), b.const(np.array([stop], np.int64))])

    folded = []
    for t in (x, y):
        shape = b.op("Shape", [t])
        wide = b.op("Expand", [t, shape])  # broadcasts the batch dims; here they already agree
        target = b.op("Concat", [b.const(np.array([-1], np.int64)), part(shape, 2, 4)], axis=0)
        folded.append(b.op("Reshape", [wide, target]))
    product = b.op("MatMul", folded)
    target = b.op("Concat", [part(b.op("Shape", [x]), 0, 2), part(b.op("Shape", [product]), 1, 3)], axis=0)
    return b.op("Reshape", [product, target])


def _dropout(b: _Builder, v: Variant, p: str) -> str:
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


def in_functions(model: onnx.ModelProto, depth: int = 2, domain: str = "pkg.egfuse.testing") -> onnx.ModelProto:
    """``model`` as torch 2.1–2.4's dynamo exporter writes modules: the main graph one call of a model-local
    function, which calls the next, ``depth`` deep, the innermost holding every node. Weights stay initializers
    of the main graph, passed down as inputs; small constants become ``Constant`` nodes inside the body."""
    graph = model.graph
    weights = [t for t in graph.initializer if t.dims and int(np.prod(t.dims)) > 1]
    small = [t for t in graph.initializer if not (t.dims and int(np.prod(t.dims)) > 1)]
    ins = [i.name for i in graph.input] + [t.name for t in weights]
    outs = [o.name for o in graph.output]
    body = [helper.make_node("Constant", [], [t.name], value=t) for t in small] + list(graph.node)
    opsets = [helper.make_opsetid("", default_opset_of(model))]
    functions = []
    callee = None
    for level in range(depth):
        name = f"Block_{level}"
        nodes = body if callee is None else [helper.make_node(callee, ins, outs, domain=domain, name=f"call_{callee}")]
        functions.append(
            helper.make_function(domain, name, ins, outs, nodes, [*opsets, helper.make_opsetid(domain, 1)])
        )
        callee = name
    call = helper.make_node(callee, ins, outs, domain=domain, name=f"call_{callee}")
    main = helper.make_graph([call], graph.name, list(graph.input), list(graph.output), weights)
    wrapped = helper.make_model(
        main, opset_imports=[*opsets, helper.make_opsetid(domain, 1)], producer_name=model.producer_name
    )
    wrapped.functions.extend(functions)
    wrapped.ir_version = model.ir_version
    return wrapped


def default_opset_of(model: onnx.ModelProto) -> int:
    return next(e.version for e in model.opset_import if e.domain in ("", "ai.onnx"))


def _causal(b: _Builder, v: Variant, s: str, x: str, np_type: np.dtype, past: str | None) -> str:
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


def _buffer_causal(b: _Builder, v: Variant, s: str, q: str, kt: str, np_type: np.dtype) -> str:
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


class _Rope:
    """Rotary embedding ``x·cos + rotate(x)·sin`` on the first ``width`` features of each head: rotate-half
    (Llama) or interleaved pairs (GPT-J), on (B, N, S, H) or (B, S, N, H), with (B, S, ·) cos/sin tables that
    are graph inputs or computed from positions."""

    def __init__(self, b: _Builder, v: Variant, inputs: list, batch, seq, onnx_type: int) -> None:
        self.b, self.head, self.interleaved = b, v.head_dim, v.rope_interleaved
        self.width = v.head_dim // 2 if v.rope_partial else v.head_dim
        self.half = self.width // 2
        table_width = self.half if self.interleaved else self.width
        if v.rope_tables == "inputs":
            for name in ("cos", "sin"):
                inputs.append(helper.make_tensor_value_info(name, onnx_type, [batch, seq, table_width]))
            tables = ["cos", "sin"]
        elif v.rope_tables == "buffer":  # (max_positions, width) tables cut to [:S], broadcast over the batch
            length = b.op("Shape", ["x"], start=1, end=2)
            angles = np.arange(64, dtype=np.float32)[:, None] * (
                1.0 / 10000 ** (np.arange(0, self.width, 2) / self.width)
            )
            if not self.interleaved:
                angles = np.concatenate([angles, angles], axis=-1)
            np_type = helper.tensor_dtype_to_np_dtype(onnx_type)
            tables = []
            for fn in (np.cos, np.sin):
                zero, first = b.const(np.array([0], np.int64)), b.const(np.array([0], np.int64))
                cut = b.op("Slice", [b.const(fn(angles).astype(np_type), "table"), zero, length, first])
                tables.append(b.op("Unsqueeze", [cut, b.const(np.array([0], np.int64))]))
        else:  # transformers: θ = position ⊗ inv_freq; cos/sin of θ (GPT-J) or of Concat(θ, θ), in the model's type
            length = b.op("Squeeze", [b.op("Shape", ["x"], start=1, end=2)])
            positions = b.op(
                "Cast",
                [b.op("Range", [b.const(np.array(0, np.int64)), length, b.const(np.array(1, np.int64))])],
                to=TensorProto.FLOAT,
            )
            inv_freq = (1.0 / 10000 ** (np.arange(0, self.width, 2) / self.width)).astype(np.float32)
            theta = b.op(
                "Mul", [b.op("Unsqueeze", [positions, b.const(np.array([0, 2], np.int64))]), b.const(inv_freq)]
            )
            angles = theta if self.interleaved else b.op("Concat", [theta, theta], axis=-1)
            tables = [b.op("Cast", [b.op(op, [angles])], to=onnx_type) for op in ("Cos", "Sin")]
        axis = 2 if v.rope_seq_first else 1
        self.cos, self.sin = (self._spread(t, axis) for t in tables)

    def _spread(self, table: str, axis: int) -> str:
        """The table unsqueezed at the head axis (and repeat_interleave'd by 2 when the features are paired)."""
        b = self.b
        if not self.interleaved:
            return b.op("Unsqueeze", [table, b.const(np.array([axis], np.int64))])
        wide = b.op("Unsqueeze", [table, b.const(np.array([axis, 4], np.int64))])
        pairs = b.op("Expand", [wide, b.const(np.array([1, 1, 1, 1, 2], np.int64))])
        return b.op("Reshape", [pairs, b.const(np.array([0, 0, 0, -1], np.int64))])

    def __call__(self, t: str) -> str:
        b = self.b

        def part(x: str, start: int, stop: int, step: int = 1) -> str:
            ends = [b.const(np.array([e], np.int64)) for e in (start, stop, -1, step)]
            return b.op("Slice", [x, *ends])

        x = part(t, 0, self.width) if self.width < self.head else t
        if self.interleaved:  # rotate_every_two: stack (−x[1::2], x[0::2]) on a new axis, flatten
            last = b.const(np.array([-1], np.int64))
            pair = [b.op("Unsqueeze", [y, last]) for y in (b.op("Neg", [part(x, 1, 2**31, 2)]), part(x, 0, 2**31, 2))]
            stacked = b.concat(pair, axis=-1)
            rotated = b.op("Reshape", [stacked, b.const(np.array([0, 0, 0, -1], np.int64))])
        else:
            rotated = b.concat([b.op("Neg", [part(x, self.half, 2**31)]), part(x, 0, self.half)], axis=-1)
        out = b.op("Add", [b.op("Mul", [x, self.cos]), b.op("Mul", [rotated, self.sin])])
        return b.op("Concat", [out, part(t, self.width, 2**31)], axis=-1) if self.width < self.head else out


def feeds_for(
    model: onnx.ModelProto, seed: int = 0, batch: int = 2, seq: int = 5, left_padding: bool = False
) -> dict[str, np.ndarray]:
    """Random inputs with real padding: the last sequence's final position is masked out.

    ``left_padding`` also masks the first two positions of the first sequence (a left-padded batch): under a
    causal mask its first query rows then see no key at all — the fully masked rows whose meaning (the mean
    of V, or of the keys a select fill ties with) fused kernels must keep.

    Keys/values of cross-attention (``kv_seq``) are two positions longer than the queries, so a mix-up of
    the two lengths cannot pass unnoticed."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "seq": seq, "kv_seq": seq + 2, "past_seq": 3, "total_seq": seq + 3}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tensor_type = inp.type.tensor_type
        dims = [
            d.dim_value
            if d.HasField("dim_value")
            else int(d.dim_param)
            if d.dim_param.isdigit()
            else sizes[d.dim_param]
            for d in tensor_type.shape.dim
        ]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if tensor_type.elem_type == TensorProto.INT64:  # 1 = attend, 0 = padding
            m = np.ones(dims, np.int64)
            m[-1, -1] = 0
            if left_padding:
                m[0, :2] = 0
            feeds[inp.name] = m
        elif tensor_type.elem_type == TensorProto.BOOL:
            m = np.ones(dims, bool)
            m[-1, ..., -1] = False
            if left_padding:
                m[0, ..., :2] = False
            feeds[inp.name] = m
        elif inp.name == "mask":
            m = np.zeros(dims, dtype)
            m[-1, ..., -1] = -10000.0
            if left_padding:
                m[0, ..., :2] = -10000.0
            feeds[inp.name] = m
        else:
            feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


def _compatible(choices: dict) -> dict:
    """Choices made compatible by dropping what cannot combine (drawn independently, then repaired, so no
    draw is wasted): cross-attention has no causal mask, self cache or RoPE, and the ops that need (B, N, T, H)
    keys (repeat_kv, the cache, RoPE) get them from the (0, 1, 3, 2) layout."""
    c = dict(choices)
    if c["rope_tables"] == "buffer" and (not c["symbolic"] or c["past"]):
        # A cut to a fixed length is a constant table, and past a cache the cut starts at the past length:
        # neither is the transformers 4.36 spelling this value draws (positions cover those tables).
        c["rope_tables"] = "positions"
    if c["cross"]:
        c["causal"], c["past"], c["rope"] = "none", False, False
    kv = c["kv_heads"] or c["heads"]
    if c["heads"] % kv:
        c["kv_heads"] = None
    if c["k_layout"] == "transpose_0231" and (c["kv_heads"] not in (None, c["heads"]) or c["past"] or c["rope"]):
        c["k_layout"] = "transpose_0132"
    if c.get("softcap", "none") != "none":
        c["position_bias"] = False
        c["query_bias"] = "none"
        if c["mask"] == "additive_before_scale":
            c["mask"] = "additive"
    layout = c.setdefault("heads_layout", "split")
    if c.setdefault("baddbmm", False):  # BLOOM's alibi.baddbmm: only on folded heads, alpha the scale, no cap
        if layout != "batch_folded":
            c["baddbmm"] = False
        else:
            c["scale"], c["softcap"] = "qk_mul", "none"
    if layout in ("channel_first", "single"):  # no repeat_kv, cache or RoPE in these blocks
        c["kv_heads"], c["past"], c["rope"] = None, False, False
    if layout == "single":
        c["heads"] = 1
    if layout == "batch_folded" and c["heads"] == 1 and c["past"] and c["guard"]:
        # Known gap (--target onnx only): one folded head with RoPE before the head transpose (seq-first), a
        # cache and the NaN guard: the mask's Add over the split scores is not read as scores + mask.
        c["rope_seq_first"] = False
    if layout != "split" or c.get("softcap", "none") != "none":  # query biases: split heads, no soft-cap
        c["query_bias"] = "none"
    if c.get("einsum") and c.get("query_bias") == "rel_pos_uv":
        c["query_bias"] = "none"
    if (layout != "split" or c.get("einsum")) and c["causal"] in ("buffer_where", "buffer_local"):
        c["causal"] = "trilu"  # the buffer is sliced by Kᵀ's shape: split heads' MatMul scores only
    if c.get("dtype", "float32") != "float32":
        c["qdq"] = "none"
    if layout != "split" or c.get("einsum") or c.get("query_bias", "none") != "none":
        c["matmul"] = "plain"  # the decomposition is of split heads' 4D MatMuls
    if c.get("cache_read", "joined") == "split_score" and c["past"]:  # (B, N, T, H) keys, plain MatMuls
        c["k_layout"], c["heads_layout"], c["einsum"], c["matmul"] = "transpose_0132", "split", False, "plain"
        c["query_bias"] = "none"
        c["scale"] = "qk_div" if c["scale"] in ("k_div", "split_sqrt") else c["scale"]
        c["causal"] = "trilu" if c["causal"] in ("buffer_where", "buffer_local") else c["causal"]
        c["baddbmm"] = False
    if c["causal"] in ("buffer_where", "buffer_local") and c["matmul"] == "batched_3d" and c["heads"] == 1:
        # Known gap (session 8 note): one head of static size, the causal buffer over batched 3D MatMuls and the
        # probabilities CastLike'd to themselves: "probabilities @ V not recognised".
        c["dropout"] = "none" if c.get("dropout") == "castlike" else c.get("dropout", "none")
    return c


def variants():  # pragma: no cover - exercised by the property tests
    """A hypothesis strategy over :class:`Variant` (imported lazily: hypothesis is a test dependency)."""
    from hypothesis import strategies as st

    choices = st.fixed_dictionaries(
        {
            "scale": st.sampled_from(SCALES),
            "k_layout": st.sampled_from(K_LAYOUTS),
            "mask": st.sampled_from(MASKS),
            "guard": st.booleans(),
            "commuted": st.booleans(),
            "proj_bias": st.booleans(),
            "heads": st.sampled_from([1, 2, 4]),
            "head_dim": st.sampled_from([8, 16, 32, 64, 128]),
            "symbolic": st.booleans(),
            "causal": st.sampled_from(CAUSAL),
            "kv_heads": st.sampled_from([None, None, 1, 2]),
            "cross": st.booleans(),
            "dtype": st.sampled_from(DTYPES),
            "past": st.booleans(),
            "cache_read": st.sampled_from(CACHE_READS),
            "rope": st.booleans(),
            "rope_tables": st.sampled_from(ROPE_TABLES),
            "rope_partial": st.booleans(),
            "rope_interleaved": st.booleans(),
            "rope_seq_first": st.booleans(),
            "concat": st.sampled_from(CONCATS),
            "position_bias": st.booleans(),
            "softcap": st.sampled_from(SOFTCAPS),
            "heads_layout": st.sampled_from(HEAD_LAYOUTS),
            "baddbmm": st.booleans(),
            "einsum": st.booleans(),
            "clamp": st.booleans(),
            "query_bias": st.sampled_from(QUERY_BIASES),
            "qdq": st.sampled_from(QDQ[:2]),
            "matmul": st.sampled_from(MATMULS),
            "dropout": st.sampled_from(DROPOUTS),
            "text_dims": st.booleans(),
            "seed": st.integers(0, 2**16),
        }
    )
    return choices.map(lambda c: Variant(**_compatible(c)))


__all__ = [
    "CACHE_READS",
    "CAUSAL",
    "CONCATS",
    "DROPOUTS",
    "DTYPES",
    "HEAD_LAYOUTS",
    "K_LAYOUTS",
    "MASKS",
    "MATMULS",
    "QDQ",
    "QUERY_BIASES",
    "ROPE_TABLES",
    "SCALES",
    "SOFTCAP",
    "SOFTCAPS",
    "Variant",
    "attention_model",
    "feeds_for",
    "in_functions",
    "replace",
    "variants",
]

"""The axes of attention spellings: one tuple of choices each, with what each choice writes, and :data:`AXES`,
every axis the generator draws.

Apart from :class:`~egfuse.testing.variant.Variant` (one point of the space) so the space itself reads as one
list: what an exporter may write, axis by axis, without the code that builds or repairs it.
"""

from __future__ import annotations

SCALES = ("qk_mul", "qk_div", "q_mul", "k_div", "split_sqrt", "runtime", "custom", "none", "per_head")
"""``per_head``: the scores times a (N, 1, 1) constant, one factor per head (SwinV2's learned logit scale),
on split heads' scores with no bias inside the product."""


K_LAYOUTS = ("transpose_0132", "transpose_0231", "dynamo_3d")


MASKS = ("none", "additive", "additive_first", "additive_before_scale", "where_neginf", "where_finfo",
         "where_reversed", "padding_int", "keras_select")  # fmt: skip
"""``keras_select``: a boolean mask applied as tf2onnx writes Keras' ``where``: ``Cast(m)·S + F·Cast(¬m)``."""


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


MATMULS = ("plain", "batched_3d", "tf2onnx_einsum")
"""How the two attention MatMuls are written: one 4D MatMul; as torch 2.1–2.4's dynamo exporter decomposes it:
``Expand`` (to the shape it has) → ``Reshape`` to (B·N, ·, ·) → 3D MatMul → ``Reshape`` back to (B, N, ·, ·); or as
tf2onnx lowers Keras' Einsum: each operand ``Unsqueeze``d to the letters of both, ``Transpose``d to (batch, free,
contracted), ``Reshape``d to (B·N, ·, ·) by a ``ReduceProd`` of its batch dims, a 3D MatMul, ``Reshape``d back
with a unit axis and ``Squeeze``d. With fewer K/V heads than query heads, as tf2onnx lowers Keras' grouped
einsum: K and V not repeated, each group of query heads packed into the rows of one (B·K, G·S, H) batch entry
(without a KV cache: Keras' caches are no Concat)."""


DROPOUTS = ("none", "plain", "ratio", "training_false", "castlike")
"""An inference Dropout between the softmax and ``·V``: no extra input, a ratio input (and the unused mask
output), or ratio and ``training_mode`` from ``Constant`` nodes (false), as exporters write eval-mode dropout;
or none but torch 2.1's ``CastLike``s: the probabilities cast like themselves, and read as the "like" operand
of a fill's cast (its dtype only)."""


ROPE_TABLES = ("inputs", "positions", "buffer")
"""Where RoPE's cos/sin tables come from: graph inputs (nothing proves their halves equal, so the rotation
must stay as it is), computed from positions as transformers does (``cos(Concat(θ, θ))``: fusable), or stored
(max_positions, H) buffers cut to the sequence length read off the input (transformers 4.36's
``cos_cached[:seq_len]``: a Slice whose end is symbolic; fusable, since rows cut keep equal halves)."""


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


AXES: dict[str, tuple] = {
    "scale": SCALES,
    "k_layout": K_LAYOUTS,
    "mask": MASKS,
    "guard": (False, True),
    "zeroed": (False, True),
    "commuted": (False, True),
    "proj_bias": (False, True),
    "heads": (1, 2, 4),
    "head_dim": (8, 16, 32, 64, 128),
    "symbolic": (False, True),
    "causal": CAUSAL,
    "kv_heads": (None, 1, 2),
    "cross": (False, True),
    "dtype": DTYPES,
    "past": (False, True),
    "cache_read": CACHE_READS,
    "rope": (False, True),
    "rope_tables": ROPE_TABLES,
    "rope_partial": (False, True),
    "rope_interleaved": (False, True),
    "rope_seq_first": (False, True),
    "concat": CONCATS,
    "position_bias": (False, True),
    "softcap": SOFTCAPS,
    "heads_layout": HEAD_LAYOUTS,
    "baddbmm": (False, True),
    "einsum": (False, True),
    "clamp": (False, True),
    "query_bias": QUERY_BIASES,
    "qdq": QDQ[:2],
    "matmul": MATMULS,
    "dropout": DROPOUTS,
    "text_dims": (False, True),
}
"""Every axis the generator draws, with its values (the seed aside): the spelling space is their product, with
what cannot combine repaired (:func:`egfuse.testing.repair.compatible`). ``qdq='probs'`` is a near miss (no fused
op rounds its probabilities), not a spelling of attention; ``head_dim`` is a size, not a spelling."""

SIZE_AXES = ("head_dim",)
"""Axes that change sizes, not the spelling."""

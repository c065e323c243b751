"""The axes of attention spellings (one tuple of choices each) and :class:`Variant`, one point of that
space — with the hypothesis strategy that draws them and the repair that makes free draws combine."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

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


@dataclass(frozen=True)
class Variant:
    """One spelling of self-attention. Defaults are the classic BERT export."""

    scale: str = "qk_div"
    k_layout: str = "transpose_0231"
    mask: str = "additive"
    guard: bool = False  # Where(IsNaN(p), 0, p) after the softmax
    zeroed: bool = False  # Keras: the probabilities times Cast(mask) (where_finfo, keras_select; split heads)
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
    query_bias: str = "none"  # see QUERY_BIASES: split heads only, no soft-cap
    qdq: str = "none"  # see QDQ
    matmul: str = "plain"  # see MATMULS
    dropout: str = "none"  # see DROPOUTS
    text_dims: bool = False  # fixed sizes of graph inputs named as text dims ('16'), as old dynamo exports do
    seed: int = 0

    def __post_init__(self) -> None:
        if self.zeroed and (
            self.mask not in ("where_finfo", "keras_select")
            or self.heads_layout != "split"
            or self.causal != "none"
            or self.clamp
        ):
            raise ValueError("probabilities are zeroed with a boolean mask that hid the keys, on split heads")
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
    if c["mask"] == "keras_select" and (
        layout != "split" or c.get("query_bias", "none") != "none" or c.get("position_bias")
    ):
        # Known gaps: the select as arithmetic over rank-3 scores (heads folded or single) is not read — the
        # products would have to split through each elementwise op; Keras' graphs keep the heads axis — and over
        # scores plus a bias egfuse cannot prove finite (0·bias is a select's 0 only for a finite bias).
        c["mask"] = "where_finfo"
    if c.get("zeroed") and (
        c["mask"] not in ("where_finfo", "keras_select") or layout != "split" or c["causal"] != "none" or c.get("clamp")
    ):
        # zeroed with the boolean mask that hid the keys, on (B, N, S, T) probabilities; a causal term added after
        # the select makes it no identity (rules/masks.py), Keras combines the two masks before it; OPT's clamp
        # between the select and the softmax is not read under the zeroing (Keras never clamps)
        c["zeroed"] = False
    if c["scale"] == "per_head" and (
        layout != "split" or c.get("query_bias", "none") != "none" or c["mask"] == "additive_before_scale"
    ):  # a (N, 1, 1) factor scales split heads' (B, N, S, T) scores, nothing added before it
        c["scale"] = "qk_div"
    if layout != "split" or c.get("einsum") or c.get("query_bias", "none") != "none":
        c["matmul"] = "plain"  # the decomposition is of split heads' 4D MatMuls
    if c.get("cache_read", "joined") == "split_score" and c["past"]:  # (B, N, T, H) keys, plain MatMuls
        c["k_layout"], c["heads_layout"], c["einsum"], c["matmul"] = "transpose_0132", "split", False, "plain"
        c["query_bias"] = "none"
        c["scale"] = "qk_div" if c["scale"] in ("k_div", "split_sqrt") else c["scale"]
        c["causal"] = "trilu" if c["causal"] in ("buffer_where", "buffer_local") else c["causal"]
        c["baddbmm"] = False
    if c["causal"] in ("buffer_where", "buffer_local") and c["matmul"] != "plain" and c["heads"] == 1:
        # Known gap (session 8 note): one head, the causal buffer over decomposed (3D) MatMuls, and the
        # probabilities CastLike'd to themselves or a KV cache: "probabilities @ V not recognised".
        c["dropout"] = "none" if c.get("dropout") == "castlike" else c.get("dropout", "none")
        if c.get("past"):
            c["matmul"] = "plain"
    return c


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
what cannot combine repaired (:func:`_compatible`). ``qdq='probs'`` is a near miss (no fused op rounds its
probabilities), not a spelling of attention; ``head_dim`` is a size, not a spelling."""

SIZE_AXES = ("head_dim",)
"""Axes that change sizes, not the spelling."""


def canonical(choices: dict) -> Variant | None:
    """The variant these choices spell if they are its one canonical form, else None: nothing the repair would
    change, nothing that cannot combine, and no choice the rest makes meaningless set off its default (the
    RoPE table forms without RoPE, the cache's reading without a cache, kv heads equal to the heads). Each
    spelling has exactly one canonical form, so counting and sampling canonical forms counts and samples
    spellings."""
    default = _defaults()
    c = {**default, **choices}
    if _compatible(c) != c:
        return None
    if not c["rope"] and any(c[k] != default[k] for k in _ROPE_ONLY):
        return None
    if not c["past"] and c["cache_read"] != default["cache_read"]:
        return None
    if c["kv_heads"] is not None and c["kv_heads"] == c["heads"]:
        return None
    try:
        return Variant(**c)
    except ValueError:
        return None


@functools.cache
def _defaults() -> dict:
    return asdict(Variant())


_ROPE_ONLY = ("rope_tables", "rope_partial", "rope_interleaved", "rope_seq_first", "concat")


def variants():  # pragma: no cover - exercised by the property tests
    """A hypothesis strategy over :class:`Variant` (imported lazily: hypothesis is a test dependency). Draws
    each axis of :data:`AXES` independently — MHA twice as often as each of GQA and MQA — and repairs."""
    from hypothesis import strategies as st

    def axis(name: str, values: tuple):
        if name == "kv_heads":
            return st.sampled_from([None, None, 1, 2])
        return st.booleans() if values == (False, True) else st.sampled_from(list(values))

    strategies = {name: axis(name, values) for name, values in AXES.items()}
    choices = st.fixed_dictionaries({**strategies, "seed": st.integers(0, 2**16)})
    return choices.map(lambda c: Variant(**_compatible(c)))

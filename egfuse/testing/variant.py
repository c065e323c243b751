"""One point of the spelling space, :class:`Variant`, with the hypothesis strategy that draws them and the
canonical form that counts each spelling once.

The axes themselves are :mod:`~egfuse.testing.axes`, the repair that makes free draws combine
:mod:`~egfuse.testing.repair`.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from egfuse.testing.axes import (
    AXES,
    CACHE_READS,
    HEAD_LAYOUTS,
    QUERY_BIASES,
)
from egfuse.testing.repair import compatible

__all__ = ["Variant", "canonical", "variants"]


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
        return Variant(**compatible({**asdict(self), **changes}))

    @property
    def split_score(self) -> bool:
        return self.past and self.cache_read == "split_score"

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads


def canonical(choices: dict) -> Variant | None:
    """The variant these choices spell if they are its one canonical form, else None: nothing the repair would
    change, nothing that cannot combine, and no choice the rest makes meaningless set off its default (the
    RoPE table forms without RoPE, the cache's reading without a cache, kv heads equal to the heads). Each
    spelling has exactly one canonical form, so counting and sampling canonical forms counts and samples
    spellings."""
    default = _defaults()
    c = {**default, **choices}
    if compatible(c) != c:
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
    return choices.map(lambda c: Variant(**compatible(c)))

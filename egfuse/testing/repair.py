"""The repair that makes independently drawn choices combine: what cannot go with the rest is dropped.

The generator draws every axis independently (no draw is wasted on a rejection) and repairs afterwards, so the
repair decides which spellings exist at all: :func:`egfuse.testing.canonical` counts a spelling only where the
repair leaves it unchanged. One function per family of constraint, applied in a fixed order — a later repair
reads what an earlier one settled (the head layout before the biases that need split heads, the cache's reading
last, over everything it overrides).
"""

from __future__ import annotations

from collections.abc import Callable


def compatible(choices: dict) -> dict:
    """Choices made compatible by dropping what cannot combine (drawn independently, then repaired, so no
    draw is wasted): cross-attention has no causal mask, self cache or RoPE, and the ops that need (B, N, T, H)
    keys (repeat_kv, the cache, RoPE) get them from the (0, 1, 3, 2) layout."""
    c = dict(choices)
    for repair in _REPAIRS:
        repair(c)
    return c


def _keys_and_tables(c: dict) -> None:
    """RoPE's buffer tables, cross-attention, the K/V head count and the K layout the cache and RoPE need."""
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


def _soft_cap(c: dict) -> None:
    """Soft-capping comes before the mask and any bias: nothing may be added inside it."""
    if c.get("softcap", "none") != "none":
        c["position_bias"] = False
        c["query_bias"] = "none"
        if c["mask"] == "additive_before_scale":
            c["mask"] = "additive"


def _head_layout(c: dict) -> None:
    """BLOOM's baddbmm, and what folded, channel-first and single-head blocks have no room for."""
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


def _biases_and_precision(c: dict) -> None:
    """Query-dependent biases and the causal buffer need split heads' MatMul scores; QDQ pairs float32."""
    layout = c["heads_layout"]
    if layout != "split" or c.get("softcap", "none") != "none":  # query biases: split heads, no soft-cap
        c["query_bias"] = "none"
    if c.get("einsum") and c.get("query_bias") == "rel_pos_uv":
        c["query_bias"] = "none"
    if (layout != "split" or c.get("einsum")) and c["causal"] in ("buffer_where", "buffer_local"):
        c["causal"] = "trilu"  # the buffer is sliced by Kᵀ's shape: split heads' MatMul scores only
    if c.get("dtype", "float32") != "float32":
        c["qdq"] = "none"


def _masks(c: dict) -> None:
    """Keras' arithmetic select and the zeroed probabilities, where egfuse reads them."""
    layout = c["heads_layout"]
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


def _scale_and_matmuls(c: dict) -> None:
    """A per-head scale and the batched-MatMul decomposition, both of split heads' (B, N, S, T) scores."""
    layout = c["heads_layout"]
    if c["scale"] == "per_head" and (
        layout != "split" or c.get("query_bias", "none") != "none" or c["mask"] == "additive_before_scale"
    ):  # a (N, 1, 1) factor scales split heads' (B, N, S, T) scores, nothing added before it
        c["scale"] = "qk_div"
    if layout != "split" or c.get("einsum") or c.get("query_bias", "none") != "none":
        c["matmul"] = "plain"  # the decomposition is of split heads' 4D MatMuls


def _cache_read(c: dict) -> None:
    """The split-score reading of a cache overrides what it cannot take; a known gap of the causal buffer."""
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


_REPAIRS: tuple[Callable[[dict], None], ...] = (
    _keys_and_tables,
    _soft_cap,
    _head_layout,
    _biases_and_precision,
    _masks,
    _scale_and_matmuls,
    _cache_read,
)
"""The repairs in the order they apply (see the module docstring)."""

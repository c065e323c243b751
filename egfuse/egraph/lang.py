"""The e-graph language: tensors as egglog terms.

Every stage (lower, rules, extract, raise) speaks this one vocabulary. Three layers of constructors:

* **primitive** — one per ONNX op the rules reason about (``matmul``, ``transpose`` …). Each raises back to
  that op, so any e-class that holds an original value can always be extracted unchanged.
* **semantic layout** — what a ``Reshape`` *means* (``split_heads``, ``merge_lead`` …), decided at lowering
  from symbolic shapes, so layout rules are pure algebra with no shape conditions.
* **attention** — the canonical forms (``scores``, ``probs``, ``attend``) every spelling is rewritten into,
  and the target ops (``mha``, ``packed_attention``) that extraction may choose per hardware target.

Dims and permutations are ``String`` ("64", "batch", "0,2,1,3"): equal strings mean equal dims, which is
all the rules need. Permutation algebra is a lookup table (``perm_then``) written into each e-graph. What is
known of a term (its rank, a constant's value, finiteness …) are the facts of :mod:`egfuse.egraph.term_facts`.
"""

from __future__ import annotations

from egglog import Expr, StringLike, f64Like, i64Like

__all__ = ["Tensor"]


class Tensor(Expr):
    """A tensor-valued program. Constructors are grouped as the module docstring describes."""

    # --- leaves -------------------------------------------------------------------------------------------
    @classmethod
    def value(cls, index: i64Like) -> Tensor:
        """An ONNX value defined outside the region (or an initializer): emitted as a reference to it."""

    @classmethod
    def full_like(cls, like: Tensor, fill: f64Like) -> Tensor:
        """A scalar ``fill`` of ``like``'s dtype: the 0 and −inf of a select mask made additive."""

    @classmethod
    def zero_bias(cls, weight: Tensor) -> Tensor:
        """Zeros as wide as ``weight``'s output: the bias of a projection written without one."""

    @classmethod
    def unit_scale(cls, like: Tensor, width: i64Like) -> Tensor:
        """Ones, ``width`` of them in ``like``'s element type: the γ of a norm written without one."""

    @classmethod
    def no_bias(cls) -> Tensor:
        """The absent additive mask."""

    # --- primitive ONNX ops -------------------------------------------------------------------------------
    @classmethod
    def matmul(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def add(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def sub(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def mul(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def div(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def where(cls, cond: Tensor, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def isnan(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def sqrt(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def tanh(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def pow(cls, a: Tensor, b: Tensor) -> Tensor: ...
    @classmethod
    def reciprocal(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def erf(cls, a: Tensor) -> Tensor: ...

    @classmethod
    def reduce_mean(cls, a: Tensor) -> Tensor:
        """``ReduceMean`` over the last axis, keeping it (the only reduction a norm needs)."""

    @classmethod
    def cast(cls, a: Tensor, to: i64Like) -> Tensor: ...

    @classmethod
    def maximum(cls, a: Tensor, b: Tensor) -> Tensor:
        """``Max(a, b)``: OPT clamps its masked scores at finfo.min before the softmax."""

    @classmethod
    def softmax(cls, a: Tensor) -> Tensor:
        """Softmax over the last axis (the only axis attention normalises)."""

    @classmethod
    def transpose(cls, a: Tensor, perm: StringLike) -> Tensor: ...

    @classmethod
    def reshape(cls, a: Tensor, shape: Tensor) -> Tensor:
        """A reshape with no recognised meaning: kept as the original op."""

    @classmethod
    def nan_to_zero(cls, a: Tensor, zero: Tensor) -> Tensor:
        """``Where(IsNaN(a), zero, a)``: the guard exporters put after softmax for fully masked rows."""

    # --- pieces and joins: a KV cache read in split-score form, attention written head by head ----------------
    @classmethod
    def concat(cls, a: Tensor, b: Tensor, axis: i64Like) -> Tensor:
        """``Concat([a, b], axis)`` with ``axis`` counted from the end (−1 the last), so a rule holds at any rank.
        An n-ary Concat is a left fold of these."""

    @classmethod
    def part(cls, a: Tensor, axis: i64Like, start: i64Like, size: i64Like) -> Tensor:
        """``a[…, start : start + size, …]`` along ``axis`` (counted from the end): one piece of a Split."""

    # --- rotary embeddings (:mod:`egfuse.rules.rotary`): the rotation and its cos/sin tables ---------------------
    @classmethod
    def neg(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def cos(cls, a: Tensor) -> Tensor: ...
    @classmethod
    def sin(cls, a: Tensor) -> Tensor: ...

    @classmethod
    def unsqueeze(cls, a: Tensor, axis: i64Like) -> Tensor:
        """A new unit axis at ``axis`` of the result, counted from the end (ONNX's negative axes)."""

    @classmethod
    def squeeze(cls, a: Tensor, axis: i64Like) -> Tensor:
        """``a`` without its unit axis ``axis`` (counted from the end): ``unsqueeze``'s inverse."""

    @classmethod
    def rows(cls, table: Tensor, index: Tensor) -> Tensor:
        """``Gather(table, index, axis=0)``: rows of a table (``cos_cached[position_ids]``)."""

    @classmethod
    def rows_nd(cls, table: Tensor, index: Tensor) -> Tensor:
        """``GatherND(table, index)`` with an index of last dim 1: rows of a table (torch 2.1-2.3's ``aten::index``)."""

    @classmethod
    def sliced(cls, a: Tensor, axis: i64Like) -> Tensor:
        """A piece of ``a`` along ``axis`` (counted from the end, never the last) at bounds only the graph knows
        (``cos_cached[:seq_len]``): written as the graph's own value, never anew."""

    @classmethod
    def strided(cls, a: Tensor, start: i64Like) -> Tensor:
        """``a[…, start::2]``: the even (0) or odd (1) features of an even-width last axis."""

    @classmethod
    def interleave(cls, a: Tensor, b: Tensor) -> Tensor:
        """``[a₀, b₀, a₁, b₁, …]`` along the last axis: ``stack((a, b), -1).flatten(-2)``."""

    @classmethod
    def rotary_cos(cls, x: Tensor, cos: Tensor, heads_axis: i64Like, interleaved: i64Like) -> Tensor:
        """``x · cos`` with a table of the op's structure (the first half of a rotation's sum)."""

    @classmethod
    def rotary_sin(
        cls, x: Tensor, sin: Tensor, heads_axis: i64Like, interleaved: i64Like, rotary_dim: i64Like
    ) -> Tensor:
        """``rotate(x) · sin`` over ``rotary_dim`` features (the second half)."""

    @classmethod
    def rotary(
        cls, x: Tensor, cos: Tensor, sin: Tensor, heads_axis: i64Like, interleaved: i64Like, rotary_dim: i64Like
    ) -> Tensor:
        """The standard ``RotaryEmbedding`` on the first ``rotary_dim`` features of a 4D ``x`` whose heads are
        on ``heads_axis`` (1 or 2), the rest kept. ``cos``/``sin`` are (b, S, ·) tables: rotate-half ones as
        wide as the rotation with equal halves (the op reads the first), interleaved ones half as wide."""

    # --- attention sinks (:mod:`egfuse.rules.sinks`): a softmax over one more column than the keys -------------
    @classmethod
    def row_max(cls, a: Tensor) -> Tensor:
        """``ReduceMax`` over the last axis, keeping it: what a numerically stable softmax subtracts."""

    @classmethod
    def zero_row(cls, a: Tensor) -> Tensor:
        """``a`` with one row of zeros appended along axis −2: a key that scores 0 and a value that adds 0."""

    @classmethod
    def zero_col(cls, a: Tensor) -> Tensor:
        """``a`` with one column of zeros appended along the last axis: a mask that leaves the extra key alone."""

    @classmethod
    def sink_col(cls, e: Tensor, k: Tensor) -> Tensor:
        """``e`` (…, 1) placed after as many zero columns as ``k`` has rows (axis −2): a sink's logit as the
        bias of the key ``zero_row(k)`` appends."""

    @classmethod
    def cols_before(cls, a: Tensor, n: StringLike) -> Tensor:
        """``a[…, :n]``: the probabilities over a KV cache of length ``n`` (a symbolic dim)."""

    @classmethod
    def cols_from(cls, a: Tensor, n: StringLike) -> Tensor:
        """``a[…, n:]``: the probabilities over the keys that follow a cache of length ``n``."""

    # --- semantic layout (what a Reshape means) ------------------------------------------------------------
    @classmethod
    def split_heads(cls, a: Tensor, heads: StringLike, head_dim: StringLike) -> Tensor:
        """(…, heads·head_dim) → (…, heads, head_dim)."""

    @classmethod
    def merge_heads(cls, a: Tensor, heads: StringLike, head_dim: StringLike) -> Tensor:
        """(…, heads, head_dim) → (…, heads·head_dim)."""

    @classmethod
    def merge_lead(cls, a: Tensor, second: StringLike) -> Tensor:
        """(A, second, …) → (A·second, …): how dynamo folds batch and heads into one dim."""

    @classmethod
    def split_lead(cls, a: Tensor, second: StringLike) -> Tensor:
        """(A·second, …) → (A, second, …): the inverse of ``merge_lead``. ``second`` may be a symbol (a window
        count only the run knows): it is written as read off the shape of a value that has that dim."""

    @classmethod
    def tile_lead(cls, m: Tensor, like: Tensor, second: StringLike) -> Tensor:
        """A (1, second, …) tensor repeated over the batch that ``like`` (B·second, …) folds in: (B·second, …)
        with row b·second + w equal to m[0, w] — a per-window mask made a mask of the folded batch (Swin)."""

    @classmethod
    def repeat_heads(cls, a: Tensor, times: StringLike) -> Tensor:
        """(B, N, T, H) → (B, N·times, T, H), each head repeated ``times`` times in place: GQA/MQA's repeat_kv."""

    @classmethod
    def group_heads(cls, a: Tensor, groups: StringLike) -> Tensor:
        """(B, K·G, T, X) → (B, K, G, T, X) with G = ``groups``: the heads axis viewed as K groups of G
        consecutive heads, query heads sharing one KV head (Keras' grouped-query einsum ``btkgh,bskh``)."""

    @classmethod
    def ungroup_heads(cls, a: Tensor, groups: StringLike) -> Tensor:
        """(B, K, G, T, X) → (B, K·G, T, X): ``group_heads``' inverse."""

    @classmethod
    def fold_groups(cls, a: Tensor, kv_heads: StringLike, groups: StringLike) -> Tensor:
        """(B, K·G, T, X) → (B·K, G·T, X) with K = ``kv_heads``: each group's heads stacked as rows of one batch
        entry, so one batched MatMul against the group's KV head serves all G (tf2onnx's grouped einsum)."""

    @classmethod
    def unfold_groups(cls, a: Tensor, kv_heads: StringLike, groups: StringLike) -> Tensor:
        """(B·K, G·T, X) → (B, K·G, T, X): ``fold_groups``' inverse."""

    # --- canonical attention -------------------------------------------------------------------------------
    @classmethod
    def scores(cls, q: Tensor, k: Tensor, scale: f64Like) -> Tensor:
        """``scale · q @ kᵀ`` with q, k in (B, N, S, H) — K given untransposed, so every K layout meets here."""

    @classmethod
    def softcap(cls, a: Tensor, cap: f64Like) -> Tensor:
        """``cap · tanh(a / cap)``: Gemma 2's logit soft-capping of the scores, before the mask."""

    @classmethod
    def probs(cls, q: Tensor, k: Tensor, bias: Tensor, scale: f64Like, cap: f64Like) -> Tensor:
        """``softmax(softcap(scale · q @ kᵀ, cap) + bias)``; ``cap`` 0 means no soft-capping."""

    @classmethod
    def attend(cls, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like) -> Tensor:
        """``probs(q, k, bias, scale, cap) @ v`` in (B, N, S, H); fully masked rows give NaN, like the
        primitives. K and V may have fewer heads than Q (GQA/MQA): query head i reads kv head i // (N / N_kv)."""

    @classmethod
    def attend_z(cls, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like) -> Tensor:
        """``attend`` whose fully masked rows are 0: the softmax was guarded by ``nan_to_zero``."""

    # --- canonical norms and activations (:mod:`egfuse.rules.norms`, :mod:`egfuse.rules.gelu`) -----------------
    @classmethod
    def normalized(cls, x: Tensor, epsilon: f64Like) -> Tensor:
        """``(x − mean(x)) / √(var(x) + epsilon)`` over the last axis: a layer norm before its affine part."""

    @classmethod
    def layer_norm(cls, x: Tensor, scale: Tensor, bias: Tensor, epsilon: f64Like) -> Tensor:
        """``normalized(x, epsilon) · scale + bias``: the standard ``LayerNormalization`` (opset 17), axis −1."""

    @classmethod
    def gelu_cdf(cls, x: Tensor) -> Tensor:
        """``1 + erf(x / √2)``: twice the normal CDF, the bracket of the exact GELU."""

    @classmethod
    def gelu(cls, x: Tensor) -> Tensor:
        """``x · ½ · (1 + erf(x / √2))``: the exact GELU, ``Gelu`` (opset 20) or ``com.microsoft.Gelu``."""

    @classmethod
    def bias_gelu(cls, x: Tensor, bias: Tensor) -> Tensor:
        """``gelu(x + bias)`` with a per-feature ``bias``: ``com.microsoft.BiasGelu`` (a projection's bias)."""

    @classmethod
    def skip_layer_norm(cls, x: Tensor, skip: Tensor, scale: Tensor, bias: Tensor, epsilon: f64Like) -> Tensor:
        """``layer_norm(x + skip, …)``: ``com.microsoft.SkipLayerNormalization``, which also returns the sum."""

    @classmethod
    def skip_rms_norm(cls, x: Tensor, skip: Tensor, scale: Tensor, epsilon: f64Like) -> Tensor:
        """``rms_norm(x + skip, …)``: ``com.microsoft.SkipSimplifiedLayerNormalization``, which returns the sum too."""

    @classmethod
    def rms_normalized(cls, x: Tensor, epsilon: f64Like) -> Tensor:
        """``x / √(mean(x²) + epsilon)`` over the last axis: an RMS norm before its scale."""

    @classmethod
    def rms_norm(cls, x: Tensor, scale: Tensor, epsilon: f64Like) -> Tensor:
        """``rms_normalized(x, epsilon) · scale``: the standard ``RMSNormalization`` (opset 23), axis −1."""

    # --- target ops ----------------------------------------------------------------------------------------
    @classmethod
    def mha(
        cls, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like, heads: StringLike
    ) -> Tensor:
        """``attend`` on the unsplit (B, S, N·H) inputs, output (B, S, N·Hv): MultiHeadAttention's layout, and
        the standard op's 3D form (``q_num_heads``)."""

    @classmethod
    def gqa(cls, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like, heads: StringLike,
            kv_heads: StringLike) -> Tensor:  # fmt: skip
        """``mha`` whose K and V have fewer heads (B, T, N_kv·H): the standard op's 3D form with ``q_num_heads``
        ≠ ``kv_num_heads``. No contrib op takes it without a causal mask (GroupQueryAttention is causal)."""

    @classmethod
    def mha_kv4(
        cls, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like, heads: StringLike
    ) -> Tensor:
        """``mha`` whose K and V are given already split, (B, N, T, H): after RoPE or a KV-head repeat, K and V
        are no longer a plain head split of a projection."""

    @classmethod
    def packed_attention(cls, x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, bq: Tensor, bk: Tensor, bv: Tensor,
                         bias: Tensor, scale: f64Like, heads: StringLike) -> Tensor:  # fmt: skip
        """``com.microsoft.Attention``: the Q/K/V projections of one input and attention in one op."""

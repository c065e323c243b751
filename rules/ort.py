"""onnxruntime's packed-QKV ``com.microsoft.Attention``: ``mha`` whose Q, K and V are three projections
``x @ W + b`` of one input is one op with the three weights concatenated (the fastest spelling of a BERT
block on ORT CPU). A layer norm of a residual sum is ``com.microsoft.SkipLayerNormalization``, an RMS norm
of one ``com.microsoft.SkipSimplifiedLayerNormalization``. And ``mha`` is also ``mha_standard``: the same
attention on the same (B, S, N·H) inputs, written as the standard ``Attention`` (``q_num_heads``) where the ort
target writes ``mha`` as ``com.microsoft.MultiHeadAttention`` — two ops for one layout, so the costs of the
execution provider choose (on onnxruntime's CPU the standard op, on its CUDA provider the contrib one).

The family declares that constructor itself (:data:`CONSTRUCTORS`), as :mod:`egfuse.rules.tanh_gelu` does."""

from __future__ import annotations

from egglog import String, StringLike, eq, f64, f64Like, function, i64, rewrite, rule, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import is_weight, rank_of


@function
def mha_standard(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: f64Like, cap: f64Like, heads: StringLike
) -> Tensor:
    """``mha`` written as the standard ``Attention`` on its 3D inputs (``q_num_heads`` = ``kv_num_heads`` =
    ``heads``)."""


CONSTRUCTORS = {"mha_standard": mha_standard}
"""This family's constructors by name: what the e-graph reads back and the cost model and writers key on."""


@ruleset
def rules(
    b: Tensor,
    x: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    bq: Tensor,
    bk: Tensor,
    bv: Tensor,
    s: f64,
    c: f64,
    n: String,
):
    def proj(w: Tensor, c: Tensor) -> Tensor:
        return Tensor.add(Tensor.matmul(x, w), c)

    # A projection without a bias has a zero one (Whisper's k_proj), so it packs like the others.
    yield rewrite(Tensor.matmul(x, wq)).to(
        Tensor.add(Tensor.matmul(x, wq), Tensor.zero_bias(wq)), is_weight(wq), eq(rank_of(wq)).to(i64(2))
    )
    yield rule(Tensor.zero_bias(wq)).then(is_weight(Tensor.zero_bias(wq)))

    yield rewrite(Tensor.mha(proj(wq, bq), proj(wk, bk), proj(wv, bv), b, s, f64(0.0), n)).to(
        Tensor.packed_attention(x, wq, wk, wv, bq, bk, bv, b, s, n),
        is_weight(wq),
        is_weight(wk),
        is_weight(wv),
        is_weight(bq),
        is_weight(bk),
        is_weight(bv),
    )
    # A residual sum normalized: SkipLayerNormalization (SkipSimplifiedLayerNormalization for an RMS norm), which
    # returns the sum for the next residual too.
    yield rewrite(Tensor.layer_norm(Tensor.add(x, b), wq, bq, s)).to(Tensor.skip_layer_norm(x, b, wq, bq, s))
    yield rewrite(Tensor.rms_norm(Tensor.add(x, b), wq, s)).to(Tensor.skip_rms_norm(x, b, wq, s))
    # MultiHeadAttention's layout written as the standard op too (appended: the rules above keep their names).
    yield rewrite(Tensor.mha(wq, wk, wv, b, s, c, n)).to(mha_standard(wq, wk, wv, b, s, c, n))

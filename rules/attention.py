"""Attention itself: ``softmax(scores + bias) @ V`` is ``attend`` — the one e-class every spelling reaches —
and ``attend`` over head-split inputs is ``mha`` over the unsplit ones. Soft-capped scores
(``softcap(scores, c)``) are the same forms with ``cap`` c; uncapped ones have ``cap`` 0."""

from __future__ import annotations

from egglog import String, eq, f64, i64, ne, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, rank_of

BNSH = "0,2,1,3"
NO_CAP = 0.0


def heads_first(x: Tensor, n: String, h: String) -> Tensor:
    """(B, S, N·H) → (B, N, S, H), the way every exporter splits heads."""
    return Tensor.transpose(Tensor.split_heads(x, n, h), BNSH)


@ruleset
def rules(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    b: Tensor,
    z: Tensor,
    s: f64,
    c: f64,
    n: String,
    h: String,
    hk: String,
    hv: String,
    nk: String,
):
    for logits, cap in ((Tensor.scores(q, k, s), f64(NO_CAP)), (Tensor.softcap(Tensor.scores(q, k, s), c), c)):
        yield rewrite(Tensor.softmax(logits)).to(Tensor.probs(q, k, Tensor.no_bias(), s, cap))
        yield rewrite(Tensor.softmax(Tensor.add(logits, b))).to(Tensor.probs(q, k, b, s, cap))
    yield rewrite(Tensor.matmul(Tensor.probs(q, k, b, s, c), v)).to(
        Tensor.attend(q, k, v, b, s, c), eq(rank_of(v)).to(i64(4))
    )
    # Guarded probabilities: fully masked rows give 0 instead of NaN. The guard commutes with "@ V" (a NaN
    # row of p makes a NaN row of p @ V, for finite V), so it is also a guard after an unguarded attend.
    guarded = Tensor.matmul(Tensor.nan_to_zero(Tensor.probs(q, k, b, s, c), z), v)
    yield rule(guarded, eq(rank_of(v)).to(i64(4))).then(
        union(guarded).with_(Tensor.attend_z(q, k, v, b, s, c)),
        union(guarded).with_(Tensor.nan_to_zero(Tensor.attend(q, k, v, b, s, c), z)),
    )
    # Repeating K/V heads to match Q (repeat_kv) is what grouped-query attention does natively.
    yield rewrite(Tensor.attend(q, Tensor.repeat_heads(k, n), Tensor.repeat_heads(v, n), b, s, c)).to(
        Tensor.attend(q, k, v, b, s, c)
    )
    yield rewrite(Tensor.attend_z(q, Tensor.repeat_heads(k, n), Tensor.repeat_heads(v, n), b, s, c)).to(
        Tensor.attend_z(q, k, v, b, s, c)
    )
    # Any (B, N, S, H) query is the head split of its merge, so attention on it is mha on the merged query.
    yield rewrite(Tensor.attend(q, k, v, b, s, c)).to(
        heads_first(Tensor.mha_kv4(Tensor.merge_heads(Tensor.transpose(q, BNSH), n, h), k, v, b, s, c, n), n, hv),
        eq(dim_of(q, i64(1))).to(n),
        eq(dim_of(q, i64(3))).to(h),
        eq(dim_of(v, i64(3))).to(hv),
        eq(dim_of(k, i64(1))).to(n),  # MultiHeadAttention has no grouped K/V heads
    )
    yield rewrite(Tensor.mha_kv4(q, heads_first(k, n, hk), heads_first(v, n, hv), b, s, c, n)).to(
        Tensor.mha(q, k, v, b, s, c, n)
    )
    # The head split commutes with attention: attend(split(q), split(k), split(v)) = split(mha(q, k, v)).
    yield rewrite(Tensor.attend(heads_first(q, n, h), heads_first(k, n, hk), heads_first(v, n, hv), b, s, c)).to(
        heads_first(Tensor.mha(q, k, v, b, s, c, n), n, hv)
    )
    # ... and with fewer K/V heads (GQA/MQA projections split into N_kv heads), the grouped 3D form.
    yield rewrite(Tensor.attend(heads_first(q, n, h), heads_first(k, nk, hk), heads_first(v, nk, hv), b, s, c)).to(
        heads_first(Tensor.gqa(q, k, v, b, s, c, n, nk), n, hv), ne(n).to(nk)
    )

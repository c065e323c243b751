"""Where the heads live: folded into the batch as (B·N, S, H), or absent, (B, S, H) being one head.

Older transformers code (OPT, BART, Marian, Whisper, BLOOM's ``baddbmm``) runs attention on (B·N, S, H)
with batched 3D MatMuls and views the scores as (B, N, S, T) only to add the mask; single-head blocks have no
heads axis at all. Both are the 4D attention under ``merge_lead`` (for one head, ``merge_lead(·, "1")`` just
drops the unit heads axis). These identities move ``merge_lead`` outward through what attention computes on
the merged batch — softmax over the last axis, an additive term, a batched MatMul — so the 4D forms the
other rule sets know appear inside it, and ``split_lead`` of the merged result cancels it.
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, set_, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, is_weight, rank_of, scalar_of

BNSH = "0,2,1,3"
ONE = "1"


@ruleset
def rules(x: Tensor, c: Tensor, m: Tensor, a: Tensor, n: String, h: String, r: i64, r2: i64, f: f64, g: f64):
    # Ranks through the batch merge/split, so rules conditioned on rank see through them.
    yield rule(Tensor.merge_lead(x, n), rank_of(x) == r).then(set_(rank_of(Tensor.merge_lead(x, n))).to(r - 1))
    yield rule(Tensor.split_lead(x, n), rank_of(x) == r).then(set_(rank_of(Tensor.split_lead(x, n))).to(r + 1))
    # A select mask of scalar fills has its condition's rank (the fills broadcast to it).
    yield rule(Tensor.where(m, a, c), rank_of(m) == r, scalar_of(a) == f, scalar_of(c) == g).then(
        set_(rank_of(Tensor.where(m, a, c))).to(r)
    )
    # A sum broadcasts to the larger rank (masks the other rules combine into one bias).
    yield rule(Tensor.add(a, c), rank_of(a) == r, rank_of(c) == r2).then(set_(rank_of(Tensor.add(a, c))).to(r.max(r2)))
    # Softmax normalises the last axis only: it commutes with merging or splitting the leading ones.
    yield rewrite(Tensor.softmax(Tensor.merge_lead(x, n))).to(Tensor.merge_lead(Tensor.softmax(x), n))
    yield rewrite(Tensor.softmax(Tensor.split_lead(x, n))).to(Tensor.split_lead(Tensor.softmax(x), n))
    # Elementwise maps commute with any batch merge or split (the soft-cap of 3D scores, a Cast around them).
    for lead in (lambda t: Tensor.merge_lead(t, n), lambda t: Tensor.split_lead(t, n)):
        for unary in (Tensor.tanh, lambda t: Tensor.softcap(t, f), lambda t: Tensor.cast(t, r)):
            yield rewrite(unary(lead(x))).to(lead(unary(x)))
        # So does a clamp at a scalar (OPT's max(scores, finfo.min) on its (B·N, T, S) scores).
        yield rewrite(Tensor.maximum(lead(x), c)).to(lead(Tensor.maximum(x, c)), scalar_of(c) == f)
    # A sum of two merges over the same second dim is the merge of the sum (the leading dims then agree).
    yield rewrite(Tensor.add(Tensor.merge_lead(x, n), Tensor.merge_lead(c, n))).to(
        Tensor.merge_lead(Tensor.add(x, c), n)
    )
    merged = Tensor.merge_lead(x, n)
    for total in (Tensor.add(merged, c), Tensor.add(c, merged)):
        # A term with the full merged batch (an ALiBi bias (B·N, 1, T)) is the merge of its split.
        yield rewrite(total).to(
            Tensor.merge_lead(Tensor.add(x, Tensor.split_lead(c, n)), n),
            eq(dim_of(c, i64(0))).to(dim_of(merged, i64(0))),
            eq(rank_of(c)).to(rank_of(merged)),
        )
        # A term of lower rank broadcasts over the merged batch just as over the dims it merges.
        yield rewrite(total).to(Tensor.merge_lead(Tensor.add(x, c), n), rank_of(c) < rank_of(merged))
        # With one head, any term of the same rank splits (a unit axis broadcasts like no axis).
        yield rewrite(total).to(
            Tensor.merge_lead(Tensor.add(x, Tensor.split_lead(c, ONE)), ONE),
            eq(n).to(String(ONE)),
            eq(rank_of(c)).to(rank_of(merged)),
        )
    # A select with a scalar fill over a merged tensor is the merge of the select, under the same conditions
    # as a sum: the condition is split like an added term (full merged batch, lower rank, or one head).
    for fill_first in (False, True):

        def select(cond: Tensor, kept: Tensor, first: bool = fill_first) -> Tensor:
            return Tensor.where(cond, c, kept) if first else Tensor.where(cond, kept, c)

        total = select(m, merged)
        yield rewrite(total).to(
            Tensor.merge_lead(select(Tensor.split_lead(m, n), x), n),
            scalar_of(c) == f,
            eq(dim_of(m, i64(0))).to(dim_of(merged, i64(0))),
            eq(rank_of(m)).to(rank_of(merged)),
        )
        yield rewrite(total).to(Tensor.merge_lead(select(m, x), n), scalar_of(c) == f, rank_of(m) < rank_of(merged))
        yield rewrite(total).to(
            Tensor.merge_lead(select(Tensor.split_lead(m, ONE), x), ONE),
            scalar_of(c) == f,
            eq(n).to(String(ONE)),
            eq(rank_of(m)).to(rank_of(merged)),
        )
    # A batched 3D MatMul is one head of a 4D one (then the 4D rules apply; merge_lead(·, "1") undoes it).
    yield rewrite(Tensor.matmul(x, c)).to(
        Tensor.merge_lead(Tensor.matmul(Tensor.split_lead(x, ONE), Tensor.split_lead(c, ONE)), ONE),
        eq(rank_of(x)).to(i64(3)),
        eq(rank_of(c)).to(i64(3)),
    )
    # (B, S, H) as one head: inserting the unit heads axis is a head split of H into 1 × H, heads first.
    one_head = Tensor.transpose(Tensor.split_heads(x, ONE, h), BNSH)
    yield rule(Tensor.split_lead(x, ONE), eq(rank_of(x)).to(i64(3)), eq(dim_of(x, i64(2))).to(h)).then(
        union(Tensor.split_lead(x, ONE)).with_(one_head),
        set_(dim_of(Tensor.split_lead(x, ONE), i64(1))).to(String(ONE)),
        set_(dim_of(Tensor.split_lead(x, ONE), i64(3))).to(h),
    )
    yield rewrite(Tensor.merge_lead(one_head, ONE)).to(x)
    # K given as (B, N, H, T) with no Transpose in sight (channel-first heads, a stored Kᵀ) is still Kᵀ.
    yield rewrite(Tensor.matmul(x, c)).to(
        Tensor.scores(x, Tensor.transpose(c, "0,1,3,2"), 1.0), eq(rank_of(x)).to(i64(4)), eq(rank_of(c)).to(i64(4))
    )


@ruleset
def weights(w: Tensor, p: String):
    """A weight transposed is still a weight (a 1×1 convolution's (C', C, 1) kernel read as the (C, C') matrix)."""
    yield rule(Tensor.transpose(w, p), is_weight(w)).then(is_weight(Tensor.transpose(w, p)))

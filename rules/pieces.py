"""Pieces and joins: attention computed a part at a time is attention on the whole.

Two spellings compute attention in parts and join the results (``../shared/seeds/004``: what NPU toolchains write):

* **split-score KV cache**: scores against the cache and against the new keys by two MatMuls, joined along the
  keys; one Softmax; the probabilities cut at the cache's length and multiplied with the cache's values and the
  new values apart, the products added. Column algebra makes it attention over ``Concat(past, new)``:
  ``[x·a | x·b] = x·[a | b]`` and ``p[…, :n]·a + p[…, n:]·b = p·[a; b]`` where ``a`` has ``n`` rows.
* **single-head attention (SHA)**: Q, K and V split per head, attention per head, the outputs joined along the
  heads. Heads are independent, so the join of attention on each is attention on the joined heads — when the
  K/V heads group alike on both sides and the mask is the same for every head — and the pieces of one tensor
  joined back in order are that tensor.

Joins are binary (an n-ary Concat is lowered as a left fold) with the axis counted from the end, so every rule
holds at any rank; the nested forms let a fold join a group of heads that share K/V before joining the groups.
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, set_, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, head_invariant, heads_of, rank_of, scalar_of

LAST, ROWS, HEADS = -1, -2, -3
BNSH = "0,2,1,3"
SWAP_LAST2 = ("0,2,1", "0,1,3,2")


@ruleset
def rules(
    x: Tensor,
    y: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    qa: Tensor,
    qb: Tensor,
    ka: Tensor,
    kb: Tensor,
    va: Tensor,
    vb: Tensor,
    m: Tensor,
    s: f64,
    cap: f64,
    f: f64,
    n: String,
    t: String,
    ax: i64,
    i: i64,
    j: i64,
    w: i64,
    w2: i64,
    r: i64,
):
    # --- facts of pieces and joins -------------------------------------------------------------------------
    yield rule(Tensor.concat(a, b, ax), rank_of(a) == r).then(set_(rank_of(Tensor.concat(a, b, ax))).to(r))
    yield rule(Tensor.part(x, ax, i, w), rank_of(x) == r).then(set_(rank_of(Tensor.part(x, ax, i, w))).to(r))
    yield rule(Tensor.cols_before(x, n), rank_of(x) == r).then(set_(rank_of(Tensor.cols_before(x, n))).to(r))
    yield rule(Tensor.cols_from(x, n), rank_of(x) == r).then(set_(rank_of(Tensor.cols_from(x, n))).to(r))
    yield rule(Tensor.part(x, i64(HEADS), i, w)).then(set_(heads_of(Tensor.part(x, i64(HEADS), i, w))).to(w))
    yield rule(Tensor.split_lead(x, String("1")), eq(rank_of(x)).to(i64(3))).then(
        set_(heads_of(Tensor.split_lead(x, String("1")))).to(i64(1))
    )
    yield rule(Tensor.concat(a, b, i64(HEADS)), heads_of(a) == w, heads_of(b) == w2).then(
        set_(heads_of(Tensor.concat(a, b, i64(HEADS)))).to(w + w2),
        set_(dim_of(Tensor.concat(a, b, i64(HEADS)), i64(1))).to((w + w2).to_string()),
    )
    yield rule(Tensor.concat(a, b, i64(HEADS)), dim_of(a, i64(3)) == n).then(
        set_(dim_of(Tensor.concat(a, b, i64(HEADS)), i64(3))).to(n)
    )
    # The rows of a cache's values survive the batch merge/split that 3D per-head attention adds around them.
    for lead in (Tensor.merge_lead, Tensor.split_lead):
        yield rule(lead(x, t), dim_of(x, i64(ROWS)) == n).then(set_(dim_of(lead(x, t), i64(ROWS))).to(n))

    # --- split-score KV cache --------------------------------------------------------------------------------
    # The columns of a product: [x·a | x·b] = x·[a | b].
    yield rewrite(Tensor.concat(Tensor.matmul(x, a), Tensor.matmul(x, b), i64(LAST))).to(
        Tensor.matmul(x, Tensor.concat(a, b, i64(LAST)))
    )
    # Probabilities cut at n rows of a: p[…, :n]·a + p[…, n:]·b = p·[a; b] (either order of the sum).
    before, after = Tensor.matmul(Tensor.cols_before(x, n), a), Tensor.matmul(Tensor.cols_from(x, n), b)
    for total in (Tensor.add(before, after), Tensor.add(after, before)):
        yield rewrite(total).to(Tensor.matmul(x, Tensor.concat(a, b, i64(ROWS))), eq(dim_of(a, i64(ROWS))).to(n))
    # A scale applied to each part is a scale of the join.
    for scaled in (Tensor.mul, Tensor.div):
        yield rewrite(Tensor.concat(scaled(a, c), scaled(b, c), ax)).to(
            scaled(Tensor.concat(a, b, ax), c), scalar_of(c) == f
        )
    # Repeating K/V heads (repeat_kv) commutes with joining along the keys.
    yield rewrite(Tensor.concat(Tensor.repeat_heads(a, t), Tensor.repeat_heads(b, t), i64(ROWS))).to(
        Tensor.repeat_heads(Tensor.concat(a, b, i64(ROWS)), t)
    )

    # --- joins through layout ops: a transpose moves the join's axis ---------------------------------------
    for perm in SWAP_LAST2:
        for before_axis, after_axis in ((LAST, ROWS), (ROWS, LAST)):
            yield rewrite(Tensor.concat(Tensor.transpose(a, perm), Tensor.transpose(b, perm), i64(before_axis))).to(
                Tensor.transpose(Tensor.concat(a, b, i64(after_axis)), perm)
            )
    for before_axis, after_axis in ((ROWS, HEADS), (HEADS, ROWS)):
        yield rewrite(Tensor.concat(Tensor.transpose(a, BNSH), Tensor.transpose(b, BNSH), i64(before_axis))).to(
            Tensor.transpose(Tensor.concat(a, b, i64(after_axis)), BNSH)
        )
        yield rewrite(Tensor.transpose(Tensor.concat(a, b, i64(before_axis)), BNSH)).to(
            Tensor.concat(Tensor.transpose(a, BNSH), Tensor.transpose(b, BNSH), i64(after_axis))
        )
    # The batch merge/split of 3D per-head attention leaves the last two axes where they are.
    for axis in (LAST, ROWS):
        yield rewrite(Tensor.concat(Tensor.merge_lead(a, t), Tensor.merge_lead(b, t), i64(axis))).to(
            Tensor.merge_lead(Tensor.concat(a, b, i64(axis)), t), eq(rank_of(a)).to(i64(4))
        )
        yield rewrite(Tensor.split_lead(Tensor.concat(a, b, i64(axis)), t)).to(
            Tensor.concat(Tensor.split_lead(a, t), Tensor.split_lead(b, t), i64(axis)), eq(rank_of(a)).to(i64(3))
        )

    # --- single-head attention: heads joined ---------------------------------------------------------------
    # The mask: one shared by every head, or each side's own heads of one per-head mask (a position bias).
    shared_mask = ((m, m, m), (head_invariant(m),))
    ma, mb = Tensor.part(y, i64(HEADS), r, i), Tensor.part(y, i64(HEADS), r + i, j)
    own_masks = ((ma, mb, Tensor.concat(ma, mb, i64(HEADS))), ())
    for form in (Tensor.attend, Tensor.attend_z):
        for (mask_a, mask_b, mask), mask_facts in (shared_mask, own_masks):
            left, right = form(qa, ka, va, mask_a, s, cap), form(qb, kb, vb, mask_b, s, cap)
            joined = form(
                Tensor.concat(qa, qb, i64(HEADS)),
                Tensor.concat(ka, kb, i64(HEADS)),
                Tensor.concat(va, vb, i64(HEADS)),
                mask,
                s,
                cap,
            )
            same_groups = (
                *mask_facts,
                heads_of(qa) == i,
                heads_of(qb) == j,
                heads_of(ka) == w,
                heads_of(kb) == w2,
                eq(i * w2).to(j * w),  # K heads group the query heads alike on both sides …
                eq(i * heads_of(vb)).to(j * heads_of(va)),  # … and V heads too
            )
            yield rule(Tensor.concat(left, right, i64(HEADS)), *same_groups).then(
                union(Tensor.concat(left, right, i64(HEADS))).with_(joined)
            )
            yield rule(Tensor.concat(Tensor.concat(c, left, i64(HEADS)), right, i64(HEADS)), *same_groups).then(
                union(Tensor.concat(Tensor.concat(c, left, i64(HEADS)), right, i64(HEADS))).with_(
                    Tensor.concat(c, joined, i64(HEADS))
                )
            )
            # Query heads that read the same single K/V head (one group of GQA, or MQA).
            left, right = form(qa, ka, va, mask_a, s, cap), form(qb, ka, va, mask_b, s, cap)
            shared = form(Tensor.concat(qa, qb, i64(HEADS)), ka, va, mask, s, cap)
            one_kv = (
                *mask_facts,
                heads_of(qa) == i,
                heads_of(qb) == j,
                eq(heads_of(ka)).to(i64(1)),
                eq(heads_of(va)).to(i64(1)),
            )
            yield rule(Tensor.concat(left, right, i64(HEADS)), *one_kv).then(
                union(Tensor.concat(left, right, i64(HEADS))).with_(shared)
            )
            yield rule(Tensor.concat(Tensor.concat(c, left, i64(HEADS)), right, i64(HEADS)), *one_kv).then(
                union(Tensor.concat(Tensor.concat(c, left, i64(HEADS)), right, i64(HEADS))).with_(
                    Tensor.concat(c, shared, i64(HEADS))
                )
            )
    # Pieces of one tensor joined in order are the larger piece (also as the last step of a fold) …
    yield rewrite(Tensor.concat(Tensor.part(x, ax, i, w), Tensor.part(x, ax, j, w2), ax)).to(
        Tensor.part(x, ax, i, w + w2), eq(j).to(i + w)
    )
    yield rewrite(Tensor.concat(Tensor.concat(c, Tensor.part(x, ax, i, w), ax), Tensor.part(x, ax, j, w2), ax)).to(
        Tensor.concat(c, Tensor.part(x, ax, i, w + w2), ax), eq(j).to(i + w)
    )
    # … and all of its heads are the tensor.
    yield rewrite(Tensor.part(x, i64(HEADS), i64(0), w)).to(x, eq(heads_of(x)).to(w))
    # Per-head K (or V) read in split-score form: the heads of the cache and of the new keys joined apart.
    pa, pb = Tensor.part(x, i64(HEADS), i, w), Tensor.part(x, i64(HEADS), j, w2)
    ya, yb = Tensor.part(y, i64(HEADS), i, w), Tensor.part(y, i64(HEADS), j, w2)
    yield rewrite(Tensor.concat(Tensor.concat(pa, ya, i64(ROWS)), Tensor.concat(pb, yb, i64(ROWS)), i64(HEADS))).to(
        Tensor.concat(Tensor.concat(pa, pb, i64(HEADS)), Tensor.concat(ya, yb, i64(HEADS)), i64(ROWS))
    )

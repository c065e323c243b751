"""Attention over windows: an extra leading axis (B, W, N, S, H) — Twins' locally grouped attention, Swin's
windows kept apart — is attention on the batch folded with it, (B·W, N, S, H). Folding leading axes commutes
with everything attention does along the last ones: a batched MatMul, a softmax over the last axis, a transpose
that keeps the two leading axes. So a rank-5 block is ``split_lead`` of a rank-4 one, and the rank-4 rules
take it from there.

Swin's shifted windows add a per-window mask m (1, W, 1, N, N) to the scores viewed per window, then fold them
back: ``merge_lead(split_lead(S, W) + m, W) = S + tile_lead(m, S, W)``, the mask repeated over the batch — an
additive mask of the folded batch like any other."""

from __future__ import annotations

import itertools

from egglog import String, eq, i64, rewrite, rule, ruleset, set_, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, head_invariant, rank_of

FIVE = i64(5)
KEEP_LEADING = tuple(
    (",".join(map(str, (0, 1, *rest))), ",".join(map(str, (0, *(a - 1 for a in rest)))))
    for rest in itertools.permutations((2, 3, 4))
    if rest != (2, 3, 4)
)
"""Rank-5 permutations that keep the two leading axes, and the rank-4 one each is after folding them (K as
(…, H, T) for the scores: ``0,1,3,4,2``, LongT5's einsum)."""


@ruleset
def rules(x: Tensor, y: Tensor, m: Tensor, n: String, d: String):
    lead = (eq(rank_of(x)).to(FIVE), eq(dim_of(x, i64(1))).to(n))
    # A batched MatMul over two equal leading axes (no broadcast between them).
    yield rule(
        Tensor.matmul(x, y),
        *lead,
        eq(rank_of(y)).to(FIVE),
        eq(dim_of(y, i64(1))).to(n),
        eq(dim_of(x, i64(0))).to(dim_of(y, i64(0))),
    ).then(
        union(Tensor.matmul(x, y)).with_(
            Tensor.split_lead(Tensor.matmul(Tensor.merge_lead(x, n), Tensor.merge_lead(y, n)), n)
        )
    )
    yield rule(Tensor.softmax(x), *lead).then(
        union(Tensor.softmax(x)).with_(Tensor.split_lead(Tensor.softmax(Tensor.merge_lead(x, n)), n))
    )
    for five, four in KEEP_LEADING:
        yield rule(Tensor.transpose(x, five), *lead).then(
            union(Tensor.transpose(x, five)).with_(
                Tensor.split_lead(Tensor.transpose(Tensor.merge_lead(x, n), four), n)
            )
        )
        # The batch kept too: what the MatMul's operands compare (Q and K transposed by an Einsum: LongT5)
        yield rule(Tensor.transpose(x, five), eq(rank_of(x)).to(FIVE), eq(dim_of(x, i64(0))).to(d)).then(
            set_(dim_of(Tensor.transpose(x, five), i64(0))).to(d)
        )
    # A per-window mask added to the scores viewed per window is a mask of the folded batch.
    windowed = eq(rank_of(m)).to(FIVE), eq(dim_of(m, i64(0))).to(String("1")), eq(dim_of(m, i64(1))).to(n)
    for total in (Tensor.add(Tensor.split_lead(x, n), m), Tensor.add(m, Tensor.split_lead(x, n))):
        yield rewrite(Tensor.merge_lead(total, n)).to(Tensor.add(x, Tensor.tile_lead(m, x, n)), *windowed)
    yield rule(Tensor.tile_lead(m, x, n), head_invariant(m)).then(head_invariant(Tensor.tile_lead(m, x, n)))
    # A term added over the same two leading axes as the scores' own (a mask per block: LongT5's local attention,
    # never one the scores broadcast against), or over two unit ones (a bias every block shares), is added to the
    # folded scores, folded the same way.
    for total in (Tensor.add(Tensor.split_lead(x, n), m), Tensor.add(m, Tensor.split_lead(x, n))):
        yield rule(
            eq(y).to(total), eq(rank_of(m)).to(FIVE), eq(dim_of(m, i64(0))).to(dim_of(Tensor.split_lead(x, n), i64(0))),
            eq(dim_of(m, i64(1))).to(n),
        ).then(union(y).with_(Tensor.split_lead(Tensor.add(x, Tensor.merge_lead(m, n)), n)))  # fmt: skip
        yield rule(
            eq(y).to(total), eq(rank_of(m)).to(FIVE), eq(dim_of(m, i64(0))).to(String("1")),
            eq(dim_of(m, i64(1))).to(String("1")),
        ).then(union(y).with_(Tensor.split_lead(Tensor.add(x, Tensor.merge_lead(m, String("1"))), n)))  # fmt: skip

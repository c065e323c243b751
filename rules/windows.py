"""Attention over windows: an extra leading axis (B, W, N, S, H) — Twins' locally grouped attention, Swin's
windows kept apart — is attention on the batch folded with it, (B·W, N, S, H). Folding leading axes commutes
with everything attention does along the last ones: a batched MatMul, a softmax over the last axis, a transpose
that keeps the two leading axes. So a rank-5 block is ``split_lead`` of a rank-4 one, and the rank-4 rules
take it from there.

Swin's shifted windows add a per-window mask m (1, W, 1, N, N) to the scores viewed per window, then fold them
back: ``merge_lead(split_lead(S, W) + m, W) = S + tile_lead(m, S, W)``, the mask repeated over the batch — an
additive mask of the folded batch like any other."""

from __future__ import annotations

from egglog import String, eq, i64, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, head_invariant, rank_of

FIVE = i64(5)
KEEP_LEADING = (("0,1,2,4,3", "0,1,3,2"), ("0,1,3,2,4", "0,2,1,3"))
"""Rank-5 permutations that keep the two leading axes, and the rank-4 one they are after folding them."""


@ruleset
def rules(x: Tensor, y: Tensor, m: Tensor, n: String):
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
    # A per-window mask added to the scores viewed per window is a mask of the folded batch.
    windowed = eq(rank_of(m)).to(FIVE), eq(dim_of(m, i64(0))).to(String("1")), eq(dim_of(m, i64(1))).to(n)
    for total in (Tensor.add(Tensor.split_lead(x, n), m), Tensor.add(m, Tensor.split_lead(x, n))):
        yield rewrite(Tensor.merge_lead(total, n)).to(Tensor.add(x, Tensor.tile_lead(m, x, n)), *windowed)
    yield rule(Tensor.tile_lead(m, x, n), head_invariant(m)).then(head_invariant(Tensor.tile_lead(m, x, n)))

"""Attention over windows: an extra leading axis (B, W, N, S, H) — Twins' locally grouped attention, Swin's
windows kept apart — is attention on the batch folded with it, (B·W, N, S, H). Folding leading axes commutes
with everything attention does along the last ones: a batched MatMul, a softmax over the last axis, a transpose
that keeps the two leading axes. So a rank-5 block is ``split_lead`` of a rank-4 one, and the rank-4 rules
take it from there."""

from __future__ import annotations

from egglog import String, eq, i64, rule, ruleset, union

from egfuse.lang import Tensor, dim_of, rank_of

FIVE = i64(5)
KEEP_LEADING = (("0,1,2,4,3", "0,1,3,2"), ("0,1,3,2,4", "0,2,1,3"))
"""Rank-5 permutations that keep the two leading axes, and the rank-4 one they are after folding them."""


@ruleset
def rules(x: Tensor, y: Tensor, n: String):
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

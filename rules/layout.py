"""Layout algebra: how Transpose and the meanings of Reshape compose.

Exporters reach the same (B, N, S, H) tensors by different paths — K transposed with (0,1,3,2), with
(0,2,3,1) straight from BSNH, or through the 3D reshape/transpose/reshape dance dynamo writes. Composing
permutations (a table loaded into the e-graph) and cancelling inverse reshapes makes all of them equal.
Scalars and the NaN guard are elementwise, so they move freely through any layout op.
"""

from __future__ import annotations

from egglog import String, birewrite, eq, f64, i64, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, is_weight, perm_then, scalar_of


@ruleset
def rules(x: Tensor, c: Tensor, z: Tensor, p: String, q: String, pq: String, n: String, h: String, f: f64):
    # transpose ∘ transpose = transpose by the composed permutation; the identity permutation vanishes.
    yield rule(Tensor.transpose(Tensor.transpose(x, p), q), pq == perm_then(p, q)).then(
        union(Tensor.transpose(Tensor.transpose(x, p), q)).with_(Tensor.transpose(x, pq))
    )
    yield rewrite(Tensor.transpose(x, "0,1,2,3,4")).to(x)
    yield rewrite(Tensor.transpose(x, "0,1,2,3")).to(x)
    yield rewrite(Tensor.transpose(x, "0,1,2")).to(x)
    yield rewrite(Tensor.transpose(x, "0,1")).to(x)
    # Reshape meanings and their inverses.
    yield rewrite(Tensor.merge_heads(Tensor.split_heads(x, n, h), n, h)).to(x)
    yield rewrite(Tensor.split_heads(Tensor.merge_heads(x, n, h), n, h)).to(x)
    yield rewrite(Tensor.split_lead(Tensor.merge_lead(x, n), n)).to(x)
    yield rewrite(Tensor.merge_lead(Tensor.split_lead(x, n), n)).to(x)
    # A transpose that keeps the merged leading dim in place commutes with the merge (rank 3 ↔ rank 4).
    yield rewrite(Tensor.transpose(Tensor.merge_lead(x, n), "0,2,1")).to(
        Tensor.merge_lead(Tensor.transpose(x, "0,1,3,2"), n)
    )
    yield rewrite(Tensor.split_lead(Tensor.transpose(x, "0,2,1"), n)).to(
        Tensor.transpose(Tensor.split_lead(x, n), "0,1,3,2")
    )
    # A scalar factor moves out of a MatMul (it is linear in each operand).
    yield rewrite(Tensor.matmul(Tensor.mul(x, c), z)).to(Tensor.mul(Tensor.matmul(x, z), c), scalar_of(c) == f)
    yield rewrite(Tensor.matmul(z, Tensor.mul(x, c))).to(Tensor.mul(Tensor.matmul(z, x), c), scalar_of(c) == f)
    yield rewrite(Tensor.matmul(Tensor.div(x, c), z)).to(Tensor.div(Tensor.matmul(x, z), c), scalar_of(c) == f)
    yield rewrite(Tensor.matmul(z, Tensor.div(x, c))).to(Tensor.div(Tensor.matmul(z, x), c), scalar_of(c) == f)
    # A per-head bias added after the head split is a flat bias added before it.
    yield rewrite(Tensor.add(Tensor.split_heads(x, n, h), c)).to(
        Tensor.split_heads(Tensor.add(x, Tensor.merge_heads(c, n, h)), n, h),
        is_weight(c),
        eq(dim_of(c, i64(-2))).to(n),
        eq(dim_of(c, i64(-1))).to(h),
    )
    # Batched MatMul over merged batch dims is the merge of the batched MatMul (DeBERTa's 3D attention). With
    # ``split_lead ∘ merge_lead = id`` below it, it is also why torch 2.1–2.4 dynamo's decomposition of a 4D MatMul
    # is one: Reshape(MatMul(Reshape(Expand(a)), Reshape(Expand(b)))) = split_lead(matmul(merge_lead(a),
    # merge_lead(b))) = split_lead(merge_lead(matmul(a, b))) = matmul(a, b), the Expands being to the shapes a and
    # b already have (lowered as the identity: lower_layout.LayoutTerms._expand).
    yield rewrite(Tensor.matmul(Tensor.merge_lead(x, n), Tensor.merge_lead(c, n))).to(
        Tensor.merge_lead(Tensor.matmul(x, c), n)
    )
    # Splitting the batch of a sum splits both terms, when both have the full batch (no broadcast).
    yield rewrite(Tensor.split_lead(Tensor.add(x, c), n)).to(
        Tensor.add(Tensor.split_lead(x, n), Tensor.split_lead(c, n)), eq(dim_of(x, i64(0))).to(dim_of(c, i64(0)))
    )
    # Elementwise scalars move through layout ops (they broadcast the same way before and after): outward,
    # towards the MatMul that absorbs them; both ways through the batch merge, where 3D attention
    # (DeBERTa) scales inside the merge what the 4D form needs outside it.
    for layout, both_ways in (
        (lambda t: Tensor.transpose(t, p), False),
        (lambda t: Tensor.split_heads(t, n, h), False),
        (lambda t: Tensor.merge_heads(t, n, h), False),
        (lambda t: Tensor.merge_lead(t, n), True),
        (lambda t: Tensor.split_lead(t, n), True),
    ):
        move = birewrite if both_ways else rewrite
        yield move(layout(Tensor.mul(x, c))).to(Tensor.mul(layout(x), c), scalar_of(c) == f)
        yield move(layout(Tensor.div(x, c))).to(Tensor.div(layout(x), c), scalar_of(c) == f)
        yield birewrite(layout(Tensor.nan_to_zero(x, z))).to(Tensor.nan_to_zero(layout(x), z))

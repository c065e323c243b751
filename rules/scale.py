"""Scale placement: Q·Kᵀ scaled after the MatMul (Mul or Div), on Q only, on K only, or √scale on both
(torch ≥ 2.9's SDPA decomposition, BART) — all are ``scores(q, k, s)`` with the product of the factors.

Scales are exact f64 products of the graph's own constants: no assumption that s equals 1/√d, so a model
with a custom scale keeps it (the fused op gets it as its ``scale`` attribute).

A factor that differs per head but not per query or key — SwinV2's learned logit scale, shape (…, N, 1, 1) —
is no scalar, but it is still a factor of Q: ``c·(Q·Kᵀ) = (c·Q)·Kᵀ`` whenever c is 1 along the last two axes
(the broadcast over the leading axes is the same for the scores and for Q). The fused op then reads the scaled
Q with scale 1.
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, last_dim, rank_of, scalar_of, swap_last2


@ruleset
def rules(
    q: Tensor, k: Tensor, x: Tensor, c: Tensor, b: Tensor, s: f64, f: f64, p: String, pk: String, r: i64, rx: i64
):
    # q @ transpose(x, p) is q @ Kᵀ with K = transpose(x, p with its last two entries swapped).
    yield rule(Tensor.matmul(q, Tensor.transpose(x, p)), eq(rank_of(q)).to(i64(4)), pk == swap_last2(p)).then(
        union(Tensor.matmul(q, Tensor.transpose(x, p))).with_(Tensor.scores(q, Tensor.transpose(x, pk), 1.0))
    )
    # (q @ kᵀ)ᵀ = k @ qᵀ: an Einsum that writes the scores transposed names Q and K the other way round.
    yield rewrite(Tensor.transpose(Tensor.scores(q, k, s), "0,1,3,2")).to(Tensor.scores(k, q, s))
    # A scale applied to the scores …
    yield rewrite(Tensor.mul(Tensor.scores(q, k, s), c)).to(Tensor.scores(q, k, s * f), scalar_of(c) == f)
    yield rewrite(Tensor.div(Tensor.scores(q, k, s), c)).to(
        Tensor.scores(q, k, s / f), scalar_of(c) == f, f != f64(0.0)
    )
    # … or to Q or K before the MatMul.
    yield rewrite(Tensor.scores(Tensor.mul(q, c), k, s)).to(Tensor.scores(q, k, s * f), scalar_of(c) == f)
    yield rewrite(Tensor.scores(Tensor.div(q, c), k, s)).to(
        Tensor.scores(q, k, s / f), scalar_of(c) == f, f != f64(0.0)
    )
    yield rewrite(Tensor.scores(q, Tensor.mul(k, c), s)).to(Tensor.scores(q, k, s * f), scalar_of(c) == f)
    yield rewrite(Tensor.scores(q, Tensor.div(k, c), s)).to(
        Tensor.scores(q, k, s / f), scalar_of(c) == f, f != f64(0.0)
    )
    # A factor of one that broadcasts to nothing new is no factor (torchlib writes ``add(x, y, alpha=1)`` as
    # ``x + y · 1``).
    yield rewrite(Tensor.mul(x, c)).to(x, scalar_of(c) == f64(1.0), rank_of(c) == r, rank_of(x) == rx, r <= rx)
    # A per-head factor (1 along the rows and columns of the scores) moves onto Q — also when it scales a bias
    # added before it (T5's position bias inside the scale): (S + b)·c = S·c + b·c.
    per_head = (
        last_dim(c) == i64(1),
        eq(dim_of(c, i64(-2))).to(String("1")),
        rank_of(c) == r,
        rank_of(q) == rx,
        r <= rx,
    )
    yield rewrite(Tensor.mul(Tensor.scores(q, k, s), c)).to(Tensor.scores(Tensor.mul(q, c), k, s), *per_head)
    yield rewrite(Tensor.mul(Tensor.add(Tensor.scores(q, k, s), b), c)).to(
        Tensor.add(Tensor.scores(Tensor.mul(q, c), k, s), Tensor.mul(b, c)), *per_head
    )

"""Facts follow the terms the other rules build: a rewritten term keeps the rank, value and finiteness
that made the original term match, so rules can chain."""

from __future__ import annotations

from egglog import String, eq, f64, i64, rule, ruleset, set_

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, finite, head_invariant, is_weight, rank_of, scalar_of


@ruleset
def rules(a: Tensor, b: Tensor, c: Tensor, d: Tensor, x: f64, y: f64, r: i64, p: String, n: String, h: String):
    # Scalar constants combine (scales multiplied or divided together by the other rules).
    yield rule(Tensor.mul(a, b), scalar_of(a) == x, scalar_of(b) == y).then(set_(scalar_of(Tensor.mul(a, b))).to(x * y))
    yield rule(Tensor.div(a, b), scalar_of(a) == x, scalar_of(b) == y, y != f64(0.0)).then(
        set_(scalar_of(Tensor.div(a, b))).to(x / y)
    )
    yield rule(Tensor.full_like(a, x)).then(set_(scalar_of(Tensor.full_like(a, x))).to(x))
    yield rule(Tensor.maximum(a, b), scalar_of(a) == x, scalar_of(b) == y).then(
        set_(scalar_of(Tensor.maximum(a, b))).to(x.max(y))
    )
    # Rank through layout ops that keep it.
    yield rule(Tensor.transpose(a, p), rank_of(a) == r).then(set_(rank_of(Tensor.transpose(a, p))).to(r))
    yield rule(Tensor.mul(a, b), rank_of(a) == r, scalar_of(b) == x).then(set_(rank_of(Tensor.mul(a, b))).to(r))
    yield rule(Tensor.div(a, b), rank_of(a) == r, scalar_of(b) == x).then(set_(rank_of(Tensor.div(a, b))).to(r))
    yield rule(Tensor.split_heads(a, n, h), rank_of(a) == r).then(set_(rank_of(Tensor.split_heads(a, n, h))).to(r + 1))
    yield rule(Tensor.mha(a, b, c, d, x, y, n), rank_of(a) == r).then(
        set_(rank_of(Tensor.mha(a, b, c, d, x, y, n))).to(r)
    )
    yield rule(Tensor.gqa(a, b, c, d, x, y, n, h), rank_of(a) == r).then(
        set_(rank_of(Tensor.gqa(a, b, c, d, x, y, n, h))).to(r)
    )
    yield rule(Tensor.mha_kv4(a, b, c, d, x, y, n)).then(set_(rank_of(Tensor.mha_kv4(a, b, c, d, x, y, n))).to(i64(3)))
    yield rule(Tensor.attend(a, b, c, d, x, y)).then(set_(rank_of(Tensor.attend(a, b, c, d, x, y))).to(i64(4)))
    yield rule(Tensor.merge_heads(a, n, h), rank_of(a) == r).then(set_(rank_of(Tensor.merge_heads(a, n, h))).to(r - 1))
    # A batch split by N has N on its second axis: the heads of K where torch spells Kᵀ of a cached, repeated K as
    # a (B·N, T, H) view transposed and split back (a decode step's keys, no graph value of their own).
    yield rule(Tensor.split_lead(a, n)).then(set_(dim_of(Tensor.split_lead(a, n), i64(1))).to(n))
    # A weight reshaped by a meaning is still a weight (tf2onnx's 3D Einsum projection weights).
    yield rule(Tensor.merge_heads(a, n, h), is_weight(a)).then(is_weight(Tensor.merge_heads(a, n, h)))
    yield rule(Tensor.merge_lead(a, n), is_weight(a)).then(is_weight(Tensor.merge_lead(a, n)))
    # Finiteness: what a softmax can never turn into NaN rows.
    yield rule(Tensor.no_bias()).then(finite(Tensor.no_bias()))
    yield rule(Tensor.full_like(a, x), x >= f64(-1.7e308), x <= f64(1.7e308)).then(finite(Tensor.full_like(a, x)))
    yield rule(Tensor.where(c, a, b), finite(a), finite(b)).then(finite(Tensor.where(c, a, b)))
    yield rule(Tensor.add(a, b), finite(a), finite(b)).then(finite(Tensor.add(a, b)))
    yield rule(Tensor.mul(a, b), finite(a), finite(b)).then(finite(Tensor.mul(a, b)))
    yield rule(Tensor.sub(a, b), finite(a), finite(b)).then(finite(Tensor.sub(a, b)))
    yield rule(Tensor.cast(a, r), finite(a)).then(finite(Tensor.cast(a, r)))
    # The same for every head: masks made of head-invariant parts, scalars, a unit heads axis put in.
    yield rule(Tensor.no_bias()).then(head_invariant(Tensor.no_bias()))
    yield rule(Tensor.full_like(a, x)).then(head_invariant(Tensor.full_like(a, x)))
    yield rule(Tensor.where(c, a, b), head_invariant(c), head_invariant(a), head_invariant(b)).then(
        head_invariant(Tensor.where(c, a, b))
    )
    for binary in (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div):
        yield rule(binary(a, b), head_invariant(a), head_invariant(b)).then(head_invariant(binary(a, b)))
    yield rule(Tensor.cast(a, r), head_invariant(a)).then(head_invariant(Tensor.cast(a, r)))
    yield rule(Tensor.split_lead(a, String("1")), eq(rank_of(a)).to(i64(3))).then(
        head_invariant(Tensor.split_lead(a, String("1")))
    )

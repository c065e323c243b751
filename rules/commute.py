"""Canonical operand order for the commutative ops attention uses.

General commutativity/associativity explodes (a 12-term sum passes 470k e-nodes), so operands are put in
one canonical order instead: a scalar or weight second, the attention scores first. Lowering already orders
graph operands this way; these rules order the terms other rules create.
"""

from __future__ import annotations

from egglog import String, f64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import is_weight, scalar_of


@ruleset
def rules(a: Tensor, b: Tensor, q: Tensor, k: Tensor, s: f64, c: f64, x: f64, p: String):
    yield rewrite(Tensor.mul(a, b)).to(Tensor.mul(b, a), scalar_of(a) == x)
    yield rewrite(Tensor.add(a, b)).to(Tensor.add(b, a), is_weight(a))
    for logits in (Tensor.scores(q, k, s), Tensor.softcap(Tensor.scores(q, k, s), c)):  # plain or soft-capped
        yield rewrite(Tensor.add(a, logits)).to(Tensor.add(logits, a))
        # Bias terms added one after the other are one bias: (S + b1) + b2 = S + (b1 + b2).
        yield rewrite(Tensor.add(Tensor.add(logits, a), b)).to(Tensor.add(logits, Tensor.add(a, b)))
        yield rewrite(Tensor.add(b, Tensor.add(logits, a))).to(Tensor.add(logits, Tensor.add(a, b)))

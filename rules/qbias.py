"""Query-dependent additive biases: relative-position terms and gates computed from Q.

Transformer-XL, XLNet and Funnel add to the content scores ``(Q + u)·Kᵀ`` a position term ``(Q + v)·Rᵀ``
(relatively shifted), a segment term and a subtracted mask: ``((AC + BD + EF)·s) − 1e30·mask``. The fused op
takes all of it as its additive input as long as ``scores(q, k, s)`` stands alone in the sum, whatever the
other terms read — Q included: a term the rules do not see through (the shift's Pad/Slice, a gate's Sigmoid)
is a value computed outside the fused op from the same Q projection, which keeps its nodes. What is needed is
the arithmetic that moves the scores out of the sum:

* ``(S + a) − b = S + (a − b)`` — the mask subtracted after the terms were summed (exact up to rounding);
* ``(S + a)·c = S·c + a·c`` is in :mod:`masks`, ``(S + a) + b = S + (a + b)`` in :mod:`commute`.

The query ``Q + u`` itself is a query like any other (the fused op computes ``(Q + u)·Kᵀ``, which is cheaper
than distributing it into ``Q·Kᵀ + u·Kᵀ``: a MatMul and a full (B, N, S, T) bias fewer). Distributing would
also create a second ``scores`` term in the same sum, leaving extraction free to fuse on the wrong one.
"""

from __future__ import annotations

from egglog import f64, rewrite, ruleset

from egfuse.egraph.lang import Tensor


@ruleset
def rules(q: Tensor, k: Tensor, a: Tensor, b: Tensor, s: f64, c: f64):
    for logits in (Tensor.scores(q, k, s), Tensor.softcap(Tensor.scores(q, k, s), c)):
        yield rewrite(Tensor.sub(Tensor.add(logits, a), b)).to(Tensor.add(logits, Tensor.sub(a, b)))

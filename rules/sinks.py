"""Attention sinks: a softmax over the keys and one more logit per head, whose column is dropped before ``@ V``.

gpt-oss (and StreamingLLM's variants) let each head put probability on "no key": the scores get one more column,
a learned logit ``e`` per head, and the probabilities of that column are cut off before they weight V::

    p = softmax([S + M | e])          S = scale · Q Kᵀ, M the mask, e (…, 1)
    out = p[…, :T] · V                T the keys

That is attention over one more key — a key of zeros, whose score ``Q · 0`` is 0, biased by ``e``, with a value
of zeros, which adds nothing:

* ``[S + M | e] = scale · Q [K; 0]ᵀ + ([M | 0] + [0 … 0 | e])`` (``zero_row``, ``zero_col``, ``sink_col``); the
  soft-capped form too, as ``softcap(0) = 0``. (Where a row of Q is not finite the original's row is NaN already.)
* ``p[…, :T] · V = p · [V; 0]`` when V has T rows (``zero_row``): the piece of ``p`` over the zero row adds 0.

So every target's attention op computes it, its K, V and mask one row or column longer. The shift exporters
write for a stable softmax (``x − max(x)``, gpt-oss's eager code) is the softmax's own: ``softmax(x − c) =
softmax(x)`` for any c constant along the row, the row's max among them (rows of −∞ or +∞ give NaN either way).
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, set_

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, heads_of, last_dim, rank_of

LAST, ROWS = -1, -2


@ruleset
def rules(q: Tensor, k: Tensor, v: Tensor, m: Tensor, e: Tensor, b: Tensor, x: Tensor, s: f64, c: f64, n: String,
          r: i64, w: i64, d: String):  # fmt: skip
    # A stable softmax's shift.
    yield rewrite(Tensor.softmax(Tensor.sub(x, Tensor.row_max(x)))).to(Tensor.softmax(x))

    # The sink's logit as the bias of a zero key.
    sinks = Tensor.sink_col(e, k)
    for logits, longer in (
        (Tensor.scores(q, k, s), Tensor.scores(q, Tensor.zero_row(k), s)),
        (Tensor.softcap(Tensor.scores(q, k, s), c), Tensor.softcap(Tensor.scores(q, Tensor.zero_row(k), s), c)),
    ):
        yield rewrite(Tensor.concat(Tensor.add(logits, m), e, i64(LAST))).to(
            Tensor.add(longer, Tensor.add(Tensor.zero_col(m), sinks)), eq(last_dim(e)).to(i64(1))
        )
        yield rewrite(Tensor.concat(logits, e, i64(LAST))).to(Tensor.add(longer, sinks), eq(last_dim(e)).to(i64(1)))
    # The sink's column cut off the probabilities: V with a zero row.
    p = Tensor.probs(q, Tensor.zero_row(k), b, s, c)
    yield rewrite(Tensor.matmul(Tensor.cols_before(p, d), v)).to(
        Tensor.matmul(p, Tensor.zero_row(v)), eq(dim_of(v, i64(ROWS))).to(d)
    )
    # A zero row appended to repeated K/V heads is the repeat of the heads with it (GQA's repeat_kv).
    yield rewrite(Tensor.zero_row(Tensor.repeat_heads(x, n))).to(Tensor.repeat_heads(Tensor.zero_row(x), n))

    # Facts: a zero row keeps the rank, the heads and the head size.
    grown = Tensor.zero_row(x)
    yield rule(grown, rank_of(x) == r).then(set_(rank_of(grown)).to(r))
    yield rule(grown, heads_of(x) == w).then(set_(heads_of(grown)).to(w))
    yield rule(grown, last_dim(x) == w).then(set_(last_dim(grown)).to(w))
    for axis in (1, 3):
        yield rule(grown, dim_of(x, i64(axis)) == d).then(set_(dim_of(grown, i64(axis))).to(d))

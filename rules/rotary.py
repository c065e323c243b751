"""Rotary position embeddings: every spelling of ``x·cos + rotate(x)·sin`` whose tables have the op's structure
is ``rotary(x, cos, sin, …)`` — the standard ``RotaryEmbedding``.

The op computes ``[x₁·c − x₂·s, x₂·c + x₁·s]`` from tables of half the rotated width, in one of two pairings
of the features; the graph multiplies by full-width tables. The two agree exactly when the tables repeat
what the op reads, which is proven here as facts, never assumed:

* rotate-half (Llama): ``rotate(x) = Concat(−x[…, R/2:], x[…, :R/2])`` and tables whose halves are equal —
  ``halves_repeat`` holds of ``Concat(θ, θ)`` on the last axis, of a stored table with equal halves (stated at
  lowering from its values), and through what keeps it: elementwise functions (cos, sin, neg, cast, a scalar
  factor), rows gathered (``cos_cached[position_ids]``) or cut (``cos_cached[:seq_len]``) and a new axis
  before the last;
* interleaved (GPT-J): ``rotate(x) = interleave(−x[…, 1::2], x[…, 0::2])`` (stacked on a new last axis and
  flattened) and tables ``interleave(t, t)`` — ``repeat_interleave(t, 2)``, which lowering reads as a unit last
  axis spread to two (``Concat(u, u)``) and merged. Elementwise functions, rows and new axes move inside an
  interleave, so a table computed after the repeat is recognised too;
* partial (GPT-NeoX, Phi): a rotation of ``x[…, :R]`` concatenated back with ``x[…, R:]``;
* halves apart (gpt-oss): ``[x₁·c − x₂·s, x₂·c + x₁·s]`` with half-width tables is rotate-half with the
  tables joined to themselves; with x₁, x₂ x's even and odd features (DeepSeek's ``rope_interleave``), rotate-half
  of x de-interleaved, ``[x[…, 0::2] | x[…, 1::2]]``.

The tables multiply x after a new unit axis at x's heads axis (1: (B, N, S, H); 2: (B, S, N, H)), and the sums
and products come in either operand order. Which tables the op then reads, whether their length is x's and
whether their batch must be expanded is checked where the op is written (:mod:`egfuse.writing.rotary_write`).
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, set_, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import halves_repeat, last_dim, rank_of, scalar_of

_UNARY: tuple[Callable[[Tensor], Tensor], ...] = (Tensor.cos, Tensor.sin, Tensor.neg)
"""Elementwise functions of one tensor: they keep a table's repeated halves and move inside an interleave."""


def _products(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return Tensor.mul(a, b), Tensor.mul(b, a)


@ruleset
def rules(x: Tensor, t: Tensor, a: Tensor, b: Tensor, c: Tensor, s: Tensor, i: Tensor, ax: i64, h: i64, w: i64,
          n: i64, to: i64, k: i64, r: i64, v: f64, m: String):  # fmt: skip
    # Tables whose halves repeat.
    yield rule(eq(t).to(Tensor.concat(a, a, -1))).then(halves_repeat(t))
    for f in _UNARY:
        yield rule(eq(t).to(f(a)), halves_repeat(a)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.cast(a, to)), halves_repeat(a)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.mul(a, b)), halves_repeat(a), scalar_of(b) == v).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.div(a, b)), halves_repeat(a), scalar_of(b) == v).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.rows(a, i)), halves_repeat(a), rank_of(a) == r, r >= i64(2)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.rows_nd(a, i)), halves_repeat(a)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.unsqueeze(a, ax)), halves_repeat(a), ax <= i64(-2)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.sliced(a, ax)), halves_repeat(a), ax <= i64(-2)).then(halves_repeat(t))
    yield rule(eq(t).to(Tensor.part(a, ax, h, n)), halves_repeat(a), ax <= i64(-2)).then(halves_repeat(t))

    # Interleaved pairs: stacked on a new last axis and flattened; what is applied after moves inside.
    pairs = Tensor.concat(Tensor.unsqueeze(a, -1), Tensor.unsqueeze(b, -1), -1)
    yield rewrite(Tensor.merge_heads(pairs, m, String("2"))).to(Tensor.interleave(a, b))
    for f in _UNARY:
        yield rewrite(f(Tensor.interleave(a, b))).to(Tensor.interleave(f(a), f(b)))
    yield rewrite(Tensor.cast(Tensor.interleave(a, b), to)).to(
        Tensor.interleave(Tensor.cast(a, to), Tensor.cast(b, to))
    )
    # A cast is elementwise, and negation exact in every float type: it moves inside what only moves values
    # or flips their sign — a rotation or a table computed in float16 and cast up after (Cohere's and ERNIE
    # 4.5's float16 exports multiply float32 x by cast(unsqueeze(table)) and cast(rotate(x16))).
    yield rewrite(Tensor.cast(Tensor.unsqueeze(a, ax), to)).to(Tensor.unsqueeze(Tensor.cast(a, to), ax))
    yield rewrite(Tensor.cast(Tensor.neg(a), to)).to(Tensor.neg(Tensor.cast(a, to)))
    yield rewrite(Tensor.cast(Tensor.strided(a, k), to)).to(Tensor.strided(Tensor.cast(a, to), k))
    yield rewrite(Tensor.cast(Tensor.part(a, ax, h, n), to)).to(Tensor.part(Tensor.cast(a, to), ax, h, n))
    yield rewrite(Tensor.cast(Tensor.concat(a, b, ax), to)).to(
        Tensor.concat(Tensor.cast(a, to), Tensor.cast(b, to), ax)
    )
    yield rewrite(Tensor.mul(Tensor.interleave(a, b), c)).to(
        Tensor.interleave(Tensor.mul(a, c), Tensor.mul(b, c)), scalar_of(c) == v
    )
    yield rewrite(Tensor.rows(Tensor.interleave(a, b), i)).to(Tensor.interleave(Tensor.rows(a, i), Tensor.rows(b, i)))
    yield rewrite(Tensor.unsqueeze(Tensor.interleave(a, b), ax)).to(
        Tensor.interleave(Tensor.unsqueeze(a, ax), Tensor.unsqueeze(b, ax)), ax <= i64(-2)
    )

    # The angles' cos and sin taken after the new axis are the tables' cos and sin with the axis added.
    for f in (Tensor.cos, Tensor.sin):
        yield rewrite(f(Tensor.unsqueeze(a, ax))).to(Tensor.unsqueeze(f(a), ax))
    # A piece of the last axis taken after a new axis before it is the piece with the axis added (GLM's
    # interleaved tables: ``cos[..., :R/2].repeat_interleave(2)`` of a table unsqueezed at the heads axis).
    yield rewrite(Tensor.part(Tensor.unsqueeze(a, ax), -1, h, n)).to(
        Tensor.unsqueeze(Tensor.part(a, -1, h, n), ax), ax <= i64(-2)
    )

    # An even piece of the last axis of interleaved pairs is the interleave of the pieces half as wide (timm's
    # EVA stores sin and cos side by side, both repeat_interleave'd, and splits them).
    yield rewrite(Tensor.part(Tensor.interleave(a, b), -1, h, n)).to(
        Tensor.interleave(Tensor.part(a, -1, h / i64(2), n / i64(2)), Tensor.part(b, -1, h / i64(2), n / i64(2))),
        eq(h % i64(2)).to(i64(0)),
        eq(n % i64(2)).to(i64(0)),
    )
    # A (S, R) table times a (B, N, S, R) x broadcasts as the table with the heads axis added: stated so for an
    # interleaved table (timm's EVA multiplies by its stored (S, R) tables, no Unsqueeze written).
    for product in _products(x, Tensor.interleave(a, a)):
        yield rewrite(product).to(
            Tensor.mul(x, Tensor.interleave(Tensor.unsqueeze(a, -3), Tensor.unsqueeze(a, -3))),
            rank_of(x) == i64(4),
            rank_of(Tensor.interleave(a, a)) == i64(2),
        )

    # The rotations, in two halves that meet in the sum (smaller patterns than the whole sum in every operand
    # order: egglog compiles each). The tables gain a unit axis at x's heads axis (−3 or −2 from the end).
    heads_axis = (ax >= i64(-3), ax <= i64(-2), rank_of(x) == i64(4))
    half = Tensor.concat(Tensor.neg(Tensor.part(x, -1, h, h)), Tensor.part(x, -1, 0, h), -1)
    # x's halves rotated apart and joined (gpt-oss): [x₁·c − x₂·s | x₂·c + x₁·s] = x·[c|c] + [−x₂|x₁]·[s|s] for
    # half-width tables c, s — rotate-half, its tables' halves repeated by construction.
    x1, x2 = Tensor.part(x, -1, 0, h), Tensor.part(x, -1, h, h)
    full = Tensor.add(
        Tensor.mul(x, Tensor.unsqueeze(Tensor.concat(c, c, -1), ax)),
        Tensor.mul(half, Tensor.unsqueeze(Tensor.concat(s, s, -1), ax)),
    )
    # x's even and odd features are the halves of x de-interleaved, [x[…, 0::2] | x[…, 1::2]]: rotated apart and
    # joined as halves (DeepSeek's rope_interleave), they are rotate-half of that tensor.
    evens, odds = Tensor.strided(x, 0), Tensor.strided(x, 1)
    apart = Tensor.concat(evens, odds, -1)
    yield rule(evens, odds, last_dim(x) == w, rank_of(x) == r, eq(w % i64(2)).to(i64(0))).then(
        union(evens).with_(Tensor.part(apart, -1, 0, w / i64(2))),
        union(odds).with_(Tensor.part(apart, -1, w / i64(2), w / i64(2))),
        set_(last_dim(apart)).to(w),
        set_(rank_of(apart)).to(r),
    )
    for times in (Tensor.mul, lambda a, b: Tensor.mul(b, a)):
        cos, sin = Tensor.unsqueeze(c, ax), Tensor.unsqueeze(s, ax)
        minus = Tensor.sub(times(x1, cos), times(x2, sin))
        for plus in (Tensor.add(times(x2, cos), times(x1, sin)), Tensor.add(times(x1, sin), times(x2, cos))):
            yield rewrite(Tensor.concat(minus, plus, -1)).to(full, *heads_axis, last_dim(x) == h * i64(2))
    pairs_of = Tensor.interleave(Tensor.neg(Tensor.strided(x, 1)), Tensor.strided(x, 0))
    for table in _products(x, Tensor.unsqueeze(c, ax)):
        yield rewrite(table).to(Tensor.rotary_cos(x, c, ax + i64(4), 0), *heads_axis, halves_repeat(c))
    for table in _products(x, Tensor.interleave(Tensor.unsqueeze(c, ax), Tensor.unsqueeze(c, ax))):
        yield rewrite(table).to(Tensor.rotary_cos(x, c, ax + i64(4), 1), *heads_axis)
    for table in _products(half, Tensor.unsqueeze(s, ax)):
        yield rewrite(table).to(
            Tensor.rotary_sin(x, s, ax + i64(4), 0, h * i64(2)), *heads_axis, last_dim(x) == h * i64(2),
            halves_repeat(s),
        )  # fmt: skip
    for table in _products(pairs_of, Tensor.interleave(Tensor.unsqueeze(s, ax), Tensor.unsqueeze(s, ax))):
        yield rewrite(table).to(Tensor.rotary_sin(x, s, ax + i64(4), 1, w), *heads_axis, last_dim(x) == w)
    cos_term, sin_term = Tensor.rotary_cos(x, c, ax, k), Tensor.rotary_sin(x, s, ax, k, w)
    for total in (Tensor.add(cos_term, sin_term), Tensor.add(sin_term, cos_term)):
        yield rewrite(total).to(Tensor.rotary(x, c, s, ax, k, w))
    # Partial: the first R features rotated, the rest concatenated back unchanged.
    rotated = Tensor.rotary(Tensor.part(x, -1, 0, w), c, s, ax, k, w)
    yield rewrite(Tensor.concat(rotated, Tensor.part(x, -1, w, n), -1)).to(
        Tensor.rotary(x, c, s, ax, k, w), last_dim(x) == w + n
    )

"""Mask arithmetic older code writes under the softmax: a clamp from below, and a subtracted mask.

``max(S, c)`` is ``S`` for scores ``S`` and a very negative ``c``: no score is below it. A clamp of a select
mask clamps each branch: ``max(where(m, S, fill), c)`` is ``where(m, max(S, c), max(fill, c))``, exactly.

OPT clamps its *masked* scores, ``torch.max(S + m, finfo.min)``: two finfo.min terms, or a causal −inf added to
a finfo.min padding mask, sum to −inf, and the clamp is what makes a fully masked row the mean of V instead
of NaN. So the clamp is not dropped there but moved onto the whole mask (every term the scores are added to,
summed first: ``commute`` collects them): ``max(S + m, c)`` is ``S + max(m, c)`` wherever ``c`` absorbs the
scores (``S + c == c``: finfo.min's ulp is 2¹⁰⁴ in float32), and under the softmax in every row with one real
score whatever ``S`` is (entries at or below ``c`` get weight exp(c − row max) = 0 either way). The fused op
then gets a finite mask and computes the fully masked row as the graph does. ``c`` must be very negative —
the bound the select-mask rules use (``masks.MASK_FILL_MAX``) — and validation checks the rows inputs mask.

``x − b`` is ``x + b·(−1)`` (exact): XLNet and Funnel subtract ``1e30 · mask`` from the scores, which the
additive-mask rules then read as any other bias.
"""

from __future__ import annotations

from egfuse.rules.masks import MASK_FILL_MAX
from egglog import eq, f64, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import scalar_of


@ruleset
def rules(p: Tensor, x: Tensor, b: Tensor, c: Tensor, q: Tensor, k: Tensor, s: f64, f: f64, g: f64):
    deep = (scalar_of(c) == f, f <= f64(MASK_FILL_MAX))
    # Recognise what is under the clamp as if it were not there: ``softmax(x)`` is built beside the clamped
    # softmax (not made equal to it), so every rule that reads a softmax's input reads this one too.
    yield rule(Tensor.softmax(Tensor.maximum(x, c)), *deep).then(Tensor.softmax(x))
    for logits in (Tensor.scores(q, k, s), Tensor.softcap(Tensor.scores(q, k, s), g)):  # plain or soft-capped
        # Recognised as scores plus a mask: the clamp goes onto the mask (exact; see above).
        yield rule(
            eq(p).to(Tensor.softmax(Tensor.maximum(x, c))),
            eq(Tensor.softmax(x)).to(Tensor.softmax(Tensor.add(logits, b))),
            *deep,
        ).then(union(p).with_(Tensor.softmax(Tensor.add(logits, Tensor.maximum(b, c)))))
        # Recognised as unmasked scores: no score is below a very negative c, the clamp does nothing.
        yield rule(
            eq(p).to(Tensor.softmax(Tensor.maximum(x, c))), eq(Tensor.softmax(x)).to(Tensor.softmax(logits)), *deep
        ).then(union(p).with_(Tensor.softmax(logits)))
    yield rewrite(Tensor.sub(Tensor.scores(q, k, s), b)).to(
        Tensor.add(Tensor.scores(q, k, s), Tensor.mul(b, Tensor.full_like(b, -1.0)))
    )

"""Mask arithmetic older code writes under the softmax: a clamp from below, and a subtracted mask.

``softmax(max(x, c))`` is ``softmax(x)`` for a very negative ``c``.

OPT clamps its masked scores with ``torch.max(scores, finfo.min)`` (two finfo.min terms can overflow to −inf).
Entries at or below ``c`` get weight exp(c − row max) = 0 with or without the clamp, so every row with one
real score is unchanged; only a row masked entirely differs (the mean of V instead of NaN) — the same bound
the select-mask rules use (``masks.MASK_FILL_MAX``), and validation checks the rows the inputs mask.

``x − b`` is ``x + b·(−1)`` (exact): XLNet and Funnel subtract ``1e30 · mask`` from the scores, which the
additive-mask rules then read as any other bias.
"""

from __future__ import annotations

from egfuse.rules.masks import MASK_FILL_MAX
from egglog import f64, rewrite, ruleset

from egfuse.lang import Tensor, scalar_of


@ruleset
def rules(x: Tensor, b: Tensor, c: Tensor, q: Tensor, k: Tensor, s: f64, f: f64):
    yield rewrite(Tensor.softmax(Tensor.maximum(x, c))).to(
        Tensor.softmax(x), scalar_of(c) == f, f <= f64(MASK_FILL_MAX)
    )
    yield rewrite(Tensor.sub(Tensor.scores(q, k, s), b)).to(
        Tensor.add(Tensor.scores(q, k, s), Tensor.mul(b, Tensor.full_like(b, -1.0)))
    )

"""A clamp from below under the softmax: ``softmax(max(x, c))`` is ``softmax(x)`` for a very negative ``c``.

OPT clamps its masked scores with ``torch.max(scores, finfo.min)`` (two finfo.min terms can overflow to −inf).
Entries at or below ``c`` get weight exp(c − row max) = 0 with or without the clamp, so every row with one
real score is unchanged; only a row masked entirely differs (the mean of V instead of NaN) — the same bound
the select-mask rules use (``masks.MASK_FILL_MAX``), and validation checks the rows the inputs mask.
"""

from __future__ import annotations

from egfuse.rules.masks import MASK_FILL_MAX
from egglog import f64, rewrite, ruleset

from egfuse.lang import Tensor, scalar_of


@ruleset
def rules(x: Tensor, c: Tensor, f: f64):
    yield rewrite(Tensor.softmax(Tensor.maximum(x, c))).to(
        Tensor.softmax(x), scalar_of(c) == f, f <= f64(MASK_FILL_MAX)
    )

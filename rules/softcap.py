"""Logit soft-capping (Gemma 2): ``c · tanh(x / c)`` is ``softcap(x, c)``.

Written with the division (``x / c``) or with the reciprocal as a constant (``x · (1/c)``, equal to ``x / c``
up to the rounding of ``1/c``). The scale folded into the scores stays inside the cap and the mask is added
after it — the order of the standard ``Attention`` op's ``softcap`` attribute.
"""

from __future__ import annotations

from egglog import f64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import scalar_of

RECIPROCAL_TOLERANCE = 1e-6
"""How far ``(1/c) · c`` may be from 1: the rounding of a reciprocal stored in float32."""


@ruleset
def rules(x: Tensor, c: Tensor, d: Tensor, f: f64, g: f64):
    yield rewrite(Tensor.mul(Tensor.tanh(Tensor.div(x, c)), d)).to(
        Tensor.softcap(x, f), scalar_of(c) == f, scalar_of(d) == f, f > f64(0.0)
    )
    yield rewrite(Tensor.mul(Tensor.tanh(Tensor.mul(x, c)), d)).to(
        Tensor.softcap(x, g),
        scalar_of(c) == f,
        scalar_of(d) == g,
        g > f64(0.0),
        f * g >= f64(1.0 - RECIPROCAL_TOLERANCE),
        f * g <= f64(1.0 + RECIPROCAL_TOLERANCE),
    )

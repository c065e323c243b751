"""Precision: half-precision models compute the softmax and the norms in float32
(``softmax(x.float()).to(x.dtype)``; Llama's ``(x.float() · rsqrt(mean x² + ε)).to(x.dtype)``).

The casts change rounding, not meaning: upcasting is exact, every fused attention op accumulates its
softmax in at least float32 for half-precision inputs, and ``LayerNormalization`` / ``RMSNormalization``
compute in float32 by default (``stash_type`` 1). So ``Cast(f(Cast(x, float32)), t)`` is ``f(x)`` for
``f`` a softmax or a normalization whenever ``x`` already has type ``t`` — the narrowing cast must return to
``x``'s own type, or the op's output type would change.
"""

from __future__ import annotations

from egglog import f64, i64, rewrite, ruleset

from egfuse.lang import Tensor, dtype_of

FLOAT32 = 1
"""``TensorProto.FLOAT``."""


@ruleset
def rules(x: Tensor, t: i64, eps: f64):
    yield rewrite(Tensor.cast(Tensor.softmax(Tensor.cast(x, FLOAT32)), t)).to(Tensor.softmax(x), dtype_of(x) == t)
    yield rewrite(Tensor.cast(Tensor.rms_normalized(Tensor.cast(x, FLOAT32), eps), t)).to(
        Tensor.rms_normalized(x, eps), dtype_of(x) == t
    )
    yield rewrite(Tensor.cast(Tensor.normalized(Tensor.cast(x, FLOAT32), eps), t)).to(
        Tensor.normalized(x, eps), dtype_of(x) == t
    )

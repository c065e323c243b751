"""Precision: half-precision models compute the softmax in float32 (``softmax(x.float()).to(x.dtype)``).

The casts change rounding, not meaning: upcasting is exact, and every fused attention op accumulates its
softmax in at least float32 for half-precision inputs. So ``Cast(Softmax(Cast(x, float32)), t)`` is the
softmax of ``x`` whenever ``x`` already has type ``t`` — the narrowing cast must return to ``x``'s own
type, or the op's output type would change.
"""

from __future__ import annotations

from egglog import i64, rewrite, ruleset

from egfuse.lang import Tensor, dtype_of

FLOAT32 = 1
"""``TensorProto.FLOAT``."""


@ruleset
def rules(x: Tensor, t: i64):
    yield rewrite(Tensor.cast(Tensor.softmax(Tensor.cast(x, FLOAT32)), t)).to(Tensor.softmax(x), dtype_of(x) == t)

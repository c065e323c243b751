"""Precision: half-precision models compute the softmax and the norms in float32
(``softmax(x.float()).to(x.dtype)``; Llama's ``(x.float() · rsqrt(mean x² + ε)).to(x.dtype)``).

The casts change rounding, not meaning: upcasting is exact, every fused attention op accumulates its
softmax in at least float32 for half-precision inputs, and ``LayerNormalization`` / ``RMSNormalization``
compute in float32 by default (``stash_type`` 1). So ``Cast(f(Cast(x, float32)), t)`` is ``f(x)`` for
``f`` a softmax or a normalization whenever ``x`` already has type ``t`` — the narrowing cast must return to
``x``'s own type, or the op's output type would change. A norm whose γ and β are applied in float32 too is the
norm with them narrowed to ``t`` (the op's scale and bias have its input's type).

Scores upcast alone, before a float32 term joins them (MPT: ``softmax(S.float() + alibi)``, a select after),
are the same sum: a half tensor plus a float32 one means their sum in float32 here (``add(cast(x), b) =
add(x, b)``; the writer casts the half operand up, as ONNX adds one type), and an attention op given a float32
mask adds it to its scores in float32 (the standard ``Attention``'s mask type is free of Q's).
"""

from __future__ import annotations

from egglog import eq, f64, i64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of

FLOAT32 = 1
"""``TensorProto.FLOAT``."""
HALF = (10, 16)
"""``TensorProto.FLOAT16`` and ``BFLOAT16``."""


@ruleset
def rules(x: Tensor, b: Tensor, g: Tensor, t: i64, eps: f64):
    yield rewrite(Tensor.cast(Tensor.softmax(Tensor.cast(x, FLOAT32)), t)).to(Tensor.softmax(x), dtype_of(x) == t)
    yield rewrite(Tensor.cast(Tensor.rms_normalized(Tensor.cast(x, FLOAT32), eps), t)).to(
        Tensor.rms_normalized(x, eps), dtype_of(x) == t
    )
    yield rewrite(Tensor.cast(Tensor.normalized(Tensor.cast(x, FLOAT32), eps), t)).to(
        Tensor.normalized(x, eps), dtype_of(x) == t
    )
    # γ (and β) applied in float32 before the narrowing cast (Gemma 3: ``(norm(x.float()) · (1 + w.float()))
    # .to(x.dtype)``): the op's scale narrowed instead, so the norm reads and writes x's own type.
    yield rewrite(Tensor.cast(Tensor.rms_norm(Tensor.cast(x, FLOAT32), g, eps), t)).to(
        Tensor.rms_norm(x, Tensor.cast(g, t), eps), dtype_of(x) == t
    )
    yield rewrite(Tensor.cast(Tensor.layer_norm(Tensor.cast(x, FLOAT32), g, b, eps), t)).to(
        Tensor.layer_norm(x, Tensor.cast(g, t), Tensor.cast(b, t), eps), dtype_of(x) == t
    )
    # A half tensor widened to float32 and narrowed back is itself: float32 holds every half value exactly
    # (XGLM's float16 export casts its probabilities so, after a softmax taken in float16).
    for h in HALF:
        yield rewrite(Tensor.cast(Tensor.cast(x, FLOAT32), i64(h))).to(x, eq(dtype_of(x)).to(i64(h)))
    # A half tensor plus a float32 one is their float32 sum; the probabilities of such a sum narrowed back to
    # the scores' type are an attention op's, which adds a float32 mask in float32.
    for h in HALF:
        yield rewrite(Tensor.add(Tensor.cast(x, FLOAT32), b)).to(
            Tensor.add(x, b), eq(dtype_of(x)).to(i64(h)), eq(dtype_of(b)).to(i64(FLOAT32))
        )
    yield rewrite(Tensor.cast(Tensor.softmax(Tensor.add(x, b)), t)).to(
        Tensor.softmax(Tensor.add(x, b)), dtype_of(x) == t
    )

"""GELU: every spelling of ``x · ½ · (1 + erf(x / √2))`` is ``gelu(x)``.

Exporters divide by √2 or multiply by 1/√2 (a constant in the model's precision either way, equal to the exact
one up to its rounding in that type: float16 keeps 11 bits of it, bfloat16 8), and multiply by ½ first, last
or into the bracket; ``x · (1 + erf(·)) / 2`` is the same. The bracket is ``gelu_cdf(x)`` (twice the normal
CDF), so the orders of the outer products meet there. Products of two computed values are written in both
orders, as lowering leaves them. A per-feature bias added to the input first is ``bias_gelu`` (onnxruntime's
``BiasGelu``).
"""

from __future__ import annotations

import math

from egglog import eq, f64, i64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of, is_weight, rank_of, scalar_of

SQRT2_TOLERANCE = 1e-6
"""How far a stored √2 (or 1/√2) may be from the exact one, relatively: float32's rounding of it."""

HALF_TOLERANCES = {10: 2.0**-11, 16: 2.0**-8}
"""The same for a constant stored in float16 and bfloat16 (``TensorProto`` codes): half an ulp, relatively."""


def _near(f: f64, exact: float, tolerance: float = SQRT2_TOLERANCE) -> tuple:
    return f >= f64(exact * (1 - tolerance)), f <= f64(exact * (1 + tolerance))


@ruleset
def rules(x: Tensor, c: Tensor, one: Tensor, half: Tensor, b: Tensor, f: f64):
    # The bracket: 1 + erf(x / √2), with the division or the product by 1/√2.
    yield rewrite(Tensor.add(Tensor.erf(Tensor.div(x, c)), one)).to(
        Tensor.gelu_cdf(x), scalar_of(c) == f, *_near(f, math.sqrt(2.0)), scalar_of(one) == f64(1.0)
    )
    yield rewrite(Tensor.add(Tensor.erf(Tensor.mul(x, c)), one)).to(
        Tensor.gelu_cdf(x), scalar_of(c) == f, *_near(f, math.sqrt(0.5)), scalar_of(one) == f64(1.0)
    )
    for dtype, tolerance in HALF_TOLERANCES.items():  # the same constants stored in half precision
        yield rewrite(Tensor.add(Tensor.erf(Tensor.div(x, c)), one)).to(
            Tensor.gelu_cdf(x),
            *(scalar_of(c) == f, eq(dtype_of(c)).to(i64(dtype)), *_near(f, math.sqrt(2.0), tolerance)),
            scalar_of(one) == f64(1.0),
        )
        yield rewrite(Tensor.add(Tensor.erf(Tensor.mul(x, c)), one)).to(
            Tensor.gelu_cdf(x),
            *(scalar_of(c) == f, eq(dtype_of(c)).to(i64(dtype)), *_near(f, math.sqrt(0.5), tolerance)),
            scalar_of(one) == f64(1.0),
        )
    # ½ applied last, to x first, or to the bracket first; or a division by 2 last.
    is_half = scalar_of(half) == f64(0.5)
    for product in (Tensor.mul(x, Tensor.gelu_cdf(x)), Tensor.mul(Tensor.gelu_cdf(x), x)):
        yield rewrite(Tensor.mul(product, half)).to(Tensor.gelu(x), is_half)
        yield rewrite(Tensor.div(product, half)).to(Tensor.gelu(x), scalar_of(half) == f64(2.0))
    for half_x in (Tensor.mul(x, half),):
        yield rewrite(Tensor.mul(half_x, Tensor.gelu_cdf(x))).to(Tensor.gelu(x), is_half)
        yield rewrite(Tensor.mul(Tensor.gelu_cdf(x), half_x)).to(Tensor.gelu(x), is_half)
    half_cdf = Tensor.mul(Tensor.gelu_cdf(x), half)
    yield rewrite(Tensor.mul(x, half_cdf)).to(Tensor.gelu(x), is_half)
    yield rewrite(Tensor.mul(half_cdf, x)).to(Tensor.gelu(x), is_half)
    # A projection's bias added first: the form onnxruntime's BiasGelu takes (no other target writes it).
    yield rewrite(Tensor.gelu(Tensor.add(x, b))).to(Tensor.bias_gelu(x, b), is_weight(b), eq(rank_of(b)).to(i64(1)))

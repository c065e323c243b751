"""Norms: every spelling of ``(x − mean x) / √(var x + ε) · γ + β`` is ``layer_norm(x, γ, β, ε)``, and every
spelling of ``x / √(mean x² + ε) · γ`` is ``rms_norm(x, γ, ε)``.

Exporters differ in how they write the square (``Pow(·, 2)`` or ``c · c``), the division (``Div`` by the root,
``Mul`` by its ``Reciprocal`` or by ``1 / root``, either operand first) and where γ multiplies (after the
division or before it). Each is an identity of real arithmetic that holds for any model; the mean is the
last axis's (lowering only admits ``ReduceMean`` over it, kept), the one axis ``LayerNormalization`` takes
here. A norm without γ has no term a target writes and stays as it is.
"""

from __future__ import annotations

from egglog import eq, f64, i64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import is_weight, rank_of, scalar_of


@ruleset
def rules(x: Tensor, c: Tensor, e: Tensor, g: Tensor, b: Tensor, s: Tensor, eps: f64):
    # The square, and the division written as a product.
    yield rewrite(Tensor.pow(x, c)).to(Tensor.mul(x, x), scalar_of(c) == f64(2.0))
    yield rewrite(Tensor.mul(x, Tensor.reciprocal(s))).to(Tensor.div(x, s))
    yield rewrite(Tensor.mul(Tensor.reciprocal(s), x)).to(Tensor.div(x, s))
    yield rewrite(Tensor.mul(x, Tensor.div(c, s))).to(Tensor.div(x, s), scalar_of(c) == f64(1.0))
    yield rewrite(Tensor.mul(Tensor.div(c, s), x)).to(Tensor.div(x, s), scalar_of(c) == f64(1.0))
    # γ multiplied before the division: (x · γ) / s = (x / s) · γ.
    yield rewrite(Tensor.div(Tensor.mul(x, g), s)).to(Tensor.mul(Tensor.div(x, s), g), is_weight(g))
    # The normalization: the centred input over the root of its mean square plus ε.
    centred = Tensor.sub(x, Tensor.reduce_mean(x))
    variance = Tensor.reduce_mean(Tensor.mul(centred, centred))
    yield rewrite(Tensor.div(centred, Tensor.sqrt(Tensor.add(variance, e)))).to(
        Tensor.normalized(x, eps), scalar_of(e) == eps, eps >= f64(0.0)
    )
    # The RMS norm: the input over the root of its mean square plus ε, then γ.
    yield rewrite(Tensor.div(x, Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.mul(x, x)), e)))).to(
        Tensor.rms_normalized(x, eps), scalar_of(e) == eps, eps >= f64(0.0)
    )
    yield rewrite(Tensor.mul(Tensor.rms_normalized(x, eps), g)).to(
        Tensor.rms_norm(x, g, eps), is_weight(g), eq(rank_of(g)).to(i64(1))
    )
    # The affine part: a per-feature γ, then a per-feature β (a norm written without β has β = 0).
    yield rewrite(Tensor.mul(Tensor.normalized(x, eps), g)).to(
        Tensor.layer_norm(x, g, Tensor.zero_bias(g), eps), is_weight(g), eq(rank_of(g)).to(i64(1))
    )
    yield rewrite(Tensor.add(Tensor.layer_norm(x, g, Tensor.zero_bias(g), eps), b)).to(
        Tensor.layer_norm(x, g, b, eps), is_weight(b), eq(rank_of(b)).to(i64(1))
    )

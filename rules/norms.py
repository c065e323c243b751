"""Norms: every spelling of ``(x − mean x) / √(var x + ε) · γ + β`` is ``layer_norm(x, γ, β, ε)``, and every
spelling of ``x / √(mean x² + ε) · γ`` is ``rms_norm(x, γ, ε)``.

Exporters differ in how they write the square (``Pow(·, 2)`` or ``c · c``), the division (``Div`` by the root,
``Mul`` by its ``Reciprocal``, by ``1 / root`` or by the power ``(·)^(−½)``, either operand first) and where γ
multiplies (after the division or before it, or into the reciprocal root as Keras writes ``x · (rsqrt(·) · γ)``).
Each is an identity of real arithmetic that holds for any model; the mean is the last axis's (lowering only admits
``ReduceMean`` over it, kept, and ``GlobalAveragePool`` of a rank-3 tensor, which is that mean), the one axis
``LayerNormalization`` takes here. A norm written without γ is the norm with γ = 1 (OLMo's non-parametric
LayerNorm; a γ of ones an exporter folded away), where the last axis' width is known.
"""

from __future__ import annotations

from egglog import eq, f64, i64, rewrite, ruleset

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import is_weight, last_dim, per_feature, rank_of, scalar_of


@ruleset
def rules(x: Tensor, c: Tensor, e: Tensor, g: Tensor, b: Tensor, s: Tensor, m: Tensor, eps: f64, w: i64):
    # The square, and the division written as a product.
    yield rewrite(Tensor.pow(x, c)).to(Tensor.mul(x, x), scalar_of(c) == f64(2.0))
    # The reciprocal root written as a power: s^(−½) = 1/√s (Gemma 4's x · (mean x² + ε)^(−½), torch.pow).
    yield rewrite(Tensor.pow(s, c)).to(Tensor.reciprocal(Tensor.sqrt(s)), scalar_of(c) == f64(-0.5))
    yield rewrite(Tensor.mul(x, Tensor.reciprocal(s))).to(Tensor.div(x, s))
    yield rewrite(Tensor.mul(Tensor.reciprocal(s), x)).to(Tensor.div(x, s))
    yield rewrite(Tensor.mul(x, Tensor.div(c, s))).to(Tensor.div(x, s), scalar_of(c) == f64(1.0))
    yield rewrite(Tensor.mul(Tensor.div(c, s), x)).to(Tensor.div(x, s), scalar_of(c) == f64(1.0))
    # γ multiplied before the division: (x · γ) / s = (x / s) · γ.
    yield rewrite(Tensor.div(Tensor.mul(x, g), s)).to(Tensor.mul(Tensor.div(x, s), g), is_weight(g))
    # γ multiplied into the reciprocal root first: x · (1/s · γ) = (x / s) · γ.
    yield rewrite(Tensor.mul(x, Tensor.mul(Tensor.reciprocal(s), g))).to(Tensor.mul(Tensor.div(x, s), g), is_weight(g))
    yield rewrite(Tensor.mul(Tensor.mul(Tensor.reciprocal(s), g), x)).to(Tensor.mul(Tensor.div(x, s), g), is_weight(g))
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
    # γ and β hold one stored value per feature: of rank 1, or (1, …, 1, D) no wider in rank than the input
    # (broadcasting would add axes to the output the op does not have).
    for one_per_feature in (
        lambda t: [eq(rank_of(t)).to(i64(1))],
        lambda t: [per_feature(t), rank_of(t) <= rank_of(x)],
    ):
        yield rewrite(Tensor.mul(Tensor.rms_normalized(x, eps), g)).to(
            Tensor.rms_norm(x, g, eps), is_weight(g), *one_per_feature(g)
        )
        # The affine part: a per-feature γ, then a per-feature β (a norm written without β has β = 0).
        yield rewrite(Tensor.mul(Tensor.normalized(x, eps), g)).to(
            Tensor.layer_norm(x, g, Tensor.zero_bias(g), eps), is_weight(g), *one_per_feature(g)
        )
        yield rewrite(Tensor.add(Tensor.layer_norm(x, g, Tensor.zero_bias(g), eps), b)).to(
            Tensor.layer_norm(x, g, b, eps), is_weight(b), *one_per_feature(b)
        )
    # TensorFlow's batch_normalization form (Keras' LayerNormalization): x · i + (−mean · i + β), where
    # i = rsqrt(var + ε) · γ; distributing the shared factor back, (x − mean) · i + β.
    left, right, shifted = Tensor.mul(x, s), Tensor.mul(Tensor.neg(m), s), Tensor.mul(Tensor.sub(x, m), s)
    yield rewrite(Tensor.add(left, Tensor.add(right, b))).to(Tensor.add(shifted, b), is_weight(b))
    yield rewrite(Tensor.add(Tensor.add(right, b), left)).to(Tensor.add(shifted, b), is_weight(b))
    yield rewrite(Tensor.add(left, right)).to(shifted)
    yield rewrite(Tensor.add(right, left)).to(shifted)
    # No γ: the norm with γ = 1 (and β = 0), as wide as the last axis.
    unit = Tensor.unit_scale(x, w)
    yield rewrite(Tensor.rms_normalized(x, eps)).to(Tensor.rms_norm(x, unit, eps), last_dim(x) == w)
    yield rewrite(Tensor.normalized(x, eps)).to(
        Tensor.layer_norm(x, unit, Tensor.zero_bias(unit), eps), last_dim(x) == w
    )

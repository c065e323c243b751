"""Masks: every way exporters mask scores becomes one additive ``bias``.

* select masks ``Where(m, S, fill)`` with a very negative fill (−inf, finfo.min, −1e9 …) are ``S + Where(m,
  0, fill)`` under the softmax: masked entries get weight exp(−huge) = 0 either way (exact for −inf, and
  within float rounding for any fill ≤ −1e4); the reversed polarity ``Where(m, fill, S)`` likewise;
* a mask added before the scale is a scaled mask added after it (distributivity);
* ``Where(IsNaN(p), 0, p)`` is the NaN guard; once the mask is known finite it is the identity.
"""

from __future__ import annotations

from egglog import f64, rewrite, rule, ruleset, union

from egfuse.lang import Tensor, finite, scalar_of

NEG_INF = float("-inf")
MASK_FILL_MAX = -1e4
"""A select-mask fill at or below this is 'masked out' (exp underflows to 0 in fp16 and fp32)."""


@ruleset
def rules(
    q: Tensor,
    k: Tensor,
    m: Tensor,
    x: Tensor,
    b: Tensor,
    c: Tensor,
    d: Tensor,
    z: Tensor,
    p: Tensor,
    s: f64,
    f: f64,
    g: f64,
):
    # The additive mask holds its own copy of the fill (``full_like``), which a target may respell as the
    # number its kernel reads the same way (see ``Target.mask_fill``).
    fill = f64(MASK_FILL_MAX)
    zero, masked = Tensor.full_like(c, 0.0), Tensor.full_like(c, f)
    yield rewrite(Tensor.softmax(Tensor.where(m, x, c))).to(
        Tensor.softmax(Tensor.add(x, Tensor.where(m, zero, masked))), scalar_of(c) == f, f <= fill
    )
    yield rewrite(Tensor.softmax(Tensor.where(m, c, x))).to(
        Tensor.softmax(Tensor.add(x, Tensor.where(m, masked, zero))), scalar_of(c) == f, f <= fill
    )
    # A select mask followed by an additive one (GPT-2: causal Where, then the padding mask added), either
    # polarity, either operand order.
    polarities = (
        (Tensor.where(m, x, c), Tensor.where(m, zero, masked)),
        (Tensor.where(m, c, x), Tensor.where(m, masked, zero)),
    )
    for select, additive in polarities:
        for select_then_add in (Tensor.add(select, b), Tensor.add(b, select)):
            yield rewrite(Tensor.softmax(select_then_add)).to(
                Tensor.softmax(Tensor.add(x, Tensor.add(additive, b))), scalar_of(c) == f, f <= fill
            )
    # Scaling a select-masked tensor scales both branches (exact, elementwise).
    yield rewrite(Tensor.mul(Tensor.where(m, x, c), d)).to(
        Tensor.where(m, Tensor.mul(x, d), Tensor.mul(c, d)), scalar_of(c) == f, scalar_of(d) == g
    )
    yield rewrite(Tensor.div(Tensor.where(m, x, c), d)).to(
        Tensor.where(m, Tensor.div(x, d), Tensor.div(c, d)),
        scalar_of(c) == f,
        scalar_of(d) == g,
        g != f64(0.0),
    )
    # (S + b)·c = S·c + b·c — the mask added before the scale.
    yield rewrite(Tensor.mul(Tensor.add(Tensor.scores(q, k, s), b), c)).to(
        Tensor.add(Tensor.scores(q, k, s * f), Tensor.mul(b, c)), scalar_of(c) == f
    )
    yield rewrite(Tensor.div(Tensor.add(Tensor.scores(q, k, s), b), c)).to(
        Tensor.add(Tensor.scores(q, k, s / f), Tensor.div(b, c)), scalar_of(c) == f, f != f64(0.0)
    )
    # Masked probabilities zeroed after the softmax (NeMo/Conformer's masked_fill(mask, 0)): with the same mask
    # filled very negative before the softmax, this is a −inf mask whose fully masked rows are 0 — exactly.
    yield rule(
        Tensor.where(m, z, Tensor.softmax(Tensor.where(m, c, x))),
        scalar_of(z) == f64(0.0),
        scalar_of(c) == f,
        f <= fill,
    ).then(
        union(Tensor.where(m, z, Tensor.softmax(Tensor.where(m, c, x)))).with_(
            Tensor.nan_to_zero(
                Tensor.softmax(Tensor.add(x, Tensor.where(m, Tensor.full_like(c, NEG_INF), Tensor.full_like(c, 0.0)))),
                z,
            )
        )
    )
    # The NaN guard after softmax.
    yield rule(Tensor.where(Tensor.isnan(p), z, p), scalar_of(z) == f64(0.0)).then(
        union(Tensor.where(Tensor.isnan(p), z, p)).with_(Tensor.nan_to_zero(p, z))
    )
    # A guard over a finite-masked attention never fires.
    yield rewrite(Tensor.attend_z(q, k, x, b, s, g)).to(Tensor.attend(q, k, x, b, s, g), finite(b))

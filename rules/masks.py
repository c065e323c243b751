"""Masks: every way exporters mask scores becomes one additive ``bias``.

* select masks ``Where(m, S, fill)`` with a very negative fill (−inf, finfo.min, −1e9 …) are ``S + Where(m,
  0, fill)`` under the softmax: masked entries get weight exp(−huge) = 0 either way (exact for −inf, and
  within float rounding for any fill ≤ −1e4); the reversed polarity ``Where(m, fill, S)`` likewise;
* only the scores S (soft-capped or not) may stand in the select's kept branch: what is added to a fill must be
  absorbed by it. ``S + F = F`` in float32 (|S| < 2^103 for F = finfo.min), but a term that holds F itself
  (a padding mask ``(1 − m)·F`` added before the select, a nested select with the same fill) gives
  ``F + F = −inf`` where the select gave F, and a row masked entirely (left padding under a causal mask) is
  uniform over all its keys in the graph but over fewer after the rewrite. Such a term b is moved *into* the
  select instead: ``Where(m, S + b, F) = S + Where(m, b, F)`` exactly. For fills that absorb every score
  (−inf, and ≤ −1e30: float32's finfo.min) these are identities of tensors, not only under the softmax, so
  they compose — nested selects, a select then an added mask (GPT-2/GPT-Neo eager) — through the bias
  associativity of ``commute``;
* a mask added before the scale is a scaled mask added after it (distributivity);
* ``Where(IsNaN(p), 0, p)`` is the NaN guard; once the mask is known finite it is the identity;
* a select written as arithmetic on its flag, ``m·S + (1 − m)·F`` (tf2onnx's SelectV2), is ``Where(m, S, F)``
  for finite scores and a finite fill: ``0·S = 0`` and ``0·F = 0`` then, so each entry is S or F exactly;
* probabilities zeroed where the same mask hid the keys — by a select or by Keras' adder ``S + (1 − m)·F`` —
  (Keras' ``Softmax(mask)``: ``p·m``, or ``Where(m, p, 0)`` written as arithmetic by tf2onnx) change only rows
  the mask hides entirely: a −inf mask whose fully masked rows are 0, as NeMo's guard (the opposite polarity)
  already is. The adder otherwise stays the additive mask the graph adds: its masked scores are S + F, not F.
"""

from __future__ import annotations

from egglog import f64, i64, rewrite, rule, ruleset, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of, finite, scalar_of

NEG_INF = float("-inf")
MASK_FILL_MAX = -1e4
"""A select-mask fill at or below this is 'masked out' (exp underflows to 0 in fp16 and fp32)."""
ABSORBING_FILL = -1e30
"""A fill at or below this absorbs any score added to it: ``S + F == F`` exactly in float32 for |S| < 2^103
(F = finfo.min, ulp 2^104) and for −inf; no float16 number lies between it and −inf."""


@ruleset
def rules(
    q: Tensor,
    k: Tensor,
    m: Tensor,
    m2: Tensor,
    x: Tensor,
    b: Tensor,
    c: Tensor,
    d: Tensor,
    z: Tensor,
    p: Tensor,
    o: Tensor,
    s: f64,
    f: f64,
    g: f64,
    g2: f64,
    r: i64,
):
    # The additive mask holds its own copy of the fill (``full_like``), which a target may respell as the
    # number its kernel reads the same way (see ``Target.mask_fill``).
    fill = f64(MASK_FILL_MAX)
    zero, masked = Tensor.full_like(c, 0.0), Tensor.full_like(c, f)
    for logits in (Tensor.scores(q, k, s), Tensor.softcap(Tensor.scores(q, k, s), g)):
        # The kept branch is the scores, or the scores plus a bias b that moves into the select.
        for kept, other in ((logits, zero), (Tensor.add(logits, b), b)):
            for select, additive in (
                (Tensor.where(m, kept, c), Tensor.where(m, other, masked)),
                (Tensor.where(m, c, kept), Tensor.where(m, masked, other)),
            ):
                yield rewrite(Tensor.softmax(select)).to(
                    Tensor.softmax(Tensor.add(logits, additive)), scalar_of(c) == f, f <= fill
                )
                # Absorbing fills: an identity of tensors, so it composes with what is around the select.
                yield rewrite(select).to(Tensor.add(logits, additive), scalar_of(c) == f, f <= f64(ABSORBING_FILL))
        # Nested selects over the scores (a select mask, then a causal Where): both masked gives the outer fill,
        # as the nested additive mask does (a sum of the two would give −inf there, or 2·fill).
        inner_fill, inner_zero = Tensor.full_like(d, g2), Tensor.full_like(d, 0.0)
        inner_selects = [
            pair
            for kept, other in ((logits, inner_zero), (Tensor.add(logits, b), b))
            for pair in (
                (Tensor.where(m2, kept, d), Tensor.where(m2, other, inner_fill)),
                (Tensor.where(m2, d, kept), Tensor.where(m2, inner_fill, other)),
            )
        ]
        for inner, inner_additive in inner_selects:
            for select, additive in (
                (Tensor.where(m, inner, c), Tensor.where(m, inner_additive, masked)),
                (Tensor.where(m, c, inner), Tensor.where(m, masked, inner_additive)),
            ):
                yield rewrite(Tensor.softmax(select)).to(
                    Tensor.softmax(Tensor.add(logits, additive)),
                    scalar_of(c) == f,
                    f <= fill,
                    scalar_of(d) == g2,
                    g2 <= fill,
                )
        # A select mask followed by an additive one (GPT-2: causal Where, then the padding mask added), either
        # polarity, either operand order.
        # The kept branch may again carry a bias (a position bias added before the select).
        polarities = [
            (Tensor.where(m, kept, c), Tensor.where(m, other, masked))
            for kept, other in ((logits, zero), (Tensor.add(logits, b), b))
        ] + [
            (Tensor.where(m, c, kept), Tensor.where(m, masked, other))
            for kept, other in ((logits, zero), (Tensor.add(logits, b), b))
        ]
        for select, additive in polarities:
            for select_then_add in (Tensor.add(select, d), Tensor.add(d, select)):
                yield rewrite(Tensor.softmax(select_then_add)).to(
                    Tensor.softmax(Tensor.add(logits, Tensor.add(additive, d))), scalar_of(c) == f, f <= fill
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
    # A select of two fills is arithmetic on its condition: Where(m, 0, f) = (1 − float(m))·f and
    # Where(m, f, 0) = float(m)·f, for a finite fill (0·−inf is NaN). NPUs run the product (Equal → Cast → Mul in
    # their toolchains' words) where a Select is slow; which form is written is the cost model's choice.
    one = Tensor.full_like(c, 1.0)
    for select, product in (
        (Tensor.where(m, zero, masked), Tensor.mul(Tensor.sub(one, Tensor.cast(m, r)), masked)),
        (Tensor.where(m, masked, zero), Tensor.mul(Tensor.cast(m, r), masked)),
    ):
        yield rule(select, dtype_of(c) == r, f >= f64(-1.7e308)).then(union(select).with_(product))
    # The NaN guard after softmax.
    yield rule(Tensor.where(Tensor.isnan(p), z, p), scalar_of(z) == f64(0.0)).then(
        union(Tensor.where(Tensor.isnan(p), z, p)).with_(Tensor.nan_to_zero(p, z))
    )
    # A guard over a finite-masked attention never fires.
    yield rewrite(Tensor.attend_z(q, k, x, b, s, g)).to(Tensor.attend(q, k, x, b, s, g), finite(b))
    # A select as arithmetic on its cast flag: m·S + (1 − m)·F = Where(m, S, F), and (1 − m)·S + m·F =
    # Where(m, F, S) — for scores (finite: the graph's float inputs are) and a finite fill, either operand order.
    # The scores may carry a finite bias (ALiBi added before the select), or a select of their own with a finite
    # fill (a causal Where the half-precision algebra keeps as a select: then the select nests).
    plain = (Tensor.scores(q, k, s), Tensor.softcap(Tensor.scores(q, k, s), g))
    for logits, needs in [
        *[(t, []) for t in plain],
        *[(Tensor.add(t, b), [finite(b)]) for t in plain],
        *[(Tensor.where(m2, t, d), [finite(d)]) for t in plain],
        *[(Tensor.where(m2, d, t), [finite(d)]) for t in plain],
    ]:
        kept, dropped = Tensor.cast(m, r), Tensor.sub(o, Tensor.cast(m, r))
        for on, off, select in (
            (kept, dropped, Tensor.where(m, logits, c)),
            (dropped, kept, Tensor.where(m, c, logits)),
        ):
            for scores_term in (Tensor.mul(logits, on), Tensor.mul(on, logits)):
                for fill_term in (Tensor.mul(off, c), Tensor.mul(c, off)):
                    for total in (Tensor.add(scores_term, fill_term), Tensor.add(fill_term, scores_term)):
                        facts = [scalar_of(c) == f, f >= f64(-1.7e308), f <= f64(1.7e308), scalar_of(o) == f64(1.0)]
                        yield rewrite(total).to(select, *facts, *needs)
    # Masked probabilities zeroed after the softmax with the same mask that hid the keys before it (Keras): by a
    # select, or by Keras' adder S + (1 − m)·F (either operand order; the adder itself stays an additive mask).
    hidden_inf = Tensor.where(m, Tensor.full_like(c, 0.0), Tensor.full_like(c, NEG_INF))
    zero_like = Tensor.full_like(c, 0.0)
    adders = [Tensor.mul(Tensor.sub(o, Tensor.cast(m, r)), c), Tensor.mul(c, Tensor.sub(o, Tensor.cast(m, r)))]
    # (softmax that hid the keys, it reads a one, the guarded attention it is). Not with a term added after the
    # select (a causal mask): a row whose kept keys that term hides with a finite fill weighs the select's keys in
    # the graph (then zeroed) but the kept ones in a −inf mask.
    guarded = Tensor.nan_to_zero(Tensor.softmax(Tensor.add(x, hidden_inf)), zero_like)
    hiding = [
        (Tensor.softmax(Tensor.where(m, x, c)), False, guarded),
        *[(Tensor.softmax(Tensor.add(x, a)), True, guarded) for a in adders],
    ]
    for hidden, reads_one, guarded in hiding:
        zeroed = [(Tensor.where(m, hidden, z), True, reads_one)]  # (form, has a zero, has a one)
        for kept in (Tensor.mul(hidden, Tensor.cast(m, r)), Tensor.mul(Tensor.cast(m, r), hidden)):
            zeroed.append((kept, False, reads_one))
            for dropped in (
                Tensor.mul(Tensor.sub(o, Tensor.cast(m, r)), z),
                Tensor.mul(z, Tensor.sub(o, Tensor.cast(m, r))),
            ):
                zeroed += [(Tensor.add(kept, dropped), True, True), (Tensor.add(dropped, kept), True, True)]
        for form, has_zero, has_one in zeroed:
            facts = [scalar_of(c) == f, f <= fill, f >= f64(-1.7e308)]
            facts += [scalar_of(z) == f64(0.0)] if has_zero else []  # a variable in no term would match any zero
            facts += [scalar_of(o) == f64(1.0)] if has_one else []
            yield rule(form, *facts).then(union(form).with_(guarded))
    # A guard over a guard: its NaN rows are 0 already.
    twice = Tensor.nan_to_zero(Tensor.nan_to_zero(p, z), x)
    yield rule(twice, scalar_of(z) == f64(0.0), scalar_of(x) == f64(0.0)).then(
        union(twice).with_(Tensor.nan_to_zero(p, z))
    )

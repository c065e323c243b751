"""The ``rotary`` rule family on hand-written terms: which spellings of ``x·cos + rotate(x)·sin`` are proven to
be the standard op, and which near misses are not (tables that do not repeat, the wrong pairing, a partial
rotation that drops a feature, tables unsqueezed off the heads axis)."""

from __future__ import annotations

from egfuse.rules import facts, layout, rotary
from egglog import EGraph, i64, set_, unstable_combine_rulesets

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import halves_repeat, last_dim, rank_of

from ..rules.test_rules import proves
from ..rules.test_rules import saturated as rules_saturated

x, theta, positions, t = (Tensor.value(i) for i in range(4))
RULES = unstable_combine_rulesets(rotary.rules, facts.rules, layout.rules)


def saturated(*terms_and_facts: object) -> EGraph:
    return rules_saturated(RULES, *terms_and_facts)


def x_facts(width: int, of: Tensor = x) -> list:
    return [set_(rank_of(of)).to(i64(4)), set_(last_dim(of)).to(i64(width))]


def rotate_half(v: Tensor, half: int) -> Tensor:
    return Tensor.concat(Tensor.neg(Tensor.part(v, -1, half, half)), Tensor.part(v, -1, 0, half), -1)


def table(f, angles: Tensor, axis: int = -3) -> Tensor:
    """``f(angles)`` gathered at the positions, as float32, with a unit axis at x's heads axis."""
    return Tensor.unsqueeze(Tensor.cast(Tensor.rows(f(angles), positions), 1), axis)


def test_rotate_half_with_tables_of_repeated_angles_is_the_op():
    angles = Tensor.concat(theta, theta, -1)  # Concat(θ, θ): what Llama's exporters write
    cos, sin = table(Tensor.cos, angles), table(Tensor.sin, angles)
    llama = Tensor.add(Tensor.mul(x, cos), Tensor.mul(rotate_half(x, 8), sin))
    swapped = Tensor.add(Tensor.mul(sin, rotate_half(x, 8)), Tensor.mul(cos, x))  # operands in the other orders
    egraph = saturated(llama, swapped, *x_facts(16), set_(rank_of(Tensor.cos(angles))).to(i64(2)),
                       set_(rank_of(Tensor.sin(angles))).to(i64(2)))  # fmt: skip
    op = Tensor.rotary(x, Tensor.cast(Tensor.rows(Tensor.cos(angles), positions), 1),
                       Tensor.cast(Tensor.rows(Tensor.sin(angles), positions), 1), 1, 0, 16)  # fmt: skip
    assert proves(egraph, llama, op)
    assert proves(egraph, swapped, op)


def test_tables_not_proven_to_repeat_their_halves_are_not_the_op():
    cos, sin = table(Tensor.cos, theta), table(Tensor.sin, theta)  # θ itself: halves unknown
    term = Tensor.add(Tensor.mul(x, cos), Tensor.mul(rotate_half(x, 8), sin))
    egraph = saturated(term, *x_facts(16), set_(rank_of(Tensor.cos(theta))).to(i64(2)),
                       set_(rank_of(Tensor.sin(theta))).to(i64(2)))  # fmt: skip
    egraph.check_fail(halves_repeat(Tensor.cos(theta)))
    op = Tensor.rotary(x, Tensor.cast(Tensor.rows(Tensor.cos(theta), positions), 1),
                       Tensor.cast(Tensor.rows(Tensor.sin(theta), positions), 1), 1, 0, 16)  # fmt: skip
    assert not proves(egraph, term, op)


def test_a_stored_table_stated_to_repeat_is_enough_and_the_width_must_be_xs():
    cos, sin = Tensor.unsqueeze(t, -3), Tensor.unsqueeze(theta, -3)
    term = Tensor.add(Tensor.mul(x, cos), Tensor.mul(rotate_half(x, 8), sin))
    egraph = saturated(term, *x_facts(16), halves_repeat(t), halves_repeat(theta))
    assert proves(egraph, term, Tensor.rotary(x, t, theta, 1, 0, 16))
    wider = saturated(term, *x_facts(18), halves_repeat(t), halves_repeat(theta))  # halves of 8 in 18 features
    assert not proves(wider, term, Tensor.rotary(x, t, theta, 1, 0, 16))


def test_tables_unsqueezed_off_the_heads_axis_are_not_the_op():
    cos, sin = Tensor.unsqueeze(t, -4), Tensor.unsqueeze(theta, -4)
    term = Tensor.add(Tensor.mul(x, cos), Tensor.mul(rotate_half(x, 8), sin))
    egraph = saturated(term, *x_facts(16), halves_repeat(t), halves_repeat(theta))
    assert not proves(egraph, term, Tensor.rotary(x, t, theta, 0, 0, 16))


def _stacked(a: Tensor, b: Tensor) -> Tensor:
    """``stack((a, b), -1).flatten(-2)`` as lowering reads the ops."""
    return Tensor.merge_heads(Tensor.concat(Tensor.unsqueeze(a, -1), Tensor.unsqueeze(b, -1), -1), "8", "2")


def test_interleaved_pairs_with_repeat_interleaved_tables_are_the_op():
    pairs = _stacked(Tensor.neg(Tensor.strided(x, 1)), Tensor.strided(x, 0))  # GPT-J's rotate_every_two
    repeated = [_stacked(Tensor.unsqueeze(s, -3), Tensor.unsqueeze(s, -3)) for s in (t, theta)]
    gptj = Tensor.add(Tensor.mul(x, repeated[0]), Tensor.mul(pairs, repeated[1]))
    wrong = _stacked(Tensor.strided(x, 0), Tensor.neg(Tensor.strided(x, 1)))  # the pair's order swapped
    swapped = Tensor.add(Tensor.mul(x, repeated[0]), Tensor.mul(wrong, repeated[1]))
    egraph = saturated(gptj, swapped, *x_facts(16))
    assert proves(egraph, gptj, Tensor.rotary(x, t, theta, 1, 1, 16))
    assert not proves(egraph, swapped, Tensor.rotary(x, t, theta, 1, 1, 16))


def test_a_function_of_an_interleaved_table_is_an_interleaved_table():
    egraph = saturated(Tensor.cos(Tensor.interleave(theta, theta)))
    assert proves(egraph, Tensor.cos(Tensor.interleave(theta, theta)),
                  Tensor.interleave(Tensor.cos(theta), Tensor.cos(theta)))  # fmt: skip


def test_a_partial_rotation_concatenated_back_with_the_rest_is_the_op_and_with_a_gap_is_not():
    rotated_part = Tensor.part(x, -1, 0, 16)
    whole = Tensor.concat(Tensor.rotary(rotated_part, t, theta, 1, 0, 16), Tensor.part(x, -1, 16, 48), -1)
    gap = Tensor.concat(Tensor.rotary(rotated_part, t, theta, 1, 0, 16), Tensor.part(x, -1, 17, 47), -1)
    egraph = saturated(whole, gap, *x_facts(64))
    assert proves(egraph, whole, Tensor.rotary(x, t, theta, 1, 0, 16))
    assert not proves(egraph, gap, Tensor.rotary(x, t, theta, 1, 0, 16))


def test_rows_cut_or_gathered_keep_the_halves_and_a_matrix_transposed_does_not():
    cut = Tensor.rows_nd(Tensor.transpose(Tensor.sliced(t, -2), "0,1"), positions)
    swapped = Tensor.rows_nd(Tensor.transpose(Tensor.sliced(t, -2), "1,0"), positions)
    last_axis_cut = Tensor.sliced(t, -1)
    egraph = saturated(cut, swapped, last_axis_cut, halves_repeat(t))
    egraph.check(halves_repeat(cut))
    egraph.check_fail(halves_repeat(swapped))
    egraph.check_fail(halves_repeat(last_axis_cut))


def _halves_apart(v: Tensor, half: int, cos: Tensor, sin: Tensor, *, inverse: bool = False) -> Tensor:
    """gpt-oss's ``[x₁·c − x₂·s, x₂·c + x₁·s]`` (``inverse``: ``[x₁·c + x₂·s, x₂·c − x₁·s]``, the rotation by −θ)."""
    x1, x2 = Tensor.part(v, -1, 0, half), Tensor.part(v, -1, half, half)
    if inverse:
        return Tensor.concat(Tensor.add(Tensor.mul(x1, cos), Tensor.mul(x2, sin)),
                             Tensor.sub(Tensor.mul(x2, cos), Tensor.mul(x1, sin)), -1)  # fmt: skip
    return Tensor.concat(Tensor.sub(Tensor.mul(x1, cos), Tensor.mul(x2, sin)),
                         Tensor.add(Tensor.mul(x2, cos), Tensor.mul(x1, sin)), -1)  # fmt: skip


def test_halves_rotated_apart_with_half_width_tables_are_the_op_and_the_inverse_rotation_is_not():
    """Half-width tables need no proof of repeated halves: the rule joins each to itself."""
    cos, sin = table(Tensor.cos, theta), table(Tensor.sin, theta)
    written = _halves_apart(x, 8, cos, sin)
    x1, x2 = Tensor.part(x, -1, 0, 8), Tensor.part(x, -1, 8, 8)
    tables_first = Tensor.concat(Tensor.sub(Tensor.mul(cos, x1), Tensor.mul(sin, x2)),
                                 Tensor.add(Tensor.mul(sin, x1), Tensor.mul(cos, x2)), -1)  # fmt: skip
    inverse = _halves_apart(x, 8, cos, sin, inverse=True)
    other = _halves_apart(t, 8, cos, sin)  # x's halves, but t's width unknown: no rotation of t is proven
    egraph = saturated(written, tables_first, inverse, other, *x_facts(16))
    c = Tensor.cast(Tensor.rows(Tensor.cos(theta), positions), 1)
    s = Tensor.cast(Tensor.rows(Tensor.sin(theta), positions), 1)
    op = Tensor.rotary(x, Tensor.concat(c, c, -1), Tensor.concat(s, s, -1), 1, 0, 16)
    assert proves(egraph, written, op)
    assert proves(egraph, tables_first, op)
    assert not proves(egraph, inverse, op)
    assert not proves(egraph, other, Tensor.rotary(t, Tensor.concat(c, c, -1), Tensor.concat(s, s, -1), 1, 0, 16))


def test_even_and_odd_features_rotated_apart_are_rotate_half_of_x_deinterleaved():
    """DeepSeek's rope_interleave: x₁ = x[..., 0::2], x₂ = x[..., 1::2], joined as halves — rotate-half of
    [x₁ | x₂]; with the features of an odd width no such halves exist."""
    c = Tensor.cast(Tensor.rows(Tensor.cos(theta), positions), 1)
    s = Tensor.cast(Tensor.rows(Tensor.sin(theta), positions), 1)
    cos, sin = Tensor.unsqueeze(c, -3), Tensor.unsqueeze(s, -3)

    def apart(v: Tensor) -> Tensor:
        x1, x2 = Tensor.strided(v, 0), Tensor.strided(v, 1)
        return Tensor.concat(Tensor.sub(Tensor.mul(x1, cos), Tensor.mul(x2, sin)),
                             Tensor.add(Tensor.mul(x2, cos), Tensor.mul(x1, sin)), -1)  # fmt: skip

    egraph = saturated(apart(x), apart(t), *x_facts(8), *x_facts(7, of=t))
    for v, width, proven in ((x, 8, True), (t, 7, False)):
        joined = Tensor.concat(Tensor.strided(v, 0), Tensor.strided(v, 1), -1)
        op = Tensor.rotary(joined, Tensor.concat(c, c, -1), Tensor.concat(s, s, -1), 1, 0, width)
        assert proves(egraph, apart(v), op) is proven

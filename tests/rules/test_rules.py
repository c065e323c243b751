"""Each rule family on small hand-written terms: what it must prove equal, and a near miss it must not.

These run egglog directly on terms of :mod:`egfuse.egraph.lang` (no ONNX, no onnxruntime): a family's algebra is
checked apart from lowering and raising, which the end-to-end tests cover with numerics."""

from __future__ import annotations

import math

import pytest
from egfuse.rules import (
    CORE,
    attention,
    clamp,
    commute,
    facts,
    groups,
    heads,
    layout,
    masks,
    ort,
    pieces,
    precision,
    qbias,
    scale,
    softcap,
)  # fmt: skip
from egglog import EggSmolError, EGraph, Ruleset, String, eq, f64, i64, set_

from egfuse.egraph.lang import Tensor
from egfuse.egraph.perms import perm_table
from egfuse.egraph.term_facts import (
    dim_of,
    dtype_of,
    finite,
    head_invariant,
    heads_of,
    is_weight,
    perm_then,
    rank_of,
    scalar_of,
)

q, k, v, x, y, c, m = (Tensor.value(i) for i in range(7))
NO_CAP = 0.0


def saturated(ruleset: Ruleset, *facts_: object, tables: bool = False) -> EGraph:
    egraph = EGraph()
    if tables:
        egraph.register(*(set_(perm_then(String(a), String(b))).to(String(r)) for a, b, r in perm_table()))
    egraph.register(*facts_)
    egraph.run(ruleset.saturate())
    return egraph


def proves(egraph: EGraph, a: Tensor, b: Tensor) -> bool:
    try:
        egraph.check(eq(a).to(b))
    except EggSmolError:
        return False
    return True


def four_d(*tensors: Tensor) -> list:
    return [set_(rank_of(t)).to(i64(4)) for t in tensors]


# --- scale ----------------------------------------------------------------------------------------------------


def test_scale_factors_multiply_into_the_scores():
    term = Tensor.div(Tensor.scores(Tensor.mul(q, c), k, 1.0), y)
    egraph = saturated(
        scale.rules | facts.rules, term, set_(scalar_of(c)).to(f64(0.5)), set_(scalar_of(y)).to(f64(4.0))
    )
    assert proves(egraph, term, Tensor.scores(q, k, 0.125))
    assert not proves(egraph, term, Tensor.scores(q, k, 0.5))


def test_a_scale_that_is_not_a_constant_stays_outside():
    term = Tensor.mul(Tensor.scores(q, k, 1.0), c)  # c has no scalar_of: a tensor, not a scale
    egraph = saturated(scale.rules | facts.rules, term)
    assert not proves(egraph, term, Tensor.scores(q, k, 1.0))


# --- layout ---------------------------------------------------------------------------------------------------


def test_transposes_compose_and_the_identity_vanishes():
    term = Tensor.transpose(Tensor.transpose(x, "0,2,1,3"), "0,2,1,3")
    egraph = saturated(layout.rules, term, tables=True)
    assert proves(egraph, term, x)
    other = Tensor.transpose(Tensor.transpose(x, "0,2,1,3"), "0,1,3,2")
    egraph = saturated(layout.rules, other, tables=True)
    assert proves(egraph, other, Tensor.transpose(x, "0,2,3,1")) and not proves(egraph, other, x)


def test_reshape_meanings_cancel_only_with_the_same_dims():
    same = Tensor.merge_heads(Tensor.split_heads(x, "4", "8"), "4", "8")
    different = Tensor.merge_heads(Tensor.split_heads(x, "4", "8"), "8", "4")
    egraph = saturated(layout.rules, same, different, tables=True)
    assert proves(egraph, same, x)
    assert not proves(egraph, different, x)


# --- commute --------------------------------------------------------------------------------------------------


def test_bias_terms_gather_after_the_scores():
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.add(Tensor.add(c, scores), m)
    egraph = saturated(commute.rules, term)
    assert proves(egraph, term, Tensor.add(scores, Tensor.add(c, m)))


# --- masks ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fill", [-math.inf, -3.4028234663852886e38, -1e9])
def test_a_select_mask_is_an_additive_mask_under_the_softmax(fill: float):
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.softmax(Tensor.where(m, scores, c))
    egraph = saturated(masks.rules | facts.rules, term, set_(scalar_of(c)).to(f64(fill)))
    additive = Tensor.where(m, Tensor.full_like(c, 0.0), Tensor.full_like(c, fill))
    assert proves(egraph, term, Tensor.softmax(Tensor.add(scores, additive)))


def test_a_select_with_a_mild_fill_is_not_a_mask():
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.softmax(Tensor.where(m, scores, c))
    egraph = saturated(masks.rules | facts.rules, term, set_(scalar_of(c)).to(f64(-1.0)))  # exp(-1) is no zero
    additive = Tensor.where(m, Tensor.full_like(c, 0.0), Tensor.full_like(c, -1.0))
    assert not proves(egraph, term, Tensor.softmax(Tensor.add(scores, additive)))


def test_a_finite_select_mask_is_arithmetic_on_its_condition_and_an_infinite_one_is_not():
    finite_fill = Tensor.where(m, Tensor.full_like(c, 0.0), Tensor.full_like(c, -1e9))
    infinite_fill = Tensor.where(m, Tensor.full_like(y, 0.0), Tensor.full_like(y, -math.inf))
    egraph = saturated(
        masks.rules, finite_fill, infinite_fill, set_(dtype_of(c)).to(i64(1)), set_(dtype_of(y)).to(i64(1))
    )
    product = Tensor.mul(Tensor.sub(Tensor.full_like(c, 1.0), Tensor.cast(m, 1)), Tensor.full_like(c, -1e9))
    assert proves(egraph, finite_fill, product)
    infinite = Tensor.mul(Tensor.sub(Tensor.full_like(y, 1.0), Tensor.cast(m, 1)), Tensor.full_like(y, -math.inf))
    assert not proves(egraph, infinite_fill, infinite)  # 0·−inf would be NaN


# --- softcap and precision ------------------------------------------------------------------------------------


def test_a_soft_cap_is_recognised_with_its_cap():
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.mul(Tensor.tanh(Tensor.div(scores, c)), y)
    egraph = saturated(
        softcap.rules | facts.rules, term, set_(scalar_of(c)).to(f64(50.0)), set_(scalar_of(y)).to(f64(50.0))
    )
    assert proves(egraph, term, Tensor.softcap(scores, 50.0))
    mismatched = Tensor.mul(Tensor.tanh(Tensor.div(scores, c)), x)
    egraph = saturated(
        softcap.rules | facts.rules, mismatched, set_(scalar_of(c)).to(f64(50.0)), set_(scalar_of(x)).to(f64(30.0))
    )
    assert not proves(egraph, mismatched, Tensor.softcap(scores, 50.0))


def test_a_float32_softmax_between_casts_is_the_softmax():
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.cast(Tensor.softmax(Tensor.cast(scores, 1)), 10)
    egraph = saturated(precision.rules | facts.rules, term, set_(dtype_of(scores)).to(i64(10)))
    assert proves(egraph, term, Tensor.softmax(scores))


# --- attention ------------------------------------------------------------------------------------------------


def test_softmax_of_scores_times_values_is_attention():
    probs = Tensor.softmax(Tensor.add(Tensor.scores(q, k, 0.125), m))
    term = Tensor.matmul(probs, v)
    egraph = saturated(attention.rules | facts.rules, term, *four_d(q, k, v))
    assert proves(egraph, term, Tensor.attend(q, k, v, m, 0.125, NO_CAP))


def test_probabilities_times_a_rank_3_value_are_not_attention():
    term = Tensor.matmul(Tensor.softmax(Tensor.scores(q, k, 0.125)), v)
    egraph = saturated(attention.rules | facts.rules, term, set_(rank_of(v)).to(i64(3)))
    assert not proves(egraph, term, Tensor.attend(q, k, v, Tensor.no_bias(), 0.125, NO_CAP))


def test_repeated_kv_heads_are_grouped_attention():
    term = Tensor.attend(q, Tensor.repeat_heads(k, "4"), Tensor.repeat_heads(v, "4"), m, 0.125, NO_CAP)
    egraph = saturated(attention.rules | facts.rules, term)
    assert proves(egraph, term, Tensor.attend(q, k, v, m, 0.125, NO_CAP))
    unequal = Tensor.attend(q, Tensor.repeat_heads(k, "4"), Tensor.repeat_heads(v, "2"), m, 0.125, NO_CAP)
    egraph = saturated(attention.rules | facts.rules, unequal)
    assert not proves(egraph, unequal, Tensor.attend(q, k, v, m, 0.125, NO_CAP))


# --- groups ---------------------------------------------------------------------------------------------------


def test_rows_of_a_group_share_their_kv_head_and_of_another_count_do_not():
    """``fold_groups(Q) @ merge_lead(Y) = fold_groups(Q @ repeat_heads(Y, G))`` when both fold the same K heads."""
    merged = Tensor.merge_lead(y, "2")
    term = Tensor.matmul(Tensor.fold_groups(q, "2", "3"), merged)
    egraph = saturated(groups.rules, term, set_(rank_of(merged)).to(i64(3)))
    assert proves(egraph, term, Tensor.fold_groups(Tensor.matmul(q, Tensor.repeat_heads(y, "3")), "2", "3"))
    other = Tensor.matmul(Tensor.fold_groups(q, "2", "3"), Tensor.merge_lead(y, "6"))  # K = 6: another batch split
    egraph = saturated(groups.rules, other, set_(rank_of(Tensor.merge_lead(y, "6"))).to(i64(3)))
    assert not proves(egraph, other, Tensor.fold_groups(Tensor.matmul(q, Tensor.repeat_heads(y, "3")), "2", "3"))


def test_a_mask_with_unit_group_axes_is_a_mask_of_the_heads_and_one_per_kv_head_is_not():
    grouped = Tensor.group_heads(x, "3")
    shared, per_kv = Tensor.add(grouped, m), Tensor.add(grouped, c)
    shape = [set_(rank_of(t)).to(i64(5)) for t in (m, c)]
    dims = [set_(dim_of(m, i64(1))).to(String("1")), set_(dim_of(m, i64(2))).to(String("1"))]
    dims += [set_(dim_of(c, i64(1))).to(String("2")), set_(dim_of(c, i64(2))).to(String("1"))]
    egraph = saturated(groups.rules, shared, per_kv, *shape, *dims)
    heads_mask = Tensor.ungroup_heads(m, "1")
    assert proves(egraph, shared, Tensor.group_heads(Tensor.add(x, heads_mask), "3"))
    assert proves(egraph, heads_mask, Tensor.squeeze(m, -3))  # what a target writes
    egraph.check(head_invariant(heads_mask))
    assert not proves(egraph, per_kv, Tensor.group_heads(Tensor.add(x, Tensor.ungroup_heads(c, "1")), "3"))


def test_grouped_views_cancel_and_commute_with_the_softmax():
    term = Tensor.ungroup_heads(Tensor.softmax(Tensor.group_heads(x, "4")), "4")
    egraph = saturated(groups.rules, term)
    assert proves(egraph, term, Tensor.softmax(x))
    folded = Tensor.unfold_groups(Tensor.fold_groups(x, "2", "4"), "2", "4")
    egraph = saturated(groups.rules, folded, Tensor.unfold_groups(Tensor.fold_groups(x, "2", "4"), "4", "2"))
    assert proves(egraph, folded, x)
    assert not proves(egraph, Tensor.unfold_groups(Tensor.fold_groups(x, "2", "4"), "4", "2"), x)


# --- clamp and qbias ------------------------------------------------------------------------------------------


def test_a_clamp_at_a_very_negative_value_vanishes_under_the_softmax_and_a_mild_one_does_not():
    scores = Tensor.scores(q, k, 0.125)
    deep, mild = Tensor.softmax(Tensor.maximum(scores, c)), Tensor.softmax(Tensor.maximum(scores, y))
    egraph = saturated(clamp.rules, deep, mild, set_(scalar_of(c)).to(f64(-3.4e38)), set_(scalar_of(y)).to(f64(-2.0)))
    assert proves(egraph, deep, Tensor.softmax(scores))
    assert not proves(egraph, mild, Tensor.softmax(scores))


def test_a_clamp_over_masked_scores_moves_onto_the_mask_and_is_not_dropped():
    """Masked scores clamped from below keep the clamp, on the mask: a causal −inf and a finfo.min padding sum
    to −inf, and the clamp is what makes that row the mean of V; dropping it would make it NaN."""
    scores = Tensor.scores(q, k, 0.125)
    clamped = Tensor.softmax(Tensor.maximum(Tensor.add(scores, m), c))
    egraph = saturated(clamp.rules, clamped, set_(scalar_of(c)).to(f64(-3.4e38)))
    assert proves(egraph, clamped, Tensor.softmax(Tensor.add(scores, Tensor.maximum(m, c))))
    assert not proves(egraph, clamped, Tensor.softmax(Tensor.add(scores, m)))


def test_a_mask_subtracted_from_summed_terms_leaves_the_scores_alone_in_the_sum():
    scores = Tensor.scores(q, k, 0.125)
    term = Tensor.sub(Tensor.add(scores, x), m)
    egraph = saturated(qbias.rules, term)
    assert proves(egraph, term, Tensor.add(scores, Tensor.sub(x, m)))


# --- ort ------------------------------------------------------------------------------------------------------


def test_three_projections_of_one_input_pack_into_one_attention_and_of_two_inputs_do_not():
    w = [Tensor.value(10 + i) for i in range(6)]  # wq, wk, wv, bq, bk, bv
    weights = [is_weight(t) for t in w] + [set_(rank_of(t)).to(i64(2)) for t in w[:3]]

    def proj(inp: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return Tensor.add(Tensor.matmul(inp, weight), bias)

    one = Tensor.mha(proj(x, w[0], w[3]), proj(x, w[1], w[4]), proj(x, w[2], w[5]), m, 0.125, NO_CAP, "2")
    two = Tensor.mha(proj(x, w[0], w[3]), proj(y, w[1], w[4]), proj(y, w[2], w[5]), m, 0.125, NO_CAP, "2")
    egraph = saturated(ort.rules, one, two, *weights)
    assert proves(egraph, one, Tensor.packed_attention(x, *w, m, 0.125, "2"))
    assert not proves(egraph, two, Tensor.packed_attention(x, *w, m, 0.125, "2"))  # cross-attention


# --- facts ----------------------------------------------------------------------------------------------------


def test_facts_follow_the_terms_rules_build():
    term = Tensor.mul(c, y)
    mask = Tensor.where(m, Tensor.full_like(c, 0.0), Tensor.full_like(c, -1e9))
    egraph = saturated(facts.rules, term, mask, set_(scalar_of(c)).to(f64(0.5)), set_(scalar_of(y)).to(f64(0.25)))
    egraph.check(eq(scalar_of(term)).to(f64(0.125)))
    egraph.check(finite(mask))
    with pytest.raises(EggSmolError):
        egraph.check(head_invariant(mask))  # the condition's heads are unknown
    egraph = saturated(facts.rules, mask, head_invariant(m))
    egraph.check(head_invariant(mask))


# --- heads ----------------------------------------------------------------------------------------------------


def test_softmax_commutes_with_the_batch_merge():
    term = Tensor.softmax(Tensor.merge_lead(x, "8"))
    egraph = saturated(heads.rules, term)
    assert proves(egraph, term, Tensor.merge_lead(Tensor.softmax(x), "8"))


# --- pieces ---------------------------------------------------------------------------------------------------


def test_pieces_joined_in_order_are_the_tensor():
    joined = Tensor.concat(Tensor.part(x, -3, 0, 1), Tensor.part(x, -3, 1, 1), -3)
    gap = Tensor.concat(Tensor.part(x, -3, 0, 1), Tensor.part(x, -3, 2, 1), -3)
    egraph = saturated(pieces.rules, joined, gap, set_(heads_of(x)).to(i64(2)))
    assert proves(egraph, joined, x)
    assert not proves(egraph, gap, Tensor.part(x, -3, 0, 2))


def test_probabilities_cut_at_the_cache_length_are_one_product():
    def total(length: str) -> Tensor:
        return Tensor.add(
            Tensor.matmul(Tensor.cols_before(y, length), x), Tensor.matmul(Tensor.cols_from(y, length), v)
        )

    egraph = saturated(pieces.rules, total("past"), total("other"), set_(dim_of(x, i64(-2))).to(String("past")))
    assert proves(egraph, total("past"), Tensor.matmul(y, Tensor.concat(x, v, -2)))
    assert not proves(egraph, total("other"), Tensor.matmul(y, Tensor.concat(x, v, -2)))  # cut elsewhere


def test_heads_join_when_grouped_alike_and_not_otherwise():
    one = [set_(heads_of(t)).to(i64(1)) for t in (q, x, k, v, y, c)]

    def head(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        return Tensor.attend(query, key, value, Tensor.no_bias(), 0.125, NO_CAP)

    alike = Tensor.concat(head(q, k, v), head(x, y, c), -3)  # two heads, one K/V head each
    egraph = saturated(pieces.rules | facts.rules, alike, *one)
    joined = head(Tensor.concat(q, x, -3), Tensor.concat(k, y, -3), Tensor.concat(v, c, -3))
    assert proves(egraph, alike, joined)
    # Two query heads on one K/V head beside one query head on its own: the groups differ (2:1 vs 1:1).
    two_q = Tensor.concat(q, x, -3)
    unlike = Tensor.concat(head(two_q, k, v), head(m, y, c), -3)
    egraph = saturated(pieces.rules | facts.rules, unlike, *one, set_(heads_of(m)).to(i64(1)))
    bad = head(Tensor.concat(two_q, m, -3), Tensor.concat(k, y, -3), Tensor.concat(v, c, -3))
    assert not proves(egraph, unlike, bad)


def test_heads_with_a_mask_that_varies_by_head_do_not_share_it():
    one = [set_(heads_of(t)).to(i64(1)) for t in (q, x, k, v)]
    left = Tensor.attend(q, k, v, m, 0.125, NO_CAP)
    right = Tensor.attend(x, k, v, m, 0.125, NO_CAP)
    term = Tensor.concat(left, right, -3)
    shared = Tensor.attend(Tensor.concat(q, x, -3), k, v, m, 0.125, NO_CAP)
    assert not proves(saturated(pieces.rules | facts.rules, term, *one), term, shared)  # m's heads unknown
    egraph = saturated(pieces.rules | facts.rules, term, *one, head_invariant(m))
    assert proves(egraph, term, shared)


# --- the whole core -------------------------------------------------------------------------------------------


def test_the_core_rules_make_a_classic_block_attention():
    kt = Tensor.transpose(k, "0,1,3,2")
    term = Tensor.matmul(Tensor.softmax(Tensor.add(Tensor.div(Tensor.matmul(q, kt), c), m)), v)
    egraph = saturated(CORE, term, *four_d(q, k, v), set_(scalar_of(c)).to(f64(8.0)), finite(m), tables=True)
    assert proves(egraph, term, Tensor.attend(q, k, v, m, 0.125, NO_CAP))

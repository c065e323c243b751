"""A half-precision select mask goes to the standard ``Attention`` in float32.

``Where(m, S, F)`` replaces the masked scores by the fill: a query row whose every key it hides is uniform over
them however large the scores, the mean of V. The fused op adds its mask to the scores instead, which keeps
that only where the fill absorbs every score added to it — and no float16 number does for a kernel that adds in
float32 (|S| > 16 against float16's finfo.min, |S| > 4 against −1e4). The op's mask type is free (``U``), so
the select mask is written in float32, its fills absorbing (float32's finfo.min moved one ulp up, finite fills
times a power of two past 1e30), as float32 models have it. Before, such blocks were rolled back on float16
(a fully masked row 2-4 off the graph's) or, on the ``onnx`` target, gave inf on large scores."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for
from egfuse.validation import fill_reach

SELECTS = [
    pytest.param(
        Variant(scale="q_mul", k_layout="dynamo_3d", mask="where_finfo", head_dim=16, kv_heads=1, dtype="float16",
                rope=True, rope_partial=True, position_bias=True, matmul="batched_3d", text_dims=True, seed=9793),
        id="finfo-select-position-bias",
    ),
    pytest.param(
        Variant(scale="none", k_layout="transpose_0132", mask="where_neginf", causal="buffer_local", kv_heads=1,
                head_dim=128, dtype="float16", rope=True, rope_tables="buffer", rope_interleaved=True,
                rope_seq_first=True, concat="sequence", clamp=True, query_bias="gated", dropout="ratio", seed=40258),
        id="neginf-select-local-causal-clamp",
    ),
]  # fmt: skip


def _mask_types(model: onnx.ModelProto) -> list[int]:
    """The element type of each standard Attention's mask input."""
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*typed.graph.value_info, *typed.graph.input]}
    types.update({n.output[0]: n.attribute[0].t.data_type for n in model.graph.node if n.op_type == "Constant"})
    attention = [n for n in model.graph.node if n.op_type == "Attention" and n.domain == ""]
    return [types.get(n.input[3], 0) for n in attention if len(n.input) > 3 and n.input[3]]


@pytest.mark.parametrize("variant", SELECTS)
def test_a_float16_select_mask_fuses_into_the_standard_op_in_float32(variant):
    model = attention_model(variant)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert _mask_types(result.model) == [onnx.TensorProto.FLOAT]
    for seed in range(4):  # the judge's own feeds (left padding under the causal masks: fully masked rows)
        feeds = feeds_for(model, seed=seed, batch=3, seq=6, left_padding=True)
        assert disagreements(model, result.model, feeds) == [], seed


def test_an_additive_float16_mask_stays_float16():
    """HF's SDPA masks are added by the graph too (S + finfo.min): nothing to keep there that a float16 mask
    loses, and a float32 copy of a (B, 1, S, T) mask per layer would cost memory and a cast for nothing."""
    model = attention_model(Variant(mask="additive", causal="trilu", dtype="float16", heads=2))
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert set(_mask_types(result.model)) == {onnx.TensorProto.FLOAT16}


def test_a_fully_masked_row_is_the_mean_of_v_on_large_scores():
    variant = SELECTS[0].values[0]
    model = attention_model(variant)
    result = egfuse.fuse(model, target="onnx")
    feeds = feeds_for(model, seed=3, batch=2, seq=6, left_padding=True)
    feeds["mask"] = np.zeros_like(feeds["mask"])  # every key of every row hidden
    feeds["x"] = (feeds["x"].astype(np.float32) * 16).astype(np.float16)  # scores far past the fill's ulp
    expected = egfuse.validation.validate.run(model, feeds)
    actual = egfuse.validation.validate.run(result.model, feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name].astype(np.float32), value.astype(np.float32), atol=2e-2, rtol=1e-2)


OVERFLOWING_SUMS = [
    pytest.param(  # OPT: max(S + M, finfo.min) — the clamp moved onto the mask, S + finfo.min overflowed
        Variant(scale="qk_div", k_layout="dynamo_3d", mask="additive_first", causal="trilu", kv_heads=None,
                head_dim=8, dtype="float16", clamp=True, position_bias=True, query_bias="gated", past=True,
                rope=True, seed=2417),
        id="clamp-at-finfo-min",
    ),
    pytest.param(  # (1 − m)·finfo.min + causal finfo.min + a position bias: −inf in float16 where both hide
        Variant(scale="custom", k_layout="transpose_0132", mask="padding_int", causal="trilu", heads=1,
                head_dim=16, dtype="float16", position_bias=True, rope=True, rope_partial=True, seed=43176),
        id="padding-plus-causal-plus-bias",
    ),
]  # fmt: skip


@pytest.mark.parametrize("variant", OVERFLOWING_SUMS)
def test_a_float16_mask_whose_terms_may_overflow_goes_in_float32(variant):
    """A mask summed (or clamped) in float16 overflows to −inf on keys the graph, adding the scores first, kept
    finite: a fully masked row gave NaN or 0 where the graph gives a number (the onnx target rolled these back:
    2.4 off on left padding, inf on large scores). Summed in float32 it cannot overflow."""
    model = attention_model(variant)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert _mask_types(result.model) == [onnx.TensorProto.FLOAT]
    for seed in range(3):
        feeds = feeds_for(model, seed=seed, batch=3, seq=6, left_padding=True)
        assert disagreements(model, result.model, feeds) == [], seed


FINITE_FILLS = [
    pytest.param(Variant(mask="where_reversed", causal="trilu", dtype="float16", heads=2, position_bias=True),
                 id="reversed-select-causal-position-bias"),
    pytest.param(Variant(scale="q_mul", k_layout="dynamo_3d", mask="where_reversed", commuted=True, heads=4,
                         head_dim=32, kv_heads=2, dtype="float16", rope=True, einsum=True, seed=53475),
                 id="reversed-select-grouped-heads"),
    pytest.param(Variant(mask="keras_select", causal="buffer_local", dtype="float16", heads=2, clamp=True),
                 id="keras-select-local-causal-clamp"),
]  # fmt: skip


@pytest.mark.parametrize("variant", FINITE_FILLS)
def test_a_finite_float16_select_fill_is_written_to_absorb_the_scores(variant):
    """``Where(m, S, −1e4)`` in float16: a fully masked row is uniform in the graph, which a float16 −1e4 added to
    float32 scores is not (every such block was rolled back: 2-4 off on left padding). Written in float32 and
    scaled past 1e30 the fill absorbs the scores as the graph's select does; the report says what that assumes."""
    model = attention_model(variant)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert _mask_types(result.model) == [onnx.TensorProto.FLOAT]
    assert result.report.regions[0].assumed_fill == -1e4
    for seed in range(4):  # the judge's own feeds (left padding under the causal masks: fully masked rows)
        feeds = feeds_for(model, seed=seed, batch=3, seq=6, left_padding=True)
        assert disagreements(model, result.model, feeds) == [], seed


REACHED = Variant(
    scale="none", k_layout="transpose_0132", mask="where_reversed", commuted=True, heads=2, head_dim=128,
    symbolic=False, causal="buffer_local", kv_heads=1, dtype="float16", rope=True, rope_tables="inputs",
    rope_partial=True, position_bias=True, query_bias="rel_pos_uv", dropout="training_false", seed=10749,
)  # fmt: skip
"""Unscaled scores over 128 features plus a position term from Q: on feeds four times larger they reach −1.5e4."""


def test_scores_that_reach_a_finite_fill_roll_the_region_back():
    model = attention_model(REACHED)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 0, str(result.report)
    assert "reach the mask's fill -10000" in result.report.regions[0].reason


def test_without_the_check_such_a_region_changes_what_the_model_computes():
    """What the check stands for: written unchecked, the block gives a row whose kept keys score below the fill
    to those keys, where the graph gives it to the masked ones — seen on the judge's own feeds."""
    model = attention_model(REACHED)
    unchecked = egfuse.fuse(model, target="onnx", validate=False).model
    found = [disagreements(model, unchecked, feeds_for(model, seed=seed)) for seed in range(8)]
    assert any("large scores, float32 copies" in line for lines in found for line in lines), found


def test_the_scores_closest_to_a_fill_leave_out_fills_and_hidden_entries():
    fill = -1e4
    hidden = [float(np.finfo(np.float16).min), -3.0e38, -np.inf, fill + 24.0, fill]  # other masks; F + a bias
    assert fill_reach.closest_score(np.array([3.0, -40.0, *hidden]), fill) is None
    assert fill_reach.closest_score(np.array([3.0, -6e3, -1.5e4, *hidden]), fill) == -1.5e4
    assert fill_reach.closest_score(np.array([-4.9e3]), fill) is None  # not half-way to the fill
    assert fill_reach.closest_score(np.array([-6e8]), -1e9) == -6e8


def test_a_float16_nan_guard_stays_after_the_standard_op():
    """``Where(IsNaN(p), 0, p)`` after a float16 softmax: the standard op gives 0 for a row its mask hides with
    −inf, but onnxruntime's CPU kernel makes a NaN row of scores past float16's range, which the graph's guard
    turned into 0 (the judge's larger draws: NaN in 32 outputs where the graph has 0)."""
    variant = Variant(
        k_layout="dynamo_3d", mask="where_finfo", guard=True, heads=4, head_dim=16, symbolic=False, causal="trilu",
        kv_heads=2, dtype="float16", rope=True, rope_tables="inputs", position_bias=True, query_bias="relative",
        dropout="castlike", seed=4584,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1, str(result.report)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.index("IsNaN") > ops.index("Attention")
    for seed in (variant.seed, 1, 2):
        assert disagreements(model, result.model, feeds_for(model, seed=seed)) == [], seed

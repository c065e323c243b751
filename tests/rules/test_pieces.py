"""Attention computed in parts and joined (``rules/pieces.py``) is attention: a KV cache read in the split-score
form, and attention written head by head (single-head attention, SHA), fuse like any other spelling.

Two sources of those spellings: the generator's ``cache_read="split_score"`` (4D, written as NPU toolchains
describe it), and the ``npu`` target's own output — rank-3 per-head ops, K/V per group, a per-head split-score
cache — which every other target must fuse back into one op per block. Each test checks numerics against the
original model on onnxruntime. Each spelling runs on one target in the fast suite, the targets taking turns,
and on the others in the slow one (``-m slow``, which CI runs)."""

from __future__ import annotations

import onnx
import pytest

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for
from egfuse.validation import validate

from ..conftest import fused_op_count, one_target_fast, op_counts


def assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict) -> None:
    """Validation's criterion: float32 to 1e-4, half precision within twice the original's own rounding."""
    for name, comparison in validate.compare_models(original, fused, feeds).items():
        assert comparison.ok, f"{name} differs by {comparison.max_abs_diff}"


SPLIT_SCORE = {
    "mha": Variant(past=True, cache_read="split_score", k_layout="transpose_0132"),
    "static dims": Variant(past=True, cache_read="split_score", k_layout="transpose_0132", symbolic=False),
    "gqa, causal": Variant(
        past=True, cache_read="split_score", k_layout="transpose_0132", heads=4, kv_heads=2, causal="trilu"
    ),
    "mqa, select mask, guard": Variant(
        past=True,
        cache_read="split_score",
        k_layout="transpose_0132",
        heads=4,
        kv_heads=1,
        mask="where_finfo",
        guard=True,
    ),
    "rope, scale on q, commuted": Variant(
        past=True,
        cache_read="split_score",
        k_layout="transpose_0132",
        rope=True,
        rope_tables="positions",
        scale="q_mul",
        commuted=True,
    ),
    "float16, softcap": Variant(
        past=True, cache_read="split_score", k_layout="transpose_0132", dtype="float16", softcap="div"
    ),
}


@pytest.mark.parametrize(
    ("target", "variant"),
    one_target_fast([(v,) for v in SPLIT_SCORE.values()], list(SPLIT_SCORE), ("ort", "onnx", "npu")),
)
def test_a_cache_read_by_split_scores_fuses(variant: Variant, target: str):
    model = attention_model(variant)
    feeds = feeds_for(model, left_padding=True)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    if target != "npu":
        assert fused_op_count(result.model, target) == 1
        assert "Softmax" not in op_counts(result.model)
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=3, batch=3, seq=1))  # a decode step


SINGLE_HEAD = {
    "encoder, padding": Variant(heads=4, k_layout="transpose_0132"),
    "select mask, guard": Variant(heads=4, mask="where_finfo", guard=True, k_layout="transpose_0132"),
    "gqa, causal": Variant(heads=4, kv_heads=2, k_layout="transpose_0132", causal="trilu"),
    "mqa": Variant(heads=4, kv_heads=1, k_layout="transpose_0132"),
    "cross": Variant(heads=2, cross=True, k_layout="transpose_0132"),
    "cache (split scores per head)": Variant(past=True, heads=4, k_layout="transpose_0132", causal="trilu"),
    "gqa cache": Variant(past=True, heads=4, kv_heads=2, k_layout="transpose_0132"),
    "position bias (a mask per head)": Variant(position_bias=True, heads=4, k_layout="transpose_0132"),
    "softcap": Variant(heads=2, softcap="div", k_layout="transpose_0132"),
}


@pytest.mark.parametrize(
    ("target", "variant"), one_target_fast([(v,) for v in SINGLE_HEAD.values()], list(SINGLE_HEAD))
)
def test_single_head_attention_fuses_back_into_one_op(variant: Variant, target: str):
    """The npu target's output (one rank-3 attention a head, the heads concatenated) as the input: the heads
    join back into the one op the target has, and the result still computes what the original model did."""
    model = attention_model(variant)
    feeds = feeds_for(model, left_padding=True)
    single_head = egfuse.fuse(model, target="npu", feeds=feeds)
    assert op_counts(single_head.model).get("Softmax") == variant.heads, str(single_head.report)
    result = egfuse.fuse(single_head.model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1, op_counts(result.model)
    assert "Softmax" not in op_counts(result.model)
    assert_same_outputs(model, result.model, feeds)


def test_heads_with_different_masks_are_not_joined_under_one():
    """Two heads reading different masks (not pieces of one per-head mask) must not become one attention with
    either mask: the region is kept (or fused head by head), and the numbers stay the original's."""
    model = attention_model(Variant(heads=2, k_layout="transpose_0132"))
    single_head = egfuse.fuse(model, target="npu", feeds=feeds_for(model)).model
    _give_second_head_its_own_mask(single_head)
    feeds = feeds_for(single_head, left_padding=True)
    result = egfuse.fuse(single_head, target="ort", feeds=feeds)
    assert fused_op_count(result.model, "ort") != 1 or result.report.fused == 0, str(result.report)
    assert_same_outputs(single_head, result.model, feeds)


def _give_second_head_its_own_mask(model: onnx.ModelProto) -> None:
    """The second head's mask Add reads a new graph input of the same shape instead of the shared mask."""
    adds = [n for n in model.graph.node if n.op_type == "Add" and n.name.startswith("egfuse/")]
    softmax_inputs = {i for n in model.graph.node if n.op_type == "Softmax" for i in n.input}
    (_, second) = [n for n in adds if n.output[0] in softmax_inputs]
    shared = second.input[1]
    info = next(v for v in onnx.shape_inference.infer_shapes(model).graph.value_info if v.name == shared)
    model.graph.input.append(onnx.helper.make_tensor_value_info("other_mask", info.type.tensor_type.elem_type,
                                                                [d.dim_param or d.dim_value for d in
                                                                 info.type.tensor_type.shape.dim]))  # fmt: skip
    second.input[1] = "other_mask"

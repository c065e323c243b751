"""Never change a model's meaning: near-misses stay unfused (or fuse only where outputs still match), and a
region whose fused form fails validation is put back."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for
from egfuse.writing import writers
from egfuse.writing.raise_ import Emitter

from ..conftest import assert_same_outputs, topologically_sorted

BASE = Variant(scale="qk_div", mask="additive")


def _node(model: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op)


def _fuse_both(model: onnx.ModelProto, **feed_args):
    feeds = feeds_for(model, **feed_args)
    for target in ("ort", "onnx"):
        result = egfuse.fuse(model, target=target, feeds=feeds)
        assert_same_outputs(model, result.model, feeds)
        yield result


def test_softmax_over_another_axis_is_not_fused():
    model = attention_model(BASE)
    softmax = _node(model, "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(helper.make_attribute("axis", 2))
    for result in _fuse_both(model):
        assert result.report.fused == 0
        assert "not over the last axis" in result.report.regions[0].reason


def test_mask_multiplied_instead_of_added_is_not_fused():
    model = attention_model(BASE)
    add = next(n for n in model.graph.node if n.op_type == "Add" and "mask" in n.input)
    add.op_type = "Mul"
    for result in _fuse_both(model):
        assert result.report.fused == 0


def test_scale_that_differs_per_head_is_not_fused():
    model = attention_model(BASE)
    div = _node(model, "Div")
    per_head = onnx.numpy_helper.from_array(np.array([2.0, 3.0], np.float32).reshape(1, 2, 1, 1), "per_head")
    model.graph.initializer.append(per_head)
    div.input[1] = "per_head"
    for result in _fuse_both(model):
        assert result.report.fused == 0


def test_probabilities_also_a_graph_output_stay_exact():
    model = attention_model(BASE)
    probs = _node(model, "Softmax").output[0]
    model.graph.output.append(onnx.ValueInfoProto(name=probs))
    for result in _fuse_both(model):
        assert probs in [o.name for o in result.model.graph.output]
        assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]


def test_value_of_the_wrong_rank_is_not_fused():
    """softmax(QKᵀ) @ V with V (B, S, N·H) instead of (B, N, S, H): broadcasting, not attention (it runs
    for batch 1 only)."""
    model = attention_model(dataclasses.replace(BASE, heads=1))
    pv = [n for n in model.graph.node if n.op_type == "MatMul"][-1]
    v_transpose = next(n for n in model.graph.node if n.output[0] == pv.input[1])
    reshape = next(n for n in model.graph.node if n.output[0] == v_transpose.input[0])
    projection = reshape.input[0]  # (B, S, N·H), rank 3
    pv.input[1] = projection
    for result in _fuse_both(model, batch=1):
        assert result.report.fused == 0


def _all_keys_masked(model: onnx.ModelProto, masked: bool) -> dict[str, np.ndarray]:
    """Feeds whose last batch row masks every key, so every query row of it is fully masked."""
    feeds = feeds_for(model)
    feeds["mask"][-1] = masked
    return feeds


@pytest.mark.parametrize(("mask", "masked"), [("where_finfo", False), ("where_reversed", True)])
def test_rows_masked_entirely_with_finfo_min_keep_the_mean_of_v(mask, masked, target):
    """The primitive ops give such a row the mean of V; onnxruntime's standard Attention reads finfo.min as
    −inf and would give 0 (DeBERTa masks padded queries this way). The fill is written so the kernel agrees."""
    model = attention_model(Variant(mask=mask))
    feeds = _all_keys_masked(model, masked)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize("causal", ["range_greater", "trilu"])
def test_left_padded_causal_rows_keep_their_meaning_on_the_standard_op(causal, monkeypatch):
    """GPT-J's and HF eager's spelling: a causal term (a finfo.min select fill, or −inf added) plus the padding
    term ``(1 − mask)·finfo.min``. With left padding the first query row sees only a padded key, whose score
    plus finfo.min is finfo.min — finite, tied with the row's select fills — where onnxruntime's standard
    Attention reads a mask entry of finfo.min as −inf. The mask the op gets has finfo.min moved one ulp up;
    without that (patched out here) validation catches the difference and rolls the region back."""
    model = attention_model(Variant(mask="padding_int", causal=causal))
    feeds = feeds_for(model)
    feeds["attention_mask"][0, 0] = 0  # left padding: query row 0 of the first sequence sees nothing else
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert_same_outputs(model, result.model, feeds)
    monkeypatch.setattr(Emitter, "finite_mask", lambda self, bias, mask: mask)
    unguarded = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert [r.status for r in unguarded.report.regions] == ["rolled back"], str(unguarded.report)


def test_rows_masked_entirely_with_minus_inf_roll_back_on_the_standard_op():
    """The primitive ops give NaN rows, the standard op's kernel 0 rows: validation sees it and keeps the
    original region (MultiHeadAttention keeps the NaN, so ``ort`` fuses)."""
    model = attention_model(Variant(mask="where_neginf"))
    feeds = _all_keys_masked(model, False)
    onnx_result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert [r.status for r in onnx_result.report.regions] == ["rolled back"]
    assert_same_outputs(model, onnx_result.model, feeds, atol=0.0)
    ort_result = egfuse.fuse(model, target="ort", feeds=feeds)
    assert ort_result.report.fused == 1
    assert_same_outputs(model, ort_result.model, feeds)


def test_failed_validation_rolls_the_region_back(monkeypatch):
    real_writers = dict(writers.WRITERS)

    def wrong_scale(name):
        def write(node, emitter, op):
            node = dataclasses.replace(node, args=tuple(a * 1.5 if isinstance(a, float) else a for a in node.args))
            return real_writers[name](node, emitter, op)

        return write

    for name in real_writers:
        monkeypatch.setitem(writers.WRITERS, name, wrong_scale(name))
    model = attention_model(BASE)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="ort", feeds=feeds)
    region = result.report.regions[0]
    assert region.status == "rolled back"
    assert "differ" in region.reason and region.max_abs_diff > 1e-3
    assert result.report.fused == 0
    assert_same_outputs(model, result.model, feeds, atol=0.0)


def test_cache_is_not_absorbed_when_the_mask_reads_the_present_length(target):
    """A mask sized from Shape(present_key): standing the op's present output in for the Concat would make the
    op read its own output. The Concat stays outside; attention still fuses."""
    model = attention_model(Variant(past=True, k_layout="transpose_0132", mask="none"))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    zero = onnx.numpy_helper.from_array(np.zeros(1, np.float32))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "ones"))
    model.graph.node.extend(
        [
            helper.make_node("Shape", ["present_key"], ["total"], start=2, end=3),
            helper.make_node("Shape", ["x"], ["queries"], start=1, end=2),
            helper.make_node("Concat", ["ones", "queries", "total"], ["bias_shape"], axis=0),
            helper.make_node("ConstantOfShape", ["bias_shape"], ["bias"], value=zero),
            helper.make_node("Add", [softmax.input[0], "bias"], ["biased"]),
        ]
    )
    softmax.input[0] = "biased"
    model = topologically_sorted(model)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    producers = {out: node.op_type for node in result.model.graph.node for out in node.output}
    assert producers["present_key"] == "Concat"
    assert "kept outside" in result.report.regions[0].variants["kv cache"]
    assert_same_outputs(model, result.model, feeds)

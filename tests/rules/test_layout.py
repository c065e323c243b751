"""Where the heads live, and Einsum products: heads folded into the batch (``bmm``/``baddbmm``), channel-first
1×1-convolution projections, Einsum scores/context, single-head (B, S, H) attention — each fuses into one op on
both targets with the original's numerics (issue 14, spellings 2, 4, 5 and 7). The lists of spellings run each
on one target in the fast suite, the targets alternating, and on the other in the slow one (``-m slow``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.testing import HEAD_LAYOUTS, Variant, attention_model, feeds_for
from egfuse.validation import validate

from ..conftest import assert_same_outputs, fast_on, fused_op_count, one_target_fast, only, op_counts

BASE = Variant()
SPELLINGS = [
    *({"heads_layout": layout} for layout in HEAD_LAYOUTS),
    *({"heads_layout": layout, "einsum": True} for layout in HEAD_LAYOUTS),
    {"einsum": True, "k_layout": "transpose_0231"},  # XLNet's bind,bjnd->bnij / bnij,bjnd->bind
    {"heads_layout": "batch_folded", "baddbmm": True},
    {"heads_layout": "batch_folded", "baddbmm": True, "mask": "where_finfo", "dtype": "float16"},  # BLOOM
    {"heads_layout": "batch_folded", "mask": "none"},  # no mask: softmax straight on the 3D scores
    {"heads_layout": "batch_folded", "scale": "q_mul", "cross": True},  # BART/Marian cross-attention
    {"heads_layout": "batch_folded", "past": True, "causal": "trilu"},  # OPT/BART decoder with a cache
    {"heads_layout": "batch_folded", "kv_heads": 1, "k_layout": "transpose_0132"},
    {"heads_layout": "batch_folded", "position_bias": True, "mask": "padding_int"},
    {"heads_layout": "batch_folded", "clamp": True, "mask": "padding_int", "causal": "range_greater"},  # OPT
    {"clamp": True, "mask": "where_neginf", "dtype": "float16"},
    {"clamp": True, "mask": "additive", "causal": "trilu"},  # −inf causal + finfo.min padding: the clamp matters
    {"clamp": True, "mask": "where_finfo", "causal": "trilu", "heads_layout": "batch_folded"},
    {"heads_layout": "single", "mask": "padding_int", "causal": "range_greater"},
    {"heads_layout": "single", "scale": "split_sqrt", "mask": "where_neginf", "position_bias": True},
    {"heads_layout": "channel_first", "mask": "padding_int", "proj_bias": False},
    {"heads_layout": "channel_first", "cross": True, "scale": "k_div"},
    # a causal Where kept as a select in float16 under Keras' select: the selects nest
    {"mask": "keras_select", "causal": "buffer_where", "dtype": "float16"},
]
TF2ONNX_EINSUMS = [  # tf2onnx's Einsum lowering (unit axes put in, moved, folded by ReduceProd, squeezed out)
    {"matmul": "tf2onnx_einsum", "mask": "keras_select", "causal": "range_greater"},
    {"matmul": "tf2onnx_einsum", "mask": "keras_select", "zeroed": True, "kv_heads": 1},
    {"matmul": "tf2onnx_einsum", "mask": "padding_int", "past": True, "causal": "trilu"},
]


def _id(spelling: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spelling.items())


@pytest.mark.parametrize(
    ("target", "spelling"), one_target_fast([(s,) for s in SPELLINGS], [_id(s) for s in SPELLINGS])
)
def test_layout_spelling_fuses(spelling, target):
    model = attention_model(BASE.replaced(**spelling))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True
    assert fused_op_count(result.model, target) == 1
    assert not {"Softmax", "Einsum"} & set(op_counts(result.model)), op_counts(result.model)
    for check in (feeds, feeds_for(model, seed=5, batch=3, seq=4)):
        _assert_matches(model, result.model, check)


@pytest.mark.parametrize(
    ("target", "spelling"), one_target_fast([(s,) for s in TF2ONNX_EINSUMS], [_id(s) for s in TF2ONNX_EINSUMS])
)
def test_tf2onnx_einsum_lowering_fuses(spelling, target):
    """The probabilities reach V through Unsqueeze → Transpose of a unit axis → Reshape (a view of them) →
    3D MatMul → Reshape → Squeeze: one attention op, the original's numerics."""
    model = attention_model(BASE.replaced(**spelling))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    for check in (feeds, feeds_for(model, seed=5, batch=3, seq=4)):
        _assert_matches(model, result.model, check)


def test_a_shape_read_of_the_probabilities_does_not_keep_the_softmax():
    """tf2onnx's lowering reshapes by ``Shape(probabilities)``: the shape is read from surviving values
    instead (``egfuse.writing.shape_reads``), so no score, softmax or score MatMul is computed for it."""
    model = attention_model(BASE.replaced(**TF2ONNX_EINSUMS[0]))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 1
    assert "Softmax" not in op_counts(result.model), op_counts(result.model)
    assert op_counts(result.model).get("MatMul") == 3, op_counts(result.model)  # the projections only
    assert result.report.stats["shape_reads_rewritten"] >= 1
    for check in (feeds, feeds_for(model, seed=5, batch=3, seq=4)):
        _assert_matches(model, result.model, check)


def _assert_matches(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict) -> None:
    """Validation's criterion (float16 measured against a float32 evaluation of the original)."""
    for name, comparison in validate.compare_models(original, fused, feeds).items():
        assert comparison.ok, f"{name} differs by {comparison.max_abs_diff}"


def test_single_head_is_one_head(target):
    """(B, S, H) attention is the fused op with one head on the unsplit tensors."""
    model = attention_model(BASE.replaced(heads_layout="single"))
    result = egfuse.fuse(model, target=only(target, "mha"), feeds=feeds_for(model))
    (fused,) = [n for n in result.model.graph.node if n.op_type in ("Attention", "MultiHeadAttention")]
    heads = {a.name: a.i for a in fused.attribute if a.name in ("num_heads", "q_num_heads")}
    assert set(heads.values()) == {1}, heads


def test_channel_first_projections_pack_for_ort():
    """Three 1×1 convolutions of one input are three projections: onnxruntime's packed-QKV Attention."""
    model = attention_model(BASE.replaced(heads_layout="channel_first"))
    result = egfuse.fuse(model, target=only("ort", "packed_attention"), feeds=feeds_for(model))
    assert op_counts(result.model).get("com.microsoft.Attention") == 1, op_counts(result.model)
    assert "Conv" not in op_counts(result.model)


EINSUMS = [
    ("bhqd,bhkd->bhqk", "qk", "bhqk,bhkd->bhqd", "bnsh"),
    ("bhkd,bhqd->bhqk", "kq", "bhqk,bhkd->bhqd", "bnsh"),  # operands named the other way round
    ("bind,bjnd->bnij", "qk", "bnij,bjnd->bind", "bsnh"),  # XLNet, no transposes at all
    ("bnid,bnjd->bnji", "qk", "bnij,bnjd->bnid", "bnsh"),  # the scores written transposed, then transposed
    ("bnid,bndj->bnij", "qK", "bnij,bndj->bndi", "bnsh"),  # K and V given as (B, N, H, T)
]


@pytest.mark.parametrize(
    ("target", "scores", "operands", "context", "layout"), one_target_fast(EINSUMS, ["-".join(e) for e in EINSUMS])
)
def test_einsum_equations_fuse(scores, operands, context, layout, target):
    """Any Einsum that is a batched MatMul up to transposes lowers to transposes and a MatMul."""
    model = _einsum_model(scores, operands, context, layout)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert_same_outputs(model, result.model, feeds)


def _einsum_model(scores: str, operands: str, context: str, layout: str) -> onnx.ModelProto:
    """Q, K, V as inputs in ``layout`` ((B, N, S, H) or (B, S, N, H); an upper-case K, and then V, transposed
    to (B, N, H, T)); the scores put keys last (a Transpose where the equation does not) before the softmax."""
    hd = 8
    dims = ["batch", 2, "seq", hd] if layout == "bnsh" else ["batch", "seq", 2, hd]
    transposed = ["batch", 2, hd, "seq"]
    nodes = [helper.make_node("Einsum", [c.lower() for c in operands], ["s"], equation=scores)]
    if scores.endswith("ji"):
        nodes.append(helper.make_node("Transpose", ["s"], ["st"], perm=[0, 1, 3, 2]))
    nodes += [
        helper.make_node("Mul", [nodes[-1].output[0], "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["o"], equation=context),
    ]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, transposed if n != "q" and "K" in operands else dims)
        for n in ("q", "k", "v")
    ]
    scale = onnx.numpy_helper.from_array(np.array(1.0 / np.sqrt(hd), np.float32), "scale")
    output = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "einsum", inputs, [output], [scale]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model


@pytest.mark.parametrize("target", fast_on("ort"))
def test_subtracted_permuted_mask_fuses(target):
    """XLNet's ``scores − 1e30 · mask`` with the mask permuted by a one-operand Einsum (``ijbn->bnij``)."""
    hd = 8
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bnid,bnjd->bnij"),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Einsum", ["mask"], ["m"], equation="ijbn->bnij"),
        helper.make_node("Mul", ["m", "big"], ["mb"]),
        helper.make_node("Sub", ["ss", "mb"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["o"], equation="bnij,bnjd->bnid"),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2, "seq", hd]) for n in ("q", "k", "v")]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "seq", "batch", 1]))
    consts = [
        onnx.numpy_helper.from_array(np.array(1.0 / np.sqrt(hd), np.float32), "scale"),
        onnx.numpy_helper.from_array(np.array(1e30, np.float32), "big"),
    ]
    output = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "xlnet", inputs, [output], consts), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 2, 5, hd)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["mask"] = np.zeros((1, 5, 2, 1), np.float32)
    feeds["mask"][0, -1, 1, 0] = 1.0  # the last key of the second sequence is padding
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert_same_outputs(model, result.model, feeds)

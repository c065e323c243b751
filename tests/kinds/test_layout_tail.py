"""Attention whose output the graph views in a layout no rule reads back (VitDet's and SAM's windowed
attention: the (B·N, S, H) result viewed as (B, N, h, w, H), permuted to (B, h, w, N, H), then merged): the
fused op is written at the attention's own output and the graph's layout ops after it read it. Before, the
whole block stayed as written, its reason blaming the Squeeze of the unbound Q/K/V."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import egfuse
from egfuse.testing.agree import disagreements

B, HEIGHT, WIDTH, HEADS, HEAD = 2, 4, 4, 4, 8
S, D = HEIGHT * WIDTH, HEADS * HEAD


def _windowed_block(tail: str, positions: tuple[str, ...] = ()) -> onnx.ModelProto:
    """x (B, h, w, D) → qkv → (3, B·N, S, H) unbound → softmax(q·s @ kᵀ (+ ``positions``)) @ v → ``tail`` →
    projection. ``positions``: decomposed relative-position terms computed from q ("height", "width"), added
    with the scores viewed as (B·N, h, w, h, w), as ViTDet and segment-anything write them."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((D, 3 * D)).astype(np.float32) * 0.2, "w_qkv"),
        numpy_helper.from_array(rng.standard_normal(3 * D).astype(np.float32) * 0.1, "b_qkv"),
        numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) * 0.2, "w_out"),
        numpy_helper.from_array(np.array([B, S, 3, HEADS, HEAD], np.int64), "shape5"),
        numpy_helper.from_array(np.array([3, B * HEADS, S, HEAD], np.int64), "shape4"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array(HEAD**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array([B, HEADS, HEIGHT, WIDTH, HEAD], np.int64), "heads5"),
        numpy_helper.from_array(np.array([B, HEADS, S, HEAD], np.int64), "heads4"),
        numpy_helper.from_array(np.array([B, HEIGHT, WIDTH, D], np.int64), "merged"),
    ]
    inits += [numpy_helper.from_array(np.array([i], np.int64), f"at{i}") for i in range(4)]
    inits += [
        numpy_helper.from_array(np.array([B * HEADS, HEIGHT, WIDTH, HEAD], np.int64), "grid"),
        numpy_helper.from_array(np.array([B * HEADS, HEIGHT, WIDTH, HEIGHT, WIDTH], np.int64), "pairs"),
        numpy_helper.from_array(np.array([B * HEADS, S, S], np.int64), "scores_shape"),
        numpy_helper.from_array(rng.standard_normal((HEAD, HEIGHT)).astype(np.float32), "rel_height"),
        numpy_helper.from_array(rng.standard_normal((HEAD, WIDTH)).astype(np.float32), "rel_width"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array([-2], np.int64), "second_last"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv_mm"]),
        helper.make_node("Add", ["qkv_mm", "b_qkv"], ["qkv"]),
        helper.make_node("Reshape", ["qkv", "shape5"], ["qkv5"]),
        helper.make_node("Transpose", ["qkv5"], ["qkv5t"], perm=[2, 0, 3, 1, 4]),
        helper.make_node("Reshape", ["qkv5t", "shape4"], ["qkv4"]),
    ]
    for i, name in enumerate("qkv"):
        nodes.append(helper.make_node("Slice", ["qkv4", f"at{i}", f"at{i + 1}", "axis0"], [f"{name}_1"]))
        nodes.append(helper.make_node("Squeeze", [f"{name}_1", "axis0"], [name]))
    nodes += [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
    ]
    if positions:
        nodes += [
            helper.make_node("Reshape", ["q", "grid"], ["q_grid"]),
            helper.make_node("Reshape", ["scores", "pairs"], ["scores_5d"]),
        ]
        total = "scores_5d"
        for which in positions:
            axis = "last" if which == "height" else "second_last"
            nodes += [
                helper.make_node("MatMul", ["q_grid", f"rel_{which}"], [f"{which}_term"]),
                helper.make_node("Unsqueeze", [f"{which}_term", axis], [f"{which}_5d"]),
                helper.make_node("Add", [total, f"{which}_5d"], [f"with_{which}"]),
            ]
            total = f"with_{which}"
        nodes.append(helper.make_node("Reshape", [total, "scores_shape"], ["logits"]))
    else:
        nodes.append(helper.make_node("Identity", ["scores"], ["logits"]))
    nodes += [
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
    ]
    if tail == "windows":  # VitDet / SAM: the rows viewed as the h × w window again
        nodes += [
            helper.make_node("Reshape", ["context", "heads5"], ["context5"]),
            helper.make_node("Transpose", ["context5"], ["context5t"], perm=[0, 2, 3, 1, 4]),
            helper.make_node("Reshape", ["context5t", "merged"], ["joined"]),
        ]
    else:  # the usual head merge, which the rules read back into the op's output
        nodes += [
            helper.make_node("Reshape", ["context", "heads4"], ["context4"]),
            helper.make_node("Transpose", ["context4"], ["context4t"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["context4t", "merged"], ["joined"]),
        ]
    nodes.append(helper.make_node("MatMul", ["joined", "w_out"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "windowed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, HEIGHT, WIDTH, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, HEIGHT, WIDTH, D])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize("target", ["ort", "onnx", "npu"])
def test_windowed_attention_fuses_before_the_layout_it_does_not_read(target):
    model = _windowed_block("windows")
    result = egfuse.fuse(model, target=target)
    (region,) = result.report.regions
    assert result.report.fused == 1 and result.report.validated, region.reason
    assert region.output == "context"  # written at the attention's own output, the view after it kept
    assert any("layout ops after it" in note for note in region.notes)
    assert region.certificate["reached_at"] is not None  # the algebra proven for that value's class
    ops = [n.op_type for n in result.model.graph.node]
    if target != "npu":  # npu's single-head attentions are plain ops, a Softmax each
        assert "Softmax" not in ops
    assert ops.count("Transpose") >= 1 and "Reshape" in ops  # the graph's own window view reads the op
    feeds = {"x": np.random.default_rng(1).standard_normal((B, HEIGHT, WIDTH, D)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-3)
    assert disagreements(model, result.model, feeds) == []


def test_a_tail_the_rules_read_is_still_folded_into_the_op():
    model = _windowed_block("heads")
    result = egfuse.fuse(model, target="onnx")
    (region,) = result.report.regions
    assert result.report.fused == 1 and result.report.validated
    assert region.output == "joined" and not any("layout ops after it" in note for note in region.notes)
    feeds = {"x": np.random.default_rng(2).standard_normal((B, HEIGHT, WIDTH, D)).astype(np.float32)}
    assert disagreements(model, result.model, feeds) == []


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_decomposed_relative_positions_are_one_bias_of_the_op(target):
    """The height and width terms, added to the scores viewed as (B·N, h, w, h, w), fill that view: its view
    back is the scores plus one (B·N, S, S) bias, which the op takes."""
    model = _windowed_block("windows", ("height", "width"))
    result = egfuse.fuse(model, target=target)
    (region,) = result.report.regions
    assert result.report.fused == 1 and result.report.validated, region.reason
    assert region.certificate["reached_at"] is not None
    assert "Softmax" not in [n.op_type for n in result.model.graph.node]
    feeds = {"x": np.random.default_rng(3).standard_normal((B, HEIGHT, WIDTH, D)).astype(np.float32)}
    assert disagreements(model, result.model, feeds) == []


def test_a_term_that_does_not_fill_the_view_is_never_fused_wrongly():
    """The height term alone is (B·N, h, w, h, 1): the view back of the sum is no bias of the scores' shape
    without broadcasting it first, which the reading does not do — whatever is written must agree."""
    model = _windowed_block("windows", ("height",))
    result = egfuse.fuse(model, target="onnx")
    feeds = {"x": np.random.default_rng(4).standard_normal((B, HEIGHT, WIDTH, D)).astype(np.float32)}
    assert disagreements(model, result.model, feeds) == []
    assert result.report.validated is not False

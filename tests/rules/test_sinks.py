"""Attention sinks (``rules/sinks.py``): a logit per head concatenated to the scores, the softmax (after the row's
max is subtracted, as gpt-oss writes it), the logit's column cut off the probabilities, then ``@ V`` — attention
over one more key, of zeros, biased by the logit. It fuses on every target, with and without a mask, and matches
the original, fully masked rows included (there the sink takes all the weight: the output is 0). Near misses stay
as written: the first column cut off instead of the sink's, a max over the wrong axis."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.testing import disagreements

from ..conftest import fast_on, fused_op_count, op_counts

B, N, S, H = 2, 4, 5, 8


def _sinks(*, mask: bool = True, shift: bool = True, cut: str = "sink", max_axis: int = -1) -> onnx.ModelProto:
    """q, k, v (B, N, S, H); the sinks' logits (1, N, 1, 1) expanded to (B, N, S, 1) and joined to the scores.
    ``cut``: "sink" keeps ``p[..., :-1]``, "first" keeps ``p[..., 1:]`` (not attention over the keys)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
        helper.make_node("Shape", ["q"], ["batch"], start=0, end=1),
        helper.make_node("Shape", ["q"], ["rows"], start=2, end=3),
        helper.make_node("Concat", ["batch", "heads", "rows", "one"], ["sink_shape"], axis=0),
        helper.make_node("Expand", ["sinks", "sink_shape"], ["sink"]),
    ]
    logits = "scores"
    if mask:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
        logits = "masked"
    nodes.append(helper.make_node("Concat", [logits, "sink"], ["joined"], axis=-1))
    probs_of = "joined"
    if shift:
        nodes += [
            helper.make_node("ReduceMax", ["joined", "max_axes"], ["row_max"], keepdims=1),
            helper.make_node("Sub", ["joined", "row_max"], ["shifted"]),
        ]
        probs_of = "shifted"
    bounds = ["zero", "minus_one"] if cut == "sink" else ["one", "to_end"]
    nodes += [
        helper.make_node("Softmax", [probs_of], ["p"], axis=-1),
        helper.make_node("Slice", ["p", *bounds, "last"], ["kept"]),
        helper.make_node("MatMul", ["kept", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", N, "sequence", H]) for n in "qkv"]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, "sequence", "sequence"]))
    rng = np.random.default_rng(1)
    inits = [
        helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)]),
        onnx.numpy_helper.from_array(rng.standard_normal((1, N, 1, 1)).astype(np.float32), "sinks"),
        *(onnx.numpy_helper.from_array(np.array([v], np.int64), name) for name, v in
          (("heads", N), ("one", 1), ("zero", 0), ("minus_one", -1), ("to_end", 2**62), ("last", -1),
           ("max_axes", max_axis))),
    ]  # fmt: skip
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "sinks", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(masked_row: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B, N, S, H)).astype(np.float32) for n in "qkv"}
    mask = np.triu(np.full((S, S), np.finfo(np.float32).min, np.float32), 1)[None, None].repeat(B, 0)
    mask[0, :, :, :2] = np.finfo(np.float32).min  # left padding: the first rows of batch 0 see no key at all
    return {**feeds, "mask": mask}


@pytest.mark.parametrize("target", fast_on("onnx", ("ort", "onnx", "npu")))
@pytest.mark.parametrize("shift", [True, False], ids=["max subtracted", "plain softmax"])
@pytest.mark.parametrize("mask", [True, False], ids=["masked", "no mask"])
def test_a_sinks_column_cut_off_is_attention_over_a_zero_key(target: str, shift: bool, mask: bool):
    model = _sinks(mask=mask, shift=shift)
    feeds = _feeds() if mask else {n: v for n, v in _feeds().items() if n != "mask"}
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True, str(result.report)
    if target != "npu":
        assert fused_op_count(result.model, target) == 1
        # nothing of the scores is computed twice (the shift is no bias to compute: the softmax has its own)
        assert not {"MatMul", "ReduceMax", "Softmax", "Slice"} & set(op_counts(result.model)), op_counts(result.model)
    assert not disagreements(model, result.model, feeds)
    if mask:  # the rows that see no key: all weight on the sink, an output of 0 (disagreements compared them)
        fused = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert np.allclose(fused.run(["y"], feeds)[0][0, :, :2], 0.0, atol=1e-6)


def test_generated_inputs_prove_it_too():
    """No feeds given: validation draws its own, padded masks among them."""
    model = _sinks()
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert not disagreements(model, result.model, _feeds())


@pytest.mark.parametrize("case", ["first column cut", "max over the rows"])
def test_near_misses_stay_as_written(case: str):
    model = _sinks(cut="first") if case == "first column cut" else _sinks(max_axis=-2)
    feeds = _feeds()
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)


def test_a_stable_softmax_is_the_softmax_in_any_attention():
    """``softmax(x − max(x))`` without a sink: plain attention, fused."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
        helper.make_node("ReduceMax", ["scores"], ["row_max"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["scores", "row_max"], ["shifted"]),
        helper.make_node("Softmax", ["shifted"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", N, "sequence", H]) for n in "qkv"]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)])
    graph = helper.make_graph(nodes, "stable", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [scale])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # axes an attribute
    feeds = {n: v for n, v in _feeds().items() if n != "mask"}
    result = egfuse.fuse(model, target="ort", feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, "ort") == 1
    assert not {"MatMul", "ReduceMax", "Softmax"} & set(op_counts(result.model)), op_counts(result.model)
    assert not disagreements(model, result.model, feeds)

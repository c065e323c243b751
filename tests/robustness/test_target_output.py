"""Every target writes only what the model's opset allows and what onnxruntime has kernels for, and never a
value a fused op reads specially: old opsets, double precision, a scale of 0."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import assert_same_outputs


def _runs(model: onnx.ModelProto) -> None:
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("target", ["ort", "onnx", "npu"])
def test_an_opset_14_model_gets_no_shape_slicing_attributes(target):
    """``Shape(start, end)`` is opset 15: below it the fused program slices the whole shape instead (the npu
    target's split-score cache read the past length that way and the model did not load)."""
    model = attention_model(Variant(heads=4, k_layout="transpose_0132", causal="trilu", past=True))
    model.opset_import[0].version = 14
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, validate=False)
    assert result.report.fused == 1
    opset = next(e.version for e in result.model.opset_import if e.domain == "")
    if opset < 15:
        assert not any(
            a.name in ("start", "end") for n in result.model.graph.node if n.op_type == "Shape" for a in n.attribute
        )
    _runs(result.model)
    assert_same_outputs(model, result.model, feeds)


def _in_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 tensor, type and cast made float64."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))
    for info in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT:
            info.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float64)))
    return model


def test_double_precision_gets_only_ops_with_double_kernels():
    """onnxruntime has no float64 MultiHeadAttention, packed Attention or RotaryEmbedding (it cannot load such a
    model): ``ort`` writes the standard Attention, which has one, and leaves RoPE as the graph wrote it."""
    model = _in_double(attention_model(Variant(heads=2, k_layout="transpose_0132", rope=True, rope_tables="positions")))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="ort", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert not any(n.domain == "com.microsoft" for n in result.model.graph.node)
    assert all("no RotaryEmbedding kernel" in r.reason for r in result.report.rotary)
    _runs(result.model)
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_scale_of_zero_is_never_written_where_it_reads_as_the_default(target):
    """``com.microsoft`` ops read ``scale=0`` as 1/√H and the standard op refuses it: a block whose scores really
    are scaled by 0 is kept (or written in a form without that reading), and its meaning never changes."""
    model = attention_model(Variant(heads=2, scale="qk_mul", k_layout="transpose_0132"))
    scale = 1.0 / np.sqrt(8)
    for tensor in model.graph.initializer:
        if tensor.dims == [] and np.isclose(numpy_helper.to_array(tensor), scale):
            tensor.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), tensor.name))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, validate=False)
    for node in result.model.graph.node:
        if node.op_type in ("Attention", "MultiHeadAttention"):
            assert all(a.f != 0.0 for a in node.attribute if a.name == "scale")
    assert_same_outputs(model, result.model, feeds)

"""Exports quantized by onnxruntime's ``quantize_dynamic`` (int8 weights: every projection a ``MatMulInteger``
between ``DynamicQuantizeLinear`` and a rescale — how many models ship to CPUs, transformers.js' ``_quantized``
files among them). Attention's own MatMuls read two activations and stay float, so every block still fuses, with
the quantized projections left outside the op, and the result matches the quantized original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType, quantize_dynamic

import egfuse

from ..conftest import DATA, assert_same_outputs


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("export", ["bert_sdpa.torchscript", "llama_sdpa.dynamo", "gpt2_past_sdpa.torchscript"])
def test_dynamically_quantized_exports_fuse(export, target, tmp_path):
    quantized = tmp_path / "quantized.onnx"
    quantize_dynamic(DATA / f"{export}.onnx", quantized, weight_type=QuantType.QInt8)
    model = onnx.load(quantized)
    assert any(n.op_type == "MatMulInteger" for n in model.graph.node)
    result = egfuse.fuse(model, target=target)
    report = result.report
    assert report.fused == len(report.regions) == 2 and report.validated, str(report)
    assert all(r.status == "fused" for r in [*report.layer_ops, *report.rotary]), str(report)
    assert any(n.op_type == "MatMulInteger" for n in result.model.graph.node)  # the projections stay quantized
    feeds = dict(np.load(DATA / f"{export}.feeds.npz"))
    assert_same_outputs(model, result.model, feeds)

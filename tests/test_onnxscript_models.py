"""onnxscript ships real fusion test graphs (``onnxscript/rewriter/models``); the encoder self-attention ones
fuse and validate the same way as our own exports."""

from __future__ import annotations

import pytest

import egfuse

from .conftest import assert_same_outputs, fused_op_count

models = pytest.importorskip("onnxscript.rewriter.models", reason="onnxscript is in the dev extra")
import onnx_ir as ir  # noqa: E402
from onnxscript.rewriter.models import _bart_encoder, _whisper_encoder  # noqa: E402

CASES = {
    "bart_encoder": (_bart_encoder._BartEncoderTest, 2),
    "whisper_encoder": (_whisper_encoder._WhisperEncoderTest, 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_models_fuse(name, target):
    test_cls, blocks = CASES[name]
    case = test_cls()
    model = ir.serde.serialize_model(case.get_onnx_model())
    feeds = case.get_ort_inputs()
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == blocks == len(result.report.regions), str(result.report)
    assert result.report.validated is True
    assert fused_op_count(result.model, target) == blocks
    assert_same_outputs(model, result.model, feeds)

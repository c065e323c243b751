"""onnxscript ships real fusion test graphs (``onnxscript/rewriter/models``): encoders and decoders (causal,
GQA, RoPE, KV cache) fuse and validate the same way as our own exports. ``_phi4lm`` is left out: its 4.6 GB
of random weights are ``Constant`` nodes (past protobuf's 2 GB limit; building it alone peaks at 15.5 GB)."""

from __future__ import annotations

import pytest

import egfuse

from .conftest import fused_op_count

models = pytest.importorskip("onnxscript.rewriter.models", reason="onnxscript is in the dev extra")
import onnx_ir as ir  # noqa: E402
from onnxscript.rewriter.models import (  # noqa: E402
    _bart_encoder,
    _phi2lm,
    _smollm_1,
    _smollm_2,
    _whisper_decoder,
    _whisper_encoder,
)

from egfuse import validate  # noqa: E402

CASES = {
    "bart_encoder": (_bart_encoder._BartEncoderTest, 2),
    "whisper_encoder": (_whisper_encoder._WhisperEncoderTest, 1),
    "whisper_decoder": (_whisper_decoder._WhisperDecoderTest, 2),
    "smollm_1": (_smollm_1._SmollmTest1, 1),
    "smollm_2": (_smollm_2._SmollmTest2, 1),
    "phi2lm": (_phi2lm._Phi2LMTest, 1),
}


# The decoders of LLM size (1-1.4 GB of random weights each; a minute a target) run with ``-m slow`` (CI does).
LARGE = {"smollm_1", "smollm_2", "phi2lm"}
PARAMS = [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in sorted(CASES)]


@pytest.mark.parametrize("name", PARAMS)
def test_models_fuse(name, target):
    test_cls, blocks = CASES[name]
    case = test_cls()
    model = ir.serde.serialize_model(case.get_onnx_model())
    # _phi2lm ships no inputs: generated ones (padded masks, in-range token ids) as validation uses
    feeds = case.get_ort_inputs() if hasattr(case, "get_ort_inputs") else validate.make_feeds(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == blocks == len(result.report.regions), str(result.report)
    assert result.report.validated is True
    assert fused_op_count(result.model, target) == blocks
    # their RoPE (smollm: rotate-half; phi2: 32 of 80 features) becomes RotaryEmbedding, every one of them
    assert all(r.status == "fused" for r in result.report.rotary), str(result.report)
    # validation's criterion (1e-4 + 1e-3 relative): the decoders' logits run into the tens
    comparisons = validate.compare_models(model, result.model, feeds)
    assert all(c.ok for c in comparisons.values()), comparisons

"""bfloat16 exports (torch's dynamo exporter at opset 18: a BERT and a Llama with grouped K/V heads and RoPE, built
by ``experiments/corpus.py --set half``). onnxruntime's CPU provider runs almost none of a bfloat16 model, so
validation judges float32 copies of both models (bfloat16 has float32's range: every fill and overflow keeps its
meaning there, only the rounding is the kernel's). On the ``onnx`` target, whose standard ops are specified for
bfloat16, every attention block, rotation and norm fuses. Before, nothing did: no form was priced for bfloat16,
and validation stopped at "the original does not load"."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.validation import judge, validate
from egfuse.validation.runner import run

from ..conftest import DATA, with_output_scaled

HALF = DATA / "half"
MODELS = [m for m in json.loads((HALF / "manifest.json").read_text())["models"] if "bfloat16" in m["flavour"]]


def _feeds(entry: dict) -> dict[str, np.ndarray]:
    return dict(np.load(HALF / entry["file"].replace(".onnx", ".feeds.npz")))


def _fused(entry: dict) -> egfuse.FuseResult:
    return egfuse.fuse(HALF / entry["file"], target="onnx", feeds=_feeds(entry))


def test_the_corpus_holds_bfloat16_models_the_cpu_cannot_run():
    # BERT, Llama, its decode step, MPT (scores upcast before a float32 ALiBi bias), GPT-2 (the tanh GELU)
    assert len(MODELS) == 5
    for entry in MODELS:
        model = onnx.load(HALF / entry["file"])
        assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16, entry["file"]
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            run(model, _feeds(entry))


@pytest.mark.parametrize("entry", MODELS, ids=[m["name"] for m in MODELS])
def test_every_block_rotation_and_norm_fuses_and_validates_on_float32_copies(entry):
    result = _fused(entry)
    report = result.report
    assert report.fused == entry["blocks"] == len(report.regions), str(report)
    assert report.validated is True and judge.FLOAT32_COPIES_NOTE in report.notes, str(report)
    assert report.layer_ops and all(r.status == "fused" for r in report.layer_ops), str(report)
    rotations = 2 * entry["blocks"] if "rope" in entry["flavour"] else 0
    assert [r.status for r in report.rotary] == ["fused"] * rotations, str(report)
    ops = {n.op_type for n in result.model.graph.node}
    assert "Attention" in ops and "Softmax" not in ops, sorted(ops)
    assert result.model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    # The numerics, on float32 copies of both (padded rows too: the feeds pad the first row on the left).
    original = onnx.load(HALF / entry["file"])
    wide_feeds = validate.upcast_feeds(_feeds(entry), fills=True)
    expected = run(validate.upcast(original, fills=True), wide_feeds)
    actual = run(validate.upcast(result.model, fills=True), wide_feeds)
    for name, e in expected.items():
        np.testing.assert_allclose(actual[name], e, atol=1e-4, rtol=1e-3, err_msg=name)


def test_a_wrong_scale_in_a_bfloat16_fused_model_is_caught():
    entry = next(m for m in MODELS if m["name"] == "llama_sdpa_bf16")
    result, original = _fused(entry), onnx.load(HALF / entry["file"])
    assert judge.judge(original, result.model, result.report, _feeds(entry), None).failing == {}
    wrong = onnx.ModelProto()
    wrong.CopyFrom(result.model)
    attention = next(n for n in wrong.graph.node if n.op_type == "Attention")
    scale = next(a for a in attention.attribute if a.name == "scale")
    scale.f *= 1.25
    failing = judge.judge(original, wrong, result.report, _feeds(entry), None).failing
    reasons = [reason for reason, _ in failing.values()]
    assert reasons and all(r.startswith("outputs differ") for r in reasons), failing


def test_a_bfloat16_mask_goes_to_the_standard_op_as_it_is():
    """bfloat16's finfo.min is no float32 number's end: onnxruntime reads it as a finite fill (a fully masked
    row stays the mean of V, which the validation above checks on the copies), so it is not moved — and moving
    it needs an ``Equal`` on bfloat16, for which onnxruntime has no kernel on any provider (CUDA refused to
    load such a model: "Provider type for Equal node ... is not set")."""
    entry = next(m for m in MODELS if m["name"] == "bert_sdpa_bf16")
    model = _fused(entry).model
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    producers = {o: n for n in model.graph.node for o in n.output}
    assert not producers[attention.input[3]].name.startswith("egfuse/"), "the mask was rewritten"
    assert not [n for n in model.graph.node if n.op_type == "Equal"]


def test_priced_for_cuda_the_ort_target_writes_multi_head_attention_in_bfloat16():
    """onnxruntime's CUDA provider runs MultiHeadAttention, the skip norms and the standard RotaryEmbedding in
    bfloat16 (MultiHeadAttention 1.3-1.5x the standard op's speed there in grouped blocks at B=8, S=512,
    experiments/results/latency_gpu.md; at this tiny model's default sizes the two are predicted alike, so the
    sizes a GPU runs are given)."""
    entry = next(m for m in MODELS if m["name"] == "llama_sdpa_bf16")
    cuda = validate.Settings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    result = egfuse.fuse(
        HALF / entry["file"], target="ort", feeds=_feeds(entry), validation=cuda, shapes={"batch": 8, "seq": 512}
    )
    report = result.report
    assert report.fused == entry["blocks"] and report.validated is True, str(report)
    assert all(r.status == "fused" for r in [*report.rotary, *report.layer_ops]), str(report)
    ops = {n.op_type for n in result.model.graph.node}
    assert ops >= {"MultiHeadAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization"}, sorted(ops)
    assert "IsNaN" not in ops, "the NaN guard stayed: the bfloat16 mask was not proven finite"


def test_priced_for_cuda_a_bfloat16_encoder_gets_packed_attention_and_bias_gelu():
    """The bfloat16 BERT on an H100: the Gelu left as five elementwise kernels made the CUDA-priced ort target
    slower than the onnx target (0.61 of the export against 0.50); CUDA runs BiasGelu and packed Attention in
    bfloat16 (probes in experiments/gpu_timer.py), and with them the model ran at 0.38."""
    entry = next(m for m in MODELS if m["name"] == "bert_sdpa_bf16")
    cuda = validate.Settings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    result = egfuse.fuse(HALF / entry["file"], target="ort", feeds=_feeds(entry), validation=cuda)
    report = result.report
    assert report.fused == entry["blocks"] and report.validated is True, str(report)
    assert all(r.status == "fused" for r in report.layer_ops), str(report)
    ops = {n.op_type for n in result.model.graph.node}
    assert {"Attention", "BiasGelu", "SkipLayerNormalization"} <= ops, sorted(ops)
    assert "Erf" not in ops, "the Gelu stayed as written"


def test_a_tanh_gelu_whose_constants_bfloat16_rounds_fuses_on_generated_feeds():
    """GPT-2's tanh GELU stores √(2/π) and 0.044715 in bfloat16 (0.796875, 0.044677…); the fused ``Gelu``
    computes with the exact ones. On float32 copies the graph outputs then differ by 1e-4 after two layers — an
    eightieth of a bfloat16 ulp — which rolled back a block at float32's tolerance (generated feeds: their
    mask-exercising sets). Graph outputs are held to the model's precision, each region's own output to
    float32's, where a fault is still seen: the GELU's output 1% large is rolled back."""
    entry = next(m for m in MODELS if m["name"] == "gpt2_sdpa_bf16")
    path = HALF / entry["file"]
    result = egfuse.fuse(path, target="onnx")
    report = result.report
    assert report.fused == entry["blocks"] and report.validated is True, str(report)
    gelus = [n for n in result.model.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == entry["blocks"] and all(r.status == "fused" for r in report.layer_ops), str(report)
    wrong = with_output_scaled(result.model, "Gelu", 0, 1.01)
    assert judge.judge(onnx.load(path), wrong, report, None, None).failing

"""float16 exports (torch's dynamo exporter at opset 18: a BERT, a Llama with grouped K/V heads and RoPE, and the
Llama's decode step over a KV cache, built by ``experiments/corpus.py --set half``): every attention block, norm,
GELU and rotation fuses and validates. Before, nothing did: the softmax and the norms that transformers computes
in float32 between casts were not read as themselves (``rules/precision.py``), GELU's √2 stored in float16 was
not √2 (``rules/gelu.py``), and validation rolled every attention block back because a query row whose every key
is masked has two correct half-precision values (``validate.fill_decided``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.targets import ort
from egfuse.testing import disagreements
from egfuse.validation import validate

from ..conftest import DATA, one_target_fast

HALF = DATA / "half"
MODELS = [
    m for m in json.loads((HALF / "manifest.json").read_text())["models"] if m["file"] and "float16" in m["flavour"]
]
"""The float16 exports (the bfloat16 ones beside them: tests/exports/test_bfloat16_exports.py)."""
CASES = one_target_fast([(m,) for m in MODELS], [m["file"] for m in MODELS])
"""Each export on one target in the fast suite (the targets alternating), on the other with ``-m slow``."""


def _feeds(entry: dict) -> dict[str, np.ndarray]:
    return dict(np.load(HALF / entry["file"].replace(".onnx", ".feeds.npz")))


def _unpadded(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same feeds with nothing padded: every row has a meaning to compare."""
    return {k: np.ones_like(v) if k == "attention_mask" else v for k, v in feeds.items()}


def test_the_half_corpus_is_float16():
    assert len(MODELS) == 4  # BERT, Llama, its decode step, MPT (scores upcast before a float32 ALiBi bias)
    for entry in MODELS:
        model = onnx.load(HALF / entry["file"], load_external_data=False)
        assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16, entry["file"]


@pytest.mark.parametrize(("target", "entry"), CASES)
def test_every_block_and_layer_op_fuses_and_validates(entry, target):
    path, feeds = HALF / entry["file"], _feeds(entry)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    report = result.report
    assert report.fused == entry["blocks"] == len(report.regions), str(report)
    assert report.validated is True, str(report)
    assert report.layer_ops and all(r.status == "fused" for r in report.layer_ops), str(report)
    rotations = 2 * entry["blocks"] if "rope" in entry["flavour"] else 0
    assert [r.status for r in report.rotary] == ["fused"] * rotations, str(report)
    ops = {n.op_type for n in result.model.graph.node}
    assert "Softmax" not in ops and "Erf" not in ops and "ReduceMean" not in ops, sorted(ops)
    original = onnx.load(path)
    # The judge every tool is held to (each mask set, float32 copies for what the masks mean) ...
    assert disagreements(original, result.model, feeds) == []
    # ... and, on rows that all mean something, within float16's rounding of the original.
    plain = _unpadded(feeds)
    expected, actual = validate.run(original, plain), validate.run(result.model, plain)
    for name, e in expected.items():
        scale = float(np.abs(e.astype(np.float64)).max())
        diff = float(np.abs(e.astype(np.float64) - actual[name].astype(np.float64)).max())
        assert diff <= 2e-2 * max(scale, 1.0), (name, diff, scale)


def test_the_npu_target_splits_the_float16_heads():
    entry = next(m for m in MODELS if m["name"] == "llama_sdpa_fp16")
    result = egfuse.fuse(HALF / entry["file"], target="npu", feeds=_feeds(entry))
    assert result.report.fused == entry["blocks"] and result.report.validated is True, str(result.report)
    assert disagreements(onnx.load(HALF / entry["file"]), result.model, _feeds(entry)) == []


def test_a_float32_mask_beside_float16_scores_goes_only_to_the_standard_op():
    """MPT upcasts its float16 scores to add a float32 ALiBi bias and select: onnxruntime's contrib ops take a
    bias of Q's type only (CUDA's costs chose MultiHeadAttention, the fused model did not load and validation
    rolled everything back), and rounding that mask to float16 would change it; the standard op's mask type is
    free. Priced for CUDA and made to fuse wherever it can, the ort target writes the standard op."""
    entry = next(m for m in MODELS if m["name"] == "mpt_eager_fp16")
    forced = replace(ort.CUDA_SPEC, keep_unfused=False)
    result = egfuse.fuse(onnx.load(HALF / entry["file"]), target=forced, feeds=_feeds(entry))
    assert result.report.fused == entry["blocks"] and result.report.validated is True, str(result.report)
    assert [r.fused_into for r in result.report.regions] == ["Attention"] * entry["blocks"], str(result.report)
    assert not [n for r in result.report.regions for n in r.notes if "did not validate" in n], str(result.report)

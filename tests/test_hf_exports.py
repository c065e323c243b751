"""Real exports of tiny random Hugging Face encoders (TorchScript and dynamo, eager and SDPA attention):
every self-attention block fuses for both targets and the fused model matches the original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse import validate

from .conftest import DATA, assert_same_outputs, fused_op_count

MANIFEST = json.loads((DATA / "manifest.json").read_text())
MODELS = [m for m in MANIFEST["models"] if m["file"]]


def _model_and_feeds(entry: dict) -> tuple[Path, dict[str, np.ndarray]]:
    """An export's path and the feeds it was exported with (saved beside it)."""
    path = DATA / entry["file"]
    return path, dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))


OTHER_SIZES = {"batch": 3, "sequence": 6, "past_sequence": 4, "total_sequence": 10, "encoder_sequence": 5}
"""A second, independent draw of input sizes (and padding) besides the export's own feeds."""


def test_only_exporter_limitations_fail_to_export():
    """An export that fails is a row with its reason: here only TorchScript's missing aten::diff (Whisper)."""
    failed = {f"{m['name']}.{m['exporter']}": m["error"] for m in MANIFEST["models"] if m["error"]}
    assert set(failed) <= {"whisper_sdpa.torchscript"}, failed
    assert all("aten::diff" in reason for reason in failed.values())
    assert len(MODELS) >= 27


ROPE_MODELS = ("llama", "gemma2")
CASES = [(m, t) for m in MODELS for t in ("ort", "onnx")]


@pytest.mark.parametrize(("entry", "target"), CASES, ids=[f"{t}-{m['file']}" for m, t in CASES])
def test_every_block_fuses_and_matches(entry, target):
    path, feeds = _model_and_feeds(entry)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    report = result.report
    assert report.fused == entry["blocks"] == len(report.regions), str(report)
    assert report.validated is True, str(report)
    assert fused_op_count(result.model, target) == entry["blocks"]
    # RoPE (on Q and K of every block) becomes RotaryEmbedding; models without RoPE have no rotate_half
    rotations = 2 * entry["blocks"] if entry["name"].startswith(ROPE_MODELS) else 0
    assert [r.status for r in report.rotary] == ["fused"] * rotations, str(report)
    assert sum(n.op_type == "RotaryEmbedding" for n in result.model.graph.node) == rotations
    onnx.checker.check_model(result.model, full_check=True)
    original = onnx.load(path)
    assert_same_outputs(original, result.model, feeds)
    # A second, independent draw of inputs (other batch/sequence sizes, other padding).
    assert_same_outputs(original, result.model, validate.make_feeds(original, seed=7, dims=OTHER_SIZES))


GQA = [m for m in MODELS if m["kv_heads"] < m["heads"]]


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("entry", GQA, ids=[m["file"] for m in GQA])
def test_gqa_fuses_with_native_kv_heads(entry, target):
    """The standard op takes K/V with their own (fewer) heads: the repeat_kv copy is gone. On `ort` too,
    which runs it faster than MultiHeadAttention on repeated heads."""
    path, feeds = _model_and_feeds(entry)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    attention = [n for n in result.model.graph.node if n.op_type == "Attention" and n.domain == ""]
    assert len(attention) == entry["blocks"]
    keys = [n.input[1] for n in attention]
    shapes = validate.run(result.model, feeds, keys)
    assert all(shapes[k].shape[1] == entry["kv_heads"] for k in keys), {k: shapes[k].shape for k in keys}
    assert_same_outputs(onnx.load(path), result.model, feeds)


# The cache Concat goes into the op (past_key/past_value in, present_key/present_value out): every fused op
# takes the K/V it would concatenate (grouped heads through the standard op, on both targets).
CACHED = [
    pytest.param(m, t, id=f"{t}-{m['file']}") for m in MODELS if "kv cache" in m["flavour"] for t in ("ort", "onnx")
]


@pytest.mark.parametrize(("entry", "target"), CACHED)
def test_kv_cache_concat_is_absorbed_and_present_outputs_kept(entry, target):
    path, feeds = _model_and_feeds(entry)
    original = onnx.load(path)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    producers = {out: node for node in result.model.graph.node for out in node.output}
    presents = [o.name for o in original.graph.output if o.name.startswith("present")]
    assert [o.name for o in result.model.graph.output] == [o.name for o in original.graph.output]
    fused = {"Attention", "MultiHeadAttention"}
    assert presents and all(producers[name].op_type in fused for name in presents), {
        n: producers[n].op_type for n in presents
    }
    # One cache per self-attention; cached cross-attention K/V (BART) are inputs, with no Concat to absorb.
    caches = [r.variants["kv cache"] for r in result.report.regions if "kv cache" in r.variants]
    assert len(caches) == len(presents) // 2 and all("absorbed" in c for c in caches), str(result.report)
    assert_same_outputs(original, result.model, feeds)
    assert_same_outputs(original, result.model, validate.make_feeds(original, seed=7, dims=OTHER_SIZES))

"""Real exports of tiny random Hugging Face encoders (TorchScript and dynamo, eager and SDPA attention):
every self-attention block fuses for both targets and the fused model matches the original.

Each export runs on both targets in the slow suite (``-m slow``, which CI runs); the fast suite runs the exports of
:data:`FAST` (every architecture and flavour, both exporters, eager and SDPA attention) each on one target, the
targets alternating. The tests of one export on one target share its fusion (``fused_export``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from egfuse.validation import validate

from ..conftest import DATA, assert_same_outputs, fused_export, fused_op_count

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


FAST = {
    "bert_eager.torchscript.onnx", "bert_sdpa.dynamo.onnx",
    "bart_encoder_eager.dynamo.onnx", "bart_encoder_sdpa.torchscript.onnx",
    "vit_eager.torchscript.onnx", "vit_sdpa.dynamo.onnx",
    "whisper_encoder_eager.dynamo.onnx", "whisper_encoder_sdpa.torchscript.onnx",
    "gpt2_sdpa.dynamo.onnx", "gpt2_past_sdpa.torchscript.onnx",
    "llama_eager.dynamo.onnx", "llama_sdpa.torchscript.onnx", "llama_past_eager.torchscript.onnx",
    "bart_sdpa.dynamo.onnx", "bart_past_sdpa.torchscript.onnx", "whisper_sdpa.dynamo.onnx",
    "t5_encoder_eager.dynamo.onnx", "deberta_v2_eager.torchscript.onnx", "gemma2_eager.dynamo.onnx",
}  # fmt: skip
"""The exports the fast suite runs: of an architecture exported four ways, its eager attention by one exporter
and its SDPA attention by the other; of one exported twice, one export (the exporters alternating); every
architecture and flavour is there."""
FAST_TARGET = {
    m["file"]: ("ort", "onnx")[(i + i // 2) % 2] for i, m in enumerate(m for m in MODELS if m["file"] in FAST)
}
"""Per fast export, the target it runs on in the fast suite (by turns: both targets meet both exporters); every
test of it does (sharing the fusion)."""


def _cases(entries: list[dict]) -> list:
    """Each of ``entries`` on both targets, fast only on its :data:`FAST_TARGET`."""
    return [
        pytest.param(t, m, marks=[] if FAST_TARGET.get(m["file"]) == t else [pytest.mark.slow], id=f"{t}-{m['file']}")
        for m in entries
        for t in ("ort", "onnx")
    ]


def _architecture(entry: dict) -> str:
    return entry["name"].removesuffix("_eager").removesuffix("_sdpa")


def test_the_fast_exports_cover_every_architecture_and_flavour():
    fast = [m for m in MODELS if m["file"] in FAST]
    assert len(fast) == len(FAST), FAST - {m["file"] for m in fast}
    assert {_architecture(m) for m in fast} == {_architecture(m) for m in MODELS}
    assert {f for m in fast for f in m["flavour"]} == {f for m in MODELS for f in m["flavour"]}
    assert {m["exporter"] for m in fast} == {m["exporter"] for m in MODELS}
    assert {(m["exporter"], FAST_TARGET[m["file"]]) for m in fast} == {
        (e, t) for e in ("torchscript", "dynamo") for t in ("ort", "onnx")
    }


ROPE_MODELS = ("llama", "gemma2")


@pytest.mark.parametrize(("target", "entry"), _cases(MODELS))
def test_every_block_fuses_and_matches(entry, target):
    path, feeds = _model_and_feeds(entry)
    result = fused_export(entry["file"], target)
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


@pytest.mark.parametrize(("target", "entry"), _cases(GQA))
def test_gqa_fuses_with_native_kv_heads(entry, target):
    """The standard op takes K/V with their own (fewer) heads: the repeat_kv copy is gone. On `ort` too,
    which runs it faster than MultiHeadAttention on repeated heads."""
    path, feeds = _model_and_feeds(entry)
    result = fused_export(entry["file"], target)
    attention = [n for n in result.model.graph.node if n.op_type == "Attention" and n.domain == ""]
    assert len(attention) == entry["blocks"]
    keys = [n.input[1] for n in attention]
    shapes = validate.run(result.model, feeds, keys)
    assert all(shapes[k].shape[1] == entry["kv_heads"] for k in keys), {k: shapes[k].shape for k in keys}
    assert_same_outputs(onnx.load(path), result.model, feeds)


# The cache Concat goes into the op (past_key/past_value in, present_key/present_value out): every fused op
# takes the K/V it would concatenate (grouped heads through the standard op, on both targets).
CACHED = _cases([m for m in MODELS if "kv cache" in m["flavour"]])


@pytest.mark.parametrize(("target", "entry"), CACHED)
def test_kv_cache_concat_is_absorbed_and_present_outputs_kept(entry, target):
    path, feeds = _model_and_feeds(entry)
    original = onnx.load(path)
    result = fused_export(entry["file"], target)
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

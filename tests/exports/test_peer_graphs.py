"""Graphs rebuilt from onnxruntime's own attention-fusion tests (``shared/peer-graphs/ort``). Each graph runs on
one target in the fast suite, the targets alternating, and on the other in the slow one (``-m slow``)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import egfuse

from ..conftest import PEER, assert_same_outputs, fused_op_count, one_target_fast

if not (PEER / "manifest.json").exists():  # the graphs live beside the repo, not in it
    pytest.skip(f"peer graphs not found at {PEER}", allow_module_level=True)

MANIFEST = {g["file"]: g for g in json.loads((PEER / "manifest.json").read_text())["graphs"]}

# What egfuse fuses today, and why the rest is not (yet) fused.
FUSES = [
    "bert_attention.onnx", "bert_attention_pruned.onnx", "bert_attention_pruned_reverse_add_order.onnx",
    "bert_attention_varied_qkv.onnx", "bart_sdpa_attention_with_mask.onnx", "bart_sdpa_attention_no_mask.onnx",
    "conformer_simple_bias.onnx", "conformer_no_add_kv.onnx", "conformer_qk_div_masking.onnx",
    "gpt2_attention_past.onnx", "gpt2_attention_past_reverse_add_order.onnx", "bert_tf2onnx_attention_3d.onnx",
]  # fmt: skip
NOT_FUSED = {
    "conformer_self_mha.onnx": "softmax is not over the last axis",  # axis=2 and cannot run: pattern-only graph
}


def feeds_for(entry: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, spec in entry["feeds_used"]["inputs"].items():
        shape, dtype = spec["shape"], np.dtype(spec["dtype"])
        if dtype == np.bool_:
            feeds[name] = np.broadcast_to(np.tril(np.ones(shape[-2:], bool)), shape).copy()  # causal
        elif "mask" in name:
            mask = np.ones(shape, dtype)
            mask[-1, -1] = 0
            feeds[name] = mask
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def randomized(path) -> onnx.ModelProto:
    """The upstream generators fill weights with constants; random weights make wrong fusions visible."""
    model = onnx.load(path)
    rng = np.random.default_rng(1)
    for init in model.graph.initializer:
        array = onnx.numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.size > 1:
            init.CopyFrom(onnx.numpy_helper.from_array(rng.standard_normal(array.shape).astype(np.float32), init.name))
    return model


@pytest.mark.parametrize(("target", "name"), one_target_fast([(n,) for n in FUSES], FUSES))
def test_fuses_and_matches(name, target):
    model = randomized(PEER / name)
    feeds = feeds_for(MANIFEST[name])
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_not_fused_says_why(name):
    result = egfuse.fuse(PEER / name, target="ort", validate=False)
    assert result.report.fused == 0
    assert NOT_FUSED[name] in result.report.regions[0].reason


# onnxruntime's own optimizer changes the outputs of these three graphs (manifest: rel diff 0.26, 0.34, 720):
# BART's net 1/d scale (√ on Q and on K) fused as 1/√d, its boolean mask dropped for a causal flag, and the
# conformer's two Where masks dropped. egfuse keeps their meaning.
ORT_GETS_WRONG = ["bart_sdpa_attention_no_mask.onnx", "bart_sdpa_attention_with_mask.onnx",
                  "conformer_qk_div_masking.onnx"]  # fmt: skip


@pytest.mark.parametrize(("target", "name"), one_target_fast([(n,) for n in ORT_GETS_WRONG], ORT_GETS_WRONG))
def test_graphs_ort_miscompiles_keep_their_meaning(name, target):
    model = randomized(PEER / name)
    feeds = feeds_for(MANIFEST[name], seed=3)
    if "mask_condition" in feeds:  # nothing masked here; test_fuses_and_matches has everything masked
        feeds["mask_condition"] = np.zeros(feeds["mask_condition"].shape, bool)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated, str(result.report)
    assert_same_outputs(model, result.model, feeds)
    for node in result.model.graph.node:
        if node.op_type in ("Attention", "MultiHeadAttention"):
            scale = next(a.f for a in node.attribute if a.name == "scale")
            if name.startswith("bart"):
                assert scale == pytest.approx(1 / 4, rel=1e-5)  # head dim 4: (1/√√4)² … net 1/d, not 1/√d

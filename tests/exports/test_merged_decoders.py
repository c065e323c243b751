"""optimum's merged decoders: every attention block inside the ``If`` on ``use_cache_branch`` (the decoder with
and without its KV cache) fused, each branch searched and proven as a model of its own, the whole model proven
on both sides of the condition; what cannot be searched apart, or does not agree whole, is returned unchanged
with the reason (``experiments/merged_decoders.py`` made the exports with optimum-onnx's ``merge_decoders``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import egfuse
from egfuse import branch_search

from ..conftest import DATA, assert_same_outputs

MERGED = DATA / "producers" / "optimum_merged"


def _feeds(path, use_cache: bool) -> dict[str, np.ndarray]:
    """The stored decode step, or (without the cache) the prompt it continues: five tokens, the same masks."""
    feeds = dict(np.load(str(path).replace(".onnx", ".feeds.npz")))
    if not use_cache:  # (Whisper's decoder takes no mask: the prompt's length is the cache's and the new token's)
        cached = next(v.shape for k, v in feeds.items() if k.startswith("past_key_values") and ".encoder." not in k)
        rng = np.random.default_rng(5)
        feeds["input_ids"] = rng.integers(0, 99, (cached[0], cached[2] + 1)).astype(np.int64)
    feeds["use_cache_branch"] = np.array([use_cache])
    return feeds


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("model", [f"{m}_{i}" for m in ("llama", "gpt2", "bart", "whisper", "t5")
                                   for i in ("sdpa", "eager")])  # fmt: skip
def test_both_branches_fuse_and_the_model_matches_on_both_sides(model, target):
    """Llama (grouped K/V heads, RoPE), GPT-2, and the decoders of BART, Whisper (no mask input at all) and T5
    (relative position bias, no scale): self- and cross-attention, 8 blocks."""
    path = MERGED / f"{model}.torchscript.onnx"
    blocks = 4 if model.startswith(("llama", "gpt2")) else 8
    result = egfuse.fuse(str(path), target=target)
    report = result.report
    assert report.fused == len(report.regions) == blocks and report.validated, str(report)
    branches = {r.notes[0] for r in report.regions}
    assert branches == {"in If 'optimum::if' then_branch", "in If 'optimum::if' else_branch"}, branches
    written = sum(n for op, n in report.fused_ops().items() if "Attention" in op)
    assert not report.unexamined and written == blocks, report.fused_ops()
    (node,) = result.model.graph.node
    assert node.op_type == "If" and not any(n.op_type == "Softmax" for a in node.attribute for n in a.g.node)
    for use_cache in (True, False):
        assert_same_outputs(onnx.load(path), result.model, _feeds(path, use_cache))


def test_branches_put_back_wrong_are_caught_whole(monkeypatch):
    """Each branch is proven alone; what proves them together is the whole model on both sides of the condition.
    A put-back that swaps the branches passes every branch's own validation and must fail that."""
    put_back = branch_search._put_back
    other = {"then_branch": "else_branch", "else_branch": "then_branch"}
    monkeypatch.setattr(branch_search, "_put_back", lambda merged, i, name, fused, proto: put_back(
        merged, i, other[name], fused, proto))  # fmt: skip
    path = MERGED / "llama_sdpa.torchscript.onnx"
    result = egfuse.fuse(str(path), target="onnx")
    report = result.report
    assert report.fused == 0 and report.validated is None, str(report)
    assert "with its branches fused" in report.validation_note, report.validation_note
    assert all(r.status == "rolled back" for r in report.regions)
    assert result.model.SerializeToString() == onnx.load(path).SerializeToString()


def test_a_branch_reading_a_computed_value_is_not_searched():
    """A branch that reads what the graph computed before the If has no inputs feeds could be made for: it is
    left as written, the report says why, and its softmaxes are listed as unexamined."""
    path = MERGED / "llama_sdpa.torchscript.onnx"
    model = onnx.load(path)
    model.graph.node.insert(0, onnx.helper.make_node("Identity", ["input_ids"], ["ids_seen"]))
    for attr in model.graph.node[1].attribute:
        for node in attr.g.node:
            node.input[:] = ["ids_seen" if name == "input_ids" else name for name in node.input]
    result = egfuse.fuse(model, target="ort")
    report = result.report
    assert report.fused == 0 and not result.report.changed
    assert any("not searched (it reads values computed before the If: ids_seen)" in n for n in report.notes)
    assert len(report.unexamined) == 4, report.unexamined
    assert_same_outputs(model, result.model, _feeds(path, True))

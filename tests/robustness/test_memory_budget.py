"""Validation keeps to a memory budget: what a run would hold is estimated before it runs, and a model over
the budget is reported as not validated — nothing applied, the report naming the largest value — instead of
running out of memory."""

from __future__ import annotations

import onnx

import egfuse
from egfuse.search import Budgets
from egfuse.testing import Variant, attention_model, feeds_for
from egfuse.validation import memory

MIB = 1 << 20


def _static(model: onnx.ModelProto, seq: int) -> onnx.ModelProto:
    """``model`` with its symbolic sequence length fixed at ``seq`` (a model exported with a huge static length)."""
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "seq":
                dim.ClearField("dim_param")
                dim.dim_value = seq
    return model


def test_the_estimate_counts_the_score_tensors():
    model = _static(attention_model(Variant(heads=2)), 1024)
    found = memory.estimate(model, feeds_for(model))
    assert found.bytes >= 2 * 2 * 1024 * 1024 * 4  # (B, N, S, S) float32 scores
    assert "[2, 2, 1024, 1024]" in found.largest


def test_a_model_over_the_budget_is_not_validated_and_left_unchanged():
    model = _static(attention_model(Variant(heads=2)), 1024)
    result = egfuse.fuse(model, budgets=Budgets(validation_bytes=16 * MIB))
    assert result.report.validated is None and result.report.fused == 0
    note = result.report.validation_note
    assert "over the validation memory budget of 16.0 MiB" in note and "[2, 2, 1024, 1024]" in note
    assert result.model is model or result.model == model


def test_user_feeds_over_the_budget_are_refused_too():
    model = attention_model(Variant(heads=2))
    feeds = feeds_for(model, seq=1024)
    result = egfuse.fuse(model, feeds=feeds, budgets=Budgets(validation_bytes=16 * MIB))
    assert result.report.validated is None and "memory budget" in result.report.validation_note


def test_the_default_budget_validates_ordinary_models():
    model = attention_model(Variant(heads=2))
    assert egfuse.fuse(model).report.validated is True
    assert memory.DEFAULT_BUDGET_BYTES == 4 << 30


def test_the_estimate_counts_the_score_tensors_of_an_old_opset_export():
    """A TorchScript export at opset 13 spells its reshapes' shapes with ``Unsqueeze`` taking its axes as an input,
    which onnx's data propagation does not run through: the estimate counted no score tensor (0 MiB for a GPT-2
    run at 512 tokens, 101 MiB at opset 14). The shapes are read off a copy at a newer opset now."""
    import numpy as np

    from ..conftest import DATA

    model = onnx.load(DATA / "old_opsets" / "gpt2_eager.torchscript-opset13.onnx")
    feeds = {"input_ids": np.zeros((2, 512), np.int64), "attention_mask": np.ones((2, 512), np.int64)}
    found = memory.estimate(model, feeds)
    heads = 4
    assert found.bytes >= 2 * heads * 512 * 512 * 4, memory.size_text(found.bytes)  # one layer's scores at least
    assert "512, 512" in found.largest

"""Query-dependent additive biases (issue 14, spelling 6): relative-position terms computed from Q —
``(Q + u)·Kᵀ + shift((Q + v)·Rᵀ)`` as Transformer-XL/XLNet/Funnel/Conformer write them — and a gate computed
from Q scaling a position bias (WavLM). The fused op computes softmax(scale·(Q + u)·Kᵀ + B)·V with B emitted
outside it from the same Q projection; each fuses on both targets with the original's numerics."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir import passes

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import fast_on, fuse_one_block, fused_op_count, one_target_fast, op_counts
from ..rules.test_layout import _assert_matches

BASE = Variant()
SPELLINGS = [
    {"query_bias": "relative"},
    {"query_bias": "relative", "einsum": True, "k_layout": "transpose_0231"},  # XLNet: bind,bjnd->bnij
    {"query_bias": "relative", "einsum": True, "scale": "q_mul", "mask": "padding_int"},  # Funnel: Q·s + u
    {"query_bias": "relative", "scale": "qk_mul", "mask": "where_finfo", "causal": "trilu"},
    {"query_bias": "relative", "mask": "additive_before_scale", "commuted": True},
    {"query_bias": "relative", "kv_heads": 1, "k_layout": "transpose_0132", "rope": True},
    {"query_bias": "relative", "cross": True, "scale": "split_sqrt", "dtype": "float16"},
    {"query_bias": "gated"},
    {"query_bias": "gated", "mask": "padding_int", "position_bias": True, "einsum": True},
    {"query_bias": "gated", "past": True, "causal": "range_greater", "k_layout": "dynamo_3d"},
]


def _id(spelling: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spelling.items())


@pytest.mark.parametrize(
    ("target", "spelling"), one_target_fast([(s,) for s in SPELLINGS], [_id(s) for s in SPELLINGS])
)
def test_query_dependent_bias_fuses(spelling, target):
    variant = BASE.replaced(**spelling)
    assert variant.query_bias == spelling["query_bias"]  # not dropped as incompatible
    model = attention_model(variant)
    feeds = feeds_for(model)
    result = fuse_one_block(model, target, feeds)
    counts = op_counts(result.model)
    assert "Softmax" not in counts, counts
    # The bias's own ops stay, computed from the query projection outside the fused op.
    assert counts.get("Pad" if variant.query_bias == "relative" else "Sigmoid") == 1, counts
    for check in (feeds, feeds_for(model, seed=5, batch=3, seq=4)):
        _assert_matches(model, result.model, check)


@pytest.mark.parametrize("target", fast_on("ort"))
def test_a_subtracted_mask_after_the_summed_terms_is_additive(target):
    """XLNet/Funnel: ``(AC + BD)·s − 1e30·mask`` — the subtraction applies to the whole sum, not to AC."""
    model = attention_model(BASE.replaced(query_bias="relative", mask="none"))
    graph = model.graph
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    graph.input.append(helper.make_tensor_value_info("pad", TensorProto.FLOAT, ["batch", 1, 1, "seq"]))
    graph.initializer.append(numpy_helper.from_array(np.array(1e30, np.float32), "big"))
    graph.node.extend([
        helper.make_node("Mul", ["pad", "big"], ["scaled_pad"], name="n_scaled_pad"),
        helper.make_node("Sub", [softmax.input[0], "scaled_pad"], ["masked"], name="n_masked"),
    ])  # fmt: skip
    softmax.input[0] = "masked"
    model = onnx_sorted(model)
    feeds = feeds_for(model)
    feeds["pad"] = np.zeros_like(feeds["pad"])
    feeds["pad"][-1, ..., -1] = 1.0
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    _assert_matches(model, result.model, feeds)


def onnx_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its nodes in topological order (the test appended the mask's nodes at the end)."""
    m = ir.serde.deserialize_model(model)
    passes.common.TopologicalSortPass()(m)
    return ir.serde.serialize_model(m)

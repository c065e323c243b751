"""A factor per head on the scores (SwinV2's learned logit scale, shape (N, 1, 1)) is a factor of Q:
``c·(Q·Kᵀ) = (c·Q)·Kᵀ`` when c is 1 along the rows and columns of the scores (``rules/scale.py``). A factor that
varies along the keys is no factor of Q and must stay as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for

from ..conftest import fused_op_count, one_target_fast

PER_HEAD = [
    Variant(scale="per_head"),
    Variant(scale="per_head", heads=4, kv_heads=2, k_layout="transpose_0132", causal="trilu"),
    Variant(scale="per_head", commuted=True, mask="where_finfo", dtype="float16"),
    Variant(scale="per_head", einsum=True, softcap="div"),
]


@pytest.mark.parametrize(
    ("target", "variant"),
    one_target_fast([(v,) for v in PER_HEAD], [f"{v.mask}-{v.dtype}-{v.heads}h" for v in PER_HEAD]),
)
def test_a_per_head_factor_fuses_onto_q(variant: Variant, target: str):
    model = attention_model(variant)
    feeds = feeds_for(model, seed=variant.seed)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert not disagreements(model, result.model, feeds)


def _with_factor(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The model with its (N, 1, 1) head factor replaced by one of ``shape`` (positive, varying)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    (init,) = [i for i in out.graph.initializer if "head_scale" in i.name]
    factor = np.random.default_rng(1).uniform(0.2, 0.6, shape).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(factor, init.name))
    return out


def test_a_factor_that_varies_along_the_keys_is_not_moved_onto_q():
    base = Variant(scale="per_head", symbolic=False, heads=2)
    model = _with_factor(attention_model(base), (2, 1, 5))  # (N, 1, T): one factor per key
    feeds = feeds_for(model, seed=0)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)
    control = _with_factor(attention_model(base), (2, 1, 1))  # the same graph with a per-head factor fuses
    assert egfuse.fuse(control, target="onnx", feeds=feeds_for(control, seed=0)).report.fused == 1

"""A select mask's finite fill is written with the factor that makes it absorb the scores on the KV-cache path
too. The cache path read the mask (to check it does not depend on the present outputs) before its fills were
given their factor, so the standard ``Attention`` got ``Where(¬m, −1e9, 0)`` as the graph wrote it: a batch
row whose every key is masked is uniform in the graph but not in the op once scores pass ±32, and validation's
large-scores feeds rolled every such block back (``where_reversed`` masks with a cache, 9 of the onnx target's
misses in the variant space)."""

from __future__ import annotations

import pytest

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_a_cached_block_with_a_finite_select_fill_fuses_and_keeps_fully_masked_rows_uniform(kv_heads):
    variant = Variant(
        scale="qk_div", k_layout="transpose_0132", heads=4, head_dim=16, mask="where_reversed", past=True,
        kv_heads=kv_heads, seed=5,
    )  # fmt: skip
    model = attention_model(variant)
    feeds = feeds_for(model, seed=12, batch=3, seq=6, left_padding=True)

    unchecked = egfuse.fuse(model, target="onnx", validate=False).model
    assert any(n.op_type == "Attention" for n in unchecked.graph.node)
    assert disagreements(model, unchecked, feeds) == []  # the writer itself is right, not only the rollback

    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused == 1, [r.reason for r in result.report.regions]
    assert disagreements(model, result.model, feeds) == []

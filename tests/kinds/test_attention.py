"""A region that is not fused is kept exactly as the graph spells it, so a fused form has to beat *that*, not
the cheapest rewrite of the region's own ops. BLOOM's first layer (TorchScript, 2023-12 and 2024-06) builds the
ALiBi bias as ``alibi · 1`` before the scores: with ``x · 1 = x`` the rewrite without the product was priced
under SingleHeadAttention on the npu target (609 vs 646 µs) and the block was left unfused, although the ops
actually kept cost 849 µs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.report import WRITTEN_NOTE

from ..conftest import DATA, assert_same_outputs


@pytest.mark.parametrize("stack", ["2023-12", "2024-06"])
def test_a_block_cheaper_than_its_ops_as_written_is_fused(stack):
    path = DATA / "drift" / stack / "bloom_eager.torchscript.onnx"
    feeds = dict(np.load(path.with_name("bloom_eager.torchscript.feeds.npz")))
    result = egfuse.fuse(path, target="npu", feeds=feeds)
    assert [r.status for r in result.report.regions] == ["fused", "fused"]
    assert any(note.startswith(WRITTEN_NOTE) for note in result.report.regions[0].notes)
    assert result.report.fused == 2 and all(r.fused_into == "SingleHeadAttention" for r in result.report.regions)
    assert_same_outputs(onnx.load(path), result.model, feeds)

"""The ``npu`` target's single-head form of a float16 block computes its softmax in float32, as the graph's
``Cast → Softmax → Cast`` does, over a mask written in float32 (``MaskWriter.wide_value``). In float16 the
mask's ``finfo.min`` fill added to a score below −16 overflows to −inf and a fill does not absorb the scores,
so a query row whose every key is masked (left padding under a causal mask: the base feeds have them) was
spread by its scores where the graph's select makes it uniform: validation rolled back every such block
(float16 with a select mask and a causal mask, 30 of the npu target's 45 misses in a 289-spelling check)."""

from __future__ import annotations

import onnx
import pytest

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for

from ..conftest import DATA


@pytest.mark.parametrize(
    ("mask", "causal"),
    [("where_finfo", "none"), ("where_finfo", "trilu"), ("where_finfo", "range_greater"), ("additive", "trilu"),
     ("additive", "range_greater"), ("where_reversed", "trilu")],
)  # fmt: skip
def test_a_float16_block_fuses_into_single_heads_with_a_float32_softmax(mask, causal):
    variant = Variant(
        scale="qk_div", k_layout="transpose_0132", heads=4, head_dim=16, dtype="float16", mask=mask, causal=causal,
        seed=5,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="npu")
    assert result.report.fused == 1, [r.reason for r in result.report.regions]
    graph = result.model.graph
    softmaxes = [n for n in graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == variant.heads
    for softmax in softmaxes:  # each head's probabilities come back to float16 from a float32 softmax
        readers = [n for n in graph.node if softmax.output[0] in n.input]
        assert [(n.op_type, n.attribute[0].i) for n in readers] == [("Cast", onnx.TensorProto.FLOAT16)]
    for seed in range(3):  # the judge's own feeds, with their padded and fully masked rows
        feeds = feeds_for(model, seed=seed, batch=3, seq=6, left_padding=True)
        assert disagreements(model, result.model, feeds) == [], seed


def test_a_bfloat16_scale_split_over_q_and_k_is_applied_in_float32():
    """transformers' SDPA decomposition scales Q and K by √s each in the model's type; the single heads scale
    the scores by s once. Written as a bfloat16 constant s was rounded again (8-bit mantissa: 2⁻⁹ off the
    product of the graph's two constants), and validation on float32 copies rolled every block of a bfloat16
    decode step back (0.00036 off). In float32, after the scores' cast, s is the graph's own product."""
    path = DATA / "half" / "llama_past_sdpa_bf16.dynamo.onnx"
    result = egfuse.fuse(str(path), target="npu")
    assert result.report.fused == 2 and result.report.validated is True, str(result.report)
    graph = result.model.graph
    constants = {o: n for n in graph.node if n.op_type == "Constant" for o in n.output}
    written = [n for n in graph.node if n.op_type == "Mul" and n.name.startswith("egfuse/r")]
    scales = [constants[n.input[1]].attribute[0].t for n in written if n.input[1] in constants]
    assert scales and all(t.data_type == onnx.TensorProto.FLOAT and not t.dims for t in scales)

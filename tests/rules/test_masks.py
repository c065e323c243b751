"""Mask spellings of older exports (issue 14): a causal ``Where`` over a sliced boolean buffer followed by an
additive padding mask (GPT-2/GPT-Neo eager of transformers 4.36–4.42, GPT-Neo still today), with left padding
so that some query rows are masked entirely — the rows where an inexact respelling of the mask shows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import Phase, assume, given, settings

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for, variants
from egfuse.validation import validate

from ..conftest import assert_same_outputs, fast_on, fused_op_count, one_target_fast

LOWEST = np.finfo(np.float32).min


def _fuse_checked(model: onnx.ModelProto, target: str, feeds: dict) -> egfuse.FuseResult:
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=3, batch=3, seq=4, left_padding=True))
    assert_same_outputs(model, result.model, feeds_for(model, seed=4, batch=1, seq=6))
    return result


_BUFFERS_AND_SCALES = [(s, c) for s in ("qk_div", "none") for c in ("buffer_where", "buffer_local")]


@pytest.mark.parametrize(
    ("target", "scale", "causal"), one_target_fast(_BUFFERS_AND_SCALES, [f"{s}-{c}" for s, c in _BUFFERS_AND_SCALES])
)
def test_causal_buffer_select_then_padding_fuses_with_left_padding(causal, scale, target):
    """GPT-2 (scaled) and GPT-Neo (scale 1, sliding-window layers): ``Where(bias[:, :, T-S:T, :T], S, finfo.min)
    + (1 − m)·finfo.min``. In a left-padded row the keys the causal fill masks and the padded keys the row may
    see both sit at finfo.min (tied); the fused op must keep that tie."""
    model = attention_model(Variant(mask="padding_int", causal=causal, scale=scale))
    _fuse_checked(model, target, feeds_for(model, left_padding=True))


_MASKS = ["additive", "where_finfo", "where_reversed", "none"]


@pytest.mark.parametrize(("target", "mask"), one_target_fast([(m,) for m in _MASKS], _MASKS))
def test_causal_buffer_with_every_mask(mask, target):
    model = attention_model(Variant(mask=mask, causal="buffer_where", symbolic=False))
    _fuse_checked(model, target, feeds_for(model, left_padding=True))


@pytest.mark.parametrize("target", fast_on("ort"))
def test_causal_buffer_with_a_cache(target):
    """The buffer sliced at rows T-S:T (past positions P = T - S): the op takes the cache as past_key/value."""
    model = attention_model(Variant(mask="padding_int", causal="buffer_where", past=True, k_layout="transpose_0132"))
    feeds = feeds_for(model, left_padding=True)
    _fuse_checked(model, target, feeds)


def _fill_constants(model: onnx.ModelProto) -> list[float]:
    arrays = [(n.attribute[0].t.name, onnx.numpy_helper.to_array(n.attribute[0].t)) for n in model.graph.node
              if n.op_type == "Constant"]  # fmt: skip
    return [float(a) for name, a in arrays if "fill" in name and a.size == 1]


def test_a_select_fill_summed_with_a_padding_term_is_written_exactly(target):
    """The fill of a select mask summed with another term is the graph's finfo.min: moved one ulp up alone it
    would be above the padding term's finfo.min entries. The standard op (onnx) then gets the whole mask with
    finfo.min moved up (Equal → Where), so its kernel does not read those entries as −inf."""
    model = attention_model(Variant(mask="padding_int", causal="buffer_where"))
    result = egfuse.fuse(model, target=target, feeds=feeds_for(model, left_padding=True))
    assert result.report.fused == 1, str(result.report)
    assert float(LOWEST) in _fill_constants(result.model)
    ops = [n.op_type for n in result.model.graph.node]
    assert ("Equal" in ops) == (result.report.regions[0].fused_into == "Attention"), str(result.report)


def test_a_select_fill_alone_is_still_moved_for_the_standard_op():
    """Alone in the mask, every masked entry of a row moves with the fill: the constant is respelled once
    instead of a mask-wide Equal → Where at run time."""
    model = attention_model(Variant(mask="where_finfo"))
    result = egfuse.fuse(model, target="onnx", feeds=feeds_for(model, left_padding=True))
    assert result.report.fused == 1, str(result.report)
    assert float(np.nextafter(LOWEST, np.float32(0))) in _fill_constants(result.model)
    assert "Equal" not in [n.op_type for n in result.model.graph.node]


@settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(variants())
def test_drawn_spellings_keep_left_padded_rows(variant):
    """Every drawn spelling, fed a left-padded batch (fully masked query rows under a causal mask). Masks that
    fill with −inf are left out: the graph gives such a row NaN, the standard op 0 (rolled back by design); so
    are float16 models fed the −10000 additive mask of ``feeds_for`` (S − 10000 is not −10000, nor a multiple
    of 8 the graph rounds to, so a row that sees only such keys is softmax(S) in the graph's rounding: validation
    rolls those regions back), and those filling with −1e4 (``where_reversed``), which fuse only where the
    scores keep clear of the fill (``egfuse.validation.fill_reach``: unscaled scores over many features reach it)."""
    assume(variant.mask != "where_neginf" and variant.causal != "trilu")
    assume(
        not (variant.dtype == "float16" and (variant.mask.startswith("additive") or variant.mask == "where_reversed"))
    )
    # float16 with a padding term (1 − m)·finfo.min under a causal select's finfo.min fill (a buffer's, or
    # Range/Greater's): S + finfo.min overflows to −inf for S below −16 (float16's ulp there is 32), so which
    # keys of a fully masked row the graph keeps depends on each score's rounding — no fused form reproduces
    # it; validation rolls it back.
    selects_finfo_min = variant.causal.startswith("buffer") or variant.causal == "range_greater"
    assume(not (variant.dtype == "float16" and variant.mask == "padding_int" and selects_finfo_min))
    model = attention_model(variant)
    feeds = feeds_for(model, seed=variant.seed, left_padding=True)
    for target in ("ort", "onnx"):
        result = egfuse.fuse(model, target=target, feeds=feeds)
        assert result.report.fused == 1, f"{variant}\n{result.report}"
        for name, comparison in validate.compare_models(model, result.model, feeds).items():
            assert comparison.ok, f"{name} differs by {comparison.max_abs_diff}: {variant}"


_BIASES_AND_SCALES = [(b, s) for b in ("rel_pos_uv", "gated") for s in ("qk_div", "q_mul", "none")]


@pytest.mark.parametrize(
    ("target", "query_bias", "scale"), one_target_fast(_BIASES_AND_SCALES, [f"{b}-{s}" for b, s in _BIASES_AND_SCALES])
)
def test_query_dependent_biases_fuse(query_bias, scale, target):
    """Transformer-XL/Conformer's ``(Q + u)·Kᵀ + (Q + v)·Rᵀ`` — attention on the query Q + u, the position
    term an additive bias computed outside the op — and a gate computed from Q scaling a position bias."""
    model = attention_model(Variant(query_bias=query_bias, scale=scale, k_layout="transpose_0132"))
    _fuse_checked(model, target, feeds_for(model, left_padding=True))


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_query_dependent_bias_with_a_causal_buffer_and_padding(target):
    model = attention_model(Variant(query_bias="gated", mask="padding_int", causal="buffer_where"))
    _fuse_checked(model, target, feeds_for(model, left_padding=True))


@pytest.mark.parametrize("target", fast_on("ort"))
def test_qdq_pairs_on_the_projections_stay_outside_the_fused_op(target):
    """QuantizeLinear → DequantizeLinear on Q, K and V: the fused op reads the dequantized values, exactly as
    the graph's MatMuls did."""
    model = attention_model(Variant(qdq="inputs", mask="padding_int", causal="buffer_where"))
    result = _fuse_checked(model, target, feeds_for(model, left_padding=True))
    assert sum(n.op_type == "QuantizeLinear" for n in result.model.graph.node) == 3


def test_quantized_probabilities_keep_the_block_unfused_and_say_why(target):
    """``quantize_static``'s QDQ format rounds the probabilities to int8 before ·V: no fused op does that, so the
    block is left as it is and the report says why."""
    model = attention_model(Variant(qdq="probs"))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    (region,) = result.report.regions
    assert region.status == "not fused" and "quantized" in region.reason, str(result.report)
    assert_same_outputs(model, result.model, feeds, atol=0.0)


@pytest.mark.parametrize(("target", "heads"), one_target_fast([(1,), (2,)], ["1", "2"]))
def test_causal_buffer_over_batched_3d_matmuls_with_static_sizes(heads, target):
    """The buffer sliced by static sizes is a constant this evaluation computes: its shape is the array's,
    not the unknowns ONNX shape inference invents for it (which hid the heads axis of the scores)."""
    model = attention_model(
        Variant(mask="padding_int", causal="buffer_where", matmul="batched_3d", heads=heads, symbolic=False)
    )
    _fuse_checked(model, target, feeds_for(model, left_padding=True))

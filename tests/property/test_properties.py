"""Properties over randomly drawn spellings of attention (``egfuse.testing.variants()``).

Algebra, not enumeration: every combination of scale placement, K layout, mask, causal mask, guard, operand
order, projection bias, heads (MHA/GQA/MQA), head size, cross-attention, KV cache, RoPE, position bias,
precision, old dynamo's batched-MatMul decomposition, tf2onnx's Einsum lowering, eval-mode Dropout and text dims
must fuse into exactly one attention op and keep the original's numerics — also inside nested model-local
functions."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import egfuse
from egfuse.testing import SOFTCAP, Variant, attention_model, disagreements, feeds_for, in_functions, variants
from egfuse.validation import validate

from ..conftest import fused_op_count, topologically_sorted


def _assert_matches(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict) -> None:
    """Validation's criterion: 1e-4 (+1e-3 relative) in float32; in float16, no further from a float32
    evaluation of the original than twice the original's own rounding error."""
    for name, comparison in validate.compare_models(original, fused, feeds).items():
        assert comparison.ok, f"{name} differs by {comparison.max_abs_diff}"


def _check_fuses(variant: Variant, target: str) -> None:
    model = attention_model(variant)
    feeds = feeds_for(model, seed=variant.seed)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, f"{variant}\n{result.report}"
    if variant.softcap != "none":
        (cap,) = [a.f for n in result.model.graph.node for a in n.attribute if a.name == "softcap"]
        assert np.isclose(cap, SOFTCAP), cap
    assert fused_op_count(result.model, target) == 1
    if variant.n_kv != variant.heads:  # grouped K/V heads go in natively, unrepeated (standard op on both)
        assert _key_heads(result.model, feeds) == variant.n_kv, variant
    _check_rotations(variant, result)
    if variant.past and not variant.split_score:  # the cache Concat goes in the op (split scores never read
        # it: the graph's own Concat stays for the present outputs it returns)
        producers = {out: node.op_type for node in result.model.graph.node for out in node.output}
        assert {producers["present_key"], producers["present_value"]} <= {"Attention", "MultiHeadAttention"}
    _assert_matches(model, result.model, feeds)
    _assert_matches(model, result.model, feeds_for(model, seed=variant.seed + 1, batch=3, seq=4))


def _check_rotations(variant: Variant, result: egfuse.FuseResult) -> None:
    """RoPE on Q and K becomes two RotaryEmbedding ops exactly when the tables provably have the op's
    structure: interleaved tables always do (the graph repeats each entry itself); rotate-half tables must be
    cos/sin of ``Concat(θ, θ)`` or a stored table with equal halves cut to the sequence (``buffer``: rows cut
    keep the halves) — tables fed as inputs (halves unknown) keep the rotation as it was."""
    fusable = variant.rope and (variant.rope_interleaved or variant.rope_tables in ("positions", "buffer"))
    written = sum(n.op_type == "RotaryEmbedding" for n in result.model.graph.node)
    assert written == (2 if fusable else 0), f"{variant}\n{result.report}"
    assert len(result.report.rotary) == (2 if variant.rope else 0)
    assert all((r.status == "fused") == fusable for r in result.report.rotary), str(result.report)


def _key_heads(model: onnx.ModelProto, feeds: dict) -> int:
    attention = next(n for n in model.graph.node if n.op_type == "Attention" and n.domain == "")
    key = validate.run(model, feeds, [attention.input[1]])[attention.input[1]]
    attrs = {a.name: a.i for a in attention.attribute}
    return key.shape[1] if key.ndim == 4 else attrs["kv_num_heads"]


@given(variants())
def test_every_spelling_fuses_for_ort(variant):
    _check_fuses(variant, "ort")


@given(variants())
def test_every_spelling_fuses_for_onnx(variant):
    _check_fuses(variant, "onnx")


@given(variants(), st.integers(1, 3), st.sampled_from(["ort", "onnx"]))
def test_every_spelling_fuses_inside_model_local_functions(variant, depth, target):
    """torch 2.1–2.4's dynamo exporter writes modules as nested model-local functions: inlined, every spelling
    fuses as it does in a flat graph."""
    model = in_functions(attention_model(variant), depth=depth)
    feeds = feeds_for(model, seed=variant.seed)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, f"{variant}\n{result.report}"
    assert fused_op_count(result.model, target) == 1
    _assert_matches(model, result.model, feeds)


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_fusing_a_fused_model_changes_nothing(variant, target):
    once = egfuse.fuse(attention_model(variant), target=target, validate=False)
    twice = egfuse.fuse(once.model, target=target, validate=False)
    assert twice.report.fused == 0
    assert twice.model.SerializeToString() == once.model.SerializeToString()


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_same_input_gives_byte_identical_output(variant, target):
    model = attention_model(variant)
    first = egfuse.fuse(model, target=target, validate=False).model.SerializeToString()
    second = egfuse.fuse(model, target=target, validate=False).model.SerializeToString()
    assert first == second


@given(variants())
def test_fused_scale_is_the_product_of_the_graphs_factors(variant):
    result = egfuse.fuse(attention_model(variant), target="onnx", validate=False)
    (scale,) = [a.f for n in result.model.graph.node for a in n.attribute if a.name == "scale"]
    expected = {"custom": 0.3, "none": 1.0}.get(variant.scale, 1 / np.sqrt(variant.head_dim))
    if variant.query_bias == "rel_pos_uv" and variant.scale in ("q_mul", "split_sqrt"):
        expected = 1.0 if variant.scale == "q_mul" else 1 / np.sqrt(np.sqrt(variant.head_dim))  # query Q·s + u
    assert np.isclose(scale, expected, rtol=1e-5 if variant.dtype == "float32" else 2e-3)  # float16 constants


# --- near misses: never fused wrongly ----------------------------------------------------------------------


def _near_miss(model: onnx.ModelProto, target: str, variant: Variant) -> egfuse.FuseResult:
    """Whatever egfuse does with a near miss, the outputs must still match the original."""
    feeds = feeds_for(model, seed=variant.seed, batch=1 if variant.heads == 1 else 2)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    _assert_matches(model, result.model, feeds)
    return result


def _node(model: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op)


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_softmax_over_another_axis_is_not_fused(variant, target):
    model = attention_model(variant)
    softmax = _node(model, "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(helper.make_attribute("axis", 1))  # not the last axis of 3D or 4D scores
    assert _near_miss(model, target, variant).report.fused == 0


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_a_scale_that_differs_per_head_keeps_the_meaning(variant, target):
    """A (1, N, 1, 1) factor on the logits the softmax reads: a factor of Q where nothing was added to the scores
    before it (SwinV2's logit scale, ``rules/scale.py``); after a mask or bias it scales that too, which no rule
    moves. Fused or not, the outputs are the original's."""
    variant = variant.replaced(heads=max(variant.heads, 2), scale="qk_mul", heads_layout="split")  # (1, N, 1, 1)
    model = attention_model(variant)
    softmax = _node(model, "Softmax")
    factors = np.linspace(0.5, 1.5, variant.heads, dtype=np.float32).reshape(1, variant.heads, 1, 1)
    model.graph.initializer.append(onnx.numpy_helper.from_array(factors, "per_head"))
    model.graph.node.append(helper.make_node("Mul", [softmax.input[0], "per_head"], ["per_head_scaled"]))
    softmax.input[0] = "per_head_scaled"
    model = topologically_sorted(model)
    result = _near_miss(model, target, variant)
    assert fused_op_count(result.model, target) == result.report.fused <= 1


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_a_mask_multiplied_instead_of_added_is_not_fused(variant, target):
    variant = variant.replaced(mask="additive")
    model = attention_model(variant)
    add = next(n for n in model.graph.node if n.op_type == "Add" and "mask" in n.input)
    add.op_type = "Mul"
    assert _near_miss(model, target, variant).report.fused == 0


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_probabilities_used_elsewhere_stay_exact(variant, target):
    model = attention_model(variant)
    probs = _node(model, "Softmax").output[0]
    model.graph.output.append(onnx.ValueInfoProto(name=probs))
    result = _near_miss(model, target, variant)
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_value_of_the_wrong_rank_is_not_fused(variant, target):
    # runs only for batch 1; the plain MatMul is the one whose V operand this test rewires
    variant = variant.replaced(heads=1, kv_heads=None, guard=False, symbolic=True, past=False, matmul="plain")
    variant = variant.replaced(heads_layout="split", einsum=False)  # V behind its head Transpose
    model = attention_model(variant)
    pv = [n for n in model.graph.node if n.op_type == "MatMul"][-1]
    transpose = next(n for n in model.graph.node if n.output[0] == pv.input[1])
    reshape = next(n for n in model.graph.node if n.output[0] == transpose.input[0])
    pv.input[1] = reshape.input[0]  # (B, S, H): broadcasting, not attention
    assert _near_miss(model, target, variant).report.fused == 0


@given(variants())
def test_every_spelling_fuses_for_npu(variant):
    """The npu target writes every drawn spelling as single-head attention: one Softmax a head, no fused op,
    matching the original on two input draws."""
    model = attention_model(variant)
    feeds = feeds_for(model, seed=variant.seed)
    result = egfuse.fuse(model, target="npu", feeds=feeds)
    rank3 = variant.heads_layout == "single" or (variant.heads_layout == "batch_folded" and variant.heads == 1)
    if rank3:  # rank-3 single-head attention already: may be kept, and the report says why
        assert result.report.fused == 1 or "predicted cheaper" in result.report.regions[0].reason, str(result.report)
        return
    assert result.report.fused == 1, f"{variant}\n{result.report}"
    ops = [n.op_type for n in result.model.graph.node]
    # One Softmax a head; heads folded into the batch (B·N, S, H) may stay one rank-3 attention over B·N rows.
    allowed = {variant.heads, 1} if variant.heads_layout == "batch_folded" else {variant.heads}
    assert _softmaxes_read_for_values(result.model) in allowed, f"{variant}\n{result.report}"
    assert not [op for op in ops if "Attention" in op], ops
    _assert_matches(model, result.model, feeds)
    _assert_matches(model, result.model, feeds_for(model, seed=variant.seed + 1, batch=3, seq=4))


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_single_head_attention_fuses_back(variant, target):
    """The npu target's single-head output of any drawn spelling, taken as the input: its heads (and a
    per-head split-score cache) join back into exactly one fused op that computes what the original did.
    Not a float16 block with a mask: its single heads add the mask in float32 (``writers.single_head``, so a
    fully masked row stays what the graph makes it), a spelling no rule reads back into a float16 fused op;
    there the single-head output itself is checked."""
    variant = variant.replaced(heads_layout="split", heads=max(variant.heads, 2), kv_heads=variant.kv_heads)
    model = attention_model(variant)
    feeds = feeds_for(model, seed=variant.seed)
    single_head = egfuse.fuse(model, target="npu", feeds=feeds)
    assert single_head.report.fused == 1, f"{variant}\n{single_head.report}"
    if _mask_added_in_float32(single_head.model):
        _assert_matches(model, single_head.model, feeds)
        return
    result = egfuse.fuse(single_head.model, target=target, feeds=feeds)
    assert result.report.fused == 1, f"{variant}\n{result.report}"
    assert fused_op_count(result.model, target) == 1, f"{variant}\n{result.report}"
    assert "Softmax" not in [n.op_type for n in result.model.graph.node]  # nor kept for a Shape read of it
    _assert_matches(model, result.model, feeds)
    _assert_matches(model, result.model, feeds_for(model, seed=variant.seed + 1, batch=3, seq=4))


def _mask_added_in_float32(model: onnx.ModelProto) -> bool:
    """A float16 block's single heads: scores cast to float32, then a mask added."""
    made_by = {out: node for node in model.graph.node for out in node.output}
    return any(
        node.op_type == "Add"
        and any(
            (c := made_by.get(i)) is not None and c.op_type == "Cast" and c.attribute[0].i == onnx.TensorProto.FLOAT
            for i in node.input
        )
        for node in model.graph.node
    )


def _softmaxes_read_for_values(model: onnx.ModelProto) -> int:
    """Softmax nodes whose output reaches something beyond a shape. (A known gap: old dynamo's batched 3D
    MatMuls with one head can leave the original softmax — and its NaN guard — read by a ``Shape`` only, for
    the reshape back.)"""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}

    def read_for_values(name: str, depth: int = 0) -> bool:
        if name in outputs or depth > 8:
            return True
        for reader in readers.get(name, []):
            if reader.op_type in ("IsNaN", "Where", "Cast", "Identity", "Dropout"):  # guard, pass-through: follow
                if any(read_for_values(out, depth + 1) for out in reader.output):
                    return True
            elif reader.op_type != "Shape":
                return True
        return False

    return sum(n.op_type == "Softmax" and read_for_values(n.output[0]) for n in model.graph.node)


@given(variants(), st.sampled_from(["ort", "onnx"]))
def test_validated_means_correct_on_fresh_mask_feeds(variant, target):
    """No false pass: what egfuse's own validation (generated feeds, masks exercised) keeps fused matches the
    original on feeds it never saw — another batch and length, and each of their mask-exercising sets (heavy
    padding on both sides, random masks, a batch row masked entirely, a float mask written additively),
    judged as validation judges (``egfuse.testing.disagreements``): NaN where the original defines nothing;
    against a wider evaluation where rounding decides; in half precision, finite values (a row whose every key
    a finite fill hides is the fill's rounding: left padding under a causal mask makes them in these feeds)
    and float32 copies of both models agreeing."""
    model = attention_model(variant)
    result = egfuse.fuse(model, target=target)
    if result.report.validated is not True:
        return  # rolled back or not validated: nothing was claimed
    fresh = feeds_for(model, seed=variant.seed + 7, batch=3, seq=6, left_padding=True)
    problems = disagreements(model, result.model, fresh)
    assert not problems, f"{variant} / {target}: {problems}"

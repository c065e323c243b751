"""Validation must catch injected faults: every fault kind of ``experiments/validation_mutations.py`` on a few
block spellings and both fused targets is caught by egfuse's own judge (generated feeds, masks exercised)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for
from egfuse.validation import judge, validate

from ..conftest import one_target_fast

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "validation_mutations.py"
_spec = importlib.util.spec_from_file_location("validation_mutations", _PATH)
mutations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutations)

BASES = ["encoder, padding", "int padding mask", "gqa, causal", "kv cache", "rope"]


@pytest.mark.parametrize(("target", "base"), one_target_fast([(b,) for b in BASES], BASES))
def test_every_injected_fault_is_caught(base: str, target: str):
    """Each base on one target in the fast suite (the targets alternating), on the other with ``-m slow``."""
    original = attention_model(mutations.BASES[base])
    result = egfuse.fuse(original, target=target)
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    tried = 0
    for kind, fault in mutations.FAULTS.items():
        if kind == "fully masked rows changed" and (
            mutations.BASES[base].causal == "none" or mutations.BASES[base].past
        ):
            continue  # seen only where a causal mask and left padding hide every key of a query (no cache before)
        outcome = mutations.trial(original, result, fault)
        if outcome is None:
            continue
        tried += 1
        assert outcome["caught"], f"{kind} not caught on {base} / {target}"
    assert tried >= 15


def test_masks_are_exercised_beyond_one_padded_position():
    """The feeds that exercise masks pad half the keys of a row on either side, draw random masks and mask one
    batch row entirely; a float mask also gets the additive convention (0 and finfo.min)."""
    model = attention_model(Variant(heads=2))
    base = validate.make_feeds(model)
    sets = validate.mask_feed_sets(base)
    assert set(sets) == {"heavy padding", "random masks", "additive padding", "a row fully masked", "large scores"}
    whole = sets["a row fully masked"]["mask"]
    large = sets["large scores"]  # the most masked keys, every other float input four times larger
    assert np.array_equal(large["mask"], whole)
    assert all(np.array_equal(large[n], 4 * base[n]) for n in base if n != "mask" and base[n].dtype.kind == "f")
    assert (whole[0] == np.finfo(np.float32).min).all() and (whole[1:] == 0).any()
    heavy = sets["heavy padding"]["mask"]
    assert (heavy[0, ..., : heavy.shape[-1] // 2] == 0).all() and (heavy[-1, ..., -(heavy.shape[-1] // 2) :] == 0).all()
    assert np.isin(sets["additive padding"]["mask"], [0.0, np.finfo(np.float32).min]).all()
    assert all((m[..., 0] == 1).all() for m in (sets["random masks"]["mask"],))  # every row keeps a key


def _finite_fill_model(pool: bool) -> onnx.ModelProto:
    """Funnel's spelling: an int mask turned into a −1e6 fill, ``(1 − mask)·(−1e6)`` added to the scores. A
    row whose keys are all masked has scores rounded to the fill's ulp (1/16): the original's answer there is
    itself off the exact one, by another amount where the fused op adds the position bias to the fill
    first (rounding twice). ``pool``: an AveragePool after the attention (no float64 kernel in onnxruntime)."""
    rng = np.random.default_rng(3)
    f = onnx.TensorProto.FLOAT
    weights = {f"w{n}": rng.standard_normal((16, 16)).astype(np.float32) for n in "qkv"}
    inits = [onnx.numpy_helper.from_array(w, n) for n, w in weights.items()]
    inits += [
        onnx.numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
        onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        onnx.numpy_helper.from_array(np.array(-1e6, np.float32), "fill"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "position_bias"),
    ]
    make = onnx.helper.make_node
    nodes = [
        make("MatMul", ["x", "wq"], ["q"]),
        make("MatMul", ["x", "wk"], ["k"]),
        make("MatMul", ["x", "wv"], ["v"]),
        make("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        make("MatMul", ["q", "kt"], ["qk"]),
        make("Mul", ["qk", "scale"], ["scores"]),
        make("Cast", ["attention_mask"], ["mask_f"], to=f),
        make("Sub", ["one", "mask_f"], ["hidden"]),
        make("Mul", ["hidden", "fill"], ["bias2"]),
        make("Unsqueeze", ["bias2", "axis1"], ["bias"]),
        make("Add", ["scores", "position_bias"], ["biased"]),
        make("Add", ["biased", "bias"], ["masked"]),
        make("Softmax", ["masked"], ["probs"], axis=-1),
        make("MatMul", ["probs", "v"], ["attn" if pool else "y"]),
    ]
    if pool:
        nodes.append(make("AveragePool", ["attn"], ["y"], kernel_shape=[1]))
    graph = onnx.helper.make_graph(
        nodes,
        "finite_fill",
        [
            onnx.helper.make_tensor_value_info("x", f, [2, 8, 16]),
            onnx.helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, [2, 8]),
        ],
        [onnx.helper.make_tensor_value_info("y", f, [2, 8, 16])],
        inits,
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize("pool", [False, True], ids=["plain", "with an op lacking float64 kernels"])
def test_a_finite_fill_over_a_whole_row_is_judged_against_float64(pool: bool):
    """The fused op rounds the absorbed scores differently from the original (differences of 0.02 and more on
    the fully masked row): it is judged by its distance from a float64 run, which must be no more than twice
    the original's own — instead of rolling back a correct fusion, as it did (funnel, every export)."""
    model = _finite_fill_model(pool)
    result = egfuse.fuse(model, target="ort")
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    feeds = validate.mask_feed_sets(validate.make_feeds(model))["a row fully masked"]
    assert (feeds["attention_mask"][0] == 0).all()
    expected, actual = validate.run(model, feeds), validate.run(result.model, feeds)
    wide = validate.references(model, feeds, expected, ["y"], float32_too=True)
    assert wide["y"].dtype == np.float64
    assert validate.compare("y", expected["y"], actual["y"], wide["y"], finite_only=True).ok
    broken = actual["y"].copy()
    broken[0] = 0.0  # the fully masked row zeroed: no longer as close to float64 as the original
    assert not validate.compare("y", expected["y"], broken, wide["y"], finite_only=True).ok


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_half_precision_row_masked_entirely_must_keep_its_meaning(target: str):
    """In float16 the row a mask hides entirely is the fill's rounding, so there validation asks only for finite
    values — and judges float32 copies of both models too, where the row is the mean of V: a fused model that
    gives 0 there (its mask made −inf, as some kernels treat a fully masked row) is caught."""
    original = attention_model(mutations.BASES["float16"])
    result = egfuse.fuse(original, target=target)
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    outcome = mutations.trial(original, result, mutations.FAULTS["fully masked rows changed"])
    assert outcome is not None and outcome["caught"], outcome


def _half_rows() -> tuple[np.ndarray, np.ndarray]:
    """Two query rows of a float16 output and their float32 evaluation: row 0 is the rounding of scores
    against a finite fill (the original 0.9 off its float32 evaluation), row 1 an ordinary row (within an ulp)."""
    reference = np.array([[[0.1, 0.5, -0.3, 0.2], [0.25, -0.5, 0.75, 0.125]]])
    expected = reference.copy()
    expected[0, 0] += 0.9
    return expected.astype(np.float16), reference.astype(np.float32)


def test_a_half_precision_row_rounded_against_a_fill_need_only_be_finite():
    """A row where the float16 original is its fill's rounding (0.9 off its float32 evaluation) is no answer
    a fused kernel is bound to reproduce: a fused row 0.95 from the original there passes, in any feed set —
    not only the one built to mask a whole row (the thorough property run's false alarm: left padding under a
    causal mask made such rows in fresh feeds). A non-finite value there is still caught."""
    expected, reference = _half_rows()
    actual = expected.copy()
    actual[0, 0] -= np.float16(0.95)
    assert validate.compare("y", expected, actual, reference).ok
    actual[0, 0, 1] = np.inf
    assert not validate.compare("y", expected, actual, reference).ok


def test_a_fault_in_one_row_does_not_hide_behind_another_rows_rounding():
    """Rows are judged one by one: the original's 0.9 of rounding in row 0 allowed (as one maximum over the
    output) up to 1.8 of error anywhere — a fault of 0.5 in the ordinary row 1 passed."""
    expected, reference = _half_rows()
    actual = expected.copy()
    actual[0, 1] += np.float16(0.5)
    assert not validate.compare("y", expected, actual, reference).ok
    assert validate.compare("y", expected, expected, reference).ok


def test_a_float32_row_outside_the_tolerance_is_excused_only_by_the_fills_rounding():
    """The float64 rescue (a finite fill hiding a whole row in float32) excuses errors up to four times the
    fill's rounding, in any row (how lucky the original was in one row is noise), and nothing larger."""
    reference = np.array([[0.1, 0.5, -0.3, 0.2], [0.25, -0.5, 0.75, 0.125]])
    expected = reference.astype(np.float32)
    expected[0] += np.float32(0.01)  # row 0: the original rounded against the fill
    actual = expected.copy()
    actual[0] += np.float32(0.015)  # within 4× the original's own distance there
    actual[1] += np.float32(0.02)  # row 1: the original is exact there; within 4× the fill's rounding
    assert validate.compare("y", expected, actual, reference).ok
    actual[1, 0] += np.float32(0.1)  # a fault: far beyond the fill's rounding
    assert not validate.compare("y", expected, actual, reference).ok
    exact = reference.astype(np.float32)
    wrong = exact.copy()
    wrong[1, 0] += np.float32(0.01)  # no row rounded against a fill: 0.01 off is not excused
    assert not validate.compare("y", exact, wrong, reference).ok


def test_a_float64_reference_runs_quantize_dequantize_in_float32():
    """QuantizeLinear/DequantizeLinear take no double (their schema, not only a missing kernel): the float64
    reference computes them in float32 and the rest wide, instead of giving no reference at all — without
    one, a row a −1e4 fill hides (rounded to its ulp) could only be judged by the fixed tolerance."""
    model = attention_model(Variant(qdq="inputs", mask="additive", causal="trilu", k_layout="transpose_0132"))
    feeds = feeds_for(model, seed=8, batch=3, seq=6, left_padding=True)
    expected = validate.run(model, feeds)
    wide = validate.references(model, feeds, expected, list(expected), float32_too=True)
    assert wide and all(value.dtype == np.float64 for value in wide.values())
    assert np.allclose(wide["y"], expected["y"], atol=1e-2)


def test_float32_copies_keep_half_precision_fills_at_the_ends_of_the_range():
    """Judging a float16 model's masks on float32 copies must not change what its fills mean: finfo(float16).min
    absorbs every score in float16, −65504 in float32 does not (and OPT's clamp at it then changes the row),
    so fills move to float32's ends, one ulp up staying one ulp up; ordinary values such as −1e4 are widened
    as they are, and a reference (``fills`` off) widens every value literally."""
    half = np.finfo(np.float16)
    values = np.array([half.min, np.nextafter(half.min, np.float16(0)), -1e4, 0.0, half.max], dtype=np.float16)
    kept = validate.upcast_feeds({"mask": values}, fills=True)["mask"]
    top = np.finfo(np.float32).max
    assert kept[0] == -top and kept[1] == np.nextafter(-top, np.float32(0)) and kept[4] == top
    assert kept[2] == np.float32(-1e4) and kept[3] == 0.0
    assert validate.upcast_feeds({"mask": values})["mask"][0] == np.float32(half.min)


def test_a_lucky_original_does_not_hide_the_fills_ulp():
    """In a row a −1e4 fill hides, each score is rounded to the fill's ulp (2⁻¹⁰ in float32): the original
    happened to land 1e-4 from the float64 answer, a correct fused op 8e-4 — eight times the original's own
    error, within four ulps of the fill. Knowing the fill, the row is excused up to that; a fault (0.5) is
    not, nor is any error in a row the original computes exactly, and without a fill nothing changes."""
    reference = np.array([[0.1, 0.5, -0.3, 0.2], [0.25, -0.5, 0.75, 0.125]])
    expected = reference.astype(np.float32)
    expected[0] += np.float32(1e-4)  # row 0: rounded against the fill, by luck only 1e-4 off
    actual = expected.copy()
    actual[0, 0] += np.float32(8e-4)
    assert not validate.compare("y", expected, actual, reference).ok
    assert validate.compare("y", expected, actual, reference, fill=1e4).ok
    assert not validate.compare("y", expected, actual, reference, fill=1.0).ok  # 1.0 rounds nothing away
    faulty = expected.copy()
    faulty[0, 0] += np.float32(0.5)
    assert not validate.compare("y", expected, faulty, reference, fill=1e4).ok
    ordinary = expected.copy()
    ordinary[1, 0] += np.float32(8e-4)
    assert not validate.compare("y", expected, ordinary, reference, fill=1e4).ok
    zeroed = expected.copy()
    zeroed[0] = 0.0  # a kernel's 0 for the graph's answer, however large the fill: its ulp is capped
    assert not validate.compare("y", expected, zeroed, reference, fill=float(np.finfo(np.float32).max)).ok


def test_the_largest_fill_is_read_from_feeds_and_small_constants():
    """The fill is whatever finite magnitude the mask brings: a feed's −1e4 or a constant's finfo.min."""
    model = attention_model(Variant(mask="where_finfo"))
    feeds = feeds_for(model, seed=1)
    assert validate.largest_fill(model, feeds) == pytest.approx(float(np.finfo(np.float32).max))
    additive = attention_model(Variant(mask="additive"))
    fill = validate.largest_fill(additive, {**feeds_for(additive, seed=1), "mask": np.full((1, 1), -1e4, "float32")})
    assert fill == pytest.approx(1e4)


def test_a_float16_position_bias_block_under_a_causal_fill_is_not_a_false_alarm():
    """The thorough property run's counterexample: float16, a position bias, static dims, a causal Trilu and a
    −1e4 additive mask; on fresh left-padded feeds the float32 copies differed by 0.00094 (the fill's ulp) in a
    row the original had rounded against the fill luckily. Judged with the fill's ulp, it agrees."""
    variant = Variant(
        scale="q_mul", k_layout="transpose_0132", mask="additive", proj_bias=False, heads=1, head_dim=64,
        symbolic=False, causal="trilu", dtype="float16", position_bias=True, seed=0,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="ort")
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    fresh = feeds_for(model, seed=7, batch=3, seq=6, left_padding=True)
    assert not disagreements(model, result.model, fresh)


def test_float32_copies_of_a_half_model_are_held_to_half_precision():
    """The float32 copies judge what a float16 model's masks mean, not float32 kernels' own approximations:
    onnxruntime's soft-capped Attention is 1.2e-4 off a float64 evaluation in float32 (the thorough property
    run's counterexample, below), within float16's tolerance; a changed meaning is not."""
    reference = np.array([[0.01, 0.5, -0.3, 0.2], [0.25, -0.5, 0.75, 0.125]])
    expected = reference.astype(np.float32)
    approximate = expected + np.float32(1.2e-4)
    assert not validate.compare("y", expected, approximate, reference).ok
    assert validate.compare("y", expected, approximate, reference, copy_of_half=True).ok
    zeroed = expected.copy()
    zeroed[0] = 0.0
    assert not validate.compare("y", expected, zeroed, reference, copy_of_half=True).ok


def test_a_float16_soft_capped_block_is_not_a_false_alarm_on_its_float32_copies():
    variant = Variant(
        scale="runtime", k_layout="transpose_0132", mask="additive", heads=4, head_dim=32, symbolic=False,
        dtype="float16", softcap="div", proj_bias=False, seed=711,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="ort")
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    assert not disagreements(model, result.model, feeds_for(model, seed=718, batch=3, seq=6, left_padding=True))


def _large_scores(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A batch row with every key masked, the other float inputs four times larger (scores 16×)."""
    whole = validate.mask_feed_sets(validate.make_feeds(model))["a row fully masked"]
    return {n: v * 4 if n != "mask" and v.dtype.kind == "f" else v for n, v in whole.items()}


def test_a_finite_select_fill_is_written_so_it_absorbs_the_scores(monkeypatch):
    """The variant space's false pass: ``Where(¬m, −1e9, S + b)`` under a causal Trilu and OPT's clamp, fused as
    ``S + Where(¬m, −1e9, b)``. A query row whose every key is masked is uniform in the graph (the select
    replaced its scores); the fused op gave the softmax of ``S − 1e9`` rounded to float32's ulp there (64) —
    the same only while |S| < 32, which standard-normal feeds rarely make, so it validated. The fill is now
    written times a power of two (≥ 1e30 in magnitude, absorbing any score): the fused op computes what the
    graph did on scores of any size. Without that, the large-scores feeds catch the difference."""
    from egfuse.validation import inputs
    from egfuse.writing import raise_masks

    variant = Variant(
        heads=4, head_dim=8, kv_heads=1, mask="where_reversed", causal="trilu", clamp=True, scale="none",
        position_bias=True, einsum=True, heads_layout="batch_folded", k_layout="dynamo_3d", seed=32644,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="ort")
    assert result.report.fused == 1 and result.report.validated
    nodes = result.model.graph.node
    scalars = [onnx.numpy_helper.to_array(a.t) for n in nodes for a in n.attribute if a.name == "value"]
    assert any(s.size == 1 and -3e38 < float(s.ravel()[0]) <= -1e30 for s in scalars)  # −1e9·2^70, written
    assert not disagreements(model, result.model, _large_scores(model))

    monkeypatch.setattr(raise_masks, "absorbing_scale", lambda fills, terms: None)  # the fill as the graph wrote it
    region = egfuse.fuse(model, target="ort").report.regions[0]
    assert region.status == "rolled back" and "large scores" in (region.reason or ""), region.reason
    monkeypatch.setattr(inputs, "LARGE_SCALE", 1.0)  # and the feeds as they were: it validated, yet differs
    unscaled = egfuse.fuse(model, target="ort")
    assert unscaled.report.fused == 1
    assert disagreements(model, unscaled.model, _large_scores(model))


def test_absorbing_scale_keeps_how_fills_compare():
    """One power of two for every finite fill of a mask: −1e4 and −1e9 keep their order and ratio; finfo.min
    and −inf are left as they are (they already absorb); a fill above −1e4 is not a mask."""
    from egfuse.writing.raise_masks import absorbing_scale, mask_fill

    scale = absorbing_scale([-1e9, 0.0, float(np.finfo(np.float32).min)], 3)
    assert scale is not None and scale == 2.0**70
    big = mask_fill(-1e9, np.dtype(np.float32), scale)
    assert big <= -1e30 and np.float32(big) + np.float32(1e6) == np.float32(big)  # absorbs a score of 1e6
    two = absorbing_scale([-1e4, -1e9], 2)
    assert mask_fill(-1e4, np.dtype(np.float32), two) > mask_fill(-1e9, np.dtype(np.float32), two)
    assert absorbing_scale([-1.0], 1) is None and absorbing_scale([float("-inf")], 1) is None
    assert mask_fill(-1e4, np.dtype(np.float16), 2.0**87) == -1e4  # float16 holds no absorbing fill


def _cast_fill_model() -> onnx.ModelProto:
    """Doge's float16 spelling: a causal and padding mask whose fill is a float32 constant (−65504, torch's
    ``finfo(float16).min`` written as float32) ``CastLike``'d to the scores. onnxruntime's CPU adds the mask in
    float32 (it has no float16 Add), so a row whose every key is hidden is the scores' softmax there; its
    standard ``Attention`` adds in float16, where the fill absorbs the scores (the mean of V)."""
    make, half = onnx.helper.make_node, onnx.TensorProto.FLOAT16
    rng = np.random.default_rng(3)
    batch, seq, heads, dim = 2, 6, 2, 8
    weights = [onnx.numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float16), f"w{n}")
               for n in "qkv"]  # fmt: skip
    consts = [
        onnx.numpy_helper.from_array(np.array([batch, seq, heads, dim], np.int64), "split_shape"),
        onnx.numpy_helper.from_array(np.array([batch, seq, heads * dim], np.int64), "merged_shape"),
        onnx.numpy_helper.from_array(np.array(dim**-0.5, np.float16), "scale"),
        onnx.numpy_helper.from_array(np.array(-65504.0, np.float32), "fill32"),
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero32"),
        onnx.numpy_helper.from_array(np.tril(np.ones((seq, seq), bool)), "causal"),
        onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "axes12"),
    ]
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [make("MatMul", ["x", f"w{name}"], [f"{name}_proj"]),
                  make("Reshape", [f"{name}_proj", "split_shape"], [f"{name}_split"]),
                  make("Transpose", [f"{name}_split"], [name], perm=perm)]  # fmt: skip
    nodes += [
        make("MatMul", ["q", "k"], ["qk"]),
        make("Mul", ["qk", "scale"], ["scores"]),
        make("Cast", ["attention_mask"], ["padding"], to=onnx.TensorProto.BOOL),
        make("Unsqueeze", ["padding", "axes12"], ["padding4"]),
        make("And", ["padding4", "causal"], ["keep"]),
        make("CastLike", ["fill32", "scores"], ["fill"]),
        make("CastLike", ["zero32", "scores"], ["zero"]),
        make("Where", ["keep", "zero", "fill"], ["mask"]),
        make("Add", ["scores", "mask"], ["masked"]),
        make("Softmax", ["masked"], ["probs"], axis=-1),
        make("MatMul", ["probs", "v"], ["context"]),
        make("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        make("Reshape", ["context_t", "merged_shape"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "cast_fill",
        [onnx.helper.make_tensor_value_info("x", half, [batch, seq, 16]),
         onnx.helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, [batch, seq])],
        [onnx.helper.make_tensor_value_info("y", half, [batch, seq, 16])],
        [*weights, *consts],
    )  # fmt: skip
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_a_float32_fill_cast_to_half_precision_is_a_fill(target: str):
    """The fill is the half type's end however it is written: a row it hides entirely is decided by rounding
    (finite only, judged on float32 copies where both fills absorb), so the standard op, which adds the mask in
    float16, is not rolled back (it was: 0.1 off on Doge's float16 export) — and a fused model that changes
    what such a row means, or drops the mask, is still caught."""
    original = _cast_fill_model()
    result = egfuse.fuse(original, target=target)
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    assert {n.op_type for n in result.model.graph.node} >= {"Attention"}
    feeds = feeds_for(original, seed=5, left_padding=True)
    assert not disagreements(original, result.model, feeds)
    for fault in ("fully masked rows changed", "mask dropped", "padding side flipped"):
        outcome = mutations.trial(original, result, mutations.FAULTS[fault])
        assert outcome is not None and outcome["caught"], (fault, outcome)


def _with_scatter_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its output passed through a ScatterND that adds (row 0 added to itself): onnxruntime's CPU
    has no float16 kernel for it and refuses the model when it runs (JetMoE's float16 export: its experts)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, make = out.graph, onnx.helper.make_node
    name = graph.output[0].name
    graph.initializer.extend([
        onnx.numpy_helper.from_array(np.array([[0]], np.int64), "row0"),
        onnx.numpy_helper.from_array(np.array([0], np.int64), "start0"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "end1"),
    ])  # fmt: skip
    for node in graph.node:
        node.output[:] = [f"{o}_inner" if o == name else o for o in node.output]
    graph.node.extend([
        make("Slice", [f"{name}_inner", "start0", "end1", "start0"], ["first_row"]),
        make("ScatterND", [f"{name}_inner", "row0", "first_row"], [name], reduction="add"),
    ])  # fmt: skip
    return out


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_a_float16_model_the_cpu_cannot_run_is_validated_on_float32_copies(target: str):
    """A float16 model with an op onnxruntime's CPU has no float16 kernel for is judged on float32 copies, as a
    bfloat16 one is (it was left unvalidated: "the original does not run on generated inputs"); a fault is
    still caught there."""
    original = _with_scatter_add(attention_model(Variant(heads=2, dtype="float16", symbolic=False)))
    with pytest.raises(Exception, match="data type is not supported"):
        validate.run(original, feeds_for(original, seed=1))
    result = egfuse.fuse(original, target=target)
    report = result.report
    assert report.validated is True and report.fused == 1, str(report)
    assert judge.FLOAT32_COPIES_NOTE in report.notes, report.notes
    feeds = validate.upcast_feeds(feeds_for(original, seed=4, left_padding=True), fills=True)
    wide = [validate.upcast(m, fills=True) for m in (original, result.model)]
    assert not disagreements(*wide, feeds)
    for fault in ("mask dropped", "scale doubled", "K and V swapped"):
        outcome = mutations.trial(original, result, mutations.FAULTS[fault])
        assert outcome is not None and outcome["caught"], (fault, outcome)


def test_float32_copies_widen_sequences_of_half_tensors():
    """A value typed as a sequence of float16 tensors (JetMoE's SplitToSequence) is a sequence of float32 ones in
    the copy; left as it was, onnxruntime refuses the copy (a type error) and the model goes unvalidated."""
    make, half = onnx.helper.make_node, onnx.TensorProto.FLOAT16
    graph = onnx.helper.make_graph(
        [make("SplitToSequence", ["x"], ["parts"], axis=0, keepdims=1),
         make("ConcatFromSequence", ["parts"], ["y"], axis=0)],
        "sequences",
        [onnx.helper.make_tensor_value_info("x", half, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", half, [2, 3])],
        value_info=[onnx.helper.make_tensor_sequence_value_info("parts", half, [1, 3])],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    wide = validate.upcast(model, fills=True)
    assert wide.graph.value_info[0].type.sequence_type.elem_type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(validate.run(wide, {"x": x})["y"], x)

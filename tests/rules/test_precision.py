"""Half precision as the algebra and the judge see it: a norm computed in float32 between casts is the norm, a
√2 stored in float16 is √2 to float16's rounding (and no further), and a row whose value the fill's rounding
decides is asked to be finite while every other row is judged for closeness."""

from __future__ import annotations

import math

import numpy as np
import pytest
from egfuse.rules import gelu, norms, precision
from egglog import f64, i64, set_, unstable_combine_rulesets

import egfuse
from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of, rank_of, scalar_of
from egfuse.testing import Variant, attention_model, disagreements, feeds_for
from egfuse.validation import validate

from ..conftest import one_target_fast
from ..rules.test_rules import proves, saturated

FLOAT, FLOAT16 = 1, 10
x, g, eps_value, two, one, half, c = (Tensor.value(i) for i in range(7))
NORM_FACTS = [
    set_(scalar_of(two)).to(f64(2.0)),
    set_(scalar_of(eps_value)).to(f64(1e-6)),
    set_(rank_of(g)).to(i64(1)),
]
NORMS = unstable_combine_rulesets(norms.rules, precision.rules)


def _rms_in_float32(value: Tensor, back_to: int) -> Tensor:
    wide = Tensor.cast(value, FLOAT)
    root = Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.pow(wide, two)), eps_value))
    return Tensor.cast(Tensor.div(wide, root), back_to)


def test_an_rms_norm_computed_in_float32_is_the_rms_norm():
    term = _rms_in_float32(x, FLOAT16)
    egraph = saturated(NORMS, term, set_(dtype_of(x)).to(i64(FLOAT16)), *NORM_FACTS)
    assert proves(egraph, term, Tensor.rms_normalized(x, 1e-6))


def test_a_layer_norm_computed_in_float32_is_the_layer_norm():
    wide = Tensor.cast(x, FLOAT)
    centred = Tensor.sub(wide, Tensor.reduce_mean(wide))
    root = Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.pow(centred, two)), eps_value))
    term = Tensor.cast(Tensor.div(centred, root), FLOAT16)
    egraph = saturated(NORMS, term, set_(dtype_of(x)).to(i64(FLOAT16)), *NORM_FACTS)
    assert proves(egraph, term, Tensor.normalized(x, 1e-6))


def test_a_norm_cast_to_another_type_than_its_input_is_not_the_norm():
    """A float32 input normalized and cast to float16 changes the output's type: not the norm of the input."""
    term = _rms_in_float32(x, FLOAT16)
    egraph = saturated(NORMS, term, set_(dtype_of(x)).to(i64(FLOAT)), *NORM_FACTS)
    assert not proves(egraph, term, Tensor.rms_normalized(x, 1e-6))


def _upcast_then_biased(scores: Tensor, bias: Tensor, back_to: int) -> Tensor:
    """MPT in half precision: ``softmax(S.float() + alibi)`` narrowed back."""
    return Tensor.cast(Tensor.softmax(Tensor.add(Tensor.cast(scores, FLOAT), bias)), back_to)


@pytest.mark.parametrize("half", [FLOAT16, 16])
def test_scores_upcast_before_a_float32_bias_are_the_softmax_of_their_sum(half):
    term = _upcast_then_biased(x, c, half)
    facts = [set_(dtype_of(x)).to(i64(half)), set_(dtype_of(c)).to(i64(FLOAT))]
    assert proves(saturated(precision.rules, term, *facts), term, Tensor.softmax(Tensor.add(x, c)))


@pytest.mark.parametrize(
    ("scores_type", "bias_type", "back_to"),
    [(FLOAT, FLOAT, FLOAT16), (FLOAT16, FLOAT16, FLOAT16), (FLOAT16, FLOAT, FLOAT)],
    ids=["float32-scores", "half-bias", "kept-float32"],
)
def test_an_upcast_sum_is_not_read_past_its_types(scores_type, bias_type, back_to):
    """Near misses: float32 scores narrowed at the end change the output's type; a half bias beside upcast
    scores is no float32 sum the op would take; probabilities kept in float32 are not the scores' type."""
    term = _upcast_then_biased(x, c, back_to)
    facts = [set_(dtype_of(x)).to(i64(scores_type)), set_(dtype_of(c)).to(i64(bias_type))]
    assert not proves(saturated(precision.rules, term, *facts), term, Tensor.softmax(Tensor.add(x, c)))


def _gelu_term() -> Tensor:
    return Tensor.mul(Tensor.mul(x, Tensor.add(Tensor.erf(Tensor.div(x, c)), one)), half)


def _gelu_proved(stored: float, dtype: int) -> bool:
    facts = [
        set_(scalar_of(c)).to(f64(stored)),
        set_(dtype_of(c)).to(i64(dtype)),
        set_(scalar_of(one)).to(f64(1.0)),
        set_(scalar_of(half)).to(f64(0.5)),
    ]
    term = _gelu_term()
    return proves(saturated(gelu.rules, term, *facts), term, Tensor.gelu(x))


def test_root_two_stored_in_float16_is_root_two():
    assert _gelu_proved(float(np.float16(math.sqrt(2.0))), FLOAT16)


@pytest.mark.parametrize(
    ("stored", "dtype"),
    [(float(np.float16(math.sqrt(2.0))), FLOAT), (float(np.float16(1.41)), FLOAT16)],
    ids=["float16-rounding-in-a-float32-constant", "further-than-float16-rounding"],
)
def test_a_constant_off_root_two_by_more_than_its_rounding_is_not(stored, dtype):
    assert not _gelu_proved(stored, dtype)


# --- the judge ---------------------------------------------------------------------------------------------------


def _outputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two references of a (4 rows × 8) output that disagree on row 0 only (a row every key of which a fill
    hides), and the original's half-precision output, close to the first."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((4, 8)).astype(np.float32)
    absorbed = reference.copy()
    absorbed[0] = reference[0].mean()  # the uniform row: the mean of V
    return reference, absorbed, reference.astype(np.float16)


def test_a_row_the_fill_decides_may_take_either_value():
    reference, absorbed, expected = _outputs()
    actual = expected.copy()
    actual[0] = absorbed[0].astype(np.float16)  # the kernel absorbed the scores where the graph kept them
    assert not validate.compare("y", expected, actual, reference).ok
    assert validate.compare("y", expected, actual, reference, absorbed=absorbed).ok
    assert validate.fill_decided(np.dtype(np.float16), reference, absorbed).tolist() == [True, False, False, False]


def test_a_row_the_fill_decides_must_still_be_finite():
    reference, absorbed, expected = _outputs()
    actual = expected.copy()
    actual[0, 3] = np.inf
    assert not validate.compare("y", expected, actual, reference, absorbed=absorbed).ok


def test_a_fault_in_a_row_the_references_agree_on_is_seen():
    reference, absorbed, expected = _outputs()
    actual = expected.copy()
    actual[2] = 0  # a row the mask leaves alone, zeroed
    comparison = validate.compare("y", expected, actual, reference, absorbed=absorbed)
    assert not comparison.ok and comparison.max_abs_diff > 0.1


# --- the fill a half-precision fused op is given -------------------------------------------------------------------


_MASKS_UNDER_CAUSAL = [(m, c) for m in ("padding_int", "where_finfo", "additive") for c in ("trilu", "range_greater")]


@pytest.mark.parametrize(
    ("target", "mask", "causal"), one_target_fast(_MASKS_UNDER_CAUSAL, [f"{m}-{c}" for m, c in _MASKS_UNDER_CAUSAL])
)
def test_a_float16_causal_block_with_a_padding_mask_fuses_and_stays_finite(mask, causal, target):
    """A fused op that adds a float16 mask in float16 overflows ``S + finfo.min`` to −inf once S < −16: a row
    every key of which is masked became NaN on large scores, and validation kept the graph's ops (2 of these 12
    fused before). The mask's finfo.min entries go to the op at half of it (``raise_masks.moved_lowest``)."""
    variant = Variant(scale="qk_div", k_layout="transpose_0132", heads=4, head_dim=16, dtype="float16", mask=mask,
                      causal=causal, seed=5)  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target=target)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    # the judge's own feeds: left padding under the causal mask, and large-scores draws that hide whole rows
    assert disagreements(model, result.model, feeds_for(model, seed=1, batch=3, seq=6, left_padding=True)) == []


def test_a_half_range_fill_widens_to_a_fill():
    """The float32 copies that judge a float16 model's masks read egfuse's half-range fill as the fill it is."""
    from egfuse.validation.widen import upcast_feeds

    lowest = np.finfo(np.float16).min
    values = np.array([lowest, lowest / 2, -1.0, 0.0], np.float16)
    wide = upcast_feeds({"m": values}, fills=True)["m"]
    top = np.finfo(np.float32).max
    assert wide[0] == -top and wide[1] == np.nextafter(-top, np.float32(0)) and wide[2] == -1.0 and wide[3] == 0.0


def test_a_half_tensor_widened_and_narrowed_back_is_itself_and_nothing_else_is():
    wide, half16 = Tensor.value(20), Tensor.value(21)
    round_trip = Tensor.cast(Tensor.cast(half16, FLOAT), FLOAT16)
    narrowed = Tensor.cast(Tensor.cast(wide, FLOAT), FLOAT16)  # float32 x narrowed: rounding, not x
    lossy = Tensor.cast(Tensor.cast(wide, FLOAT16), FLOAT)  # narrowed first
    egraph = saturated(precision.rules, round_trip, narrowed, lossy, set_(dtype_of(half16)).to(i64(FLOAT16)),
                       set_(dtype_of(wide)).to(i64(FLOAT)))  # fmt: skip
    assert proves(egraph, round_trip, half16)
    assert not proves(egraph, narrowed, wide)
    assert not proves(egraph, lossy, wide)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_float16_probabilities_cast_to_float32_and_back_fuse(target):
    """XGLM's float16 export takes the softmax in float16, then casts the probabilities to float32 and back
    (``softmax(x, dtype=float32).to(float16)`` decomposed): nothing fused until the round trip was the identity."""
    model = attention_model(Variant(scale="qk_div", k_layout="transpose_0132", heads=4, head_dim=16, dtype="float16"))
    nodes = list(model.graph.node)
    (softmax,) = [n for n in nodes if n.op_type == "Softmax"]
    (widen,) = [n for n in nodes if n.output[0] == softmax.input[0]]  # the model's softmax in float32 …
    (narrow,) = [n for n in nodes if n.input[:1] == softmax.output[:1]]
    softmax.input[0], widen.input[0], narrow.input[0] = widen.input[0], softmax.output[0], widen.output[0]
    model.graph.node.remove(widen)  # … taken in float16 instead, its probabilities widened and narrowed back
    model.graph.node.insert(list(model.graph.node).index(narrow), widen)
    ops = [n.op_type for n in model.graph.node]
    assert ops[ops.index("Softmax") - 1 : ops.index("Softmax") + 3] == ["Add", "Softmax", "Cast", "Cast"]
    result = egfuse.fuse(model, target=target)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert disagreements(model, result.model, feeds_for(model, seed=1, batch=2, seq=6)) == []

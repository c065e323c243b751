"""The tanh GELU, the kind added after kinds became plug-ins: the rules on hand-written terms, then the spellings
exporters write (GPT-2's Pow, BLOOM's factored polynomial, Flux's ½ in the bracket) as ONNX graphs fused for each
target and checked against the unfused graph on onnxruntime; near misses (another coefficient, another root)
stay as they were with the step the rules did not reach, and tanh that is not a GELU (a pooler's, a gate's
other half) is not taken."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from egfuse.rules import commute, tanh_gelu
from egfuse.rules.tanh_gelu import CUBIC, SQRT_2_OVER_PI, cube, gelu_tanh, square
from egglog import f64, i64, set_, unstable_combine_rulesets
from onnx import helper

import egfuse
from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dtype_of, scalar_of
from egfuse.validation.validate import make_feeds

from ..conftest import assert_same_outputs, feature_model, one_target_fast
from ..rules.test_rules import proves, saturated

RULES = unstable_combine_rulesets(tanh_gelu.rules, commute.rules)
x, a, c, one, half, two, three = (Tensor.value(i) for i in range(7))


def _scalars(cubic: float = CUBIC, root: float = SQRT_2_OVER_PI, dtype=np.float32, code: int = 1) -> list:
    stored = {a: cubic, c: root, one: 1.0, half: 0.5, two: 2.0, three: 3.0}
    facts = [set_(scalar_of(t)).to(f64(float(dtype(v)))) for t, v in stored.items()]
    return facts + [set_(dtype_of(t)).to(i64(code)) for t in stored]


def _bracket(arg: Tensor) -> Tensor:
    return Tensor.add(Tensor.tanh(arg), one)


ARGUMENTS = {  # tanh's argument as the exporters write it
    "gpt2_pow": lambda: Tensor.mul(Tensor.add(x, Tensor.mul(Tensor.pow(x, three), a)), c),
    "cube_of_products": lambda: Tensor.mul(Tensor.add(x, Tensor.mul(Tensor.mul(Tensor.mul(x, x), x), a)), c),
    "bloom_factored": lambda: Tensor.mul(Tensor.mul(x, c), Tensor.add(Tensor.mul(Tensor.mul(x, a), x), one)),
    "constant_first": lambda: Tensor.mul(c, Tensor.add(x, Tensor.mul(a, Tensor.pow(x, three)))),
}  # fmt: skip
PRODUCTS = {
    "half_last": lambda b: Tensor.mul(Tensor.mul(x, b), half),
    "half_first": lambda b: Tensor.mul(Tensor.mul(x, half), b),
    "half_in_bracket": lambda b: Tensor.mul(x, Tensor.mul(half, b)),
    "over_two": lambda b: Tensor.div(Tensor.mul(b, x), two),
}


@pytest.mark.parametrize("argument", sorted(ARGUMENTS))
@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_every_tanh_gelu_spelling_is_gelu_tanh(argument, product):
    term = PRODUCTS[product](_bracket(ARGUMENTS[argument]()))
    assert proves(saturated(RULES, term, *_scalars()), term, gelu_tanh(x))


def test_the_cube_as_products_in_either_association_is_the_cube():
    for term in (Tensor.mul(Tensor.mul(x, x), x), Tensor.mul(x, Tensor.mul(x, x)), Tensor.pow(x, three)):
        assert proves(saturated(RULES, term, *_scalars()), term, cube(x))
    assert not proves(saturated(RULES, Tensor.mul(x, a), *_scalars()), Tensor.mul(x, a), square(x))


def test_constants_stored_in_float16_are_the_constants_to_float16s_rounding():
    term = PRODUCTS["half_last"](_bracket(ARGUMENTS["gpt2_pow"]()))
    assert proves(saturated(RULES, term, *_scalars(dtype=np.float16, code=10)), term, gelu_tanh(x))
    # The same float16 values claimed as float32 are too far from the exact constants: not the tanh GELU.
    assert not proves(saturated(RULES, term, *_scalars(dtype=np.float16, code=1)), term, gelu_tanh(x))


@pytest.mark.parametrize(("cubic", "root"), [(0.05, SQRT_2_OVER_PI), (CUBIC, 0.8), (CUBIC, math.sqrt(2.0))])
def test_another_coefficient_or_root_is_not_the_tanh_gelu(cubic, root):
    term = PRODUCTS["half_last"](_bracket(ARGUMENTS["gpt2_pow"]()))
    assert not proves(saturated(RULES, term, *_scalars(cubic, root)), term, gelu_tanh(x))


# --- ONNX graphs, fused and run ---------------------------------------------------------------------------------

WIDTH = 16


def tanh_gelu_model(
    *,
    cube_as: str = "pow",
    poly: str = "expanded",
    order: str = "half_last",
    cubic: float = CUBIC,
    root: float = SQRT_2_OVER_PI,
    gated: bool = False,
) -> onnx.ModelProto:
    """The tanh GELU between two MatMuls: the cube as ``Pow`` or ``x·x·x``, the polynomial ``expanded``
    (GPT-2: √(2/π)·(x + a·x³)) or ``factored`` (BLOOM: (x·√(2/π))·(1 + a·x·x)), ½ where ``order`` puts it;
    ``gated``: the activation multiplied by a second projection of the input (GeGLU, Gemma's MLP)."""
    rng = np.random.default_rng(0)
    consts = {"a": cubic, "c": root, "one": 1.0, "half": 0.5, "three": 3.0}
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    for name in ("w_in", "w_up", "w_out"):
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), name))
    nodes = [helper.make_node("MatMul", ["input", "w_in"], ["h"])]
    if poly == "expanded":
        if cube_as == "pow":
            nodes.append(helper.make_node("Pow", ["h", "three"], ["cu"]))
        else:
            nodes += [helper.make_node("Mul", ["h", "h"], ["sq"]), helper.make_node("Mul", ["sq", "h"], ["cu"])]
        nodes += [
            helper.make_node("Mul", ["cu", "a"], ["acu"]),
            helper.make_node("Add", ["h", "acu"], ["p"]),
            helper.make_node("Mul", ["p", "c"], ["arg"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["h", "a"], ["ha"]),
            helper.make_node("Mul", ["ha", "h"], ["ah2"]),
            helper.make_node("Add", ["ah2", "one"], ["br"]),
            helper.make_node("Mul", ["h", "c"], ["hc"]),
            helper.make_node("Mul", ["hc", "br"], ["arg"]),
        ]
    nodes += [helper.make_node("Tanh", ["arg"], ["t"]), helper.make_node("Add", ["t", "one"], ["cdf"])]
    if order == "half_last":
        nodes += [helper.make_node("Mul", ["h", "cdf"], ["xp"]), helper.make_node("Mul", ["xp", "half"], ["g"])]
    elif order == "half_first":
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "cdf"], ["g"])]
    else:  # ½ into the bracket (torch's F.gelu(approximate="tanh") decomposed)
        nodes += [helper.make_node("Mul", ["half", "cdf"], ["hc2"]), helper.make_node("Mul", ["h", "hc2"], ["g"])]
    if gated:
        nodes += [helper.make_node("MatMul", ["input", "w_up"], ["up"]), helper.make_node("Mul", ["g", "up"], ["gu"])]
    nodes.append(helper.make_node("MatMul", ["gu" if gated else "g", "w_out"], ["output"]))
    return feature_model(nodes, inits, "tanh_gelu", WIDTH)


LABELS = {"ort": "Gelu", "onnx": "Gelu"}
"""Priced for the CPU, the ort target writes the standard Gelu (opset 23, as for attention)."""
_SPELLINGS = [
    ("pow", "expanded", "half_last"),
    ("products", "expanded", "half_first"),
    ("pow", "factored", "half_last"),
    ("pow", "expanded", "half_in_bracket"),
]


@pytest.mark.parametrize(
    ("target", "cube_as", "poly", "order"),
    one_target_fast(_SPELLINGS, ["-".join(s) for s in _SPELLINGS], tuple(LABELS)),
)
def test_tanh_gelu_spellings_fuse_and_match(cube_as, poly, order, target):
    model = tanh_gelu_model(cube_as=cube_as, poly=poly, order=order)
    result = egfuse.fuse(model, target=target)
    (entry,) = result.report.layer_ops
    assert entry.kind == "tanh_gelu" and entry.status == "fused" and result.report.validated, entry
    assert result.report.fused_ops() == {LABELS[target]: 1}
    (written,) = [n for n in result.model.graph.node if n.op_type == "Gelu"]
    assert [(a.name, a.s) for a in written.attribute] == [("approximate", b"tanh")]
    assert not {"Tanh", "Pow"} & {n.op_type for n in result.model.graph.node}
    assert_same_outputs(model, result.model, make_feeds(model))


def test_a_model_whose_opset_stays_gets_onnxruntimes_fast_gelu():
    """Below opset 20 the standard Gelu cannot be written: the ort target's contrib op takes its place."""
    model = tanh_gelu_model()
    result = egfuse.fuse(model, target="ort", raise_opset=False)
    assert result.report.fused_ops() == {"com.microsoft.FastGelu": 1} and result.report.validated
    assert_same_outputs(model, result.model, make_feeds(model))


def test_a_gated_units_other_half_stays_out_of_the_region():
    """GeGLU: gelu_tanh(x W) · (x W_up). The product with the other projection is not part of the activation."""
    model = tanh_gelu_model(gated=True, order="half_in_bracket")
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused_ops() == {"Gelu": 1} and result.report.validated
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Mul") == 1 and ops.count("MatMul") == 3
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize(
    ("cubic", "root", "reason"),
    [
        (0.05, SQRT_2_OVER_PI, "coefficient 0.044715"),
        (CUBIC, 0.8, "not multiplied by √(2/π)"),
    ],
)
def test_near_misses_stay_and_say_which_step_failed(cubic, root, reason):
    model = tanh_gelu_model(cubic=cubic, root=root)
    result = egfuse.fuse(model, target="ort")
    (entry,) = result.report.layer_ops
    assert entry.status == "not fused" and reason in entry.reason, entry.reason
    assert "Tanh" in {n.op_type for n in result.model.graph.node}
    assert_same_outputs(model, result.model, make_feeds(model))


def test_a_tanh_that_is_not_a_gelu_is_no_region():
    """A pooler's tanh of a projection: not raised by 1 and multiplied by its input, so never a candidate."""
    rng = np.random.default_rng(1)
    w = onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["input", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["output"])]
    model = feature_model(nodes, [w], "pooler", WIDTH)
    result = egfuse.fuse(model, target="ort")
    assert result.report.layer_ops == []
    assert [n.op_type for n in result.model.graph.node] == ["MatMul", "Tanh"]


def test_each_target_writes_the_tanh_gelu_as_it_writes_the_exact_one():
    """The kind brings its op: the standard Gelu's tanh form beside the standard Gelu (same opset), FastGelu
    beside onnxruntime's Gelu (not in bfloat16: CUDA was never seen to run it there)."""
    from egfuse.kinds.registry import offered
    from egfuse.targets import npu, onnx, ort

    def written(spec):
        target = offered(spec)
        return {(op.label, op.opset) for op in (*target.ops, *target.below_opset_ops) if op.constructor == "gelu_tanh"}

    assert written(ort.SPEC) == {("Gelu", 23), ("com.microsoft.FastGelu", 1)}
    assert written(onnx.SPEC) == written(npu.SPEC) == {("Gelu", 20)}
    (fast,) = (op for op in offered(ort.CUDA_SPEC).ops if op.constructor == "gelu_tanh")
    assert fast.label == "com.microsoft.FastGelu" and "bfloat16" not in fast.dtypes
    assert offered(ort.SPEC).op_for("gelu_tanh").attributes == (("approximate", "tanh"),)

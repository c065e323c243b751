"""GELU: the rules on hand-written terms, then every spelling as an ONNX graph fused for each target and checked
against the unfused graph on onnxruntime; near misses (another constant in the erf, a bracket without the 1)
stay as they were."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from egfuse.rules import gelu
from egglog import f64, set_
from onnx import helper

import egfuse
from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import scalar_of
from egfuse.validation import validate
from egfuse.validation.validate import make_feeds

from ..conftest import assert_same_outputs, feature_model, one_target_fast
from ..rules.test_rules import proves, saturated

x, root2, inv_root2, one, half, two = (Tensor.value(i) for i in range(6))
SCALARS = [
    set_(scalar_of(root2)).to(f64(float(np.float32(math.sqrt(2.0))))),  # as a float32 constant stores it
    set_(scalar_of(inv_root2)).to(f64(float(np.float32(math.sqrt(0.5))))),
    set_(scalar_of(one)).to(f64(1.0)),
    set_(scalar_of(half)).to(f64(0.5)),
    set_(scalar_of(two)).to(f64(2.0)),
]
BRACKETS = {
    "div": lambda: Tensor.add(Tensor.erf(Tensor.div(x, root2)), one),
    "mul": lambda: Tensor.add(Tensor.erf(Tensor.mul(x, inv_root2)), one),
}
PRODUCTS = {
    "half_last": lambda b: Tensor.mul(Tensor.mul(x, b), half),
    "half_last_swapped": lambda b: Tensor.mul(Tensor.mul(b, x), half),
    "half_first": lambda b: Tensor.mul(Tensor.mul(x, half), b),
    "half_in_bracket": lambda b: Tensor.mul(x, Tensor.mul(b, half)),
    "over_two": lambda b: Tensor.div(Tensor.mul(x, b), two),
}


@pytest.mark.parametrize("bracket", sorted(BRACKETS))
@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_every_gelu_spelling_is_gelu(bracket, product):
    term = PRODUCTS[product](BRACKETS[bracket]())
    assert proves(saturated(gelu.rules, term, *SCALARS), term, Tensor.gelu(x))


def test_erf_of_half_the_input_is_not_gelu():
    term = Tensor.mul(Tensor.mul(x, Tensor.add(Tensor.erf(Tensor.div(x, two)), one)), half)
    assert not proves(saturated(gelu.rules, term, *SCALARS), term, Tensor.gelu(x))


def test_the_bracket_without_its_one_is_not_gelu():
    term = Tensor.mul(Tensor.mul(x, Tensor.erf(Tensor.div(x, root2))), half)
    assert not proves(saturated(gelu.rules, term, *SCALARS), term, Tensor.gelu(x))


# --- ONNX graphs, fused and run ---------------------------------------------------------------------------------

WIDTH = 16


def gelu_model(
    *,
    scaling: str = "div",
    order: str = "half_last",
    constant: float = math.sqrt(2.0),
    bias: bool = False,
    gated: bool = False,
) -> onnx.ModelProto:
    """GELU between two MatMuls, spelled as ``scaling`` (x / √2 or x · 1/√2) and ``order`` (where ½ goes);
    ``bias``: the first MatMul's bias added before it, as a projection with a bias writes it; ``gated``: the
    activation multiplied by a second projection of the input (GEGLU: diffusers' UNet and DiT MLPs)."""
    rng = np.random.default_rng(0)
    scale = constant if scaling == "div" else 1.0 / constant
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_in"),
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_out"),
        onnx.numpy_helper.from_array(np.array(scale, np.float32), "c"),
        onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        onnx.numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), "b_in"),
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_up"),
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w_in"], ["h0" if bias else "h"]),
        *([helper.make_node("Add", ["h0", "b_in"], ["h"])] if bias else []),
        helper.make_node("Div" if scaling == "div" else "Mul", ["h", "c"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["bracket"]),
    ]
    if order == "half_last":
        nodes += [helper.make_node("Mul", ["h", "bracket"], ["p"]), helper.make_node("Mul", ["p", "half"], ["g"])]
    elif order == "half_first":
        nodes += [helper.make_node("Mul", ["half", "h"], ["hh"]), helper.make_node("Mul", ["hh", "bracket"], ["g"])]
    else:  # ½ into the bracket
        nodes += [helper.make_node("Mul", ["bracket", "half"], ["bh"]), helper.make_node("Mul", ["bh", "h"], ["g"])]
    if gated:
        nodes += [helper.make_node("MatMul", ["input", "w_up"], ["up"]), helper.make_node("Mul", ["g", "up"], ["gu"])]
    nodes.append(helper.make_node("MatMul", ["gu" if gated else "g", "w_out"], ["output"]))
    return feature_model(nodes, inits, "gelu", WIDTH)


CUDA = validate.Settings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
"""The ort target priced for CUDA (validated on the CPU here): the contrib Gelu and BiasGelu are its own forms
there; priced for the CPU it writes the standard Gelu, faster in whole models (targets/ort.CPU_WHOLE_MODEL_LOSERS)."""


def _fuse(model: onnx.ModelProto, target: str) -> egfuse.FuseResult:
    if target == "ort:cuda":
        return egfuse.fuse(model, target="ort", validation=CUDA)
    return egfuse.fuse(model, target=target)


LABELS = {"ort": "Gelu", "ort:cuda": "com.microsoft.Gelu", "onnx": "Gelu"}
"""The op each target writes for a GELU."""
_SPELLINGS = [(s, o) for o in ("half_last", "half_first", "half_in_bracket") for s in ("div", "mul")]


@pytest.mark.parametrize(
    ("target", "scaling", "order"), one_target_fast(_SPELLINGS, [f"{s}-{o}" for s, o in _SPELLINGS], tuple(LABELS))
)
def test_gelu_spellings_fuse_and_match(scaling, order, target):
    """Each spelling on one target in the fast suite (the targets taking turns), on the others with ``-m slow``."""
    model = gelu_model(scaling=scaling, order=order)
    result = _fuse(model, target)
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated
    assert result.report.fused_ops() == {LABELS[target]: 1}
    assert "Erf" not in {n.op_type for n in result.model.graph.node}
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("order", ["half_last", "half_first", "half_in_bracket"])
def test_a_gated_units_other_half_stays_out_of_the_gelu(order):
    """GEGLU, gelu(x W) · (x W_up): the product with the other projection read the GELU's output, so the region
    once took it in, and its output (the product) was never the GELU the rules proved."""
    model = gelu_model(order=order, gated=True)
    result = egfuse.fuse(model, target="onnx")
    assert result.report.fused_ops() == {"Gelu": 1} and result.report.validated, result.report.layer_ops
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Mul") == 1 and ops.count("MatMul") == 3
    assert_same_outputs(model, result.model, make_feeds(model))


def test_gelu_below_opset_20_is_kept_for_a_target_without_its_own_op():
    """npu writes the standard Gelu only: at opset 18 the region stays, and the report says why."""
    model = gelu_model()
    result = egfuse.fuse(model, target="npu")
    (entry,) = result.report.layer_ops
    assert entry.status == "not fused" and "opset 20" in entry.reason
    assert "Erf" in {n.op_type for n in result.model.graph.node}


def test_a_different_constant_is_not_gelu():
    """erf(x / 2) is another function: kept, and the report names the bracket the rules did not build."""
    model = gelu_model(constant=2.0)
    result = egfuse.fuse(model, target="ort")
    assert not any(n.status == "fused" for n in result.report.layer_ops)
    assert all("no GELU bracket" in n.reason for n in result.report.layer_ops), result.report.layer_ops
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize(
    ("target", "written"), [("ort:cuda", "com.microsoft.BiasGelu"), ("ort", "Gelu"), ("onnx", "Gelu")]
)
def test_a_projections_bias_goes_into_bias_gelu_where_the_target_has_it(target, written):
    model = gelu_model(bias=True)
    result = _fuse(model, target)
    assert result.report.fused_ops() == {written: 1} and result.report.validated
    assert_same_outputs(model, result.model, make_feeds(model))

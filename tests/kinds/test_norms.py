"""Layer and RMS norms: the rules on hand-written terms, then every spelling as an ONNX graph fused for each
target and checked against the unfused graph on onnxruntime; near misses (ε outside the root, a mean over
another axis, a scale of one element) must stay as they were, and a wrongly written norm must be put back."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from egfuse.rules import norms
from egglog import f64, i64, set_
from onnx import helper

import egfuse
from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import is_weight, last_dim, rank_of, scalar_of
from egfuse.validation import validate
from egfuse.validation.validate import make_feeds
from egfuse.writing import writers

from ..conftest import assert_same_outputs, fast_on, feature_model, one_target_fast
from ..rules.test_rules import proves, saturated

x, g, b, two, one, eps = (Tensor.value(i) for i in range(6))
WEIGHTS = [is_weight(g), is_weight(b), set_(rank_of(g)).to(i64(1)), set_(rank_of(b)).to(i64(1))]
SCALARS = [set_(scalar_of(two)).to(f64(2.0)), set_(scalar_of(one)).to(f64(1.0)), set_(scalar_of(eps)).to(f64(1e-5))]


def _centred() -> Tensor:
    return Tensor.sub(x, Tensor.reduce_mean(x))


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("division", ["div", "reciprocal", "one_over", "reciprocal_first", "scale_first"])
def test_every_layer_norm_spelling_is_layer_norm(square, division):
    c = _centred()
    sq = Tensor.pow(c, two) if square == "pow" else Tensor.mul(c, c)
    root = Tensor.sqrt(Tensor.add(Tensor.reduce_mean(sq), eps))
    normed = {
        "div": lambda: Tensor.mul(Tensor.div(c, root), g),
        "reciprocal": lambda: Tensor.mul(Tensor.mul(c, Tensor.reciprocal(root)), g),
        "one_over": lambda: Tensor.mul(Tensor.mul(c, Tensor.div(one, root)), g),
        "reciprocal_first": lambda: Tensor.mul(Tensor.mul(Tensor.reciprocal(root), c), g),
        "scale_first": lambda: Tensor.div(Tensor.mul(c, g), root),
    }[division]()
    term = Tensor.add(normed, b)
    egraph = saturated(norms.rules, term, *WEIGHTS, *SCALARS)
    assert proves(egraph, term, Tensor.layer_norm(x, g, b, 1e-5))


def test_epsilon_outside_the_root_is_not_a_layer_norm():
    c = _centred()
    term = Tensor.add(
        Tensor.mul(Tensor.div(c, Tensor.add(Tensor.sqrt(Tensor.reduce_mean(Tensor.mul(c, c))), eps)), g), b
    )
    egraph = saturated(norms.rules, term, *WEIGHTS, *SCALARS)
    assert not proves(egraph, term, Tensor.layer_norm(x, g, b, 1e-5))


def test_a_cube_is_not_the_square():
    c = _centred()
    term = Tensor.mul(Tensor.div(c, Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.pow(c, one)), eps))), g)
    egraph = saturated(norms.rules, term, *WEIGHTS, *SCALARS)
    assert not proves(egraph, term, Tensor.layer_norm(x, g, Tensor.zero_bias(g), 1e-5))


@pytest.mark.parametrize("division", ["div", "reciprocal", "one_over"])
def test_every_rms_norm_spelling_is_rms_norm(division):
    root = Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.pow(x, two)), eps))
    normed = {
        "div": lambda: Tensor.div(x, root),
        "reciprocal": lambda: Tensor.mul(x, Tensor.reciprocal(root)),
        "one_over": lambda: Tensor.mul(x, Tensor.div(one, root)),
    }[division]()
    term = Tensor.mul(normed, g)
    egraph = saturated(norms.rules, term, *WEIGHTS, *SCALARS)
    assert proves(egraph, term, Tensor.rms_norm(x, g, 1e-5))


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_the_reciprocal_root_as_a_power_is_the_norm(kind):
    """``s^(−½) = 1/√s``: Gemma 4 writes its RMS norms ``x · (mean x² + ε)^(−½) · γ`` (torch.pow); a power of
    +½ (the root itself, a product with it) is no norm."""
    minus_half, half = Tensor.value(7), Tensor.value(8)
    powers = [set_(scalar_of(minus_half)).to(f64(-0.5)), set_(scalar_of(half)).to(f64(0.5))]
    source = x if kind == "rms" else _centred()
    mean_square = Tensor.add(Tensor.reduce_mean(Tensor.pow(source, two)), eps)
    expected = Tensor.rms_norm(x, g, 1e-5) if kind == "rms" else Tensor.layer_norm(x, g, b, 1e-5)

    def normed(exponent: Tensor) -> Tensor:
        term = Tensor.mul(Tensor.mul(source, Tensor.pow(mean_square, exponent)), g)
        return term if kind == "rms" else Tensor.add(term, b)

    term, near = normed(minus_half), normed(half)
    egraph = saturated(norms.rules, Tensor.add(term, near), *WEIGHTS, *SCALARS, *powers)
    assert proves(egraph, term, expected)
    assert not proves(egraph, near, expected)


def test_a_scale_that_is_not_a_weight_is_not_the_norms_scale():
    term = Tensor.mul(Tensor.div(x, Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.mul(x, x)), eps))), b)
    egraph = saturated(norms.rules, term, *SCALARS)  # no is_weight(b): a gate computed from the input
    assert not proves(egraph, term, Tensor.rms_norm(x, b, 1e-5))


# --- ONNX graphs, fused and run ---------------------------------------------------------------------------------

WIDTH = 16


def _weights(seed: int, gamma_shape, beta_shape) -> list[onnx.TensorProto]:
    """The two projections around a norm and its γ (about 1) and β (about 0), drawn in that order."""
    rng = np.random.default_rng(seed)
    return [
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_in"),
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_out"),
        onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(gamma_shape)).astype(np.float32), "gamma"),
        onnx.numpy_helper.from_array((0.1 * rng.standard_normal(beta_shape)).astype(np.float32), "beta"),
    ]


def norm_model(
    kind: str, *, square="pow", division="div", scale_width=WIDTH, eps_inside=True, axis=-1, gamma=True, mean="reduce"
) -> onnx.ModelProto:
    """A norm spelled as exporters write it, between two MatMuls (so the region has a producer and a reader).
    ``division="keras"``: γ multiplied into the reciprocal root first; ``gamma=False``: no γ (nor β);
    ``mean="pool"``: the means as ``GlobalAveragePool`` (of the rank-3 activations: the last axis)."""
    inits = [
        *_weights(0, scale_width, WIDTH),
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        onnx.numpy_helper.from_array(np.array([axis], np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "minus_half"),
        onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [helper.make_node("MatMul", ["input", "w_in"], ["h"])]
    src = "h"

    def average(source: str, out: str):
        if mean == "pool":
            return helper.make_node("GlobalAveragePool", [source], [out])
        return helper.make_node("ReduceMean", [source, "axes"], [out])

    if kind == "layer":
        nodes += [
            average("h", "mean"),
            helper.make_node("Sub", ["h", "mean"], ["c"]),
        ]
        src = "c"
    if square == "pow":
        nodes.append(helper.make_node("Pow", [src, "two"], ["sq"]))
    else:
        nodes.append(helper.make_node("Mul", [src, src], ["sq"]))
    nodes.append(average("sq", "var"))
    if division in ("power", "square_root_power"):  # x · (var + ε)^(−½) as Gemma 4 writes it; ^(+½): a near miss
        exponent = "minus_half" if division == "power" else "half"
        nodes.append(helper.make_node("Add", ["var", "eps"], ["var_eps"]))
        nodes.append(helper.make_node("Pow", ["var_eps", exponent], ["r"]))
        nodes.append(helper.make_node("Mul", [src, "r"], ["n"]))
    elif eps_inside:
        nodes += [helper.make_node("Add", ["var", "eps"], ["var_eps"]), helper.make_node("Sqrt", ["var_eps"], ["root"])]
    else:
        nodes += [helper.make_node("Sqrt", ["var"], ["root0"]), helper.make_node("Add", ["root0", "eps"], ["root"])]
    if division in ("power", "square_root_power"):
        pass
    elif division == "div":
        nodes.append(helper.make_node("Div", [src, "root"], ["n"]))
    elif division == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["root"], ["r"]), helper.make_node("Mul", [src, "r"], ["n"])]
    elif division == "keras":  # x · (rsqrt(·) · γ)
        nodes += [helper.make_node("Reciprocal", ["root"], ["r"]), helper.make_node("Mul", ["r", "gamma"], ["rg"])]
        nodes.append(helper.make_node("Mul", [src, "rg"], ["scaled"]))
    else:
        nodes += [helper.make_node("Div", ["one", "root"], ["r"]), helper.make_node("Mul", ["r", src], ["n"])]
    if division != "keras":
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["scaled"]) if gamma else helper.make_node(
            "Identity", ["n"], ["scaled"]))  # fmt: skip
    last = "scaled"
    if kind == "layer" and gamma:
        nodes.append(helper.make_node("Add", ["scaled", "beta"], ["shifted"]))
        last = "shifted"
    nodes.append(helper.make_node("MatMul", [last, "w_out"], ["output"]))
    return feature_model(nodes, inits, "norm", WIDTH)


def _fused_ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


_SPELLINGS = [
    ("layer", "pow", "div"), ("layer", "mul", "reciprocal"), ("layer", "pow", "one_over"),
    ("rms", "pow", "reciprocal"), ("rms", "mul", "div"), ("rms", "pow", "one_over"),
    ("rms", "mul", "power"), ("layer", "pow", "power"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("target", "kind", "square", "division"),
    one_target_fast(_SPELLINGS, ["-".join(s) for s in _SPELLINGS], ("ort", "onnx", "npu")),
)
def test_norm_spellings_fuse_and_match(kind, square, division, target):
    """Each spelling on one target in the fast suite (the targets taking turns), on the others with ``-m slow``."""
    model = norm_model(kind, square=square, division=division)
    result = egfuse.fuse(model, target=target)
    op = "LayerNormalization" if kind == "layer" else "RMSNormalization"
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated
    assert op in _fused_ops(result.model) and not {"ReduceMean", "Sqrt"} & _fused_ops(result.model)
    assert result.report.fused_ops() == {op: 1}
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize(("near_miss", "why"), [
    ({"eps_inside": False}, "no constant ε added to a mean"),  # √var + ε: another function
    ({"axis": 1}, "the mean under the root is not over the last axis"),  # a mean over the sequence
    ({"scale_width": 1}, "not one value per feature"),  # γ of one element broadcast: not one the ops take
])  # fmt: skip
def test_near_misses_stay_as_written(near_miss, why):
    """Each near miss is kept, and the report names the step of the rules it did not reach (read off the
    e-graph) or why the op cannot take it."""
    model = norm_model("layer", **near_miss)
    result = egfuse.fuse(model, target="ort")
    assert not any(n.status == "fused" for n in result.report.layer_ops)
    assert all(why in n.reason for n in result.report.layer_ops), [n.reason for n in result.report.layer_ops]
    assert "LayerNormalization" not in _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize(("kind", "division"), [("rms", "reciprocal"), ("layer", "div")])
def test_a_norm_without_gamma_is_the_norm_with_gamma_one(kind, division):
    """OLMo's non-parametric LayerNorm, or a γ of ones an exporter folded away (Keras' Qwen3 and Gemma 3 Q/K
    norms at their initial weights): the norm op with γ = 1 written as a constant (and β = 0)."""
    model = norm_model(kind, division=division, gamma=False)
    result = egfuse.fuse(model, target="onnx")
    op = "LayerNormalization" if kind == "layer" else "RMSNormalization"
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert result.report.fused_ops() == {op: 1}
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize(("target", "kind"), one_target_fast([("rms",), ("layer",)], ["rms", "layer"]))
def test_keras_norms_fuse_pooled_means_and_gamma_on_the_root(kind, target):
    """Keras' exporters write a norm's means as ``GlobalAveragePool`` (of (B, S, D): the last axis) and
    multiply γ into the reciprocal root before the input: x · (rsqrt(mean x² + ε) · γ)."""
    model = norm_model(kind, division="keras", mean="pool")
    result = egfuse.fuse(model, target=target)
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert not {"GlobalAveragePool", "Sqrt"} & _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


def test_a_pooled_mean_over_more_than_the_last_axis_is_not_a_norm():
    """``GlobalAveragePool`` of a rank-4 tensor averages two axes: not a norm's mean, kept as written."""
    model = norm_model("rms", mean="pool")
    graph = model.graph
    graph.node.insert(1, helper.make_node("Unsqueeze", ["h0", "one_axis"], ["h"]))
    graph.node[0].output[0] = "h0"
    graph.node[-1].input[0] = "scaled_3d"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Squeeze", ["scaled", "one_axis"], ["scaled_3d"]))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "one_axis"))
    result = egfuse.fuse(model, target="onnx")
    assert [n.status for n in result.report.layer_ops] == ["not fused"], str(result.report)  # not even tried
    assert "RMSNormalization" not in _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


def test_without_gamma_the_unit_scale_needs_the_width():
    """γ = 1 is a constant as wide as the last axis: without a known width there is none to write."""
    term = Tensor.div(x, Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.mul(x, x)), eps)))
    known = saturated(norms.rules, term, *SCALARS, set_(last_dim(x)).to(i64(WIDTH)))
    assert proves(known, term, Tensor.rms_norm(x, Tensor.unit_scale(x, WIDTH), 1e-5))
    unknown = saturated(norms.rules, term, *SCALARS)
    assert proves(unknown, term, Tensor.rms_normalized(x, 1e-5))
    assert not proves(unknown, term, Tensor.rms_norm(x, Tensor.unit_scale(x, WIDTH), 1e-5))


def test_gamma_multiplied_into_the_reciprocal_root_is_the_norms_scale():
    root = Tensor.sqrt(Tensor.add(Tensor.reduce_mean(Tensor.mul(x, x)), eps))
    for term in (
        Tensor.mul(x, Tensor.mul(Tensor.reciprocal(root), g)),
        Tensor.mul(Tensor.mul(Tensor.reciprocal(root), g), x),
    ):
        egraph = saturated(norms.rules, term, *WEIGHTS, *SCALARS)
        assert proves(egraph, term, Tensor.rms_norm(x, g, 1e-5))


def keras_layer_norm_model(param_shape: tuple[int, ...] = (1, 1, WIDTH), center: bool = True) -> onnx.ModelProto:
    """Keras' LayerNormalization as its exporters write TensorFlow's batch_normalization: means by
    ``GlobalAveragePool``, i = rsqrt(var + ε) · γ, then x · i + (−mean · i + β), γ and β stored (1, 1, D)."""
    inits = [*_weights(1, param_shape, param_shape), onnx.numpy_helper.from_array(np.array(1e-12, np.float32), "eps")]
    nodes = [
        helper.make_node("MatMul", ["input", "w_in"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["mean"]),
        helper.make_node("Neg", ["mean"], ["neg_mean"]),
        helper.make_node("Sub", ["h", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["root"]),
        helper.make_node("Reciprocal", ["root"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["i"]),
        helper.make_node("Mul", ["h", "i"], ["scaled"]),
        helper.make_node("Mul", ["neg_mean", "i"], ["shift"]),
    ]
    if center:
        nodes += [helper.make_node("Add", ["shift", "beta"], ["shift_b"]),
                  helper.make_node("Add", ["scaled", "shift_b"], ["normed"])]  # fmt: skip
    else:
        nodes.append(helper.make_node("Add", ["scaled", "shift"], ["normed"]))
    nodes.append(helper.make_node("MatMul", ["normed", "w_out"], ["output"]))
    return feature_model(nodes, inits, "keras_layer_norm", WIDTH)


@pytest.mark.parametrize(("target", "center"), one_target_fast([(True,), (False,)], ["beta", "no-beta"]))
def test_keras_layer_norm_is_layer_norm(center, target):
    """x · i − mean · i = (x − mean) · i: the batch_normalization form is the layer norm, γ and β written as
    the (D,) the op takes."""
    model = keras_layer_norm_model(center=center)
    result = egfuse.fuse(model, target=target)
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert "LayerNormalization" in _fused_ops(result.model)
    assert not {"GlobalAveragePool", "Sqrt", "Neg"} & _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


def test_a_scale_of_higher_rank_than_the_input_is_not_the_norms():
    """γ of shape (1, 1, 1, D) times a (B, S, D) input broadcasts to rank 4: the op's output would lose an axis."""
    model = keras_layer_norm_model(param_shape=(1, 1, 1, WIDTH))
    model.graph.output[0].type.tensor_type.ClearField("shape")
    result = egfuse.fuse(model, target="onnx")
    assert [n.status for n in result.report.layer_ops] == ["not fused"], str(result.report)
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_norm_of_the_attention_output_reads_the_fused_op(target):
    """BitNet normalizes the attention's output before its projection: the norm's region reads the attention
    region's output, so the norm's op must read the fused attention op's (the original ops, read instead,
    stayed alive and the fused op was dropped as unused while the report said fused)."""
    from egfuse.testing import Variant, attention_model, feeds_for

    model = attention_model(Variant())
    (identity,) = [n for n in model.graph.node if n.output[0] == "y"]
    model.graph.node.remove(identity)  # the norm reads the block's output itself, as BitNet's does
    width = Variant().heads * Variant().head_dim
    gamma = (1 + 0.1 * np.random.default_rng(3).standard_normal(width)).astype(np.float32)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(gamma, "sub_norm_gamma"),
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "sub_norm_two"),
        onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "sub_norm_eps"),
    ])  # fmt: skip
    model.graph.node.extend([
        helper.make_node("Pow", [identity.input[0], "sub_norm_two"], ["sub_sq"]),
        helper.make_node("ReduceMean", ["sub_sq"], ["sub_var"], axes=[-1]),  # (the block is at opset 17)
        helper.make_node("Add", ["sub_var", "sub_norm_eps"], ["sub_var_eps"]),
        helper.make_node("Sqrt", ["sub_var_eps"], ["sub_root"]),
        helper.make_node("Div", [identity.input[0], "sub_root"], ["sub_n"]),
        helper.make_node("Mul", ["sub_n", "sub_norm_gamma"], ["z"]),
    ])  # fmt: skip
    model.graph.output[0].name = "z"
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    report = result.report
    assert report.fused == 1 and [n.status for n in report.layer_ops] == ["fused"] and report.validated, str(report)
    ops = _fused_ops(result.model)
    assert {"RMSNormalization"} <= ops and ops & {"Attention", "MultiHeadAttention"} and "Softmax" not in ops
    assert_same_outputs(model, result.model, feeds)


def test_a_norm_written_wrong_is_put_back(monkeypatch):
    """Validation judges norm regions like attention ones: a writer that drops ε by a factor is caught and the
    region keeps its own nodes, with the reason."""
    original = writers.WRITERS["norm"]

    def wrong(node, e, op):
        out = original(node, e, op)
        written = e.new_nodes[-1]
        written.attributes["epsilon"] = onnx_ir_float("epsilon", 10.0)
        return out

    monkeypatch.setitem(writers.WRITERS, "norm", wrong)
    model = norm_model("rms")
    result = egfuse.fuse(model, target="ort")
    assert [n.status for n in result.report.layer_ops] == ["rolled back"]
    assert "RMSNormalization" not in _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


def onnx_ir_float(name: str, value: float):
    import onnx_ir as ir

    return ir.AttrFloat32(name, value)


def residual_norm_model(*, sum_read_again: bool = True) -> onnx.ModelProto:
    """``LayerNormalization(a + b)`` where a and b are computed (a residual), the sum read again by the next
    residual as a post-norm block's is not but a pre-norm block's is."""
    rng = np.random.default_rng(1)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w_in"),
        onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32), "gamma"),
        onnx.numpy_helper.from_array((0.1 * rng.standard_normal(WIDTH)).astype(np.float32), "beta"),
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w_in"], ["h"]),
        helper.make_node("Add", ["h", "input"], ["summed"]),
        helper.make_node("LayerNormalization", ["summed", "gamma", "beta"], ["normed"], axis=-1, epsilon=1e-6),
    ]
    if sum_read_again:
        nodes.append(helper.make_node("Add", ["normed", "summed"], ["output"]))
    else:
        nodes.append(helper.make_node("Identity", ["normed"], ["output"]))
    return feature_model(nodes, inits, "residual_norm", WIDTH)


CUDA = validate.Settings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
"""The ort target priced for CUDA (validated on the CPU here): the skip norms are its forms there; priced for the
CPU it leaves the sum and the standard norm, faster in whole models (targets/ort.CPU_WHOLE_MODEL_LOSERS)."""


@pytest.mark.parametrize("sum_read_again", [True, False])
def test_a_norm_of_a_residual_sum_is_skip_layer_norm_for_ort(sum_read_again):
    model = residual_norm_model(sum_read_again=sum_read_again)
    result = egfuse.fuse(model, target="ort", validation=CUDA)
    assert result.report.fused_ops() == {"com.microsoft.SkipLayerNormalization": 1} and result.report.validated
    ops = [n.op_type for n in result.model.graph.node]
    assert "LayerNormalization" not in ops and ops.count("Add") == int(sum_read_again)  # the sum from the kernel
    assert_same_outputs(model, result.model, make_feeds(model))


def test_targets_without_a_residual_norm_leave_the_op_alone():
    model = residual_norm_model()
    for target in ("onnx", "npu", "ort"):  # ort priced for the CPU: the standard norm is faster there
        result = egfuse.fuse(model, target=target)
        assert not result.report.layer_ops and not result.report.changed


def test_chained_residual_norms_leave_no_layer_norm_behind():
    """Post-norm blocks: the second residual reads the first norm's output, which SkipLayerNormalization now
    returns; the first norm op must not stay alive to feed it (it did: a norm computed twice a layer)."""
    rng = np.random.default_rng(2)
    inits, nodes, h = [], [], "input"
    for i in range(2):
        inits += [
            onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), f"w{i}"),
            onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32), f"g{i}"),
            onnx.numpy_helper.from_array((0.1 * rng.standard_normal(WIDTH)).astype(np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [h, f"w{i}"], [f"f{i}"]),
            helper.make_node("Add", [h, f"f{i}"], [f"s{i}"]),
            helper.make_node("LayerNormalization", [f"s{i}", f"g{i}", f"b{i}"], [f"h{i}"], epsilon=1e-5),
        ]
        h = f"h{i}"
    model = feature_model(nodes, inits, "post_norm", WIDTH, output=h)
    result = egfuse.fuse(model, target="ort", validation=CUDA)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("SkipLayerNormalization") == 2 and "LayerNormalization" not in ops and "Add" not in ops
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_query_and_key_norm_is_a_norm_region_not_part_of_attention(target):
    """Flux normalizes Q and K per head (RMSNorm: x · 1/√(mean x² + ε) · γ) between the projection and the
    scores. Attention's region once took the products in, leaving the norm's region only the root: "the
    division is not … a norm". The block now starts at a norm's output, as at a projection's."""
    from ..conftest import DATA, assert_same_outputs

    path = DATA / "producers" / "diffusers" / "flux_fused.dynamo.onnx"
    result = egfuse.fuse(str(path), target=target)
    assert result.report.validated and result.report.fused == len(result.report.regions) == 3
    assert result.report.fused_ops().get("RMSNormalization") == 8, result.report.layer_ops
    assert all(r.status == "fused" for r in result.report.layer_ops)
    feeds = dict(np.load(str(path).replace(".onnx", ".feeds.npz")))
    assert_same_outputs(onnx.load(str(path)), result.model, feeds)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_scalar_applied_to_a_norms_output_stays_outside_the_norm(target):
    """SD3.5 multiplies its normalized Q by the attention's scale (a one-element constant) before the scores:
    the norm's region took the product in and was then "scaled by something other than γ". The norm ends before
    a trailing one-element factor, which stays in the graph for what reads it."""
    model = norm_model("rms", division="reciprocal")
    (reader,) = [n for n in model.graph.node if n.output[0] == "output"]
    reader.input[0] = "scaled_twice"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0.35], np.float32), "attention_scale"))
    model.graph.node.insert(list(model.graph.node).index(reader), helper.make_node(
        "Mul", ["scaled", "attention_scale"], ["scaled_twice"]))  # fmt: skip
    result = egfuse.fuse(model, target=target)
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert result.report.fused_ops() == {"RMSNormalization": 1}
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("target", fast_on("onnx"))
@pytest.mark.parametrize("gamma", [True, False], ids=["gamma", "no gamma"])
def test_a_gate_multiplying_a_norms_output_stays_outside_the_norm(target, gamma):
    """A gated RMS norm (Mamba's, Qwen3-Next's linear attention: ``norm(x) · γ · silu(z)``, or Falcon-Mamba's with
    no γ) multiplies the norm by a computed gate: the norm's region took the product in ("scaled by something
    other than γ") and kept it all. The norm ends before it; the gate stays in the graph."""
    model = norm_model("rms", division="reciprocal", gamma=gamma)
    (reader,) = [n for n in model.graph.node if n.output[0] == "output"]
    reader.input[0] = "gated"
    index = list(model.graph.node).index(reader)
    model.graph.node.insert(index, helper.make_node("Mul", ["scaled" if gamma else "n", "gate"], ["gated"]))
    model.graph.node.insert(index, helper.make_node("Sigmoid", ["input"], ["gate"]))
    result = egfuse.fuse(model, target=target)
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert result.report.fused_ops() == {"RMSNormalization": 1}
    assert "Sigmoid" in _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("division", ["div", "reciprocal"])
def test_the_centred_input_computed_twice_is_still_the_norms(division):
    """Cohere's layer norm subtracts the mean twice, once under the root and once to divide: the second
    ``x − mean`` is the norm's own value (the gate rule must not end the norm there)."""
    model = norm_model("layer", division=division)
    (divide,) = [n for n in model.graph.node if n.op_type in ("Div", "Mul") and "c" in n.input]
    divide.input[list(divide.input).index("c")] = "c_again"
    index = list(model.graph.node).index(divide)
    model.graph.node.insert(index, helper.make_node("Sub", ["h", "mean"], ["c_again"]))
    result = egfuse.fuse(model, target="onnx")
    assert [n.status for n in result.report.layer_ops] == ["fused"] and result.report.validated, str(result.report)
    assert result.report.fused_ops() == {"LayerNormalization": 1}
    assert_same_outputs(model, result.model, make_feeds(model))


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_sd35s_query_norm_scaled_for_attention_fuses(target):
    """The SD3.5 export itself (diffusers, dynamo): every norm, activation and attention block fused."""
    from ..conftest import DATA

    path = DATA / "producers" / "diffusers" / "sd35_fused.dynamo.onnx"
    result = egfuse.fuse(str(path), target=target)
    report = result.report
    assert report.validated and report.fused == len(report.regions), str(report)
    assert all(r.status == "fused" for r in report.layer_ops), [r.reason for r in report.layer_ops]
    feeds = dict(np.load(str(path).replace(".onnx", ".feeds.npz")))
    assert_same_outputs(onnx.load(str(path)), result.model, feeds)


def test_a_product_with_the_root_as_a_power_is_not_a_norm():
    """``x · (mean x² + ε)^(+½)`` multiplies by the root instead of dividing: found as no norm, kept as written."""
    model = norm_model("rms", division="square_root_power")
    result = egfuse.fuse(model, target="onnx")
    assert not any(n.status == "fused" for n in result.report.layer_ops)
    assert "RMSNormalization" not in _fused_ops(result.model)
    assert_same_outputs(model, result.model, make_feeds(model))

"""How Keras models reach ONNX (tf2onnx and ``model.export``): a select written as arithmetic on its flag
(``m·S + (1 − m)·F``), the product form of a mask (``(1 − m)·F``), probabilities zeroed after the softmax with
the mask that hid the keys before it (Keras' ``Softmax(mask)``), and Einsum lowered to Unsqueeze → Transpose →
Reshape → MatMul → Reshape → Squeeze chains — each an identity in ``rules/masks.py`` or a view chain read by the
lowering (``lower_layout``). Hand-written graphs: each spelling fuses and matches the original, and the near miss
(zeroing with a different mask) is not proven."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.testing import disagreements

from ..conftest import fast_on, fused_op_count, one_target_fast

B, N, S, H = 2, 2, 5, 8
FILL = -1e9


def _graph(post: str, pre: str = "select", slope: float | None = None) -> onnx.ModelProto:
    """softmax(Q·Kᵀ/√H masked) [zeroed] @ V on (B, N, S, H) inputs; masks are (B, 1, 1, S) booleans. ``slope``: an
    ALiBi-style bias ``slope·2⁻ʰ · Cast(positions)`` (int32 positions, a graph input) added before the mask, as
    keras-hub's Falcon does."""
    nodes, inits = (
        [],
        [
            helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(H)]),
            helper.make_tensor("fill", TensorProto.FLOAT, [], [FILL]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        ],
    )
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["s" if slope is None else "s0"]),
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Not", ["m"], ["nm"]),
        helper.make_node("Cast", ["nm"], ["nmf"], to=TensorProto.FLOAT),
    ]
    if slope is not None:
        slopes = slope * 2.0 ** -np.arange(1, N + 1, dtype=np.float32)
        inits.append(helper.make_tensor("slopes", TensorProto.FLOAT, [1, N, 1, 1], slopes))
        nodes += [
            helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["slopes", "posf"], ["bias"]),
            helper.make_node("Add", ["s0", "bias"], ["s"]),
        ]
    if pre == "select":  # tf2onnx's SelectV2(m, S, F): m·S + ¬m·F
        nodes += [
            helper.make_node("Mul", ["mf", "s"], ["kept"]),
            helper.make_node("Mul", ["fill", "nmf"], ["filled"]),
            helper.make_node("Add", ["kept", "filled"], ["masked"]),
        ]
    else:  # Keras' adder: S + (1 − m)·F
        nodes += [
            helper.make_node("Sub", ["one", "mf"], ["hidden"]),
            helper.make_node("Mul", ["hidden", "fill"], ["adder"]),
            helper.make_node("Add", ["s", "adder"], ["masked"]),
        ]
    nodes.append(helper.make_node("Softmax", ["masked"], ["p"], axis=-1))
    zero_mask = "m2" if post.endswith("other") else "m"
    nodes.append(helper.make_node("Cast", [zero_mask], ["zf"], to=TensorProto.FLOAT))
    if post.startswith("mul"):  # Keras' Softmax(mask): p·m
        nodes.append(helper.make_node("Mul", ["p", "zf"], ["pz"]))
    elif post.startswith("select"):  # tf2onnx's SelectV2(m, p, 0): m·p + ¬m·0
        nodes += [
            helper.make_node("Not", [zero_mask], ["nz"]),
            helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["zf", "p"], ["pk"]),
            helper.make_node("Mul", ["zero", "nzf"], ["p0"]),
            helper.make_node("Add", ["pk", "p0"], ["pz"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["pz"]))
    nodes.append(helper.make_node("MatMul", ["pz", "v"], ["y"]))
    tensor = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, N, S, H]) for n in "qkv"]
    masks = [helper.make_tensor_value_info(n, TensorProto.BOOL, [B, 1, 1, S]) for n in ("m", "m2")]
    if slope is not None:
        masks.append(helper.make_tensor_value_info("pos", TensorProto.INT32, [1, 1, 1, S]))
    graph = helper.make_graph(
        nodes, "keras", tensor + masks, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(positions: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B, N, S, H)).astype(np.float32) for n in "qkv"}
    m = np.ones((B, 1, 1, S), bool)
    m[1, ..., -2:] = False  # padding in the second sequence
    feeds["m"] = m
    m2 = m.copy()
    m2[0, ..., 0] = False  # another mask: hides one more key
    feeds["m2"] = m2
    if positions:
        feeds["pos"] = np.arange(S, dtype=np.int32).reshape(1, 1, 1, S)
    return feeds


_MASKS = [("select", "none"), ("adder", "none"), ("select", "select"), ("adder", "mul"), ("select", "mul")]


@pytest.mark.parametrize(("target", "pre", "post"), one_target_fast(_MASKS, [f"{a}-{b}" for a, b in _MASKS]))
def test_keras_masks_fuse_and_match(pre: str, post: str, target: str):
    model = _graph(post, pre)
    feeds = _feeds()
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert not disagreements(model, result.model, feeds)


@pytest.mark.parametrize("post", ["mul_other", "select_other"])
def test_zeroing_with_another_mask_is_not_proven(post: str):
    """Zeroing where a different mask hides keys zeroes probabilities the softmax gave weight to: no identity."""
    model = _graph(post)
    feeds = _feeds()
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_a_bounded_bias_before_the_arithmetic_select_fuses(target: str):
    """ALiBi before tf2onnx's select: ``m·(S + b) + ¬m·F`` is ``Where(m, S + b, F)`` only for a finite b; here b
    is slopes · Cast(int32 positions), at most 2³¹·|slope|, which float32 holds."""
    model = _graph("none", "select", slope=8.0)
    feeds = _feeds(positions=True)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert not disagreements(model, result.model, feeds)


def test_a_bias_of_unknown_magnitude_is_no_select():
    """Near miss: a float bias given as an input may hold ±inf (inf·0 is NaN in the arithmetic select, the fill in
    a Where): no identity, not claimed."""
    model = _graph("none", "select", slope=1.0)
    cast = next(n for n in model.graph.node if n.op_type == "Cast" and n.input[0] == "pos")
    model.graph.node.remove(cast)
    model.graph.input[-1].CopyFrom(helper.make_tensor_value_info("posf", TensorProto.FLOAT, [1, 1, 1, S]))
    feeds = _feeds()
    feeds["posf"] = np.arange(S, dtype=np.float32).reshape(1, 1, 1, S)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0, str(result.report)
    assert not disagreements(model, result.model, feeds)

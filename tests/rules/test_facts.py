"""A mask built once and shared by every layer is finite in every region, not only in the first one that
computes it: the NaN guard after softmax is then the identity, and no layer keeps it (4-layer BERT at S=512:
three ``IsNaN`` + ``Where`` pairs on the attention output, 1.5% of the run, before the fact was read from
outside the region)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import egfuse
from egfuse.analysis.facts import GraphFacts

from ..conftest import DATA, assert_same_outputs

FMIN = float(np.finfo(np.float32).min)


def _facts_of(nodes: list, inputs: list, initializers: list) -> tuple[GraphFacts, dict[str, ir.Value]]:
    outputs = [helper.make_tensor_value_info(n.output[0], TensorProto.UNDEFINED, None) for n in nodes]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    values = {v.name: v for node in model.graph for v in node.outputs}
    return GraphFacts(model.graph), values


def test_finiteness_follows_selects_layouts_and_casts_but_not_sums():
    bool_in = helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 1, 4, 4])
    int_in = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])
    float_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    consts = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("fmin", TensorProto.FLOAT, [], [FMIN]),
        helper.make_tensor("ninf", TensorProto.FLOAT, [], [-np.inf]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
    ]
    nodes = [
        helper.make_node("Where", ["keep", "zero", "fmin"], ["mask"]),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["mask5"]),
        helper.make_node("Where", ["keep", "zero", "ninf"], ["inf_mask"]),
        helper.make_node("Add", ["mask", "mask"], ["summed"]),  # finfo.min + finfo.min = -inf
        helper.make_node("Cast", ["keep"], ["from_bool"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["ids"], ["from_int"], to=TensorProto.FLOAT16),  # 70000 → inf in float16
        helper.make_node("Identity", ["x"], ["opaque"]),
    ]
    facts, values = _facts_of(nodes, [bool_in, int_in, float_in], consts)
    assert facts.finite(values["mask"]) and facts.finite(values["mask5"]) and facts.finite(values["from_bool"])
    for name in ("inf_mask", "summed", "from_int", "opaque"):
        assert not facts.finite(values[name]), name


def test_bounded_values_are_finite_where_their_bound_fits_the_type():
    """Magnitude bounds: integers by their type, products and sums by their operands — ALiBi's slopes · Cast(int32
    positions) is at most 2³¹·|slope|: finite in float32, not in float16 (65504), nor with a slope of 1e30."""
    pos = helper.make_tensor_value_info("pos", TensorProto.INT32, [1, 4])
    consts = [
        helper.make_tensor("slopes", TensorProto.FLOAT, [2, 1], [0.5, 0.25]),
        helper.make_tensor("huge", TensorProto.FLOAT, [], [1e30]),
        helper.make_tensor("fmin", TensorProto.FLOAT, [], [FMIN]),
        helper.make_tensor("slopes16", TensorProto.FLOAT16, [2, 1], [0.5, 0.25]),
    ]
    nodes = [
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["slopes", "posf"], ["alibi"]),
        helper.make_node("Neg", ["alibi"], ["negated"]),
        helper.make_node("Sub", ["alibi", "posf"], ["shifted"]),
        helper.make_node("Mul", ["huge", "posf"], ["overflowing"]),
        helper.make_node("Add", ["fmin", "alibi"], ["near_min"]),  # its bound passes finfo.max: not claimed
        helper.make_node("Cast", ["pos"], ["pos16"], to=TensorProto.FLOAT16),
        helper.make_node("Mul", ["slopes16", "pos16"], ["alibi16"]),
    ]
    facts, values = _facts_of(nodes, [pos], consts)
    for name in ("posf", "alibi", "negated", "shifted"):
        assert facts.finite(values[name]), name
    assert facts.magnitude(values["alibi"]) == 0.5 * 2.0**31
    for name in ("overflowing", "near_min", "pos16", "alibi16"):  # bounds past the type's largest value
        assert not facts.finite(values[name]), name


def test_every_layer_drops_the_guard_of_a_shared_finite_mask():
    """BERT's SDPA export: one ``Where(mask, 0, finfo.min)`` feeds every layer, each layer guards its softmax."""
    path = DATA / "bert_sdpa.dynamo.onnx"
    original = onnx.load(path)
    feeds = dict(np.load(path.with_name("bert_sdpa.dynamo.feeds.npz")))
    feeds["attention_mask"][:, : feeds["attention_mask"].shape[1] // 2] = 0  # left padding: masked keys
    assert sum(n.op_type == "IsNaN" for n in original.graph.node) == 2
    for target in ("ort", "onnx"):
        result = egfuse.fuse(path, target=target, feeds=feeds)
        assert not [n.name for n in result.model.graph.node if n.op_type == "IsNaN"], target
        assert_same_outputs(original, result.model, feeds)

"""Constant folding computes what onnxruntime would — log(0) is −inf, and T5's relative-position buckets cast it
to an integer before a Where discards it — without numpy's RuntimeWarnings reaching the user's terminal."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from egfuse.analysis.facts import GraphFacts


def _bucket_graph() -> ir.Graph:
    positions = helper.make_tensor("positions", TensorProto.FLOAT, [4], [0.0, 1.0, 2.0, 8.0])
    nodes = [
        helper.make_node("Log", ["positions"], ["logs"]),
        helper.make_node("Cast", ["logs"], ["buckets"], to=TensorProto.INT64),
        helper.make_node("Div", ["positions", "zero"], ["ratios"]),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(
        nodes, "buckets", [], [helper.make_tensor_value_info(n, t, [4]) for n, t in
                               (("buckets", TensorProto.INT64), ("ratios", TensorProto.FLOAT))],
        initializer=[positions, zero],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph


def test_folding_log_of_zero_warns_nothing_and_keeps_the_infinity():
    graph = _bucket_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        facts = GraphFacts(graph)
    values = {v.name: v for node in graph for v in node.outputs}
    logs = facts.const(values["logs"])
    assert logs is not None and logs[0] == -np.inf and np.isclose(logs[1], 0.0)
    assert facts.const(values["buckets"]) is not None
    ratios = facts.const(values["ratios"])
    assert ratios is not None and np.isnan(ratios[0]) and np.isinf(ratios[1])

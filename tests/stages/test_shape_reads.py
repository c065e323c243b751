"""``egfuse.writing.shape_reads``: a ``Shape`` read of a value nothing else needs is rebuilt from surviving values'
dims, so the value's producer can go — and is left alone wherever a dim has no source or the value is needed anyway.
Each case runs the rewritten graph on onnxruntime against the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxruntime as ort
from onnx import TensorProto, helper

from egfuse.analysis.facts import GraphFacts
from egfuse.preparation.shape_inference import infer_shapes
from egfuse.writing.shape_reads import rewrite_dead_shape_reads


def _model(nodes: list, outputs: list[str]) -> onnx.ModelProto:
    """x: (batch, seq, 4) float; ``outputs`` typed by inference."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return infer_shapes(model)


def _rewritten(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    ir_model = ir.serde.deserialize_model(model)
    count = rewrite_dead_shape_reads(ir_model.graph, GraphFacts(ir_model.graph), 18)
    ir_passes.RemoveUnusedNodesPass()(ir_model)
    ir_passes.TopologicalSortPass()(ir_model)
    return ir.serde.serialize_model(ir_model), count


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _assert_same(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> None:
    for shape in ((2, 3, 4), (1, 5, 4)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        for a, b in zip(_run(original, x), _run(rewritten, x), strict=True):
            np.testing.assert_array_equal(a, b)


def _op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _scores_read_for_their_shape(shape_attrs: dict | None = None, minus_one_first: bool = False) -> onnx.ModelProto:
    """scores = softmax(x·xᵀ) (batch, seq, seq) is read only by Shape; y = x reshaped by two of its dims and -1."""
    return _model(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["x", "xt"], ["s"]),
            helper.make_node("Softmax", ["s"], ["p"], axis=-1),
            helper.make_node("Shape", ["p"], ["sp"], **(shape_attrs or {})),
            helper.make_node("Constant", [], ["two"], value=helper.make_tensor("", TensorProto.INT64, [1], [2])),
            helper.make_node("Constant", [], ["z"], value=helper.make_tensor("", TensorProto.INT64, [1], [0])),
            helper.make_node("Slice", ["sp", "z", "two"], ["bs"]),
            helper.make_node("Constant", [], ["m1"], value=helper.make_tensor("", TensorProto.INT64, [1], [-1])),
            helper.make_node("Concat", ["m1", "bs"] if minus_one_first else ["bs", "m1"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        ["y"],
    )


def test_a_shape_read_of_dead_scores_is_read_from_the_input():
    model = _scores_read_for_their_shape()
    rewritten, count = _rewritten(model)
    assert count == 1
    assert not {"MatMul", "Softmax", "Transpose"} & set(_op_types(rewritten)), _op_types(rewritten)
    _assert_same(model, rewritten)


def test_a_partial_shape_read_keeps_its_start_and_end():
    model = _scores_read_for_their_shape({"start": -1}, minus_one_first=True)  # x as (-1, seq)
    rewritten, count = _rewritten(model)
    assert count == 1 and "Softmax" not in _op_types(rewritten)
    _assert_same(model, rewritten)


def test_a_dim_with_no_source_leaves_the_read():
    """Near miss: (batch, 2·seq) — no surviving value has a 2·seq axis, so the read and its producer stay."""
    model = _model(
        [
            helper.make_node("Concat", ["x", "x"], ["xx"], axis=1),
            helper.make_node("Exp", ["xx"], ["e"]),
            helper.make_node("Shape", ["e"], ["se"]),
            helper.make_node("Reshape", ["xx", "se"], ["y"]),
        ],
        ["y"],
    )
    rewritten, count = _rewritten(model)
    assert count == 0 and "Exp" in _op_types(rewritten)
    _assert_same(model, rewritten)


def test_a_read_of_a_value_the_outputs_need_is_left():
    model = _model(
        [
            helper.make_node("Exp", ["x"], ["e"]),
            helper.make_node("Shape", ["e"], ["se"]),
            helper.make_node("Reshape", ["x", "se"], ["y"]),
        ],
        ["y", "e"],
    )
    rewritten, count = _rewritten(model)
    assert count == 0 and _op_types(rewritten).count("Shape") == 1
    _assert_same(model, rewritten)

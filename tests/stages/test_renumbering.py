"""The opset renumbering predicted from op schemas (egfuse.preparation.renumbering) agrees with onnx's converter:
wherever it says "only renumbered", the converter changes no node; where an op's newer version needs an adapter
that rewrites the node, it says no."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from egfuse.files.load import default_opset
from egfuse.preparation.renumbering import only_renumbered

from ..conftest import DATA

EXPORTS = sorted(DATA.glob("*.onnx"))  # the committed transformers exports (opsets 17 and 18)


def _without_subgraph_types(node: onnx.NodeProto) -> onnx.NodeProto:
    """``node`` with its subgraphs' value_info dropped: the converter infers shapes inside If branches, which is
    not a change of computation."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attribute in copy.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            del graph.value_info[:]
            for inner in graph.node:
                inner.CopyFrom(_without_subgraph_types(inner))
    del copy.metadata_props[:]
    return copy


def _converter_keeps_every_node(model: onnx.ModelProto, version: int) -> bool:
    converted = onnx.version_converter.convert_version(model, version)
    before = [_without_subgraph_types(n) for n in model.graph.node]
    after = [_without_subgraph_types(n) for n in converted.graph.node]
    return before == after


def test_a_predicted_renumbering_is_what_the_converter_does():
    predicted = []
    for path in EXPORTS:
        model = onnx.load(path)
        old = default_opset(model)
        if old < 23 and only_renumbered(model, old, 23):
            predicted.append(path.stem)
            assert _converter_keeps_every_node(model, 23), path.name
    assert len(predicted) >= len(EXPORTS) // 3, f"the table no longer covers the usual exports: {predicted}"


def _model(node: onnx.NodeProto, opset: int, *, domain_imports=()) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *domain_imports])


@pytest.mark.parametrize(
    ("node", "opset", "renumbered"),
    [
        (helper.make_node("Relu", ["x"], ["y"]), 17, True),  # unchanged from 14 on
        (helper.make_node("Identity", ["x"], ["y"]), 17, True),  # 19, 21, 23: types added
        (helper.make_node("Softmax", ["x"], ["y"], axis=1), 12, False),  # 13 changed what axis means
        (helper.make_node("ReduceMean", ["x"], ["y"], axes=[1]), 17, False),  # 18: axes became an input
        (helper.make_node("Split", ["x"], ["y"], axis=0), 17, False),  # 18: num_outputs
        (helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft"), 17, False),  # another domain
    ],
    ids=["relu", "identity", "softmax-12", "reducemean-17", "split-17", "contrib"],
)
def test_only_steps_that_keep_the_node_are_renumbered(node, opset, renumbered):
    imports = [helper.make_opsetid("com.microsoft", 1)] if node.domain else []
    assert only_renumbered(_model(node, opset, domain_imports=imports), opset, 23) is renumbered


def test_a_subgraph_op_counts_too():
    branch = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["z"], axis=1)], "b", [], [helper.make_tensor_value_info("z", 1, None)]
    )
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    model = _model(node, 12)
    model.graph.input.append(cond)
    assert not only_renumbered(model, 12, 23)
    with_relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["z"])], "b", [], [helper.make_tensor_value_info("z", 1, None)]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=with_relu, else_branch=with_relu)
    assert only_renumbered(_model(node, 17), 17, 23)


def test_local_functions_are_left_to_the_converter():
    model = _model(helper.make_node("Relu", ["x"], ["y"]), 17)
    model.functions.append(helper.make_function("pkg", "f", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                                [helper.make_opsetid("", 17)]))  # fmt: skip
    assert not only_renumbered(model, 17, 23)

"""Each stage on its own, with small hand-made inputs: lower (what a Reshape, a Split and a Concat mean),
extract (cheapest program, shared children counted once, no cycles), shapes (a built term's shape from its
constructor's meaning) and cost (work grows with the shapes). The end-to-end tests cover the stages together."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from egfuse.analysis.dims import Dim
from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.cost import CostModel
from egfuse.egraph.enodes import view
from egfuse.egraph.extract import extract
from egfuse.egraph.session import EClass, ENode, Session
from egfuse.egraph.shapes import class_shapes
from egfuse.kinds.regions import Region
from egfuse.lowering.lower import Lowered, Lowerer
from egfuse.targets import get_target


def _graph(nodes: list, inputs: list, inits: list | None = None) -> ir.Graph:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits or []
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph


def _lowered(graph: ir.Graph) -> tuple[Lowerer, str]:
    facts = GraphFacts(graph)
    lowerer = Lowerer(facts, Session().names, 18)
    nodes = list(graph)
    lowerer.lower(Region(0, nodes[-1], nodes=nodes, outputs=[nodes[-1].outputs[0]], main_output=nodes[-1].outputs[0]))
    return lowerer, "\n".join(lowerer.table.commands)


# --- lower ----------------------------------------------------------------------------------------------------


def test_a_reshape_that_splits_the_last_axis_is_a_head_split():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])
    shape = numpy_helper.from_array(np.array([0, 0, 4, 16], np.int64), "shape")
    graph = _graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], [x], [shape])
    _, text = _lowered(graph)
    assert "split_heads" in text and '"4" "16"' in text
    assert Session().names["reshape"] not in text  # read as its meaning, not kept as a reshape


def test_a_reshape_with_no_layout_meaning_stays_a_reshape():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])
    shape = numpy_helper.from_array(np.array([0, 0, 8, 2, 4], np.int64), "shape")  # two new axes at once
    graph = _graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], [x], [shape])
    _, text = _lowered(graph)
    assert "split_heads" not in text and "merge" not in text and "Tensor_reshape" in text


def test_a_split_into_head_wide_pieces_is_parts_and_heads_and_a_concat_is_a_fold_of_joins():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])
    sizes = numpy_helper.from_array(np.array([16, 16], np.int64), "sizes")
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=-1),
        helper.make_node("Concat", ["b", "a"], ["y"], axis=-1),
    ]
    _, text = _lowered(_graph(nodes, [x], [sizes]))
    assert "Tensor_part" in text and "-1 0 16" in text and "-1 16 16" in text
    assert '"2" "16"' in text  # the pieces are also the two heads of a head split
    assert "Tensor_concat" in text


# --- extract --------------------------------------------------------------------------------------------------


class _Costs:
    def __init__(self, table: dict[str, float | None]) -> None:
        self.table = table

    def cost(self, node: ENode) -> float | None:
        return self.table.get(node.op, 1.0)


def test_extraction_takes_the_cheapest_form_and_counts_a_shared_child_once():
    e = [EClass(i) for i in range(4)]
    classes = {
        e[0]: [ENode.of("value", (0,))],
        e[1]: [ENode.of("softmax", (e[0],))],  # shared by both forms of e[3]
        e[2]: [ENode.of("matmul", (e[1], e[1])), ENode.of("tanh", (e[0],))],
        e[3]: [ENode.of("add", (e[2], e[1])), ENode.of("mul", (e[0], e[0]))],
    }
    best = extract(classes, _Costs({"value": 0.0, "softmax": 5.0, "matmul": 1.0, "tanh": 10.0, "add": 1.0, "mul": 8.0}))
    assert best[e[2]].node.op == "matmul"  # 1 + 5 (softmax once, though read twice) beats 10
    assert best[e[3]].node.op == "add" and best[e[3]].total == 7.0  # add 1 + matmul 1 + softmax 5, once
    best = extract(classes, _Costs({"value": 0.0, "softmax": None, "tanh": 10.0, "mul": 8.0}))
    assert e[1] not in best and best[e[3]].node.op == "mul"  # what the target cannot run is never chosen


def test_extraction_never_returns_a_cycle():
    e = [EClass(i) for i in range(3)]
    classes = {
        e[0]: [ENode.of("value", (0,))],
        e[1]: [ENode.of("tanh", (e[2],)), ENode.of("sqrt", (e[0],))],
        e[2]: [ENode.of("tanh", (e[1],))],
    }
    best = extract(classes, _Costs({"value": 0.0, "tanh": 1.0, "sqrt": 3.0}))
    assert best[e[1]].node.op == "sqrt" and best[e[2]].node.children == (e[1],)


# --- shapes and cost ------------------------------------------------------------------------------------------


def _attention_classes(seq: str) -> tuple[dict, EClass]:
    q, k, v, bias, att = (EClass(i) for i in range(5))
    classes = {
        q: [ENode.of("value", (0,))],
        k: [ENode.of("value", (1,))],
        v: [ENode.of("value", (2,))],
        bias: [ENode.of("no_bias", ())],
        att: [ENode.of("attend", (q, k, v, bias, 0.125, 0.0))],
    }
    return classes, att


def test_a_built_term_gets_its_shape_from_its_meaning():
    dims = {"q": ["batch", 8, "seq", 64], "k": ["batch", 2, "total", 64], "v": ["batch", 2, "total", 32]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims.items()]
    graph = _graph([helper.make_node("Identity", ["q"], ["y"])], inputs)
    lowered = Lowered()
    for value in graph.inputs:
        lowered.id_of(value)
    classes, att = _attention_classes("seq")
    shapes = class_shapes(classes, lowered, GraphFacts(graph))
    assert shapes[att] == (Dim.of("batch"), Dim(8), Dim.of("seq"), Dim(32))  # (B, N, S, Hv): V's width
    e = [EClass(i) for i in range(10, 13)]
    joined = {e[0]: [ENode.of("part", (att, -3, 0, 2))], e[1]: [ENode.of("concat", (e[0], att, -3))]}
    shapes = class_shapes({**classes, **joined}, lowered, GraphFacts(graph))
    assert shapes[e[0]][1] == Dim(2) and shapes[e[1]][1] == Dim(10)
    assert view(joined[e[1]][0]).axis == -3


def test_the_cost_of_attention_grows_with_the_sequence():
    classes, att = _attention_classes("seq")
    shapes = {
        EClass(0): (Dim(1), Dim(8), Dim.of("seq"), Dim(64)),
        EClass(1): (Dim(1), Dim(8), Dim.of("seq"), Dim(64)),
        EClass(2): (Dim(1), Dim(8), Dim.of("seq"), Dim(64)),
        EClass(3): (),
        EClass(4): (Dim(1), Dim(8), Dim.of("seq"), Dim(64)),
    }
    target = get_target("onnx")
    (node,) = classes[att]
    short = CostModel(target.for_shapes({"seq": 16}), shapes).time(node)
    long = CostModel(target.for_shapes({"seq": 1024}), shapes).time(node)
    assert short is not None and long is not None and long > 10 * short


def test_multi_head_attention_is_refused_where_keys_and_values_differ_in_head_size():
    """onnxruntime's MultiHeadAttention takes (B, N, T, H) K and V of one shape and refuses LeViT's narrower keys
    at run time ("shall have same shape"): the cost model does not offer it there."""
    q, k, v, bias = (EClass(i) for i in range(4))
    node = ENode.of("mha_kv4", (q, k, v, bias, 0.25, 0.0, "8"))
    spec = get_target("ort")
    for head_k, expected in ((16, None), (64, "a cost")):
        shapes = {
            q: (Dim(1), Dim(49), Dim(8 * 16)),
            k: (Dim(1), Dim(8), Dim(49), Dim(head_k)),
            v: (Dim(1), Dim(8), Dim(49), Dim(64)),
            bias: (),
        }
        cost = CostModel(spec, shapes).time(node)
        assert (cost is None) == (expected is None), (head_k, cost)


def test_report_names_the_written_form_even_where_its_own_ops_were_priced_lower():
    """The ort target fuses wherever it can: a fused region whose own ops were predicted cheaper must not be
    reported as if the unfused form had been chosen."""
    from egfuse.report import RegionReport, Report

    region = RegionReport(0, "softmax_0", "fused", fused_into="com.microsoft.Attention", form="packed_attention")
    region.candidates = [
        {"form": "unfused", "op": "the graph's own ops", "cost_us": 3051.0},
        {"form": "packed_attention", "op": "com.microsoft.Attention", "cost_us": 3127.0},
        {"form": "attend", "op": "Attention", "cost_us": 3193.0},
    ]
    report = Report(source="m.onnx", target="ort", regions=[region])
    line = next(line for line in str(report).splitlines() if "chosen:" in line)
    assert "chosen: packed_attention → com.microsoft.Attention, 3127 µs" in line
    assert "fuses wherever it can" in line and "unfused → the graph's own ops 3051 µs" in line
    region.candidates = [*region.candidates[1:], {"form": "unfused", "op": "the graph's own ops", "cost_us": 4000.0}]
    line = next(line for line in str(report).splitlines() if "chosen:" in line)
    assert line.strip().startswith("chosen: packed_attention") and "; over attend → Attention 3193 µs" in line

"""Shape facts the late-2023 dynamo exports (torch 2.1, transformers 4.36) need: buffers cut to a symbolic
length, sizes written as sums (``s0*(s1//10) - s0``), ``arange(0, n)`` — each checked by fusing a real
export and comparing it with the unfused model on onnxruntime. Each export (or spelling) runs on one target in the
fast suite, the targets alternating, and on the other in the slow one (``-m slow``, which CI runs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import egfuse
from egfuse.analysis.dims import Dim
from egfuse.analysis.facts import GraphFacts
from egfuse.preparation import if_folding, literal_folding, sequences
from egfuse.testing import CONCATS, Variant, attention_model, feeds_for

from ..conftest import DATA, assert_same_outputs, fast_on, one_target_fast

OLD_DYNAMO = DATA / "old_dynamo"


def test_sums_of_products_have_one_normal_form():
    assert Dim.parse("s0*(s1//10) - s0") == Dim.parse("s0*((s1//10) - 1)")
    assert Dim.parse("s1").plus(Dim.parse("s1"), -1) == Dim(0)
    assert Dim.parse("past + seq").plus(Dim.parse("seq"), -1) == Dim.parse("past")  # the normal form cancels
    assert Dim.parse("4*batch") == Dim(4, ("batch",))
    doubled = Dim.parse("s1 + 1") * Dim(2)
    assert doubled == Dim.parse("2 + 2*s1") and doubled.div(Dim(2)) == Dim.parse("1 + s1")
    assert Dim.parse("s0*s1 - s0").div(Dim.parse("s0")) == Dim.parse("s1 - 1")


def test_a_sum_divides_a_multiple_of_itself():
    """A cache's keys (B, N, past + new, H) reshaped to (-1, past + new, H): the -1 is B·N, a product of dims
    divided by a sum (polynomial long division), and anything that is no exact multiple stays unknown."""
    total = Dim.parse("past + new")
    keys = Dim.parse("batch") * Dim(4) * total * Dim(8)
    assert keys.div(total * Dim(8)) == Dim(4, ("batch",))
    assert (total * total).div(total) == total
    assert Dim.parse("a*a - b*b").div(Dim.parse("a + b")) == Dim.parse("a - b")
    assert keys.div(Dim.parse("past + 1")) is None and total.div(Dim.parse("past")) is None
    assert (total * Dim(3)).div(total * Dim(2)) is None


def _cut_buffer_model(buffer_len: int) -> onnx.ModelProto:
    """``buffer[:, :S]`` with S read off the input's shape, as GPT-2's causal mask and RoPE tables are cut."""
    buf = helper.make_tensor("buf", TensorProto.FLOAT, [1, buffer_len], np.arange(buffer_len, dtype=np.float32))
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["buf", "zero", "shape", "axis"], ["cut"]),
        helper.make_node("Add", ["x", "cut"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "cut", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [buf],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_stored_buffer_cut_to_a_symbolic_length_has_that_length():
    graph = ir.serde.deserialize_model(_cut_buffer_model(64)).graph
    facts = GraphFacts(graph)
    cut = next(n for n in graph if n.op_type == "Slice").outputs[0]
    assert facts.shape(cut) == (Dim(1), Dim(1, ("S",)))


def test_a_computed_tensor_cut_to_a_symbolic_length_is_not_claimed():
    model = _cut_buffer_model(64)
    model.graph.node.insert(0, helper.make_node("Relu", ["buf"], ["buf_relu"]))
    next(n for n in model.graph.node if n.op_type == "Slice").input[0] = "buf_relu"
    graph = ir.serde.deserialize_model(model).graph
    facts = GraphFacts(graph)
    cut = next(n for n in graph if n.op_type == "Slice").outputs[0]
    assert facts.shape(cut) is None or facts.shape(cut)[1] != Dim(1, ("S",))


@pytest.mark.parametrize(
    ("target", "name"), one_target_fast([("gpt2_eager",), ("gpt_neo_eager",)], ["gpt2_eager", "gpt_neo_eager"])
)
def test_causal_buffer_cut_to_the_sequence_fuses(name, target):
    """torch 2.1's dynamo export: the ``bias`` buffer sliced to ``Shape(input_ids)[1]`` under a ``Where``
    (and GPT-Neo's ``arange(0, S) < S + (S - S)`` mask arithmetic) are (S, S) facts."""
    _fuses_both_blocks(name, target)


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_probabilities_cast_like_themselves_fuse(target):
    """torch 2.1: ``CastLike(p, p)`` after the softmax is the identity, a ``CastLike(fill, p)`` reads p's dtype
    only — neither is a step between the probabilities and ``·V``."""
    model = attention_model(Variant(dropout="castlike"))
    assert sum(n.op_type == "CastLike" for n in model.graph.node) == 2
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert_same_outputs(model, result.model, feeds)


def _nested_constant_ifs() -> onnx.ModelProto:
    """``If(4 > 0)`` whose taken branch holds ``If(Equal(Size(Shape(x)), 0))`` — torchlib's squeeze/gather
    wrappers — around a Softmax: both conditions are known, so the softmax is a plain op of the graph."""
    inner_then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t_in"])], "t", [], [helper.make_tensor_value_info("t_in", 1, None)]
    )
    inner_else = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["e_in"], axis=-1)],
        "e",
        [],
        [helper.make_tensor_value_info("e_in", 1, None)],
    )
    outer_then = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Size", ["shape"], ["rank"]),
            helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
            helper.make_node("Equal", ["rank", "zero"], ["is_scalar"]),
            helper.make_node("If", ["is_scalar"], ["o_in"], then_branch=inner_then, else_branch=inner_else),
        ],
        "ot", [], [helper.make_tensor_value_info("o_in", 1, None)],
    )  # fmt: skip
    outer_else = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o_else"])], "oe", [], [helper.make_tensor_value_info("o_else", 1, None)]
    )
    nodes = [
        helper.make_node("Constant", [], ["four"], value=helper.make_tensor("f", TensorProto.INT64, [], [4])),
        helper.make_node("Constant", [], ["nil"], value=helper.make_tensor("n", TensorProto.INT64, [], [0])),
        helper.make_node("Greater", ["four", "nil"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=outer_then, else_branch=outer_else),
    ]
    graph = helper.make_graph(
        nodes, "ifs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nested_ifs_on_known_conditions_are_their_branches():

    graph = ir.serde.deserialize_model(_nested_constant_ifs()).graph
    for _ in range(3):
        if not if_folding.fold_constant_ifs(graph, GraphFacts(graph)):
            break
    assert [n.op_type for n in graph if n.op_type in ("If", "Softmax")] == ["Softmax"]


@pytest.mark.parametrize(
    ("target", "interleaved", "concat"),
    one_target_fast(
        [(i, c) for i in (False, True) for c in CONCATS], [f"{i}-{c}" for i in (False, True) for c in CONCATS]
    ),
)
def test_rope_from_stored_tables_cut_to_the_sequence_fuses(concat, interleaved, target):
    """transformers 4.36's ``cos_cached[:seq_len]`` (a Slice of a stored table whose end is ``Shape(x)[1]``) and
    torch 2.1's ``torch.cat`` as ``ConcatFromSequence(SequenceConstruct(…))`` in rotate_half."""
    v = Variant(rope=True, rope_tables="buffer", concat=concat, rope_interleaved=interleaved, k_layout="transpose_0213")
    model = attention_model(v)
    assert (concat == "sequence") == any(n.op_type == "ConcatFromSequence" for n in model.graph.node)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert_same_outputs(model, result.model, feeds)


def _fuses_both_blocks(name: str, target: str) -> None:
    """The stored torch 2.1 export ``name``: both blocks fuse and validate, and match it on its own feeds."""
    path = OLD_DYNAMO / f"{name}.torch21.dynamo.onnx"
    model = onnx.load(path)
    with np.load(OLD_DYNAMO / f"{name}.torch21.dynamo.feeds.npz") as data:
        feeds = {i.name: data[i.name] for i in model.graph.input}
    result = egfuse.fuse(path, target=target, feeds=feeds)
    assert result.report.fused == len(result.report.regions) == 2, str(result.report)
    assert result.report.validated is True
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize(
    ("name", "target"),
    [pytest.param("llama_eager", "onnx", id="onnx-llama_eager"),
     pytest.param("llama_eager", "ort", marks=pytest.mark.slow, id="ort-llama_eager")],
)  # fmt: skip
def test_rope_of_torch21_dynamo_export_fuses(name, target):
    """The real late-2023 export: RoPE tables cut with a symbolic Slice, gathered by ``GatherND``, rotate_half
    concatenated from a sequence, and the causal mask built from ``arange`` arithmetic."""
    _fuses_both_blocks(name, target)


def _torchlib_gather() -> onnx.ModelProto:
    """torch 2.1's aten_gather: ``If(Size(i) == 0, CastLike(i, x), GatherElements(x, Cast(i)))``."""
    then = helper.make_graph(
        [helper.make_node("CastLike", ["i", "x"], ["t_out"])],
        "t",
        [],
        [helper.make_tensor_value_info("t_out", 1, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i64"], to=TensorProto.INT64),
         helper.make_node("GatherElements", ["x", "i64"], ["e_out"], axis=1)],
        "e", [], [helper.make_tensor_value_info("e_out", 1, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("Size", ["i"], ["size"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Equal", ["size", "zero"], ["empty"]),
        helper.make_node("If", ["empty"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes, "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6]),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_torchlib_gather_if_is_its_gather():
    """Both branches give a tensor of i's shape, empty when i is: the If is the GatherElements (checked on
    onnxruntime, an empty index included)."""
    from egfuse.validation import validate

    model = ir.serde.deserialize_model(_torchlib_gather())
    assert if_folding.fold_constant_ifs(model.graph, GraphFacts(model.graph)) == 1
    assert [n.op_type for n in model.graph] == ["Size", "Constant", "Equal", "Cast", "GatherElements"]
    folded = ir.serde.serialize_model(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for i in (np.array([[5, 0, 3], [1, 1, 2]], np.int64), np.zeros((2, 0), np.int64)):
        expected, actual = validate.run(_torchlib_gather(), {"x": x, "i": i}), validate.run(folded, {"x": x, "i": i})
        np.testing.assert_array_equal(expected["y"], actual["y"])


def test_a_mask_folded_to_a_constant_keeps_its_shape():
    """A static causal mask (``arange(7)[:, None] < arange(7)``, a fixed-length export) is evaluated to a
    constant; its (7, 7) shape stays a fact though ONNX shape inference left it unknown."""
    positions = helper.make_tensor("pos", TensorProto.INT64, [7], list(range(7)))
    nodes = [
        helper.make_node("Unsqueeze", ["pos", "one"], ["rows"]),
        helper.make_node("Unsqueeze", ["pos", "zero"], ["cols"]),
        helper.make_node("Less", ["rows", "cols"], ["future"]),
        helper.make_node("Where", ["future", "fill", "nil"], ["mask"]),
        helper.make_node("Add", ["x", "mask"], ["y"]),
    ]
    inits = [
        positions,
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("fill", TensorProto.FLOAT, [], [-1e9]),
        helper.make_tensor("nil", TensorProto.FLOAT, [], [0.0]),
    ]
    graph = helper.make_graph(
        nodes, "mask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    graph = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).graph
    facts = GraphFacts(graph)
    mask = next(n for n in graph if n.op_type == "Where").outputs[0]
    assert facts.const(mask) is not None and facts.shape(mask) == (Dim(7), Dim(7))


@pytest.mark.parametrize(
    ("target", "given"),
    [pytest.param(t, g, marks=[] if (t, g) == ("onnx", False) else [pytest.mark.slow], id=f"{t}-{i}")
     for g, i in ((True, "feeds"), (False, "generated")) for t in ("ort", "onnx")],
)  # fmt: skip
def test_wav2vec2_dims_written_as_sums_fuse(given, target):
    """torch 2.3's wav2vec2 export: the convolution's output length times the batch appears as
    ``s0*(s1//10) - s0`` and as ``s0*((s1//10) - 1)``; one normal form makes the head reshapes read. Without
    feeds, validation generates longer audio once 5 samples are too short for the strided convolutions. The fast
    suite runs that case (on onnx; the result is then compared on the export's feeds too), ``-m slow`` the rest."""
    path = OLD_DYNAMO / "wav2vec2_eager.torch23.dynamo.onnx"
    model = onnx.load(path)
    with np.load(OLD_DYNAMO / "wav2vec2_eager.torch23.dynamo.feeds.npz") as data:
        feeds = {i.name: data[i.name] for i in model.graph.input}
    result = egfuse.fuse(path, target=target, feeds=feeds if given else None)
    assert result.report.fused == len(result.report.regions) == 2, str(result.report)
    assert result.report.validated is True
    assert_same_outputs(model, result.model, feeds)


def _dims_compared(x_shape: list, y_shape: list) -> tuple[GraphFacts, ir.Graph]:
    """``Not(Equal(Shape(x)[1], Shape(y)[1]))``: DeBERTa's ``q_len != k_len``, which TorchScript writes as an If."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"], start=1, end=2),
        helper.make_node("Shape", ["y"], ["sy"], start=1, end=2),
        helper.make_node("Equal", ["sx", "sy"], ["same"]),
        helper.make_node("Not", ["same"], ["differ"]),
        helper.make_node("Cast", ["differ"], ["cond"], to=TensorProto.BOOL),
    ]
    graph = helper.make_graph(
        nodes, "compare", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [1])],
    )  # fmt: skip
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return GraphFacts(model.graph), model.graph


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "differ"),
    [(["B", "S", 8], ["B", "S", 8], False), ([2, 3], [2, 4], True), (["B", "S"], ["B", "T"], None)],
)
def test_a_comparison_of_dims_is_known_where_the_dims_are(x_shape, y_shape, differ):
    """The same dim on both sides is equal, two numbers compare, two different symbols stay unknown."""
    facts, graph = _dims_compared(x_shape, y_shape)
    assert facts.truth(graph.outputs[0]) is differ


# --- torch 2.2 and 2.4's dynamo exports (model-local functions; issue 34 item 6) --------------------------------


def _cut_between_model(start_from_query: bool) -> onnx.ModelProto:
    """GPT-2's causal buffer over a cache: ``bias[:, k - q : k]`` with k and q read off the keys' and the queries'
    shapes (``start_from_query=False``: ``bias[:, q : k]``, whose length ``k - q`` names no size)."""
    buf = helper.make_tensor("buf", TensorProto.FLOAT, [1, 64], np.arange(64, dtype=np.float32))
    start = ["k_len", "q_len"] if start_from_query else ["q_len"]
    nodes = [
        helper.make_node("Shape", ["keys"], ["k_len"], start=1, end=2),
        helper.make_node("Shape", ["queries"], ["q_len"], start=1, end=2),
        helper.make_node("Sub", start, ["start"])
        if start_from_query
        else helper.make_node("Identity", start, ["start"]),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["buf", "start", "k_len", "axis"], ["cut"]),
        helper.make_node("Add", ["queries", "cut"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "cut_between",
        [helper.make_tensor_value_info("keys", TensorProto.FLOAT, ["B", "past + 1"]),
         helper.make_tensor_value_info("queries", TensorProto.FLOAT, ["B", "1"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [buf],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_buffer_cut_between_two_symbolic_ends_has_their_difference():
    graph = ir.serde.deserialize_model(_cut_between_model(True)).graph
    cut = next(n for n in graph if n.op_type == "Slice").outputs[0]
    assert GraphFacts(graph).shape(cut) == (Dim(1), Dim(1))
    # near miss: bias[:, q : k] with q = Q has (past + 1) - Q elements, a sum no dim names: not claimed
    model = _cut_between_model(False)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "Q"
    graph = ir.serde.deserialize_model(model).graph
    cut = next(n for n in graph if n.op_type == "Slice").outputs[0]
    shape = GraphFacts(graph).shape(cut)
    assert shape is None or shape[1] is None or shape[1].invented, shape


def _positions_model(limit_from_past: bool) -> onnx.ModelProto:
    """A decoder's positions over a cache, ``arange(past, past + seq)`` (``limit_from_past=False``: ``arange(past,
    other + seq)``, whose length is no size)."""
    nodes = [
        helper.make_node("Shape", ["past"], ["p"], start=2, end=3),
        helper.make_node("Shape", ["ids"], ["s"], start=1, end=2),
        helper.make_node("Shape", ["other"], ["o"], start=0, end=1),
        helper.make_node("Add", ["s", "p" if limit_from_past else "o"], ["limit"]),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
        helper.make_node("Squeeze", ["p"], ["p0"]),
        helper.make_node("Squeeze", ["limit"], ["limit0"]),
        helper.make_node("Range", ["p0", "limit0", "one"], ["positions"]),
    ]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, ["B", 4, "P", 8]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"]),
         helper.make_tensor_value_info("other", TensorProto.INT64, ["O"])],
        [helper.make_tensor_value_info("positions", TensorProto.INT64, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_positions_over_a_cache_count_the_new_tokens():
    graph = ir.serde.deserialize_model(_positions_model(True)).graph
    positions = next(n for n in graph if n.op_type == "Range").outputs[0]
    assert GraphFacts(graph).shape(positions) == (Dim(1, ("S",)),)
    graph = ir.serde.deserialize_model(_positions_model(False)).graph  # near miss: O + S - P is no size
    positions = next(n for n in graph if n.op_type == "Range").outputs[0]
    shape = GraphFacts(graph).shape(positions)
    assert shape is None or shape[0] is None or shape[0].invented, shape


def _torchlib_literals() -> onnx.ModelProto:
    """torchlib's attributes passed as inputs: ``Unsqueeze(x, Cast(Constant(1)))`` and ``x.size(1)`` as
    ``Slice(Shape(x), Reshape(Constant 1), Reshape(Add(Constant 1, 1)))``; and float arithmetic on literals."""

    def const(name: str, value, dtype=TensorProto.INT64) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, [], [value]))

    nodes = [
        const("dim", 1), const("one", 1), const("half", 0.5, TensorProto.FLOAT),
        helper.make_node("Constant", [], ["vec"], value_ints=[1]),
        helper.make_node("Cast", ["dim"], ["axis"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["x", "axis"], ["unsqueezed"]),
        helper.make_node("Reshape", ["dim", "vec"], ["start"]),
        helper.make_node("Add", ["dim", "one"], ["end0"]),
        helper.make_node("Reshape", ["end0", "vec"], ["end"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "start", "end"], ["size"]),
        helper.make_node("Expand", ["unsqueezed", "size"], ["expanded"]),
        helper.make_node("Add", ["half", "half"], ["whole"]),
        helper.make_node("Mul", ["expanded", "whole"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "literals", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_torchlib_integer_literals_fold_and_ranks_come_back():
    model = ir.serde.deserialize_model(_torchlib_literals())
    folded = literal_folding.fold_literal_arithmetic(model.graph, GraphFacts(model.graph))
    ops = {n.outputs[0].name: n.op_type for n in model.graph}
    assert folded == 4 and {ops[v] for v in ("axis", "start", "end0", "end")} == {"Constant"}, ops
    assert ops["whole"] == "Add"  # float arithmetic is the model's own: never folded
    proto = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(model), data_prop=True)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in proto.graph.value_info}
    assert ranks["unsqueezed"] == 3 and ranks["expanded"] == 3, ranks
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    assert_same_outputs(_torchlib_literals(), proto, {"x": x})


def _split_sequence(split: list[int] | int, index: int) -> onnx.ModelProto:
    """``torch.split`` as torch 2.4 writes it: ``SequenceAt(SplitToSequence(x, split, axis=2), index)``."""
    dims, values = ([], [split]) if isinstance(split, int) else ([len(split)], split)
    sizes = helper.make_tensor("sizes", TensorProto.INT64, dims, values)
    nodes = [
        helper.make_node("Constant", [], ["split"], value=sizes),
        helper.make_node("Constant", [], ["i"], value=helper.make_tensor("i", TensorProto.INT64, [], [index])),
        helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=2),
        helper.make_node("SequenceAt", ["seq", "i"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("split", "index"), [(4, 0), (4, 2), ([3, 5, 2], 1), ([3, 5, 2], 2), (4, -1)])
def test_an_item_of_a_split_sequence_is_a_slice(split, index):
    """Item i is the slice it names (the last chunk of a split by one size is shorter); a negative index, which
    needs the count, is left as written."""
    original = _split_sequence(split, index)
    model = ir.serde.deserialize_model(original)
    replaced = sequences.split_sequence_items(model.graph, GraphFacts(model.graph))
    assert replaced == (index >= 0)
    assert ("SequenceAt" in {n.op_type for n in model.graph}) == (index < 0)
    x = np.random.default_rng(0).standard_normal((2, 1, 10)).astype(np.float32)
    assert_same_outputs(original, ir.serde.serialize_model(model), {"x": x})


@pytest.mark.parametrize(
    ("stack", "name", "target"),
    [("2024-09", "bert_eager", "ort"), ("2024-09", "gpt2_past_eager", "onnx"), ("2024-04", "llama_eager", "onnx")],
)
def test_torch22_and_24_dynamo_exports_fuse(stack, name, target):
    """Real exports whose inlined functions hid attention: a value typed float by the exporter's hint where its
    Expand gives int64 (BERT), ``torch.split`` as a sequence and a causal buffer cut between two symbolic ends
    over a cache (GPT-2), the causal mask's ranks behind torchlib's literal arithmetic (LLaMA)."""
    path = DATA / "drift" / stack / f"{name}.dynamo.onnx"
    model = onnx.load(path)
    feeds = dict(np.load(path.with_name(f"{name}.dynamo.feeds.npz")))
    result = egfuse.fuse(path, target=target, feeds=feeds)
    assert result.report.fused == len(result.report.regions) == 2, str(result.report)
    assert result.report.validated is True, str(result.report)
    assert_same_outputs(model, result.model, feeds)

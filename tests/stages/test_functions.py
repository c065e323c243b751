"""Old dynamo exports (torch 2.1–2.4): attention inside nested model-local functions, batched MatMuls decomposed
into Expand → Reshape → 3D MatMul → Reshape, eval-mode Dropout, fixed sizes as text dims. Each fuses and
matches the original on onnxruntime; functions nothing fused in stay functions; what is not examined is said."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

import egfuse
from egfuse.commands import cli
from egfuse.preparation import functions
from egfuse.testing import DROPOUTS, Variant, attention_model, feeds_for, in_functions

from ..conftest import DATA, assert_same_outputs, fast_on, fused_op_count, one_target_fast, only

OLD_DYNAMO = DATA / "old_dynamo"
OLD_DYNAMO_STYLE = Variant(matmul="batched_3d", dropout="training_false", text_dims=True, symbolic=False)


@pytest.mark.parametrize(("target", "depth"), one_target_fast([(1,), (3,)], ["1", "3"]))
def test_attention_inside_nested_functions_fuses(depth, target):
    model = in_functions(attention_model(OLD_DYNAMO_STYLE), depth=depth)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert fused_op_count(result.model, target) == 1
    assert not result.model.functions  # every function held the fused block (or called one that did)
    assert any("inlined" in note for note in result.report.notes)
    assert result.report.regions[0].functions[0] == "pkg.egfuse.testing::Block_0"
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize(
    ("target", "field"),
    one_target_fast([(f,) for f in ("matmul", "dropout", "text_dims")], ["matmul", "dropout", "text_dims"]),
)
def test_old_dynamo_spelling_fuses(field, target):
    for value in {"matmul": ["batched_3d"], "dropout": DROPOUTS[1:], "text_dims": [True]}[field]:
        model = attention_model(Variant(symbolic=False, **{field: value}))
        feeds = feeds_for(model)
        result = egfuse.fuse(model, target=target, feeds=feeds)
        assert result.report.fused == 1 and result.report.validated is True, f"{field}={value}\n{result.report}"
        assert_same_outputs(model, result.model, feeds)


def test_text_dims_of_digits_are_sizes_for_generated_feeds():
    """No feeds given: validation binds '5' to 5, so the original runs and the fusion is proven."""
    model = attention_model(Variant(text_dims=True, symbolic=False))
    result = egfuse.fuse(model)
    assert result.report.validated is True, str(result.report)


def test_text_dims_are_integers_to_shape_inference(target):
    """ONNX shape inference takes '3' for a symbol, so Concat(past '3', new 5) had an invented length and the
    K/V head repeat lost its meaning (repeated heads went to MultiHeadAttention): read as 3, the grouped heads go
    in natively and the cache is absorbed."""
    model = attention_model(
        Variant(k_layout="transpose_0132", heads=2, kv_heads=1, past=True, symbolic=False, text_dims=True)
    )
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    (op,) = [n for n in result.model.graph.node if n.op_type in ("Attention", "MultiHeadAttention")]
    assert (op.domain, op.output[1:]) == ("", ["present_key", "present_value"])
    assert_same_outputs(model, result.model, feeds)


def _softmax_over_axis_2(model: onnx.ModelProto) -> onnx.ModelProto:
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(helper.make_attribute("axis", 2))
    return model


def test_unfusable_model_keeps_its_functions(target):
    model = in_functions(_softmax_over_axis_2(attention_model(OLD_DYNAMO_STYLE)), depth=2)
    result = egfuse.fuse(model, target=target, feeds=feeds_for(model))
    assert result.report.fused == 0
    assert result.model.SerializeToString() == model.SerializeToString()  # functions and all
    assert "softmax is not over the last axis" in result.report.regions[0].reason
    assert any("functions and all" in note for note in result.report.notes)


def _with_unrelated_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """The block's output goes through a second model-local function (a tanh 'activation') that fusion does
    not touch."""
    domain = "pkg.egfuse.testing"
    act = helper.make_function(domain, "Activation", ["a"], ["b"], [helper.make_node("Tanh", ["a"], ["b"])],
                               [helper.make_opsetid("", 17)])  # fmt: skip
    model.functions.append(act)
    (out,) = model.graph.output
    call = model.graph.node[0]
    call.output[0] = "block_out"
    model.graph.node.append(helper.make_node("Activation", ["block_out"], [out.name], domain=domain, name="act"))
    return model


def test_functions_without_fused_attention_stay_functions():
    """``ort`` writing contrib ops on an opset-17 block needs no opset conversion: the activation stays a function."""
    model = _with_unrelated_function(in_functions(attention_model(OLD_DYNAMO_STYLE), depth=2))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=only("ort", "mha", "mha_kv4", "packed_attention"), feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert [f.name for f in result.model.functions] == ["Activation"]
    assert result.report.functions["kept"] == ["pkg.egfuse.testing::Activation"]
    assert_same_outputs(model, result.model, feeds)


def test_functions_stay_functions_where_the_opset_is_converted():
    """onnx's version converter (opset 23 for the standard op) drops functions and nodes' metadata: egfuse puts
    them back (each function's body converted too), so the activation stays a function on ``onnx`` as well."""
    model = _with_unrelated_function(in_functions(attention_model(OLD_DYNAMO_STYLE), depth=2))
    for node in model.graph.node:
        node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value=node.name)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert [f.name for f in result.model.functions] == ["Activation"]
    (activation,) = result.model.functions
    assert {e.domain: e.version for e in activation.opset_import}[""] == 23
    kept = [n for n in result.model.graph.node if n.name == "act"]
    assert kept and kept[0].metadata_props[0].value == "act"
    assert_same_outputs(model, result.model, feeds)


def test_functions_beside_a_renumbered_opset_are_converted_with_it():
    """``ort`` writing the standard Attention raises a dynamo export to opset 23; where onnx's converter changes
    no node of the graph, the model is only renumbered — and its local functions, still importing opset 18, were
    left so: onnxruntime ran the result, onnx's checker refused it. Every function now imports the model's."""
    path = DATA / "drift" / "2025-02" / "distilbert_sdpa.dynamo.onnx"
    result = egfuse.fuse(str(path), target="ort")
    assert result.report.validated is True and result.report.fused_ops().get("Attention") == 2, str(result.report)
    assert {e.domain: e.version for e in result.model.opset_import}[""] == 23
    assert all({e.domain: e.version for e in f.opset_import}.get("", 23) == 23 for f in result.model.functions)
    onnx.checker.check_model(result.model, full_check=True)
    original = onnx.load(str(path))
    assert_same_outputs(original, result.model, dict(np.load(str(path).replace(".onnx", ".feeds.npz"))))


# --- reasons and the loud report --------------------------------------------------------------------------


def test_reason_names_the_node_where_recognition_stopped():
    """Scores through an op no rule reads: the reason names that node (like onnxscript's MatchResult.fail).
    (An op on K alone is no obstacle: ``Q @ X`` is ``scores(Q, Xᵀ)`` for any X, so it fuses with X as the keys.)"""
    model = attention_model(Variant())
    qk = next(n for n in model.graph.node if n.op_type == "MatMul" and any("transpose" in i.lower() for i in n.input))
    odd = helper.make_node("Sin", [qk.output[0]], ["scores_sin"], name="odd_scores")
    for node in model.graph.node:
        node.input[:] = ["scores_sin" if i == qk.output[0] else i for i in node.input]
    model.graph.node.insert(list(model.graph.node).index(qk) + 1, odd)
    result = egfuse.fuse(model, validate=False)
    assert result.report.fused == 0
    assert "recognition stopped at Sin 'odd_scores'" in result.report.regions[0].reason, result.report.regions[0].reason


def test_reason_names_a_training_dropout():
    model = attention_model(Variant(dropout="training_false"))
    flag = next(n for n in model.graph.node if n.op_type == "Constant" and n.attribute[0].t.data_type == 9)
    flag.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(True)))
    result = egfuse.fuse(model, validate=False)
    assert result.report.fused == 0
    assert "the probabilities go to Dropout" in result.report.regions[0].reason


def _softmax_in_if_body(computed_condition: bool = False) -> onnx.ModelProto:
    """A model whose only softmax sits in an If branch on a graph input (searched as a model of its own:
    :mod:`egfuse.branch_search`) or, with ``computed_condition``, on a value computed from one: no region can
    reach it."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    then = helper.make_graph([helper.make_node("Softmax", ["x"], ["s"], name="hidden_softmax")], "then", [],
                             [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [2, 3])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "else", [],
                              [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 3])])  # fmt: skip
    cond = helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])  # known only at run time
    node = helper.make_node("If", ["cond_"] if computed_condition else ["cond"], ["y"], then_branch=then,
                            else_branch=other, name="branch")  # fmt: skip
    nodes = [helper.make_node("Not", ["cond"], ["cond_"]), node] if computed_condition else [node]
    graph = helper.make_graph(nodes, "g", [x, cond], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_softmax_in_a_branch_on_an_input_is_examined_there():
    """The branch is searched as a model of its own: its softmax is a region (not attention here), reported with
    its branch, and nothing is left unexamined."""
    result = egfuse.fuse(_softmax_in_if_body())
    assert result.report.unexamined == [] and len(result.report.regions) == 1
    assert result.report.regions[0].notes[0] == "in If 'branch' then_branch"
    assert result.report.fused == 0 and not result.report.changed


def test_softmax_no_region_covers_is_reported_loudly(tmp_path, capsys):
    model = _softmax_in_if_body(computed_condition=True)
    result = egfuse.fuse(model)
    assert result.report.unexamined == ["If 'branch' body: hidden_softmax"]
    assert "1 softmax node was not examined" in str(result.report)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert (
        cli.main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--report", str(tmp_path / "r.json")])
        == 0
    )
    assert "egfuse: note: 1 softmax node was not examined" in capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["loud_note"].startswith("1 softmax node")


def test_an_if_on_a_known_condition_is_its_branch(target):
    """torch 2.1's torchlib wraps ops in If(IsScalar(x), …): with the condition known the branch's ops are the
    graph's, and a softmax in it is examined like any other."""
    model = _softmax_in_if_body()
    model.graph.input.pop()
    model.graph.initializer.append(helper.make_tensor("cond", onnx.TensorProto.BOOL, [], [True]))
    result = egfuse.fuse(model, target=target)
    assert result.report.unexamined == [] and len(result.report.regions) == 1
    assert result.model.SerializeToString() == model.SerializeToString()  # nothing fused: returned as it came


def test_model_without_softmax_says_so():
    model = _softmax_in_if_body()
    then = next(a for a in model.graph.node[0].attribute if a.name == "then_branch")
    then.g.node[0].op_type = "Relu"
    assert "no Softmax node" in str(egfuse.fuse(model).report)


# --- real exports of torch 2.3.1 + transformers 4.42.4 (torch.onnx.dynamo_export) ------------------------


@pytest.mark.parametrize(
    ("target", "name"), one_target_fast([("bert_eager",), ("llama_eager",)], ["bert_eager", "llama_eager"])
)
def test_real_old_dynamo_exports_fuse(name, target):
    path = OLD_DYNAMO / f"{name}.dynamo.onnx"
    model = onnx.load(path)
    with np.load(OLD_DYNAMO / f"{name}.dynamo.feeds.npz") as data:
        feeds = {i.name: data[k] for i, k in zip(model.graph.input, data.files, strict=True)}
    assert model.functions and not any(n.op_type == "Softmax" for n in model.graph.node)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    assert result.report.fused == len(result.report.regions) == 1, str(result.report)
    assert result.report.validated is True
    assert_same_outputs(model, result.model, feeds)


def _with_vector_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` plus torchlib's ``aten_linalg_vector_norm`` as the 2024 dynamo exporter writes it: nested Ifs
    on ``IsInf(ord)`` and ``ord == CastLike(k, ord)`` for a constant ord (wav2vec2's weight norm)."""
    out = helper.make_tensor_value_info
    f32 = onnx.TensorProto.FLOAT

    def branch(name: str, nodes: list, result: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [out(result, f32, None)])

    def const(name: str, value: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(value, "f")))

    def reduce(op: str) -> onnx.GraphProto:
        return branch(op, [helper.make_node(op, ["y"], [f"{op}_out"], axes=[-1], keepdims=0)], f"{op}_out")

    def if_(cond: str, out: str, then: onnx.GraphProto, other: onnx.GraphProto) -> onnx.NodeProto:
        return helper.make_node("If", [cond], [out], then_branch=then, else_branch=other)

    is_one = branch("is_one", [const("one", 1.0), helper.make_node("CastLike", ["one", "ord_f"], ["one_c"]),
                               helper.make_node("Equal", ["ord_f", "one_c"], ["c1"]),
                               if_("c1", "r1", reduce("ReduceL1"), reduce("ReduceL2"))], "r1")  # fmt: skip
    finite = branch("finite", [helper.make_node("IsInf", ["ord_f"], ["c2"], detect_negative=1, detect_positive=0),
                               if_("c2", "r2", reduce("ReduceMin"), is_one)], "r2")  # fmt: skip
    model.graph.node.extend([
        const("ord", 2.0),
        helper.make_node("Cast", ["ord"], ["ord_f"], to=f32),
        helper.make_node("IsInf", ["ord_f"], ["c0"], detect_negative=0),
        if_("c0", "norm", reduce("ReduceMax"), finite),
    ])  # fmt: skip
    model.graph.output.append(out("norm", f32, None))
    return model


@pytest.mark.parametrize("target", fast_on("ort"))
def test_ifs_on_constant_tests_are_folded_nested_too(target):
    """onnxruntime 1.32 crashes (a segfault in ConstantFolding) loading such a nest once the opset is raised to
    23; folded, the model holds the branch taken (ReduceL2) and no If at all."""
    model = _with_vector_norm(attention_model(Variant()))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    ops = [n.op_type for n in result.model.graph.node]
    assert "If" not in ops and "ReduceL2" in ops, ops
    assert_same_outputs(model, result.model, feeds)


def _with_a_wrong_hint_inside(model: onnx.ModelProto, last: bool = False) -> tuple[onnx.ModelProto, str]:
    """``model`` in one function with a value typed int64 by a scoped ``value_info`` entry, as torch 2.4's dynamo
    exporter mistypes some values inside its functions (BERT's ``expand``): the softmax output, or (``last``) the
    value the graph output copies, past the attention block."""
    wrapped = in_functions(model, depth=1)
    function = wrapped.functions[0]
    value = function.node[-2].output[0] if last else next(n for n in function.node if n.op_type == "Softmax").output[0]
    hint = helper.make_tensor_value_info(f"{function.domain}::{function.name}/{value}", onnx.TensorProto.INT64, [2])
    wrapped.graph.value_info.append(hint)
    return wrapped, value


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_a_wrong_type_hint_inside_a_function_does_not_survive_inlining(target):
    """onnxruntime ignores types inside functions (the model runs) but refuses them once inlined: inference
    contradicts the hint, so the op's type wins and the block fuses."""
    model, softmax = _with_a_wrong_hint_inside(attention_model(OLD_DYNAMO_STYLE))
    feeds = feeds_for(model)
    inlined = functions.inline(model).proto
    info = next(v for v in inlined.graph.value_info if v.name == softmax)
    assert info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert_same_outputs(model, result.model, feeds)


def test_an_inlined_graph_that_does_not_run_is_egfuses_fault_not_the_feeds(monkeypatch):
    """With the hint kept (the reconciliation switched off) the inlined graph does not load although the model
    does: the report blames egfuse's inlining, never the model or the inputs, and nothing is applied."""
    model, _ = _with_a_wrong_hint_inside(attention_model(OLD_DYNAMO_STYLE), last=True)
    feeds = feeds_for(model)
    monkeypatch.setattr(functions, "retype_contradicted_hints", lambda proto: [])
    for given in (feeds, None):
        result = egfuse.fuse(model, target="ort", feeds=given)
        note = result.report.validation_note or ""
        assert result.report.fused == 0 and "fault in egfuse's inlining" in note, str(result.report)
        assert "feeds" not in note.split("(")[0], note
        assert result.model.SerializeToString() == model.SerializeToString()
